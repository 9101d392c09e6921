"""The rank study's plan (plan.toml) as the run and the report use it: which runs, in which order,
where their JSON lies, and SGD's learning rate from the sweep."""
import json
import math
import os

from studies.accuracy.report import final_metric
from studies.lib import plan as planfile

PLAN = planfile.load(__file__)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def load(p):
    with open(p) as f:
        return json.load(f)


class Study:
    """One of the plan's two studies: "first" or "followup"."""

    def __init__(self, which):
        if which not in ("first", "followup"):
            raise ValueError(f"rank study: no study {which!r} (first or followup)")
        p = PLAN[which]
        self.followup = which == "followup"
        self.out = os.path.join(RESULTS, p["results"])
        self.fig = p["figures"]
        self.env = dict(p["env"])
        self.sgd_lrs, self.sweep_seed = p["sgd_lrs"], p["sweep_seed"]
        self.configs = [(c["model"], c["name"], c["args"], range(c["seeds"])) for c in p["configs"]]
        self.exploratory = [(c["model"], c["name"], c["args"], range(c["seeds"]))
                            for c in p["exploratory"]]

    def path(self, model, config, seed, ext="json"):
        return os.path.join(self.out, f"{model}_{config}_s{seed}.{ext}")

    def sgd_lr(self):
        """The sweep's lr with the lowest final test loss, or None while the sweep is incomplete."""
        got = {}
        for lr in self.sgd_lrs:
            p = self.path("transformer", f"sgd-lr{lr}", self.sweep_seed)
            if not os.path.exists(p):
                return None
            got[lr] = final_metric(load(p))
        return min(got, key=lambda lr: (got[lr] if math.isfinite(got[lr]) else math.inf)) if got else None

    def jobs(self):
        """[(model, config, seed, driver args)] in run order: the lr sweep, then seed by seed every
        configuration, SGD's only once its lr is known; then the exploratory ones."""
        out = [("transformer", f"sgd-lr{lr}", self.sweep_seed,
                ["--reducer", "allreduce", "--optimizer", "sgd", "--lr", str(lr)]) for lr in self.sgd_lrs]
        lr = self.sgd_lr()
        for seed in range(max(len(s) for _, _, _, s in self.configs)):
            for model, config, args, seeds in self.configs:
                if seed not in seeds:
                    continue
                if "--optimizer" in args:
                    if lr is None:
                        continue
                    args = args + ["--lr", str(lr)]
                out.append((model, config, seed, args))
        for model, config, args, seeds in self.exploratory:
            out += [(model, config, seed, args) for seed in seeds]
        return out
