#!/usr/bin/env python3
"""A peer killed mid-call on the device path (issue 26, item 2; issue 39, item 1): three comm ranks
as processes of `two_rank_worker deadpeer` queue compressed calls back to back; once all are
running, rank 2 is killed (SIGKILL). Every survivor's next calls must fail, its stream's next host
synchronization return, and the survivor exit (after tearing down lowrank and NCCL), all within
the timeout plus 5 s of the kill. --owned: over lowrank's own NCCL communicator, which lowrank
must abort when the call fails (else the stream stays behind NCCL's spinning collectives); else
over the application's, which the worker aborts after lowrankCommDestroy. Run by meson on the CPU
emulation of CUDA with the NCCL test double (gpu_dead_peer_emulated, gpu_dead_peer_owned_emulated)
and by run_device_checks.sh on a GPU.

  dead_peer_check.py WORKER [TIMEOUT_SEC] [--owned]     (default 5)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

RANKS, VICTIM, SLACK = 3, 2, 5.0


def main():
    args = [a for a in sys.argv[1:] if a != "--owned"]
    owned = ["owned"] if "--owned" in sys.argv[1:] else []
    worker = args[0]
    timeout = float(args[1]) if len(args) > 1 else 5.0
    idfile = os.path.join(tempfile.mkdtemp(), "id")
    env = dict(os.environ, LOWRANK_TIMEOUT=str(timeout))  # the NCCL double's own waits too
    procs = [subprocess.Popen([worker, "deadpeer", str(r), str(RANKS), idfile, str(timeout)] + owned,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(env, NCCL_HOSTID=f"lowrank-dead-peer-host{r}"))
             for r in range(RANKS)]
    try:
        for r, p in enumerate(procs):  # every rank has made 5 calls
            line = p.stdout.readline()
            while line and "ready" not in line:
                print(f"rank {r}: {line.rstrip()}")
                line = p.stdout.readline()
            if not line:
                print(f"FAILED: rank {r} ended before it was ready (exit {p.wait()})")
                return 1
        procs[VICTIM].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        print(f"killed rank {VICTIM} (SIGKILL) mid-call; timeout {timeout:g} s")
        bad = 0
        for r, p in enumerate(procs):
            if r == VICTIM:
                p.wait()
                continue
            try:
                out, _ = p.communicate(timeout=timeout + SLACK + 30)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                print(f"FAILED: rank {r} still running {timeout + SLACK + 30:g} s after the kill")
                bad = 1
            took = time.monotonic() - killed
            print("".join(f"rank {r}| {l}\n" for l in out.splitlines() if l.strip()), end="")
            if (p.returncode != 3 or "failed" not in out or "stream synchronized" not in out
                    or "torn down" not in out):
                print(f"FAILED: rank {r} exited {p.returncode} (want 3: a failed call, the stream "
                      "synchronized, then teardown)")
                bad = 1
            elif took > timeout + SLACK:
                print(f"FAILED: rank {r} took {took:.1f} s after the kill (bound {timeout + SLACK:g} s)")
                bad = 1
            else:
                print(f"rank {r}: failed, synchronized and torn down {took:.1f} s after the kill "
                      f"(bound {timeout + SLACK:g} s)")
        print("dead-peer check " + ("FAILED" if bad else "passed"))
        return bad
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
