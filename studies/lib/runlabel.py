"""The reducer a train.py run's JSON names, read the same way by every report (study.py,
time_report.py). Runs written before the fair baseline (studies/train/torch_baseline.py) have
reducer "torch-powersgd" and no "torch_powersgd_wrapper": that hook was waited per bucket, so
they are "torch-powersgd-waited"; the name "torch-powersgd" now means the chained hook. A lowrank
run with config "alternate" set (train.py --alternate, issue 44: PowerSGDState(alternate=True)) is
"lowrank-alternate", a reducer of its own, never merged with PowerSGD's runs."""


def reducer(config):
    r = config["reducer"]
    if r == "torch-powersgd" and config.get("torch_powersgd_wrapper", "waited") == "waited":
        return "torch-powersgd-waited"
    if r == "lowrank" and config.get("alternate"):
        return "lowrank-alternate"
    return r


def has_rank(name):
    """Whether the reducer takes an approximation rank (its runs are keyed by it)."""
    return name in ("torch-powersgd", "torch-powersgd-waited", "lowrank", "lowrank-alternate")
