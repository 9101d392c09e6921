#!/usr/bin/env python3
"""The NCCL test double exports NCCL's names and their p-prefixed twins, and nothing else but its own
test-only ncclDouble* entry points.

    check_exports.py LIB
"""
import subprocess
import sys

lib = sys.argv[1]
out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
names = {line.split()[-1] for line in out.splitlines() if line.strip()}
stray = sorted(n for n in names if not (n.startswith("nccl") or n.startswith("pnccl")))
# ncclDouble*: the double's own test-only entry points (nccl_double.h), no NCCL name.
twins = sorted(n for n in names if n.startswith("nccl") and not n.startswith("ncclDouble") and "p" + n not in names)
needed = {"ncclAllReduce", "pncclAllReduce", "ncclCommInitRank", "pncclCommInitRank", "ncclGroupStart",
          "pncclGroupEnd", "ncclDoubleCallCount", "ncclDoubleLiveComms"}
ok = True
for what, bad in (("exported beyond nccl*/pnccl*", stray), ("without a pnccl twin", twins),
                  ("missing", sorted(needed - names))):
    if bad:
        print(f"FAIL {what}: {bad}")
        ok = False
print(f"{len(names)} symbols exported" + ("" if ok else "; see above"))
sys.exit(0 if ok else 1)
