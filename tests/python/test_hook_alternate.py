"""lowrank.torch's hook with alternate=True: alternating PowerSGD (ACP-SGD, Zhang, Zhang, Shi, Chu,
Li, ICDCS 2023; docs/design.md, "Alternating factors"): one factor allreduce per compressed call,
P and Q on alternate calls. DDP over gloo, 2 ranks as processes (tests/python/alternate_worker.py
and the checkpoint worker tests/python/ckpt_worker.py with CKPT_ALTERNATE=1), and one process.

The checkpoint runs follow tests/python/test_checkpoint.py: run A trains 10 steps uninterrupted;
run B trains CUT, saves model, optimizer and hook state per rank and exits; new processes load
them and train the rest. Compression starts at step 1 (CKPT_START 1), so B has made CUT - 1
compressed calls when it saves: CUT 5 saves before a P step, CUT 4 before a Q step.
"""
import os
import shutil

import pytest
import torch

from conftest import results, run_ranks

WORLD, STEPS, START = 2, 10, 1
P_NEXT, Q_NEXT = 5, 4  # CUT: 4 compressed calls made (P step next), or 3 (Q step next)


def ckpt(*args, env=None, timeout=180):
    return run_ranks(WORLD, *args, timeout=timeout, env=env, worker="ckpt_worker.py")


def _params(d, name, rank):
    return torch.load(f"{d}/{name}_rank{rank}.pt")


def _same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)


def _canon(d, name, rank):
    with open(f"{d}/canon_{name}_rank{rank}.bin", "rb") as f:
        return f.read()


# ---- a: training, the schedule, the counters -----------------------------------------------------

def test_alternate_trains_with_one_factor_allreduce_per_step():
    """2 ranks, two buckets (weights (48, 24) and (16, 48), k = 2, compression from step 1), the
    same data and initial model trained with alternate=True and with alternate=False:
    - every bucket's reduced buffer is the same on both ranks at every step (digests);
    - the warm-up step (exact) is the same under both schedules, every compressed step differs;
    - lowrank's counters: each compressed step adds, over its compressed buckets, the exact part
      and P (steps 1, 3, 5: n k per weight) or Q (steps 2, 4: m k) with alternate=True, and the
      exact part, P and Q with alternate=False; P and Q differ in size here;
    - the loss goes down, the parameters stay finite, the communicator reports alternate 1."""
    steps = 6
    res = results(run_ranks(WORLD, "train", steps, START, worker="alternate_worker.py",
                            timeout=120))
    for run in ("alt", "plain"):
        assert res[0][run]["outs"] == res[1][run]["outs"], run  # identical on every rank
        for r in res:
            assert r[run]["finite"] and r[run]["losses"][-1] < r[run]["losses"][0], r[run]
    for r in res:
        alt, plain = r["alt"], r["plain"]
        assert (alt["alternate"], plain["alternate"]) == (1, 0)
        for s in range(steps):
            if s < START:
                assert alt["outs"][str(s)] == plain["outs"][str(s)], s
            else:
                assert alt["outs"][str(s)] != plain["outs"][str(s)], s
        for s in range(START, steps):
            p, q, e = alt["factors"][s]
            assert p and q and p != q and plain["factors"][s] == [p, q, e], s
            assert alt["compressed"][s] == plain["compressed"][s] == 2, s  # both weights' buckets
            assert alt["payload"][s] == e + (p if (s - START) % 2 == 0 else q), (s, alt)
            assert plain["payload"][s] == e + p + q, (s, plain)
        assert alt["compressed"][:START] == [0] * START


# ---- b: checkpoint and restart -------------------------------------------------------------------

@pytest.fixture(scope="module")
def alt_runs(tmp_path_factory):
    """Run A with alternate=True (10 steps), then run B's first part saved before a P step
    (dir "p") and before a Q step (dir "q", run A's files copied there)."""
    env = {"CKPT_ALTERNATE": "1"}
    dirs = {"p": str(tmp_path_factory.mktemp("alt_p")), "q": str(tmp_path_factory.mktemp("alt_q"))}
    full = results(ckpt("full", dirs["p"], STEPS, env=env))
    for r in range(WORLD):
        for name in (f"full_rank{r}.pt", f"canon_full_rank{r}.bin"):
            shutil.copy(os.path.join(dirs["p"], name), dirs["q"])
    first = {"p": results(ckpt("first", dirs["p"], P_NEXT, env=env)),
             "q": results(ckpt("first", dirs["q"], Q_NEXT, env=env))}
    return dirs, full, first


@pytest.mark.parametrize("next_step", ["p", "q"])
def test_alternate_resume_equals_uninterrupted(alt_runs, next_step):
    """Saved before a P step (after 4 compressed calls) or before a Q step (after 3), the
    restarted run's parameters after the 10th step, and every tensor's lowrank state (residual,
    warm-start Q, kept P, phase, calls: format 2 in id order), equal run A's bit for bit on every
    rank: the phase and the kept P travel in the checkpoint, through DDP's single first bucket
    after the restart and its rebuild (saved before a Q step, a restart that began with a P
    step would differ). Every run alternates (config alternate 1)."""
    dirs, full, first = alt_runs
    d, cut = dirs[next_step], P_NEXT if next_step == "p" else Q_NEXT
    assert all(r["alternate"] == 1 for r in full + first[next_step])
    res = results(ckpt("resume", d, cut, STEPS, "state_dict", env={"CKPT_ALTERNATE": "1"}))
    for r in range(WORLD):
        assert res[r]["alternate"] == 1 and res[r]["iter"] == STEPS
        assert res[r]["buckets"][str(cut)] == [10]  # DDP's first step after the restart
        assert not [m for m in res[r]["log"] if "not used" in m], res[r]["log"]
        assert _same(_params(d, "resume_state_dict", r), _params(d, "full", r)), \
            f"rank {r}: parameters differ"
        assert _canon(d, "resume_state_dict", r) == _canon(d, "full", r), \
            f"rank {r}: tensor states differ"
        # settings other than alternate are still checked
        assert "matrix_approximation_rank: saved 2, this state 3" in res[r]["other_k"]
        assert res[r]["roundtrip"] is True
    assert full[0]["compressed"] == (STEPS - START) * 3  # three buckets after DDP's rebuild


def test_alternate_resume_from_a_pickled_state(alt_runs):
    """torch.save of the state itself (pickling): the loaded state alternates (its options) and
    resumes bit for bit, saved before a P step."""
    dirs, _, _ = alt_runs
    d = dirs["p"]
    res = results(ckpt("resume", d, P_NEXT, STEPS, "pickle"))  # no CKPT_ALTERNATE: the pickle's
    for r in range(WORLD):
        assert res[r]["alternate"] == 1
        assert _same(_params(d, "resume_pickle", r), _params(d, "full", r)), f"rank {r} differs"
        assert _canon(d, "resume_pickle", r) == _canon(d, "full", r), f"rank {r}: states differ"


@pytest.mark.parametrize("saved,loaded", [("alt", "plain"), ("plain", "alt")])
def test_checkpoint_loads_under_the_other_schedule(tmp_path, saved, loaded):
    """alternate is not a checked setting: a state saved under one schedule loads into a state
    of the other (saved before a Q step when saved alternating). The restart equals, bit for bit,
    the uninterrupted run that switched each bucket's schedule at the same step
    (Communicator.set_alternate: residuals and warm-start Q kept, the alternation restarting
    with a P step), parameters and every tensor's state; and it sends fewer elements
    alternating than not."""
    d, cut = str(tmp_path), Q_NEXT
    flag = {"alt": "1", "plain": "0"}
    switched = results(ckpt("full", d, STEPS, env={"CKPT_ALTERNATE": flag[saved],
                                                    "CKPT_SWITCH": str(cut)}))
    results(ckpt("first", d, cut, env={"CKPT_ALTERNATE": flag[saved]}))
    res = results(ckpt("resume", d, cut, STEPS, "state_dict",
                       env={"CKPT_ALTERNATE": flag[loaded]}))
    for r in range(WORLD):
        assert res[r]["alternate"] == int(flag[loaded])
        assert switched[r]["switched"] == [int(flag[loaded])] * 3
        assert not [m for m in res[r]["log"] if "not used" in m], res[r]["log"]
        assert _same(_params(d, "resume_state_dict", r), _params(d, "full", r)), \
            f"rank {r}: parameters differ"
        assert _canon(d, "resume_state_dict", r) == _canon(d, "full", r), \
            f"rank {r}: tensor states differ"


# ---- in one process ------------------------------------------------------------------------------

class _Steps:
    """Calls of lowrank's hook on one synthetic bucket of a (64, 32) weight and a (32,) bias
    (one buffer: the parameters' identities, hence their ids, stay), new data at every call."""

    def __init__(self, state):
        from buckets import SyntheticBucket
        self.state, self.buf = state, torch.empty(64 * 32 + 32)
        self.bucket = SyntheticBucket(0, self.buf, [(64, 32), (32,)])

    def __call__(self, seed):
        """(the reduced buffer, the payload elements the call added)."""
        from lowrank.torch import powerSGD_hook
        before = self.state.stats().get("payloadElements", 0)
        self.buf.copy_(torch.randn(self.buf.numel(), generator=torch.Generator().manual_seed(seed)))
        out = powerSGD_hook(self.state, self.bucket).wait().clone()
        return out, self.state.stats()["payloadElements"] - before


def test_state_dict_option_and_old_state_dicts(world_of_one):
    """state_dict()["options"]["alternate"] is the state's; a state_dict without it (saved
    before the option existed) loads into either schedule, and so does an old pickle (its
    __setstate__ takes alternate=False); the loading state keeps its own alternate. A world of
    1: each compressed call's payload is one factor (64 k or 32 k, plus the 32 exact) with
    alternate=True, and a state saved alternating before a Q step goes on with that Q step
    when loaded into alternate=True (the phase is in lowrank's bytes)."""
    from lowrank.torch import PowerSGDState
    kw = dict(matrix_approximation_rank=2, start_powerSGD_iter=0, random_seed=3)
    P, Q, PQ = 64 * 2 + 32, 32 * 2 + 32, 64 * 2 + 32 * 2 + 32
    a = PowerSGDState(None, alternate=True, **kw)
    step = _Steps(a)
    assert [step(i)[1] for i in range(3)] == [P, Q, P]
    sd = a.state_dict()
    assert sd["options"]["alternate"] is True and "alternate" not in sd["config"]
    a.close()
    old = dict(sd, options={k: v for k, v in sd["options"].items() if k != "alternate"})
    for alternate, want in ((False, [PQ, PQ]), (True, [Q, P])):  # the saved phase: Q next
        b = PowerSGDState(None, alternate=alternate, **kw)
        b.load_state_dict(old)
        step = _Steps(b)
        got = [step(9 + i) for i in range(2)]
        assert [n for _, n in got] == want, alternate
        assert all(torch.isfinite(out).all() for out, _ in got)
        assert b.state_dict()["options"]["alternate"] is alternate
        b.close()
    for options, want in ((old["options"], False), (sd["options"], True)):
        s = PowerSGDState.__new__(PowerSGDState)  # as pickle.load does
        s.__setstate__(dict(sd, options=options))
        assert s.state_dict()["options"]["alternate"] is want
        assert s._config["alternate"] is want
        s.close()


def test_communicator_set_alternate():
    """Communicator.set_alternate (lowrankBufferSetAlternate) on one buffer of a communicator
    made without alternation: True makes that buffer's compressed calls send one factor each,
    P then Q (payload 64 k, then 32 k, with the 32 exact), False PowerSGD's two again, None the
    communicator's (False); the config's alternate is 0. Refused: "yes" (TypeError), 2
    (InvalidArgumentError), True on a communicator with warm_start off."""
    import lowrank
    uid = lowrank.get_unique_id()
    with lowrank.Communicator.init_rank(1, uid, 0, approx_rank=2, seed=1) as c:
        assert c.config()["alternate"] == 0
        buf = torch.empty(64 * 32 + 32)
        c.set_layout(buf, [(64, 32), (32,)])

        def payload(n):
            out = []
            for _ in range(n):
                before = c.stats()["payloadElements"]
                buf.normal_()
                c.allreduce(buf)
                out.append(c.stats()["payloadElements"] - before)
            return out
        assert payload(1) == [64 * 2 + 32 * 2 + 32]
        c.set_alternate(buf, True)
        assert payload(3) == [64 * 2 + 32, 32 * 2 + 32, 64 * 2 + 32]
        c.set_alternate(buf, False)
        assert payload(1) == [64 * 2 + 32 * 2 + 32]
        c.set_alternate(buf, 1)
        assert payload(1) == [64 * 2 + 32]  # the alternation restarts with a P step
        c.set_alternate(buf, None)
        assert payload(1) == [64 * 2 + 32 * 2 + 32]
        with pytest.raises(TypeError):
            c.set_alternate(buf, "yes")
        with pytest.raises(lowrank.InvalidArgumentError):
            c.set_alternate(buf, 2)
    with lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, warm_start=False) as c:
        with pytest.raises(lowrank.InvalidArgumentError) as e:
            c.set_alternate(torch.empty(8), True)
        assert "warmStart" in str(e.value)
    with pytest.raises(lowrank.InvalidArgumentError):  # the communicator's own config, too
        lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, alternate=True,
                                       warm_start=False)
    with lowrank.Communicator.init_rank(1, lowrank.get_unique_id(), 0, alternate=True) as c:
        assert c.config()["alternate"] == 1
