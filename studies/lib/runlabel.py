"""The reducer a train.py run's JSON names, read the same way by every report (study.py,
time_report.py). Runs written before the fair baseline (studies/train/torch_baseline.py) have
reducer "torch-powersgd" and no "torch_powersgd_wrapper": that hook was waited per bucket, so
they are "torch-powersgd-waited"; the name "torch-powersgd" now means the chained hook."""


def reducer(config):
    r = config["reducer"]
    if r == "torch-powersgd" and config.get("torch_powersgd_wrapper", "waited") == "waited":
        return "torch-powersgd-waited"
    return r


def has_rank(name):
    """Whether the reducer takes an approximation rank (its runs are keyed by it)."""
    return name in ("torch-powersgd", "torch-powersgd-waited", "lowrank")
