"""An adaptive approximation rank per parameter: Accordion's detector of critical regimes
(Agarwal et al., "Adaptive Gradient Communication via Critical Learning Regime Identification",
MLSys 2021) with lowrank's own compression error, as a rule the hook applies (PowerSGDState's
`adaptive`). The rule is pure: it sees numbers every comm rank holds alike (allreduced by the
hook) and returns each parameter's k, so every rank switches at the same step to the same k.

Every `window` steps the hook measures, for each parameter under the rule, at the window's last
step m: the norm of its averaged gradient summed over the window's steps (the allreduces'
outputs, added up at every step: Accordion's accumulated gradient, of which one step's norm
would be mostly sampling noise) and its compression error at step m,
sqrt(sum_i |E_i|^2 / sum_i |M_i|^2) over the comm ranks (E_i the residual left after the call,
M_i = E_i + the output: what the call had to send). At step m + lag the hook allreduces those
numbers over the process group and asks decide(); the ks apply from that step on, through the
declaration of each bucket (lowrank keeps each parameter's residual and warm-start Q across the
change).
"""
import copy
import math


class AdaptiveRank:
    """The rule: a parameter is in a critical regime when its gradient norm changed by a
    relative `eta` or more since the last measurement (Accordion), and then gets `high`; so
    does a parameter whose compression error is `error_max` or more; the others get `low`.
    Before its first decision a parameter gets `high` (Accordion: training starts critical).

    Args (defaults, and why):
      low (None: the state's matrix_approximation_rank): the k of quiet regimes, the budget.
      high (None: 4 x low): the k of critical regimes; Accordion switched PowerSGD between
        ranks 1 and 4 (rank 2 and 8 on some models): a factor 4.
      window (100): steps between measurements, and the steps whose averaged gradients are
        summed for the norm. Accordion sums over an epoch; a window of steps serves where epochs
        are long or unknown. Summing costs one pass over each bucket per step and a float32 copy
        of the ruled parameters' gradients; each measurement copies the residual of every
        bucket to host memory once (lowrank's save_state), so not every step.
      eta (0.5): Accordion's threshold on the relative change of the gradient norm, the value
        its paper uses for every model.
      error_max (None: off): a compression error at or above it keeps `high`: the residual
        then holds almost all of what the calls had to send. Off by default: with error
        feedback the residual soon outweighs any one step's gradient, so the error is near 1
        everywhere (issue 28's runs, docs/training.md: 0.95 to 1.00 on every compressed matrix
        of the CNN and the transformer at every measurement after the first), and any
        threshold below that turned the rule into a fixed `high` (0.9 did, in its study).
      lag (1): whole steps between a measurement and its decision. On the host the numbers of
        step m are complete when step m + 1 starts; on CUDA they are read then too (the
        measurement waits for the bucket's device work), so 1 serves both; a larger lag
        decides later and never depends on when numbers land either.
    Raises ValueError for a bad argument (each named). Not thread-safe: one per state."""

    def __init__(self, low=None, high=None, *, window=100, eta=0.5, error_max=None, lag=1):
        for name, v in (("low", low), ("high", high)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65536):
                raise ValueError(f"AdaptiveRank: {name}={v!r} must be an int in [1, 65536] or None")
        if low is not None and high is not None and high < low:
            raise ValueError(f"AdaptiveRank: high={high} is below low={low}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"AdaptiveRank: window={window!r} must be an int >= 1")
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            raise ValueError(f"AdaptiveRank: lag={lag!r} must be an int >= 1 (whole steps)")
        if not (isinstance(eta, (int, float)) and eta > 0 and math.isfinite(eta)):
            raise ValueError(f"AdaptiveRank: eta={eta!r} must be a number > 0")
        if error_max is not None and not (isinstance(error_max, (int, float)) and error_max > 0):
            raise ValueError(f"AdaptiveRank: error_max={error_max!r} must be a number > 0 or None")
        self.low, self.high, self.window, self.eta = low, high, window, float(eta)
        self.error_max, self.lag = error_max, lag
        self._norms = {}  # parameter -> its gradient norm at the last measurement
        self.last = None  # (step, signals) of the last decide(): what it decided from

    def bind(self, k):
        """A copy of this rule with low and high filled from the state's k
        (matrix_approximation_rank) where None (the caller's object is left as it is, so one rule
        may serve several states). Raises ValueError: high below low, or above 65536 (lowrank's
        largest approximation rank)."""
        bound = copy.copy(self)
        bound._norms = dict(self._norms)
        if bound.low is None:
            bound.low = max(1, int(k))
        if bound.high is None:
            bound.high = max(bound.low, 4 * bound.low)
        if bound.high < bound.low:
            raise ValueError(f"AdaptiveRank: high={bound.high} is below low={bound.low}")
        if bound.high > 65536:
            raise ValueError(f"AdaptiveRank: high={bound.high} is above 65536, lowrank's largest "
                             "approximation rank (pass high=, or a smaller "
                             "matrix_approximation_rank: high defaults to 4 times it)")
        return bound

    def measures(self, step):
        """True when step (0-based) is the last of a window: its numbers are measured."""
        return step % self.window == self.window - 1

    def decides(self, step):
        """The measured step whose numbers step `step` decides from, or None."""
        m = step - self.lag
        return m if m >= 0 and self.measures(m) else None

    def initial(self):
        """The k of a parameter before its first decision."""
        return self.high

    def state_dict(self):
        """The rule's memory: {"norms": {parameter: its last measured norm}} (plain types)."""
        return {"norms": dict(self._norms)}

    def load_state_dict(self, sd):
        """Takes state_dict()'s memory. Raises ValueError if it is not one."""
        norms = sd.get("norms") if isinstance(sd, dict) else None
        if not isinstance(norms, dict) or not all(isinstance(v, (int, float)) for v in norms.values()):
            raise ValueError("AdaptiveRank.load_state_dict: not a state_dict() of AdaptiveRank")
        self._norms = {k: float(v) for k, v in norms.items()}

    def decide(self, signals, step=None):
        """signals: {parameter: (gradient norm, compression error)} of one measured step (step:
        its number, kept with them in `last`), the same numbers on every comm rank. Returns
        {parameter: k}, and remembers the norms for the next decision. A parameter measured for
        the first time is critical."""
        self.last = (step, dict(signals))
        out = {}
        for key, (norm, error) in signals.items():
            prev = self._norms.get(key)
            self._norms[key] = norm
            critical = prev is None or prev <= 0 or abs(norm - prev) / prev >= self.eta
            noisy = self.error_max is not None and error >= self.error_max
            out[key] = self.high if critical or noisy else self.low
        return out
