"""The statistics of every study and of the A/B comparison of two builds, in one place, on
scipy.stats.t (Debian's python3-scipy 1.10; scripts/setup.sh --test installs it).

Conventions, so that a quantile or a level can never be misread again:
- A quantile is named by its probability: t_quantile(0.975, df) is the point with 97.5% of
  Student's t below it. No table, no nearest-lower-df lookup: scipy's quantile is exact for any
  df > 0, fractional (Welch) included.
- `confidence` is the coverage of what is returned: for a two-sided interval the central
  coverage (0.95 -> t_quantile(0.975, df)); for a one-sided bound the one-sided coverage
  (0.95 -> t_quantile(0.95, df)). TOST takes `alpha`, the size of each one-sided test, and
  reports the (1 - 2 alpha) interval it is equivalent to.
- Samples are sequences of finite floats (any unit; results are in the same unit, ratios are
  unitless). Paired samples are paired by position and must have the same length. Fewer than
  2 samples, mismatched lengths, non-finite values, or a level outside (0, 1) raise ValueError.
- Results are frozen dataclasses (dataclasses.asdict gives the JSON a report writes).

What each study computes, and the function for it:
  mean and standard error over seeds or runs ........ mean_se
  t-interval of a mean (one sample, or a contrast) .. mean_interval, t_interval
  paired difference a - b with its interval ......... paired_difference
  paired ratio a / b (geometric mean of the ratios:
    exp of the mean log ratio) with its interval ..... paired_ratio
  one-sided upper bound of that ratio (ab_compare's
    "upper95", its --verdict METRIC:BOUND) ........... paired_ratio_upper_bound, t_upper_bound
  difference of independent means, Welch's interval . welch_difference
  ratio of means, Fieller's interval (paired, or from
    summary statistics) ............................. paired_fieller_ratio, fieller_ratio
  equivalence within a margin, two one-sided tests
    (paired, or from summary statistics) ............ paired_tost, tost

Sources: Student's t, Student (1908), Biometrika 6:1-25; Welch (1947), Biometrika 34:28-35 and
Satterthwaite (1946), Biometrics Bulletin 2:110-114; Fieller (1954), J. R. Statist. Soc. B
16:175-185 (and Franz 2007, arXiv:0710.2024, for the unbounded cases); two one-sided tests,
Schuirmann (1987), J. Pharmacokinet. Biopharm. 15:657-680, and Lakens (2017), Soc. Psychol.
Personal. Sci. 8:355-362. Each function is checked against a published worked example in
tests/studies/test_stats.py. Thread safety: pure functions, no shared state.
"""
import math
import numbers
import statistics
import sys
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

try:
    from scipy.stats import t as _student_t
except ImportError as _e:
    raise ImportError(
        "studies/lib/stats.py needs scipy: apt-get install python3-scipy (scripts/setup.sh --test) "
        f"or pip install scipy in this Python ({sys.executable})") from _e


# ---- results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeanSE:
    """A sample's mean, standard deviation (n - 1 denominator), standard error sd / sqrt(n), n."""
    mean: float
    sd: float
    se: float
    n: int


@dataclass(frozen=True)
class Interval:
    """A two-sided t-interval: estimate, [low, high] at `confidence` (central coverage), and the
    standard error and degrees of freedom it was formed from. scale "linear": se is in the data's
    unit; scale "log": estimate, low and high are ratios and se is that of the mean natural-log
    ratio (the interval was formed on the logs and exponentiated)."""
    estimate: float
    low: float
    high: float
    confidence: float
    se: float
    df: float
    n: int
    scale: str = "linear"


@dataclass(frozen=True)
class UpperBound:
    """A one-sided upper confidence bound: estimate and `upper`, with one-sided coverage
    `confidence`; se, df, n and scale as in Interval."""
    estimate: float
    upper: float
    confidence: float
    se: float
    df: float
    n: int
    scale: str = "linear"


@dataclass(frozen=True)
class FiellerInterval:
    """Fieller's confidence set for a ratio of means.

    estimate: ratio of the means (NaN when the denominator's mean is 0).
    kind: "bounded" (the set is [low, high]); "exclusive" (the set is everything outside the
    open gap `excluded`, i.e. two rays to -inf and +inf); "unbounded" (the whole line; at g
    exactly 1, a half-line). Outside "bounded", low = -inf and high = +inf (the set's hull, or
    wider), so a rule such as "high <= target" stays conservative.
    g: t^2 var(denominator) / denominator^2; the set is bounded iff g < 1, i.e. iff the
    denominator's mean differs from 0 at this confidence.
    """
    estimate: float
    low: float
    high: float
    kind: str
    confidence: float
    df: float
    g: float
    excluded: Optional[Tuple[float, float]] = None

    @property
    def bounded(self) -> bool:
        return self.kind == "bounded"


@dataclass(frozen=True)
class Tost:
    """Two one-sided tests of equivalence: H0 effect <= low or effect >= high, against
    low < effect < high. t_lower, p_lower test H0 effect <= low; t_upper, p_upper test
    H0 effect >= high; p = max(p_lower, p_upper). equivalent: both one-sided tests reject at
    `alpha`, i.e. the (1 - 2 alpha) interval `interval` lies strictly inside (low, high)."""
    estimate: float
    se: float
    df: float
    low: float
    high: float
    alpha: float
    t_lower: float
    p_lower: float
    t_upper: float
    p_upper: float
    p: float
    interval: Tuple[float, float]
    equivalent: bool


# ---- checks -----------------------------------------------------------------------------------------
def _level(value, name):
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {value}")
    return value


def _df(df):
    df = float(df)
    if not (df > 0 and math.isfinite(df)):
        raise ValueError(f"degrees of freedom must be finite and > 0, got {df}")
    return df


def _sample(xs, name="sample", least=2):
    try:
        xs = list(xs)
    except TypeError as e:
        raise ValueError(f"{name}: not a sequence of numbers ({e})") from None
    # numbers.Real, not float(): float('1') would take a string read from a file as a number.
    wrong = [x for x in xs if isinstance(x, bool) or not isinstance(x, numbers.Real)]
    if wrong:
        raise ValueError(f"{name}: not a sequence of numbers, got {wrong[:3]!r}")
    out = [float(x) for x in xs]
    if len(out) < least:
        raise ValueError(f"{name}: {len(out)} value(s), at least {least} needed")
    bad = [x for x in out if not math.isfinite(x)]
    if bad:
        raise ValueError(f"{name}: non-finite values {bad[:3]}")
    return out


def _pair(a, b):
    a, b = _sample(a, "a", least=0), _sample(b, "b", least=0)
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    return _sample(a, "a"), _sample(b, "b")


def _finite(value, name):
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _se(se):
    se = float(se)
    if not (se >= 0 and math.isfinite(se)):
        raise ValueError(f"standard error must be finite and >= 0, got {se}")
    return se


# ---- Student's t --------------------------------------------------------------------------------------
def t_quantile(q: float, df: float) -> float:
    """The q quantile of Student's t with df degrees of freedom: P(T <= t_quantile(q, df)) = q.

    q in (0, 1) (0.975 for a two-sided 95% interval, 0.95 for a one-sided 95% bound); df > 0,
    fractional allowed (Welch). Exact (scipy.stats.t.ppf), no table. ValueError otherwise.
    """
    return float(_student_t.ppf(_level(q, "q"), _df(df)))


def t_interval(estimate: float, se: float, df: float, confidence: float = 0.95) -> Tuple[float, float]:
    """(low, high) = estimate -+ t_quantile((1 + confidence) / 2, df) * se: the two-sided
    interval at central coverage `confidence` from an estimate, its standard error (>= 0, same
    unit) and degrees of freedom. ValueError for a non-finite estimate, se < 0, df <= 0 or confidence outside (0, 1)."""
    estimate = _finite(estimate, "estimate")
    half = t_quantile(0.5 + _level(confidence, "confidence") / 2, df) * _se(se)
    return estimate - half, estimate + half


def t_upper_bound(estimate: float, se: float, df: float, confidence: float = 0.95) -> float:
    """estimate + t_quantile(confidence, df) * se: the one-sided upper bound with one-sided
    coverage `confidence` (0.95 -> the 0.95 quantile, the upper end of the two-sided 90%
    interval). ValueError as t_interval."""
    return _finite(estimate, "estimate") + t_quantile(_level(confidence, "confidence"), df) * _se(se)


# ---- one sample ---------------------------------------------------------------------------------------
def mean_se(xs: Sequence[float]) -> MeanSE:
    """Mean, sample standard deviation (n - 1), standard error sd / sqrt(n) and n of xs (>= 2
    finite values, any unit). ValueError otherwise."""
    xs = _sample(xs, "xs")
    sd = statistics.stdev(xs)
    return MeanSE(statistics.fmean(xs), sd, sd / math.sqrt(len(xs)), len(xs))


def mean_interval(xs: Sequence[float], confidence: float = 0.95) -> Interval:
    """The one-sample t-interval of the mean of xs (>= 2 finite values; a paired contrast such as
    x - 3 y per run is one sample): mean -+ t_quantile((1 + confidence) / 2, n - 1) * se.
    ValueError for fewer than 2 values or a level outside (0, 1). Source: Student (1908)."""
    m = mean_se(xs)
    low, high = t_interval(m.mean, m.se, m.n - 1, confidence)
    return Interval(m.mean, low, high, confidence, m.se, m.n - 1, m.n)


# ---- paired samples -----------------------------------------------------------------------------------
def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of the per-pair differences a[i] - b[i] with its paired t-interval at central
    coverage `confidence` (df = n - 1; same unit as a and b). ValueError for fewer than 2 pairs,
    different lengths or non-finite values. Source: Student (1908); R's t.test(paired = TRUE)."""
    a, b = _pair(a, b)
    return mean_interval([x - y for x, y in zip(a, b)], confidence)


def _log_ratios(a, b):
    a, b = _pair(a, b)
    bad = [(x, y) for x, y in zip(a, b) if x <= 0 or y <= 0]
    if bad:
        raise ValueError(f"a ratio's logarithm needs values > 0, got pairs {bad[:3]}")
    return [math.log(x / y) for x, y in zip(a, b)]


def paired_ratio(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """The ratio a / b of paired positive values (times, say) as the geometric mean of the
    per-pair ratios, exp(mean(log(a[i] / b[i]))), with the paired t-interval of the mean log
    ratio at central coverage `confidence`, exponentiated (scale "log": se is that of the mean
    log ratio). Unitless. ValueError for fewer than 2 pairs, different lengths, or a value <= 0.
    Source: the t-interval on logs, as in bioequivalence's ratio of geometric means
    (Schuirmann 1987)."""
    iv = mean_interval(_log_ratios(a, b), confidence)
    return Interval(math.exp(iv.estimate), math.exp(iv.low), math.exp(iv.high), confidence,
                    iv.se, iv.df, iv.n, "log")


def paired_ratio_upper_bound(a: Sequence[float], b: Sequence[float],
                             confidence: float = 0.95) -> UpperBound:
    """The one-sided upper confidence bound of paired_ratio(a, b): exp(mean log ratio +
    t_quantile(confidence, n - 1) * se), one-sided coverage `confidence`. With a the candidate's
    times and b the baseline's, "no slowdown beyond BOUND shown" is upper <= BOUND (the A/B
    comparison's --verdict METRIC:BOUND at confidence 0.95). ValueError as paired_ratio."""
    m = mean_se(_log_ratios(a, b))
    up = t_upper_bound(m.mean, m.se, m.n - 1, confidence)
    return UpperBound(math.exp(m.mean), math.exp(up), confidence, m.se, m.n - 1, m.n, "log")


# ---- independent samples ------------------------------------------------------------------------------
def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Interval:
    """mean(a) - mean(b) of independent samples (>= 2 values each, same unit) with Welch's
    t-interval: se = sqrt(var(a)/n_a + var(b)/n_b) (the two standard errors combined), df by
    Welch-Satterthwaite (fractional). n in the result: n_a + n_b. With both variances 0 the
    interval is the point and df is n_a + n_b - 2. ValueError for fewer than 2 values in either.
    Source: Welch (1947), Satterthwaite (1946); R's t.test(var.equal = FALSE)."""
    a, b = _sample(a, "a"), _sample(b, "b")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = ((va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
          if se > 0 else float(len(a) + len(b) - 2))
    d = statistics.fmean(a) - statistics.fmean(b)
    low, high = t_interval(d, se, df, confidence)
    return Interval(d, low, high, confidence, se, df, len(a) + len(b))


# ---- Fieller --------------------------------------------------------------------------------------------
def fieller_ratio(num: float, den: float, var_num: float, var_den: float, cov: float, df: float,
                  confidence: float = 0.95) -> FiellerInterval:
    """Fieller's confidence set for the ratio of two means from their estimates: num, den (the
    means, any one unit), var_num, var_den (the variances of those estimates, i.e. squared
    standard errors, >= 0), cov (their covariance; 0 when independent), df (> 0) the degrees of
    freedom of the variance estimates, confidence the central coverage.

    The set is every rho with (num - rho den)^2 <= t^2 (var_num - 2 rho cov + rho^2 var_den),
    t = t_quantile((1 + confidence) / 2, df): the ratios a t-test of num - rho den does not
    reject. Bounded iff g = t^2 var_den / den^2 < 1; otherwise "exclusive" or "unbounded" (see
    FiellerInterval), never an error. ValueError for non-finite input, negative variances, a covariance matrix
    that is not positive semi-definite, df <= 0 or confidence outside (0, 1).
    Source: Fieller (1954), J. R. Statist. Soc. B 16:175-185."""
    if not all(math.isfinite(v) for v in (num, den, var_num, var_den, cov)):
        raise ValueError(f"non-finite input: {num}, {den}, {var_num}, {var_den}, {cov}")
    if var_num < 0 or var_den < 0 or cov * cov > var_num * var_den * (1 + 1e-12) + 1e-300:
        raise ValueError(f"not a covariance matrix: var_num {var_num}, var_den {var_den}, cov {cov}")
    t2 = t_quantile(0.5 + _level(confidence, "confidence") / 2, df) ** 2
    est = num / den if den != 0 else math.nan
    qa = den * den - t2 * var_den            # rho^2
    qb = -2.0 * (num * den - t2 * cov)       # rho
    qc = num * num - t2 * var_num            # 1
    g = t2 * var_den / (den * den) if den != 0 else math.inf
    inf = math.inf
    if qa > 0:
        root = math.sqrt(max(0.0, qb * qb - 4 * qa * qc))  # >= 0 up to rounding: rho = est is inside
        return FiellerInterval(est, (-qb - root) / (2 * qa), (-qb + root) / (2 * qa), "bounded",
                               confidence, df, g)
    disc = qb * qb - 4 * qa * qc
    if qa < 0 and disc > 0:                  # a downward parabola: <= 0 outside its roots
        r1, r2 = sorted(((-qb - math.sqrt(disc)) / (2 * qa), (-qb + math.sqrt(disc)) / (2 * qa)))
        return FiellerInterval(est, -inf, inf, "exclusive", confidence, df, g, (r1, r2))
    return FiellerInterval(est, -inf, inf, "unbounded", confidence, df, g)


def paired_fieller_ratio(a: Sequence[float], b: Sequence[float],
                         confidence: float = 0.95) -> FiellerInterval:
    """Fieller's confidence set for mean(a) / mean(b), a and b paired by position (runs, seeds):
    fieller_ratio with the sample means, var / n of each, their sample covariance / n and
    df = n - 1. Any sign is allowed (an overhead can come out <= 0 through noise, where a log
    ratio is undefined). Equivalently: the rho for which the paired t-test of a[i] - rho b[i]
    does not reject 0 at 1 - confidence. ValueError for fewer than 2 pairs, different lengths or
    non-finite values. Source: Fieller (1954)."""
    a, b = _pair(a, b)
    n = len(a)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    return fieller_ratio(ma, mb, statistics.variance(a) / n, statistics.variance(b) / n, cov / n,
                         n - 1, confidence)


# ---- equivalence ------------------------------------------------------------------------------------------
def _t_stat(num, se):
    if se > 0:
        return num / se
    return math.nan if num == 0 else math.copysign(math.inf, num)


def tost(estimate: float, se: float, df: float, low: float, high: float, alpha: float = 0.05) -> Tost:
    """Two one-sided t-tests of equivalence from an estimate (say a mean paired difference), its
    standard error (>= 0), degrees of freedom (> 0) and the equivalence bounds low < high (the
    margins, in the estimate's unit), each one-sided test at size alpha in (0, 0.5).
    t_lower = (estimate - low) / se, p_lower = P(T >= t_lower); t_upper = (estimate - high) / se,
    p_upper = P(T <= t_upper). interval: estimate -+ t_quantile(1 - alpha, df) * se, the
    (1 - 2 alpha) interval; equivalent iff it lies strictly inside (low, high). ValueError for
    low >= high or levels out of range. Sources: Schuirmann (1987); Lakens (2017)."""
    if not low < high:
        raise ValueError(f"equivalence bounds need low < high, got {low}, {high}")
    alpha = _level(alpha, "alpha")
    if alpha >= 0.5:
        raise ValueError(f"alpha must be below 0.5 (each one-sided test's size), got {alpha}")
    se, df = _se(se), _df(df)
    t_lo, t_hi = _t_stat(estimate - low, se), _t_stat(estimate - high, se)
    p_lo, p_hi = float(_student_t.sf(t_lo, df)), float(_student_t.cdf(t_hi, df))
    ci = t_interval(estimate, se, df, 1 - 2 * alpha)
    return Tost(estimate, se, df, low, high, alpha, t_lo, p_lo, t_hi, p_hi, max(p_lo, p_hi), ci,
                low < ci[0] and ci[1] < high)


def paired_tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05) -> Tost:
    """Equivalence of paired samples within +-margin (> 0, the data's unit): tost on the mean
    of a[i] - b[i], its standard error and df = n - 1, bounds (-margin, +margin), each one-sided
    test at size alpha (0.05: equivalent iff the 90% paired interval lies inside +-margin).
    ValueError for margin <= 0, fewer than 2 pairs, different lengths or non-finite values.
    Sources: Schuirmann (1987); Lakens (2017)."""
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}")
    a, b = _pair(a, b)
    m = mean_se([x - y for x, y in zip(a, b)])
    return tost(m.mean, m.se, m.n - 1, -margin, margin, alpha)
