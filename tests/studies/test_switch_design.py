"""studies/switch/design.py: the Williams square's rows and the within-run mirror balance
what they are meant to balance."""
import itertools
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from studies.switch import design as switch_design


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_latin_square(n):
    rows = [switch_design.williams_row(n, i) for i in range(n)]
    for row in rows:
        assert sorted(row) == list(range(n))
    for pos in range(n):
        assert sorted(r[pos] for r in rows) == list(range(n))


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_carry_over_balanced(n):
    """Every ordered pair of distinct reducers adjacent equally often over the rows and their
    mirrors (the square alone already for even n)."""
    rows = [switch_design.williams_row(n, i) for i in range(n)]
    count = {}
    for r in rows + [r[::-1] for r in rows]:
        for a, b in zip(r, r[1:]):
            count[(a, b)] = count.get((a, b), 0) + 1
    assert set(count) == set(itertools.permutations(range(n), 2))
    assert len(set(count.values())) == 1
    if n % 2 == 0:
        once = {}
        for r in rows:
            for a, b in zip(r, r[1:]):
                once[(a, b)] = once.get((a, b), 0) + 1
        assert set(once.values()) == {1}


def test_mirror_equalises_mean_position():
    names = ["local", "allreduce", "fp16", "torch-powersgd", "lowrank"]
    for run in range(7):
        order = switch_design.block_order(names, run, rounds=2)
        assert len(order) == 4 * len(names)
        means = {x: sum(i for i, y in enumerate(order) if y == x) / order.count(x) for x in names}
        assert len(set(means.values())) == 1, means
