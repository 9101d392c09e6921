"""Contention, per step, from the kernel's counters of this process: CPU time (all threads) and
the scheduler's run delay summed over all threads (/proc/self/task/*/schedstat: time runnable but
waiting for a CPU). A step whose run delay grows was slowed by other work on the cores, whatever
the reducer. A thread that ends between two reads takes its counts with it (the sum can fall):
the analysis reads these per step as a sign of load, not as a budget."""
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
