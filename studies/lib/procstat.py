"""Contention, per step, from the kernel's counters of this process: CPU time (all threads) and
the scheduler's run delay summed over all threads (/proc/self/task/*/schedstat: time runnable but
waiting for a CPU). A step whose run delay grows was slowed by other work on the cores, whatever
the reducer. A thread that ends between two reads takes its counts with it (the sum can fall):
the analysis reads these per step as a sign of load, not as a budget.

busy_fraction() is the machine-wide counterpart, for a study's guard that nothing else runs."""
import os
import time


def run_delay_ns():
    """Sum over this process's threads of schedstat's second field (ns waited on a run queue)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # the thread ended, or no schedstat
            pass
    return total


def snapshot():
    """(CPU seconds of the process, run delay ns summed over its threads)."""
    return time.process_time(), run_delay_ns()


def delta_ms(before, after):
    """{cpu_ms, run_delay_ms} between two snapshots."""
    return dict(cpu_ms=1000.0 * (after[0] - before[0]), run_delay_ms=(after[1] - before[1]) / 1e6)


def _cpu_idle_total(stat="/proc/stat"):
    """(idle + iowait, all) jiffies of the machine's CPUs, from /proc/stat's first line: user nice
    system idle iowait irq softirq steal, then guest and guest_nice, which user and nice already
    include (so they are not added again)."""
    with open(stat) as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v[:8])


def busy_fraction(seconds=5.0, stat="/proc/stat"):
    """Share of the machine's CPU time (all cores) spent not idle over the next `seconds`: 0 on an
    idle machine, 1 with every core busy. Unlike the load average, which lags by minutes, it says
    whether anything runs now, so a study can start its next run as soon as the last one has
    ended, and still waits for anyone else's work."""
    i0, t0 = _cpu_idle_total(stat)
    time.sleep(seconds)
    i1, t1 = _cpu_idle_total(stat)
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(max_busy, deadline, sample_s=5.0, pause_s=10.0):
    """Wait until at most `max_busy` of the CPU was busy over `sample_s`, printing why it waits;
    False if time.monotonic() passes `deadline` first (a study's budget, also while waiting)."""
    while (busy := busy_fraction(sample_s)) > max_busy:
        print(f"waiting: {busy:.0%} of the CPU busy > {max_busy:.0%}", flush=True)
        if time.monotonic() + pause_s > deadline:
            return False
        time.sleep(pause_s)
    return True
