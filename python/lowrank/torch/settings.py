"""The settings of lowrank's PowerSGD hooks (PowerSGDState of lowrank.torch and lowrank.torch.fsdp):
each checked by one rule, those a checkpoint checks, and lowrank's configuration made of them."""
import datetime
import math
import numbers

from ..comm import as_int, factor_dtype_name

# What a state_dict's "config" holds and load_state_dict checks (both hooks); the DDP hook's
# others, its "options", are not checked. alternate is an option: lowrank carries each tensor's
# residual and warm-start Q across a change of schedule (as lowrankBufferSetAlternate does; the
# alternation then starts with a P step), so a state saved under either schedule loads under the
# other. factor_dtype is an option too: the state lowrank saves (residuals, warm-start Q) is float32
# whatever dtype the factors travel in, so a state saved with one loads with another.
CHECKED = ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
           "use_error_feedback", "warm_start", "orthogonalization_epsilon", "random_seed")
OPTIONS = ("compression_stats_logging_frequency", "batch_tensors_with_same_shape", "timeout",
           "pipeline", "alternate", "factor_dtype")
# Options a state_dict may lack (saved before they existed), with the value they then take.
OPTION_DEFAULTS = {"alternate": False, "factor_dtype": "fp32"}
# Each setting's rule, in the order checked: an int in [lo, hi], a number (> or >= lo), a flag.
_RULES = {"matrix_approximation_rank": ("int", 0, 1 << 16),
          "start_powerSGD_iter": ("int", 0, 1 << 30), "random_seed": ("int", 0, 2**63 - 1),
          "compression_stats_logging_frequency": ("int", -2**63, 2**63 - 1),
          "min_compression_rate": ("number", 1, ">="),
          "orthogonalization_epsilon": ("number", 0, ">="), "timeout": ("number", 0, ">"),
          "use_error_feedback": ("flag",), "warm_start": ("flag",),
          "batch_tensors_with_same_shape": ("flag",), "pipeline": ("flag",),
          "alternate": ("flag",), "factor_dtype": ("factor dtype",)}


def check_settings(kw):
    """The settings in kw (by name, any of _RULES') checked under their own names before anything
    is made, in lowrank's ranges (lowrank.h, lowrankConfig_t), not later in the C API's terms nor
    silently truncated: TypeError for a wrong type (2.7 or True for an int, a string for a
    number), ValueError out of range. kw gets plain Python types (a state_dict of them loads with
    torch.load(weights_only=True)); a timeout may be a datetime.timedelta, kept as seconds; a
    factor_dtype is kept as its name ("fp32", "bf16", "fp16"; None: LOWRANK_FACTOR_DTYPE).
    Then the combinations: alternate True with warm_start False is a ValueError naming both
    (alternating PowerSGD computes each factor from the other one kept from the last call)."""
    for name in [n for n in _RULES if n in kw]:
        (kind, *rule), v = _RULES[name], kw[name]
        # None: LOWRANK_TIMEOUT, LOWRANK_PIPELINE, LOWRANK_FACTOR_DTYPE
        none_ok = name in ("timeout", "pipeline", "factor_dtype")
        if isinstance(v, datetime.timedelta) and name == "timeout":
            v = v.total_seconds()
        if v is None and none_ok:
            continue
        if kind == "int":
            try:
                v = as_int(v)
            except TypeError:
                raise TypeError(f"PowerSGDState: {name} must be an int, not {v!r}") from None
            if not rule[0] <= v <= rule[1]:
                raise ValueError(f"PowerSGDState: {name}={v} is out of range "
                                 f"[{rule[0]}, {rule[1]}]")
        elif kind == "factor dtype":
            try:
                v = factor_dtype_name(v)
            except (TypeError, ValueError) as e:
                raise type(e)(f"PowerSGDState: {e} (or None: LOWRANK_FACTOR_DTYPE)") from None
        elif kind == "number":
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"PowerSGDState: {name} must be a number, not {v!r}")
            v, (lo, what) = float(v), rule
            if not math.isfinite(v) or not (v > lo if what == ">" else v >= lo):
                raise ValueError(f"PowerSGDState: {name} must be a finite number {what} {lo}, "
                                 f"not {v!r}")
        else:
            numpy_bool = type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool")
            if not (isinstance(v, bool) or numpy_bool or
                    isinstance(v, numbers.Integral) and v in (0, 1)):
                raise TypeError(f"PowerSGDState: {name} must be True or False"
                                f"{' or None' if none_ok else ''}, not {v!r}")
            v = bool(v)
        kw[name] = v
    if kw.get("alternate") and not kw.get("warm_start", True):
        raise ValueError("PowerSGDState: alternate=True needs warm_start=True (alternating "
                         "PowerSGD computes each factor from the other one kept from the last "
                         "call); give warm_start=True, or alternate=False")


def communicator_config(kw):
    """lowrank's configuration (lowrank.make_config's keywords) of checked settings: the hook's
    start_powerSGD_iter is lowrank's per-id warm-up (startIter) and wins over LOWRANK_START_ITER;
    its alternate (default False) wins over LOWRANK_ALTERNATE alike, and its factor_dtype
    (default "fp32"; None: LOWRANK_FACTOR_DTYPE's) over LOWRANK_FACTOR_DTYPE."""
    return dict(approx_rank=kw["matrix_approximation_rank"], start_iter=kw["start_powerSGD_iter"],
                min_compression_rate=kw["min_compression_rate"],
                error_feedback=kw["use_error_feedback"], warm_start=kw["warm_start"],
                ortho_epsilon=kw["orthogonalization_epsilon"], seed=kw["random_seed"],
                timeout=kw.get("timeout"), pipeline=kw.get("pipeline"),
                alternate=kw.get("alternate", False),
                factor_dtype=kw.get("factor_dtype", "fp32"))


def differences(config, state):
    """The CHECKED settings in which a saved "config" differs from a state's, each "name: saved
    x, this state y" (numbers compared as numbers: 2 and 2.0 are the same, so are two NaNs)."""
    def same(a, b):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
        return a == b
    return [f"{k}: saved {config.get(k)!r}, this state {getattr(state, k)!r}"
            for k in CHECKED if not same(config.get(k), getattr(state, k))]
