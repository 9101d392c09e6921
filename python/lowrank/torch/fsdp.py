"""PowerSGD for the replica all-reduce of FSDP2's hybrid sharding (HSDP), by lowrank.

    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["shard"])          # a 1-D shard mesh: FSDP all-reduces nothing
    fully_shard(model, mesh=mesh["shard"])
    state = PowerSGDState(mesh["replicate"].get_group(), matrix_approximation_rank=4,
                          start_powerSGD_iter=10)
    lowrank.torch.fsdp.register(model, state)          # the hook reduces over the replicas

With a 1-D shard mesh FSDP2 reduce-scatters each parameter group's gradients over the shard group
and hands the flat output (the group's parameter shards, concatenated, each padded to its dim-0
chunk) to the hook set by FSDPModule.set_all_reduce_hook, which reduces it in place. This hook
views each parameter's region as its shard's matrix and lets lowrank's communicator over the
replica group compress it per tensor (Communicator.set_tensors with ids from the parameter's name
and shard index, then allreduce): state follows the parameter, not FSDP's output buffer, which
FSDP allocates afresh at every backward. docs/pytorch.md, "FSDP2: hybrid sharding (HSDP)", has
the set-up, what is compressed and each error.

Needs FSDP2's all-reduce hook (torch.distributed.fsdp.FSDPModule.set_all_reduce_hook, torch >= 2.7;
tested with 2.15): importing this module on an older torch raises ImportError saying so.
"""
import collections
import hashlib
import logging
import math

import torch
import torch.distributed as dist

_NEED = ("lowrank.torch.fsdp needs FSDP2's all-reduce hook (torch.distributed.fsdp.FSDPModule."
         "set_all_reduce_hook, torch >= 2.7); this torch is " + torch.__version__)
try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard
except Exception as _e:  # noqa: BLE001 - torch 1.13: FSDP1 only, no public DTensor; Debian's
    # 1.13 on Python 3.11 even fails importing torch.distributed.fsdp (a dataclass ValueError)
    raise ImportError(f"{_NEED} (importing FSDP2 failed: {type(_e).__name__}: {_e})") from _e
if not hasattr(FSDPModule, "set_all_reduce_hook"):
    raise ImportError(_NEED)

from ..errors import LowrankError  # noqa: E402
from .process_group import (communicator_from_process_group, require_initialized,  # noqa: E402
                            with_global_ranks)
from .settings import CHECKED, check_settings, communicator_config, differences  # noqa: E402

logger = logging.getLogger("lowrank.torch")
__all__ = ["PowerSGDState", "register", "shard_layout", "tensor_id"]

# One parameter's region of a group's flat reduce-scatter output (shard_layout's rows): `rows`
# of its `chunk` rows are data (torch.chunk's rule), the rest is FSDP's zero padding.
Region = collections.namedtuple("Region", "fqn shape shard shards chunk rows rest dtype")


def tensor_id(fqn, shard, shards, part="data"):
    """The lowrank tensor id of a parameter's shard: the first 8 bytes (little-endian) of
    BLAKE2b-64 of "<fqn>|<shard>|<shards>|<part>" (part "data" or "padding"). The same on every
    replica (the replicas of a shard have the same shard index), stable across restarts."""
    key = f"{fqn}|{shard}|{shards}|{part}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def shard_layout(module, names=None):
    """The regions (Region) of `module`'s flat reduce-scatter output, in FSDP2's order: the
    parameters `module`'s fully_shard manages (its own and its submodules', not those of nested
    FSDPModules; modules in post-order as FSDP collects them, each parameter once), those that
    require a gradient, stably grouped by dtype. Each is a DTensor on a 1-D mesh placed Shard(0):
    shard i of `shards` holds rows [i c, min((i + 1) c, n)) of its n rows, c = ceil(n / shards),
    and its region is c rows (zero-padded past n). names: {id(param): fqn} (default: module's own
    named_parameters()). Call it while the parameters are sharded (not inside forward/backward).
    Raises ValueError naming the parameter and the torch version: not a DTensor, a mesh of other
    than 1 dimension (native HSDP's 2-D mesh all-reduces by itself), a placement other than
    Shard(0), a 0-dim parameter, a local shard whose rows are not torch.chunk's."""
    if names is None:
        names = {id(p): n for n, p in module.named_parameters()}
    regions, seen = [], set()
    for m in _managed_modules(module):
        for p in m.parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            regions.append(_region(names.get(id(p), f"<unnamed {tuple(p.shape)}>"), p))
    order = list(dict.fromkeys(r.dtype for r in regions))  # FSDP packs by grad dtype, stably
    return [r for d in order for r in regions if r.dtype == d]


def _managed_modules(root):
    """FSDP2's _get_managed_modules: post-order DFS that does not enter nested FSDPModules."""
    out, seen = [], set()

    def dfs(m):
        if m is not root and isinstance(m, FSDPModule):
            return
        seen.add(m)
        for c in m.children():
            if c not in seen:
                dfs(c)
        out.append(m)
    dfs(root)
    return out


def _unmappable(fqn, what):
    return ValueError(f"lowrank.torch.fsdp: parameter {fqn!r}: {what}; this hook maps only "
                      "DTensors placed Shard(0) on a 1-D shard mesh (torch " + torch.__version__
                      + ")")


def _region(fqn, p):
    if not isinstance(p, DTensor):
        raise _unmappable(fqn, f"is a {type(p).__name__}, not a DTensor (not sharded by "
                               "fully_shard, or called inside forward/backward)")
    mesh, placements = p.device_mesh, tuple(p.placements)
    if mesh.ndim != 1:
        raise _unmappable(fqn, f"its mesh has {mesh.ndim} dimensions ({placements}): native HSDP "
                               "all-reduces over the replicate dimension itself; shard over a "
                               "1-D mesh and give the replica group to PowerSGDState")
    pl = placements[0]
    if type(pl) is not Shard or pl.dim != 0:  # _StridedShard and the like are subclasses
        raise _unmappable(fqn, f"placement {pl!r} (FSDP's shard_placement_fn?)")
    if p.dim() == 0:
        raise _unmappable(fqn, "a 0-dim parameter")
    shards, shard = mesh.size(), mesh.get_local_rank()
    n = p.shape[0]
    chunk = -(-n // shards)
    rows = max(0, min(chunk, n - shard * chunk))
    local = p.to_local()
    if local.numel() and (local.shape[0], *local.shape[1:]) != (rows, *p.shape[1:]):
        raise _unmappable(fqn, f"local shard {tuple(local.shape)} of {tuple(p.shape)} at shard "
                               f"{shard} of {shards}, torch.chunk's rule gives {rows} rows")
    return Region(fqn, tuple(p.shape), shard, shards, chunk, rows, math.prod(p.shape[1:]), p.dtype)


def _declaration(regions):
    """lowrank's tensors for the flat output: per region its data (rows, *rest) (>= 2 dims: the
    communicator's rank, compressed if it passes the rate test; 1-D exact) and its padding (1-D,
    exact), each with its own id; zero-size parts are left out (they take no room)."""
    decl = []
    for r in regions:
        if r.rows:
            shape = (r.rows, *r.shape[1:])
            if len(shape) > 8:  # lowrank's limit: the same matrix view (rows, rest)
                shape = (r.rows, r.rest)
            decl.append((tensor_id(r.fqn, r.shard, r.shards), shape))
        if (r.chunk - r.rows) * r.rest:
            decl.append((tensor_id(r.fqn, r.shard, r.shards, "padding"),
                         ((r.chunk - r.rows) * r.rest,), 0))
    return decl


class _Unit:
    """One FSDPModule as the hook sees it: its regions, the declaration, its output's size, the
    address its output had at the last call."""

    def __init__(self, name, module, regions, names):
        from ..comm import tensor_array
        self.name, self.module, self.regions, self.names = name, module, regions, names
        self.decl = _declaration(regions)
        self.array = tensor_array(self.decl) if self.decl else None
        self.numel = sum(r.chunk * r.rest for r in regions)
        self.ptr = None
        self.calls = 0


class PowerSGDState:
    """The state of lowrank's PowerSGD all-reduce hook for one FSDP2 model under HSDP: a lowrank
    communicator over the replica group and the layout of each FSDPModule's output. Construct it
    on every rank at the same point (a collective over replicate_group), after fully_shard.

    Args (PyTorch's DDP PowerSGDState's names and defaults; lowrank.torch.PowerSGDState says more):
      replicate_group: the torch.distributed group of the ranks that hold the same shard (the
        replicate dimension of the mesh, e.g. mesh["replicate"].get_group()).
      matrix_approximation_rank (1): k; 0: no compression (exact average by lowrank).
      start_powerSGD_iter (1000): each parameter shard is reduced exactly for its first so many
        hook calls (lowrank's per-id warm-up), then compressed. One call per optimizer step with
        set_requires_gradient_sync(False) on accumulation steps; else one per micro-batch.
      min_compression_rate (2), use_error_feedback (True), warm_start (True),
      orthogonalization_epsilon (0), random_seed (0): as the DDP hook's.
    Keywords: timeout (seconds a wait for a peer may last, LOWRANK_TIMEOUT, default 300), pipeline,
      alternate (False; True: alternating PowerSGD, ACP-SGD of Zhang, Zhang, Shi, Chu, Li, ICDCS
      2023: one factor allreduce per hook call, P and Q on alternate calls, P first; needs
      warm_start=True; CPU and CUDA buckets (CUDA tested on the emulation only); as the DDP hook's alternate, where it is described),
      factor_dtype ("fp32"; "bf16" or "fp16": 16-bit factors on the wire, half the factor bytes of
      every compressed call, the host transport summing in float32 (tested on CPU buckets);
      torch.bfloat16 and the like too; None: LOWRANK_FACTOR_DTYPE's; the same on every replica,
      else every replica raises lowrankInvalidUsage at the first compressed call; not saved by
      state_dict; as the DDP hook's factor_dtype, where it is described),
      device ("cpu" or "cuda"; default "cuda" for an NCCL group), op (None: FSDP's convention, see
      below; or "avg" / "sum").
    The op: with a 1-D mesh FSDP2 averages over the shard group in its reduce-scatter (fp32, bf16)
    or divides by its pre- and post-factors, which together make the shard count (fp16, and any
    dtype with set_force_sum_reduction_for_comms), so the hook averages over the replicas: the
    result is the mean over every rank, as native HSDP's. Where set_gradient_divide_factor(f) was
    called, native HSDP divides by f alone and sums over the replicas: op None sums then too
    (read from FSDP's param group at each call; "avg" if that attribute is absent).
    Raises ValueError or TypeError for a setting outside lowrank's range (as the DDP hook's, each
    named; alternate=True with warm_start=False; a factor_dtype not among those above),
    LowrankError (torch.distributed not initialized; lowrank's init errors).
    Thread safety: the hook runs on the autograd thread (CPU: it blocks there until the
    allreduce is done; CUDA: it only queues on the current stream, FSDP's all-reduce stream)."""

    def __init__(self, replicate_group, matrix_approximation_rank=1, start_powerSGD_iter=1_000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0, *, timeout=None, pipeline=None,
                 alternate=False, factor_dtype="fp32", device=None, op=None):
        settings = {k: v for k, v in locals().items()
                    if k in CHECKED + ("timeout", "pipeline", "alternate", "factor_dtype")}
        check_settings(settings)  # each as the DDP hook's
        if op not in (None, "avg", "sum"):
            raise ValueError(f"op must be None, 'avg' or 'sum', not {op!r}")
        require_initialized()
        self.process_group, self.op = replicate_group, op
        for k in CHECKED:
            setattr(self, k, settings[k])
        if device is None:
            device = "cuda" if str(dist.get_backend(replicate_group)).lower() == "nccl" else "cpu"
        self.device = device
        self._comm = communicator_from_process_group(replicate_group, device,
                                                     **communicator_config(settings))
        self._global_ranks = dist.get_process_group_ranks(replicate_group)  # by comm rank
        self._units = []   # _Unit per registered FSDPModule
        self._closed = False

    # ---- queries ---------------------------------------------------------------------------------
    def communicator(self):
        """The lowrank.Communicator over the replica group."""
        return self._comm

    def stats(self):
        """lowrank's counters (lowrankGetStats): calls, compressedCalls, ratio, stateBytes, ..."""
        return self._comm.stats()

    def layouts(self):
        """{FSDPModule's name in the model: its Regions, in flat-output order}."""
        return {u.name: list(u.regions) for u in self._units}

    def close(self):
        """Destroy the communicator (not collective); the hook refuses a closed state."""
        if not self._closed:
            self._closed = True
            self._comm.destroy()

    # ---- the hook --------------------------------------------------------------------------------
    def _reduce(self, unit, flat):
        """The all-reduce hook of one FSDPModule: `flat` (1-D, contiguous, FSDP's reduce dtype)
        averaged (or summed, see the class's op) over the replica group in place."""
        if self._closed:
            raise LowrankError(5, "this lowrank.torch.fsdp.PowerSGDState was closed: make a new "
                                  "one", "fsdp all-reduce hook")
        if flat.dim() != 1 or flat.numel() != unit.numel:
            raise RuntimeError(
                f"lowrank.torch.fsdp: FSDPModule {unit.name or '<root>'!r} handed the hook "
                f"{tuple(flat.shape)} elements, its parameters' shards make {unit.numel} "
                f"({len(unit.regions)} parameters, padded to their dim-0 chunks): some parameter "
                "got no gradient this step (FSDP leaves it out: call "
                "set_reduce_scatter_unused_params(True)), a parameter's requires_grad changed "
                "since register() (make a new state and register it), or this torch "
                f"({torch.__version__}) lays the output out otherwise than the hook expects")
        if unit.array is None:
            return
        if unit.calls == 0:  # FSDP's packing order is known (lazy init) by now: check it again
            _check_against_fsdp(unit.name, unit.module, unit.regions, unit.names)
        if flat.is_cuda != (self.device == "cuda"):
            raise RuntimeError(f"lowrank.torch.fsdp: FSDPModule {unit.name or '<root>'!r}'s "
                               f"output is on {flat.device}, this state's communicator is for "
                               f"{self.device} (PowerSGDState's device=)")
        unit.calls += 1
        op = self.op or _fsdp_op(unit.module)
        comm, ptr = self._comm, flat.data_ptr()
        try:
            comm.set_tensors(flat, unit.array)
            if flat.is_cuda:
                # queued on the current stream (FSDP runs the hook on its all-reduce stream);
                # returns once queued
                comm.allreduce(flat, op=op, stream=torch.cuda.current_stream(flat.device))
            else:
                comm.allreduce(flat, op=op)
        except LowrankError as e:  # lowrank's "comm rank N" is the rank in the replica group
            raise with_global_ranks(e, self._global_ranks, "replica group") from None
        old, unit.ptr = unit.ptr, ptr
        if old is not None and old != ptr and not flat.is_cuda and \
                all(u.ptr != old for u in self._units):
            # its ids went to this output: forget the old address, unless another group's output
            # has it now. CUDA: lowrankBufferRelease would make the host wait for the old
            # buffer's queued work, so the communicator keeps its small record (the caching
            # allocator hands out few addresses) until close()
            comm.release(old)

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self):
        """This rank's hook state, to save beside FSDP's sharded state dict (every rank its own
        file: the residuals differ across replicas). Plain Python types:
          "format": "lowrank.torch.fsdp.PowerSGDState", "version": 1;
          "config": the settings load_state_dict checks (as the DDP hook's; not alternate nor
            factor_dtype, which are not saved: a state saved under either schedule, or with any
            factor dtype, loads under the other, as the DDP hook's);
          "replica", "replicas": this rank in the replica group and its size;
          "params": {parameter FQN: {"shard", "shards", "id", "shape" (as declared), "state":
            bytes of Communicator.save_state (format 2: that id's residual, warm-start Q and
            call count) or None (nothing held: never called, or an exact-only shard)}}.
        Local, not collective. Call it between steps."""
        self._check_open()
        params = {}
        for unit in self._units:
            for (tid, shape, *_), r in zip(_data_parts(unit), _data_regions(unit)):
                params[r.fqn] = {"shard": r.shard, "shards": r.shards, "id": tid,
                                 "shape": tuple(shape), "state": self._save_id(tid, shape)}
        return {"format": _FORMAT, "version": 1,
                "config": {k: getattr(self, k) for k in CHECKED},
                "replica": dist.get_rank(self.process_group),
                "replicas": dist.get_world_size(self.process_group), "params": params}

    def load_state_dict(self, sd):
        """Stage this rank's saved state (state_dict()) in lowrank: each parameter shard's state
        is installed at its next hook call. Call it on every rank after register() and before
        the next step. Raises ValueError: not such a state_dict, other settings (each named),
        another replica's or replica count's file, a parameter saved with another shard index,
        shard count or shape (another mesh). Saved parameters this model lacks are ignored with a
        WARNING; a parameter with nothing saved starts afresh. At the first call, every rank
        raises lowrankInvalidUsage if the replicas' restored states disagree."""
        self._check_open()
        if not isinstance(sd, dict) or sd.get("format") != _FORMAT or sd.get("version") != 1 or \
                not isinstance(sd.get("config"), dict) or not isinstance(sd.get("params"), dict) \
                or not all(isinstance(sd.get(k), int) for k in ("replica", "replicas")):
            raise ValueError("lowrank.torch.fsdp.PowerSGDState.load_state_dict: not a "
                             "state_dict() of this class (version 1: format, version, config, "
                             "replica, replicas, params)")
        if not self._units:
            raise ValueError("lowrank.torch.fsdp.PowerSGDState.load_state_dict: no model is "
                             "registered on this state yet: call register(model, state) first "
                             "(the saved parameters are matched to the model's by name)")
        diffs = differences(sd["config"], self)
        if diffs:
            raise ValueError("lowrank.torch.fsdp.PowerSGDState.load_state_dict: saved with other "
                             "settings: " + "; ".join(diffs))
        here = (dist.get_rank(self.process_group), dist.get_world_size(self.process_group))
        if (sd["replica"], sd["replicas"]) != here:
            raise ValueError(f"lowrank.torch.fsdp.PowerSGDState.load_state_dict: the state of "
                             f"replica {sd['replica']} of {sd['replicas']}, loaded on replica "
                             f"{here[0]} of {here[1]}: every rank loads the file it saved")
        mine = {r.fqn: (tid, tuple(shape), r) for unit in self._units
                for (tid, shape, *_), r in zip(_data_parts(unit), _data_regions(unit))}
        staged = []
        for fqn, e in sd["params"].items():
            if fqn not in mine:
                logger.warning("lowrank.torch.fsdp: saved parameter %r is not in the model: "
                               "ignored", fqn)
                continue
            tid, shape, r = mine[fqn]
            saved = (e["shard"], e["shards"], e["id"], tuple(e["shape"]))
            if saved != (r.shard, r.shards, tid, shape):
                raise ValueError(f"lowrank.torch.fsdp.PowerSGDState.load_state_dict: {fqn!r} was "
                                 f"saved as shard {saved[0]} of {saved[1]}, shape {saved[3]}; "
                                 f"here shard {r.shard} of {r.shards}, shape {shape}")
            if e["state"] is not None:
                staged.append((tid, shape, bytes(e["state"])))
        for tid, shape, data in staged:
            scratch = self._scratch()
            self._comm.set_tensors(scratch, [(tid, shape)])
            self._comm.restore_state(scratch, data)  # staged per id, communicator-wide
            self._comm.release(scratch)  # the staged restore stays (lowrankBufferRelease)

    def _scratch(self):
        """A tensor to declare one id on, never allreduced, at an address no group's output had
        at its last call: declaring there would take that group's ids off it, and the release
        after would drop them (lowrankBufferRelease of their last buffer)."""
        held, keep = {u.ptr for u in self._units}, []
        while True:
            t = torch.empty(1)
            if t.data_ptr() not in held:
                return t
            keep.append(t)  # held until a free address comes

    def _save_id(self, tid, shape):
        scratch = self._scratch()
        self._comm.set_tensors(scratch, [(tid, shape)])
        try:
            return self._comm.save_state(scratch)
        except LowrankError as e:
            if e.code == 5:  # the id holds nothing (never called, or exact only)
                return None
            raise
        finally:
            self._comm.release(scratch)

    def _check_open(self):
        if self._closed:
            raise LowrankError(5, "this lowrank.torch.fsdp.PowerSGDState was closed", "fsdp")


_FORMAT = "lowrank.torch.fsdp.PowerSGDState"


def _data_regions(unit):
    return [r for r in unit.regions if r.rows]


def _data_parts(unit):
    return [d for d in unit.decl if len(d) == 2]  # padding entries carry approx_rank 0


def _fsdp_op(module):
    """'sum' where FSDP's param group has a gradient divide factor (native HSDP then sums over
    the replicas), else 'avg'. Reads FSDP2's private state; 'avg' where it is not there."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
    except AttributeError:
        return "avg"
    if any(getattr(g, "gradient_divide_factor", None) is not None for g in groups):
        return "sum"
    return "avg"


def register(model, state):
    """Set lowrank's all-reduce hook on every FSDPModule of `model` (model itself included),
    each with the layout of its flat output (shard_layout), checked against FSDP's own list of
    parameters where that private list is readable. Call it on every rank after fully_shard,
    before the first forward, once per state: a state serves one model (its tensor ids come from
    parameter names, which another model would share). Every FSDPModule is checked before any
    hook is set, so a refusal changes nothing.
    Returns the list of (FSDPModule, hook) set. Raises ValueError (an unmappable parameter,
    named; no FSDPModule in model; a trainable parameter outside every FSDPModule, whose gradient
    nobody would reduce across replicas; a layout that disagrees with FSDP's; a state that
    serves a model already)."""
    state._check_open()
    if state._units:
        raise ValueError("lowrank.torch.fsdp.register: this state serves a model already (its "
                         "tensor ids come from parameter names, which another model, or the "
                         "same one registered twice, would share): make a PowerSGDState per model")
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), n)
    units = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            regions = shard_layout(m, names)
            _check_against_fsdp(name, m, regions, names)
            units.append(_Unit(name, m, regions, names))
    if not units:
        raise ValueError("lowrank.torch.fsdp.register: the model has no FSDPModule (apply "
                         "fully_shard first)")
    covered = {r.fqn for u in units for r in u.regions}
    outside = [n for n, p in model.named_parameters() if p.requires_grad and n not in covered]
    if outside:
        raise ValueError("lowrank.torch.fsdp.register: trainable parameters outside every "
                         f"FSDPModule of the model ({', '.join(outside[:5])}"
                         f"{', ...' if len(outside) > 5 else ''}): their gradients would not be "
                         "reduced across replicas; apply fully_shard to the model's root (last) "
                         "and register the root")
    set_ = []
    for unit in units:
        state._units.append(unit)

        def hook(flat, _unit=unit):
            state._reduce(_unit, flat)
        unit.module.set_all_reduce_hook(hook)
        set_.append((unit.module, hook))
    return set_


def _check_against_fsdp(name, module, regions, names):
    """FSDP2's own order of a group's parameters (private: _fsdp_param_groups[i].fsdp_params
    and _reduce_scatter_param_indices), where readable, must be the layout's."""
    try:
        groups = module._get_fsdp_state()._fsdp_param_groups
        theirs = []
        for g in groups:
            params = [fp.sharded_param for fp in g.fsdp_params]
            order = getattr(g, "_reduce_scatter_param_indices", None) or range(len(params))
            theirs += [names.get(id(params[i])) for i in order if params[i].requires_grad]
    except AttributeError:
        return
    if len(groups) > 1:
        raise ValueError(f"lowrank.torch.fsdp: FSDPModule {name!r} has {len(groups)} parameter "
                         "groups: one per module is what set_all_reduce_hook supports")
    ours = [r.fqn for r in regions]
    if theirs != ours and len(set(theirs)) == len(theirs):
        raise ValueError(f"lowrank.torch.fsdp: FSDPModule {name!r}: the hook's layout "
                         f"{ours} differs from FSDP's order {theirs} (torch {torch.__version__})")
