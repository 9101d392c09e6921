"""Per-parameter treatment for PowerSGDState: `exclude` and `rank_of` turned into each
parameter's approximation rank as lowrank's declaration takes it (lowrankTensor_t.approxRank:
-1 the communicator's k, 0 exact, or a rank of its own).

DDP's hook sees parameters, not names: names are resolved once, against the `model` given, to the
parameter objects, and those to the hook's identity of a parameter (device, address, shape) at
the first step after, so that a model moved to its device after the state was made still
matches. Not thread-safe: used by one PowerSGDState, between steps and on the hook's thread.
"""
import torch

from .._capi import MAX_TENSOR_RANK, RANK_DEFAULT, RANK_EXACT


def identity(p):
    """The hook's key of a parameter: (device type, device index, address, shape)."""
    return (p.device.type, p.device.index, p.data_ptr(), tuple(p.shape))


class TensorRanks:
    """The settings exclude / rank_of / model of PowerSGDState (see its docstring), checked.

    Raises ValueError: a name without a model, a name the model does not have, a rank out of
    [0, 65536], an entry that is neither a parameter nor a name; TypeError: a model that is not
    a torch.nn.Module."""

    def __init__(self, exclude=None, rank_of=None, model=None):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (the model or its DDP wrapper), not "
                            f"{type(model).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module  # the names a user knows: without DDP's "module."
        self.model = model
        self._named = _named_parameters(model) if model is not None else []
        self._by_name = dict(self._named)
        self._rules = []  # (parameter, approxRank), later entries winning
        self.empty = exclude is None and rank_of is None
        for p, k in self._entries(rank_of, "rank_of"):
            self._rules.append((p, _check_rank(k, p, self._name_of)))
        for p, drop in self._entries(exclude, "exclude"):
            if drop:
                self._rules.append((p, RANK_EXACT))  # exclude wins over rank_of

    def resolve(self):
        """{identity: approxRank} of the parameters named, as they are now (the hook's first
        step after these settings); each parameter's last rule wins."""
        return {identity(p): k for p, k in self._rules}

    def names(self):
        """{identity: name} of the model's parameters (empty without a model)."""
        return {identity(p): name for name, p in self._named}

    # ---- internals ------------------------------------------------------------------------------
    def _name_of(self, p):
        for name, q in self._named:
            if q is p:
                return name
        return f"a parameter of shape {tuple(p.shape)}"

    def _entries(self, spec, what):
        """(parameter, value) pairs of exclude (value: True) or rank_of (value: its rank)."""
        if spec is None:
            return []
        if callable(spec) and not isinstance(spec, torch.Tensor):
            if self.model is None:
                raise ValueError(f"PowerSGDState: {what} is a function of (name, parameter): give "
                                 "model= (the model, or its DDP wrapper) to call it with")
            return [(p, spec(name, p)) for name, p in self._named]
        if isinstance(spec, (str, torch.Tensor)):
            spec = [spec]
        if what == "rank_of":
            if not hasattr(spec, "items"):
                raise ValueError("PowerSGDState: rank_of must be a dict {parameter or name: rank} "
                                 "or a function (name, parameter) -> rank, not "
                                 f"{type(spec).__name__}")
            pairs = list(spec.items())
        else:
            try:
                pairs = [(key, True) for key in spec]
            except TypeError:
                raise ValueError("PowerSGDState: exclude must be parameters or names (a list, a "
                                 "set), or a function (name, parameter) -> bool, not "
                                 f"{type(spec).__name__}") from None
        return [(self._parameter(key, what), value) for key, value in pairs]

    def _parameter(self, key, what):
        if isinstance(key, torch.Tensor):
            return key
        if not isinstance(key, str):
            raise ValueError(f"PowerSGDState: {what} holds {key!r}: give parameters (tensors) or "
                             "their names (str)")
        if self.model is None:
            raise ValueError(f"PowerSGDState: {what} names {key!r}: give model= (the model, or its "
                             "DDP wrapper) to find the parameters by name, or give the parameters")
        if key not in self._by_name:
            near = [n for n in self._by_name if key.split(".")[-1] in n][:5]
            raise ValueError(f"PowerSGDState: {what} names {key!r}, which the model has not (as "
                             f"in model.named_parameters(), without DDP's \"module.\")"
                             + (f"; did you mean {', '.join(near)}?" if near else ""))
        return self._by_name[key]


def _check_rank(k, p, name_of):
    if k is None:
        return RANK_DEFAULT
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TENSOR_RANK:
        raise ValueError(f"PowerSGDState: rank_of gives {name_of(p)} the rank {k!r}: an int in "
                         f"[0, {MAX_TENSOR_RANK}] (0: exact) or None (the default)")
    return k


def _named_parameters(model):
    """Every (name, parameter) of the model, a parameter shared by several names under each
    (named_parameters(remove_duplicate=False) where torch has it: 2.0 on)."""
    try:
        return list(model.named_parameters(remove_duplicate=False))
    except TypeError:  # torch 1.x: the modules' own parameters, every name
        return [(f"{mod}.{name}" if mod else name, p)
                for mod, m in model.named_modules() for name, p in m._parameters.items()
                if p is not None]
