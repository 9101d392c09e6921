"""The order of the reducers' blocks in a switching run (studies/switch/driver.py): a balanced Latin
square over the runs, and within a run the row then its mirror.

- Across runs: run i takes row i mod n of a Williams square (Williams 1949). Each reducer stands
  once in each position, and, for even n, follows every other reducer exactly once over the n rows.
  For odd n (5 reducers) the square and its mirror image together give that carry-over balance:
  the mirror is within each run, below.
- Within a run: the row, then the same row reversed (A B C D E E D C B A). Every reducer's mean
  position in the run is then the same, (n - 1) / 2 blocks, so a linear drift of the machine
  during a run (a load that rises or falls) adds the same to every reducer and cancels in the
  differences to `local` that the analysis takes run by run. `rounds` repeats this pair.
Rows 0..n-1 balance the first position; with runs not a multiple of n, some rows are used once
more than others (the within-run mirror still balances each run's drift).
"""


def williams_row(n, i):
    """Row i (0 <= i < n) of the Williams square of order n: the first row 0, 1, n-1, 2, n-2, ...
    and row i that row plus i, modulo n."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    return [(x + i) % n for x in first]


def block_order(reducers, run_index, rounds=1):
    """The measured blocks of run `run_index`: reducer names, row then mirror, `rounds` times."""
    n = len(reducers)
    row = [reducers[j] for j in williams_row(n, run_index % n)]
    return (row + row[::-1]) * rounds
