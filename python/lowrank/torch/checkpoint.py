"""PowerSGDState's checkpoint (Checkpoint, a mixin of hook.py's PowerSGDState): state_dict (version
2; version 1, before tensor ids, converted by lowrankStateAddCalls), loading, pickling, staging."""
import collections
import functools
import logging

import torch
import torch.distributed as dist

from ..comm import state_add_calls, tensor_array
from ..errors import InvalidArgumentError, LowrankError
from .adaptive import AdaptiveRank
from .execution import device_kind
from .numbering import declared_shape, numbering_message
from .settings import CHECKED, OPTION_DEFAULTS, OPTIONS, check_settings, differences

logger = logging.getLogger("lowrank.torch")
FORMAT, VERSION = "lowrank.torch.PowerSGDState", 2
# A saved bucket of a state_dict: device None for version 1 (saved before devices were recorded).
Saved = collections.namedtuple("Saved", "params shapes state device array")


class Checkpoint:
    """state_dict, load_state_dict, pickling; the loaded states' staging (_take_restores)."""

    def state_dict(self):
        """This rank's state of the hook, to save with the model and the optimizer (every rank
        its own: the residuals differ from rank to rank). A dict of plain Python types, bytes
        included (torch.load with weights_only=True, torch's default since 2.6, takes it; tested
        with torch 2.11; torch 1.13's weights_only refuses bytes: load with its default):
          "format": "lowrank.torch.PowerSGDState", "version": 2;
          "config": the settings load_state_dict checks: matrix_approximation_rank,
            start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start,
            orthogonalization_epsilon, random_seed;
          "options": the others, not checked: compression_stats_logging_frequency,
            batch_tensors_with_same_shape, timeout, pipeline, alternate (lowrank carries each
            tensor's residual and warm-start Q across a change of schedule: a state saved with
            alternate=False loads into alternate=True, whose alternation starts with a P step,
            and vice versa; saved and loaded alternating, each tensor goes on at its saved phase,
            which lowrank's bytes hold with the kept P. A state_dict saved before alternate
            existed has none and loads, as alternate=False when unpickled; load_state_dict never
            changes the loading state's own alternate), factor_dtype ("fp32", "bf16", "fp16" or
            None: the state lowrank saves is float32 whatever the factors travel in, so a state
            saved with one loads with another; one saved before the option loads as "fp32" when
            unpickled, and load_state_dict keeps the loading state's own);
          "iter", "next_stats_report": the step counters (ints);
          "rank", "world_size": this rank in process_group and the group's size (None if
            torch.distributed is not initialized);
          "buckets": a list, one dict per bucket of the last step: "params" (the ids of its
            parameters, a tuple of ints, below), "shapes" (a tuple of their shapes as declared
            to lowrank, each a tuple of ints), "device" ("cpu" or "cuda"), "bucket" (DDP's index
            of the bucket when saved, for reading only) and "state" (bytes of
            lowrank.Communicator.save_state, format 2: per id, its residual, warm-start Q and
            call count, warm-up included, with a CRC);
          "adaptive": None, or the adaptive rank's memory: "ks" ({id: k} of its last decisions),
            "norms" ({id: the gradient norm last measured}), "sums" ({id: the current window's
            sum of its averaged gradient so far, float32 bytes}) and "pending" ({step: {id:
            [3 floats]}}: this rank's numbers measured at a step whose decision is still to
            come), so that a restart decides as the run that did not stop would.
        The ids: every parameter is numbered in the order DDP first hands it to the hook in the
        process (DDP's first step): the model's order without find_unused_parameters (or with
        static_graph), whatever bucket_cap_mb, so each parameter's state finds it after a restart
        in whatever bucket DDP puts it; with find_unused_parameters (and no static_graph), restart
        with the same bucket_cap_mb (another numbering is refused where the shapes tell).
        A state loaded and not yet used by a step returns the loaded buckets as they came.
        Waits for the work queued so far. Local, not collective.
        Raises LowrankError (a closed state). After a step that failed (backward raised), it
        still returns what lowrank holds, but the step count includes the failed step: save
        from the last step that succeeded instead.
        Thread safety: call it between steps (after optimizer.step()), on the training thread."""
        self._check_open("state_dict")
        for worker in self._workers.values():
            worker.drain()
        if self._loaded is not None:
            version, buckets = self._loaded
        else:
            version, buckets = VERSION, []
            for index, b in sorted(self._buckets.items()):
                comm = self._comms[b.device]
                try:
                    data = comm.save_state(b.ptr)
                except LowrankError as e:  # none where the buffer was never called compressibly
                    if e.code != 5 or comm.view(b.ptr)["planned"]:
                        raise
                    continue
                buckets.append({"params": b.ids, "shapes": b.shapes, "bucket": index,
                                "device": device_kind(b.device), "state": data})
        rank = world = None
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        return {"format": FORMAT, "version": version,
                "config": {k: getattr(self, k) for k in CHECKED},
                "options": dict(zip(OPTIONS, (self.compression_stats_logging_frequency,
                                              self.batch_tensors_with_same_shape, self._timeout,
                                              self._pipeline, self._alternate,
                                              self._factor_dtype))),
                "iter": self.iter, "next_stats_report": self.next_stats_report,
                "rank": rank, "world_size": world, "buckets": list(buckets),
                "adaptive": None if self._adaptive is None else
                {"ks": dict(self._adaptive_k), **self._adaptive.state_dict(),
                 "sums": {n: a.detach().float().cpu().contiguous().numpy().tobytes()
                          for n, a in self._window_sums.items()},
                 "pending": {m: {n: list(v) for n, v in got.items()}
                             for m, got in self._signals.items()}}}

    def load_state_dict(self, state_dict):
        """Take the state_dict() this rank saved (version 2, or version 1 of lowrank before tensor
        ids): the step counters now; each saved tensor's state is staged in lowrank at the next
        step (on the hook's thread, before its first allreduce: restore_state into scratch
        buffers declared with the saved ids, which turns version 1's per-bucket bytes into
        per-id states too), and installed by whichever bucket holds that parameter, in any
        bucketing (another bucket_cap_mb, DDP's first step after a restart). Call it on every
        rank, each with its own file, before the first step with this state; not collective.
        What this state held is dropped; a parameter with nothing saved starts afresh; saved
        states that no bucket takes in the first step are logged (WARNING, logger
        "lowrank.torch") and dropped. A tensor's state is checked across ranks at its first
        call: a rank that restored it while another did not, or states of different steps, make
        every rank's backward raise lowrankInvalidUsage.
        Raises ValueError: not a state_dict of this class or version, a malformed entry (its
        structure: the bytes themselves are checked by lowrank when staged, at the next step,
        where corrupt bytes raise on every rank), a setting that differs from this state's (each
        named, with both values), another rank's or another world size's state, saved ids whose
        shapes are not those of the parameters this state numbered so; nothing is changed then.
        LowrankError: a closed state; at the next step (every rank), a parameter numbered with a
        saved id of another shape (DDP's first step handed the parameters in another order than
        the run that saved: find_unused_parameters with another bucket_cap_mb, another model).
        Thread safety: call it between steps, on the training thread."""
        self._load(state_dict, check_rank=True)

    def _load(self, state_dict, check_rank):
        self._check_open("load_state_dict")
        entries = check_state_dict(state_dict)
        adaptive_ks = None  # checked here, before anything changes
        if self._adaptive is not None and state_dict.get("adaptive"):
            saved = state_dict["adaptive"]
            try:
                AdaptiveRank().load_state_dict(saved)
                adaptive_ks = {int(n): int(k) for n, k in saved.get("ks", {}).items()}
                sums = {int(n): torch.frombuffer(bytearray(b), dtype=torch.float32).clone()
                        for n, b in saved.get("sums", {}).items()}
                pending = {int(m): {int(n): tuple(float(x) for x in v) for n, v in got.items()}
                           for m, got in saved.get("pending", {}).items()}
                if any(len(v) != 3 for got in pending.values() for v in got.values()):
                    raise ValueError("pending")
            except (ValueError, TypeError, AttributeError):
                raise ValueError("PowerSGDState.load_state_dict: a malformed \"adaptive\" "
                                 "entry") from None
        diffs = differences(state_dict["config"], self)
        if diffs:
            raise ValueError("PowerSGDState.load_state_dict: the state was saved with other "
                             "settings: " + "; ".join(diffs))
        if check_rank and dist.is_available() and dist.is_initialized():
            here = (dist.get_rank(self.process_group), dist.get_world_size(self.process_group))
            saved = (state_dict["rank"], state_dict["world_size"])
            if saved[0] is not None and saved[1] != here[1]:
                raise ValueError(f"PowerSGDState.load_state_dict: the state was saved by a world "
                                 f"of {saved[1]} ranks, this one has {here[1]}: residuals cannot "
                                 "be split or merged; start the hook afresh (load the model and "
                                 "the optimizer only, and set state.iter)")
            if saved[0] is not None and saved != here:
                raise ValueError(f"PowerSGDState.load_state_dict: the state of rank {saved[0]} of "
                                 f"{saved[1]}, loaded on rank {here[0]} of {here[1]}: every rank "
                                 "loads the state it saved")
        expect = {i: s for e in entries for i, s in zip(e.params, e.shapes)}
        clash = sorted((n, ident[3]) for ident, n in self._param_pos.items()
                       if n in expect and expect[n] != declared_shape(ident[3]))
        if clash:
            raise ValueError("PowerSGDState.load_state_dict: " + numbering_message(
                [(n, shape, expect[n]) for n, shape in clash]))
        for worker in self._workers.values():
            worker.drain()
        held = {(b.device, b.ptr) for b in (*self._buckets.values(), *self._step.values())}
        held |= {(dev, t.data_ptr()) for dev, t in self._scratch}
        for dev, ptr in held:
            self._comms[dev].release(ptr)  # the old states go (ids and staged restores alike)
        self._buckets, self._step, self._scratch = {}, {}, []
        self._restores = [e for e in entries if e.state is not None]
        self._loaded = (state_dict["version"], list(state_dict["buckets"]))
        self._expect, self._unclaimed = expect, set(expect)
        self.iter = int(state_dict["iter"])
        self.next_stats_report = int(state_dict["next_stats_report"])
        # what the steps before the load had measured and summed is not the loaded run's
        self._window_sums, self._signals, self._measure = {}, {}, {}
        if self._adaptive is not None:
            self._adaptive.last = None
        if adaptive_ks is not None:  # the rule goes on where it was
            self._adaptive.load_state_dict(state_dict["adaptive"])
            self._adaptive_k, self._rank_by_id = adaptive_ks, None
            self._window_sums, self._signals = sums, pending
        logger.info("lowrank: loaded the state of %d tensors (%d saved buckets, version %d), "
                    "staged at the next step for whichever bucket holds them", len(expect),
                    len(self._restores), state_dict["version"])

    def __getstate__(self):
        """What pickle saves: everything but the process group, as PyTorch's PowerSGDState (the
        dict of state_dict()); lowrank's communicators and threads are not saved either."""
        logger.warning("NOTE: Process group is not serializable and excluded from a saved state. "
                       "lowrank's communicators are not saved either: the first step after "
                       "loading makes them again.")
        return self.state_dict()

    def __setstate__(self, state):
        """The unpickled state: process_group None (the default group; set
        `state.process_group` before the first step for another), no communicator until the
        first step makes it (collective over the group, on every rank at that step), the saved
        tensors staged as by load_state_dict."""
        check_state_dict(state)
        logger.warning("NOTE: Process group will be set to a default group (i.e. the world size). "
                       "If a different group is desired, please set `self.process_group` after "
                       "PowerSGD state is loaded.")
        settings = {**OPTION_DEFAULTS, **state["config"], **state["options"]}
        check_settings(settings)
        self._set_settings(None, settings)
        self._load(state, check_rank=False)  # the group it was saved on is not known

    def _take_restores(self, device):
        """Actions for the next job on `device`: stage the loaded states meant for it (format 2:
        saved there; format 1: any device) in lowrank, each through a scratch buffer of its own
        declared with the saved ids (restore_state; a failure goes to the `errors` list each
        action takes)."""
        mine = [e for e in self._restores if e.device in (None, device_kind(device))]
        if not mine:
            return []
        self._restores = [e for e in self._restores if e not in mine]
        comm, actions = self._comms[device], []
        for e in mine:
            scratch = torch.empty(1)  # an address of its own, never allreduced
            self._scratch.append((device, scratch))
            actions.append(functools.partial(stage, comm, scratch, e))
        return actions


def check_state_dict(sd):
    """The saved buckets (Saved) of a state_dict(); ValueError if it is not one."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT:
        raise ValueError("PowerSGDState.load_state_dict: not a state_dict() of "
                         "lowrank.torch.PowerSGDState")
    if sd.get("version") not in (1, VERSION):
        raise ValueError(f"PowerSGDState.load_state_dict: format version {sd.get('version')!r}, "
                         f"this lowrank reads versions 1 and {VERSION}")
    missing = [k for k in ("config", "options", "iter", "next_stats_report", "rank",
                           "world_size", "buckets") if k not in sd]
    missing += [f"config.{k}" for k in CHECKED if k not in sd.get("config", {})]
    missing += [f"options.{k}" for k in OPTIONS
                if k not in sd.get("options", {}) and k not in OPTION_DEFAULTS]
    if missing:
        raise ValueError(f"PowerSGDState.load_state_dict: missing {', '.join(missing)}")
    bad = [k for k in ("iter", "next_stats_report")
           if not isinstance(sd[k], int) or isinstance(sd[k], bool) or sd[k] < 0]
    bad += [] if isinstance(sd["buckets"], (list, tuple)) else ["buckets"]
    if bad:  # checked here, before load_state_dict changes anything
        raise ValueError("PowerSGDState.load_state_dict: malformed "
                         + ", ".join(f"{k} ({sd[k]!r})" for k in bad))
    entries, ids = [], set()
    for n, b in enumerate(sd["buckets"]):
        try:
            params = tuple(int(p) for p in b["params"])
            shapes = tuple(tuple(int(d) for d in s) for s in b["shapes"])
            state = b["state"]  # None: nothing saved (version 1's warm-up checkpoints)
            device = b["device"] if sd["version"] >= 2 else None
            ok = (state is None or isinstance(state, (bytes, bytearray))) and \
                len(params) == len(shapes) > 0 and device in (None, "cpu", "cuda") and \
                not ids & set(params)
            array = tensor_array(zip(params, shapes)) if ok else None
        except (TypeError, ValueError, KeyError, InvalidArgumentError):
            ok = False
        if not ok:
            raise ValueError(f"PowerSGDState.load_state_dict: buckets[{n}] is not a saved bucket "
                             "(params, shapes, state bytes; each id once)")
        ids |= set(params)
        if state is not None:
            state = bytes(state)
            if sd["version"] == 1 and sd["config"]["start_powerSGD_iter"]:
                try:  # that hook warmed up without lowrank: its bytes count the calls since
                    state = state_add_calls(state, int(sd["config"]["start_powerSGD_iter"]))
                except InvalidArgumentError:  # not whole format-1 bytes: the restore refuses
                    pass                      # them at the next step, on every rank
        entries.append(Saved(params, shapes, state, device, array))
    return entries


def stage(comm, scratch, saved, errors):
    """Stage a saved bucket's states in lowrank (on the worker): the scratch buffer declared with
    its ids, then restore_state (format 2: each id's state; format 1: converted into them)."""
    try:
        comm.set_tensors(scratch, saved.array)
        comm.restore_state(scratch, saved.state)
    except LowrankError as e:  # the allreduce still runs: the other ranks' check fails too
        errors.append(e)


