"""The reducer a train.py run's JSON names, read the same way by every report (study.py,
time_report.py). Runs written before the fair baseline (studies/train/torch_baseline.py) have
reducer "torch-powersgd" and no "torch_powersgd_wrapper": that hook was waited per bucket, so
they are "torch-powersgd-waited"; the name "torch-powersgd" now means the chained hook. A lowrank
run with config "alternate" set (train.py --alternate, issue 44: PowerSGDState(alternate=True)) is
"lowrank-alternate", a reducer of its own, never merged with PowerSGD's runs. A lowrank run with
config "factor_dtype" other than fp32 (train.py --factor-dtype, issue 45) takes the type as a
suffix: "lowrank-bf16", "lowrank-alternate-bf16" (runs before issue 45 have no such field: fp32)."""


_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def reducer(config):
    r = config["reducer"]
    if r == "torch-powersgd" and config.get("torch_powersgd_wrapper", "waited") == "waited":
        return "torch-powersgd-waited"
    if r != "lowrank":
        return r
    dtype = config.get("factor_dtype") or "fp32"
    dtype = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())  # the library's spellings, one name
    return r + ("-alternate" if config.get("alternate") else "") + \
        ("" if dtype == "fp32" else "-" + dtype)


def has_rank(name):
    """Whether the reducer takes an approximation rank (its runs are keyed by it)."""
    return name in ("torch-powersgd", "torch-powersgd-waited") or (
        name.startswith("lowrank") and name != "lowrank-exact")
