"""One process, two comm ranks as threads, started by test_shim.py with or without LD_PRELOAD of
the NCCL shim, over the NCCL test double (LD_LIBRARY_PATH). Each comm rank:
  - the hook's path: a lowrank communicator over an NCCL communicator lowrank makes
    (lowrankCommInitNcclRank), 3 compressed allreduces of a float32 buffer with a layout;
  - the application's path: its own NCCL communicator and 5 ncclAllReduce calls of another
    float32 buffer through the global scope (where a preloaded shim interposes them: the first 2
    go to NCCL while it detects the recurring call, the others to lowrank).
Prints "RESULT <json>": the outputs' bytes as hex digests, lowrank's stats."""
import ctypes
import hashlib
import json
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pkgpath  # noqa: E402
pkgpath.use()  # the checkout's package, or the installed one (LOWRANK_TEST_INSTALLED=1)
import lowrank  # noqa: E402

N, ROWS, COLS, CALLS, APP_CALLS = 2, 256, 128, 3, 5
nccl = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # the double
glob = ctypes.CDLL(None)  # the global scope: the shim's ncclAllReduce first when preloaded


class NcclId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def data(rank, salt):
    g = np.random.default_rng(100 * rank + salt)
    return (g.standard_normal((ROWS, 4)) @ g.standard_normal((4, COLS))
            + 0.01 * g.standard_normal((ROWS, COLS))).astype(np.float32).reshape(-1)


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


lowrank_id = lowrank.nccl_unique_id()
app_id = NcclId()
assert glob.ncclGetUniqueId(ctypes.byref(app_id)) == 0
out = [None] * N


def rank_main(r):
    res = {}
    with lowrank.Communicator.from_nccl_id(N, lowrank_id, r, approx_rank=4, seed=5) as comm:
        buf = np.empty(ROWS * COLS, dtype=np.float32)
        comm.set_layout(buf, [(ROWS, COLS)])
        outs = []
        for call in range(CALLS):
            buf[:] = data(r, call)
            comm.allreduce(buf, op="avg")
            outs.append(digest(buf))
        res["hook"] = outs
        res["hook_stats"] = comm.stats()
    app_comm = ctypes.c_void_p()
    assert glob.ncclCommInitRank(ctypes.byref(app_comm), N, app_id, r) == 0
    abuf = np.empty(ROWS * COLS, dtype=np.float32)
    outs = []
    for call in range(APP_CALLS):
        abuf[:] = data(r, 50 + call)
        rc = glob.ncclAllReduce(ctypes.c_void_p(abuf.ctypes.data), ctypes.c_void_p(abuf.ctypes.data),
                                ctypes.c_size_t(abuf.size), 7, 0, app_comm, None)  # float32, sum
        assert rc == 0, rc
        outs.append(digest(abuf))
    res["app"] = outs
    assert glob.ncclCommDestroy(app_comm) == 0
    out[r] = res


threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(N)]
[t.start() for t in threads]
[t.join(120) for t in threads]
print("RESULT " + json.dumps(out), flush=True)
