"""studies/lib/stats.py against published worked examples (each cited where it is used), the
t tables the studies carried before it, and its error cases.

  PYTHONPATH=. /usr/bin/python3 -m pytest tests/studies/test_stats.py
"""
import math
import statistics

import pytest
from scipy import stats as sps

from studies.lib import stats

# ---- published data ---------------------------------------------------------------------------------
# Student's sleep data (Cushny & Peebles 1905, Student 1908; R's `sleep`): extra hours of sleep of
# 10 patients under each of two drugs, paired by patient.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
# R: with(sleep, t.test(extra[group == 2], extra[group == 1], paired = TRUE)) prints
# t = 4.0621, df = 9, 95 percent confidence interval 0.7001142 2.4598858, mean difference 1.58
# (R's ?t.test example; with the groups the other way round the signs flip).
SLEEP_T, SLEEP_MEAN, SLEEP_CI95 = 4.0621, 1.58, (0.7001142, 2.4598858)

# NCSS's example of the two-sample t-test for equivalence (yields of two processes), as TOSTER
# (Lakens) reproduces it in tests/testthat/test-NCSS1.R: Welch's df 19.169, SE 53.618547,
# mean difference -8.1153846, 95% interval [-120.27336, 104.04259]; with bounds +-110 and each
# one-sided test at 0.025, p = 0.03628 (lower) and 0.02002 (upper).
YIELD_A = [452, 874, 554, 447, 356, 754, 558, 574, 664, 682, 547, 435, 245]
YIELD_B = [546, 547, 774, 465, 459, 665, 467, 365, 589, 534, 456, 651, 654, 665, 546, 537]

# Lakens (2017)'s paired example in TOSTER (TOSTpaired.raw, the values in TOSTER's
# tests/testthat/test-known_results.R): n = 65 pairs, means 5.83 and 5.75, sds 1.17 and 1.30,
# correlation 0.745, bounds +-0.34, alpha 0.05: t1 = 3.803437, p1 = 0.0001606103,
# t2 = -2.354508, p2 = 0.01081349, df 64, 90% interval [-0.1043032, 0.2643032],
# 95% interval [-0.1406022, 0.3006022].
LAKENS = dict(n=65, diff=5.83 - 5.75, sd=math.sqrt(1.17 ** 2 + 1.30 ** 2 - 2 * 0.745 * 1.17 * 1.30),
              margin=0.34, t1=3.803437, p1=0.0001606103, t2=-2.354508, p2=0.01081349,
              ci90=(-0.1043032, 0.2643032), ci95=(-0.1406022, 0.3006022))


def standardized(n):
    """n values with mean 0 and sample sd 1 exactly (up to rounding)."""
    xs = [i - (n - 1) / 2 for i in range(n)]
    sd = statistics.stdev(xs)
    return [x / sd for x in xs]


def standardized_orthogonal(n):
    """n values with mean 0, sample sd 1, and sample covariance 0 with standardized(n): even in
    the centred index where standardized(n) is odd."""
    c = [(i - (n - 1) / 2) ** 2 for i in range(n)]
    m = statistics.fmean(c)
    sd = statistics.stdev(c)
    return [(x - m) / sd for x in c]


# ---- t quantiles ----------------------------------------------------------------------------------------
# NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2, "Critical values of the Student's t
# distribution" (3 decimals), columns 0.90 0.95 0.975 0.99 0.995.
NIST = {1: (3.078, 6.314, 12.706, 31.821, 63.657), 2: (1.886, 2.920, 4.303, 6.965, 9.925),
        5: (1.476, 2.015, 2.571, 3.365, 4.032), 10: (1.372, 1.812, 2.228, 2.764, 3.169),
        30: (1.310, 1.697, 2.042, 2.457, 2.750), 100: (1.290, 1.660, 1.984, 2.364, 2.626)}


@pytest.mark.parametrize("df", sorted(NIST))
def test_t_quantile_matches_nist_table(df):
    for q, value in zip((0.90, 0.95, 0.975, 0.99, 0.995), NIST[df]):
        assert round(stats.t_quantile(q, df), 3) == value, (q, df)


# The tables the studies carried at 908c9c3 (quantile, {df: printed value}); each entry must be
# the exact quantile rounded to the decimals printed.
STUDY_TABLES = {
    "perf/ab_compare.py:45 T975": (0.975, {
        1: "12.706", 2: "4.303", 3: "3.182", 4: "2.776", 5: "2.571", 6: "2.447", 7: "2.365",
        8: "2.306", 9: "2.262", 10: "2.228", 11: "2.201", 12: "2.179", 13: "2.160", 14: "2.145",
        15: "2.131", 16: "2.120", 17: "2.110", 18: "2.101", 19: "2.093", 20: "2.086", 21: "2.080",
        22: "2.074", 23: "2.069", 24: "2.064", 25: "2.060", 26: "2.056", 27: "2.052", 28: "2.048",
        29: "2.045", 30: "2.042", 40: "2.021", 60: "2.000", 120: "1.980"}),
    "perf/ab_compare.py:52 T95 (the 0.95 quantile)": (0.95, {
        1: "6.314", 2: "2.920", 3: "2.353", 4: "2.132", 5: "2.015", 6: "1.943", 7: "1.895",
        8: "1.860", 9: "1.833", 10: "1.812", 11: "1.796", 12: "1.782", 13: "1.771", 14: "1.761",
        15: "1.753", 16: "1.746", 17: "1.740", 18: "1.734", 19: "1.729", 20: "1.725", 21: "1.721",
        22: "1.717", 23: "1.714", 24: "1.711", 25: "1.708", 26: "1.706", 27: "1.703", 28: "1.701",
        29: "1.699", 30: "1.697", 40: "1.684", 60: "1.671", 120: "1.658"}),
    "perf/train/study.py:51 T95 (the 0.975 quantile)": (0.975, {
        1: "12.71", 2: "4.303", 3: "3.182", 4: "2.776", 5: "2.571", 6: "2.447", 7: "2.365",
        8: "2.306", 9: "2.262"}),
    "perf/train/time_report.py:34 T95 (the 0.975 quantile)": (0.975, {
        1: "12.71", 2: "4.303", 3: "3.182", 4: "2.776", 5: "2.571", 6: "2.447", 7: "2.365",
        8: "2.306", 9: "2.262", 10: "2.228", 12: "2.179", 15: "2.131", 20: "2.086", 25: "2.060",
        30: "2.042"}),
    "perf/train/rank_study.py:226 T90 (the 0.95 quantile)": (0.95, {
        1: "6.314", 2: "2.920", 3: "2.353", 4: "2.132", 5: "2.015"}),
}


@pytest.mark.parametrize("name", sorted(STUDY_TABLES))
def test_t_quantile_agrees_with_the_studies_tables(name):
    q, table = STUDY_TABLES[name]
    for df, printed in table.items():
        decimals = len(printed.split(".")[1])
        assert round(stats.t_quantile(q, df), decimals) == float(printed), (name, df)


def test_t_quantile_is_exact_between_table_rows():
    # Welch's fractional df and df between tabulated rows: no nearest-lower lookup (the old
    # time_report gave 2.042 at df 45 and 1.96 at df 60; the exact values differ).
    assert stats.t_quantile(0.975, 45) == pytest.approx(2.014103, abs=1e-6)
    assert stats.t_quantile(0.975, 60) == pytest.approx(2.000298, abs=1e-6)
    assert stats.t_quantile(0.975, 9) < stats.t_quantile(0.975, 8.5) < stats.t_quantile(0.975, 8)
    assert stats.t_quantile(0.025, 7) == pytest.approx(-stats.t_quantile(0.975, 7), rel=1e-12)
    assert stats.t_quantile(0.975, 1e9) == pytest.approx(1.959964, abs=1e-6)  # the normal's


@pytest.mark.parametrize("q,df", [(0.0, 5), (1.0, 5), (-0.1, 5), (1.5, 5), (0.975, 0),
                                  (0.975, -2), (0.975, math.inf), (0.975, math.nan)])
def test_t_quantile_rejects_bad_input(q, df):
    with pytest.raises(ValueError):
        stats.t_quantile(q, df)


# ---- one sample and paired differences --------------------------------------------------------------
def test_paired_difference_sleep():
    iv = stats.paired_difference(SLEEP_2, SLEEP_1)
    assert iv.estimate == pytest.approx(SLEEP_MEAN, abs=1e-12)
    assert iv.estimate / iv.se == pytest.approx(SLEEP_T, abs=5e-5)
    assert (iv.low, iv.high) == pytest.approx(SLEEP_CI95, abs=5e-8)
    assert (iv.df, iv.n, iv.confidence, iv.scale) == (9, 10, 0.95, "linear")
    flipped = stats.paired_difference(SLEEP_1, SLEEP_2)
    assert (flipped.low, flipped.high) == pytest.approx((-SLEEP_CI95[1], -SLEEP_CI95[0]), abs=5e-8)


def test_mean_interval_and_mean_se_on_the_sleep_differences():
    d = [y - x for x, y in zip(SLEEP_1, SLEEP_2)]
    m = stats.mean_se(d)
    assert m.mean == pytest.approx(SLEEP_MEAN) and m.n == 10
    assert m.se == pytest.approx(SLEEP_MEAN / SLEEP_T, rel=2e-5)
    assert m.sd == pytest.approx(m.se * math.sqrt(10))
    iv = stats.mean_interval(d)
    assert (iv.low, iv.high) == pytest.approx(SLEEP_CI95, abs=5e-8)
    assert stats.t_interval(m.mean, m.se, 9) == pytest.approx(SLEEP_CI95, abs=5e-8)
    wider = stats.mean_interval(d, confidence=0.99)
    assert wider.low < iv.low and wider.high > iv.high


def test_paired_ratio_is_the_sleep_interval_on_logs():
    # log(a / b) per pair = the sleep differences; each pair scaled by its own factor, which a
    # ratio of means would not ignore but a paired log ratio must.
    scale = [1.0, 3.0, 0.5, 10.0, 2.0, 7.0, 0.25, 1.5, 4.0, 9.0]
    a = [s * math.exp(y - x) for s, x, y in zip(scale, SLEEP_1, SLEEP_2)]
    iv = stats.paired_ratio(a, scale)
    assert iv.estimate == pytest.approx(math.exp(SLEEP_MEAN))
    assert (iv.low, iv.high) == pytest.approx(tuple(math.exp(x) for x in SLEEP_CI95), rel=1e-7)
    assert iv.scale == "log" and iv.se == pytest.approx(SLEEP_MEAN / SLEEP_T, rel=2e-5)


def test_upper_bound_is_the_upper_end_of_the_two_sided_interval_at_twice_the_tail():
    # Lakens's example: the one-sided 95% upper bound is the 90% interval's upper end, 0.2643032.
    se = LAKENS["sd"] / math.sqrt(LAKENS["n"])
    assert stats.t_upper_bound(LAKENS["diff"], se, 64, 0.95) == pytest.approx(LAKENS["ci90"][1], abs=5e-8)
    assert stats.t_interval(LAKENS["diff"], se, 64, 0.95) == pytest.approx(LAKENS["ci95"], abs=5e-8)


def test_paired_ratio_upper_bound_uses_the_095_quantile():
    scale = [2.0, 1.0, 5.0, 0.5, 3.0, 1.0, 8.0, 2.0, 1.0, 4.0]
    a = [s * math.exp(y - x) for s, x, y in zip(scale, SLEEP_1, SLEEP_2)]
    up = stats.paired_ratio_upper_bound(a, scale)
    d = [y - x for x, y in zip(SLEEP_1, SLEEP_2)]
    assert up.upper == pytest.approx(math.exp(stats.mean_interval(d, 0.90).high), rel=1e-12)
    assert up.upper < stats.paired_ratio(a, scale, 0.95).high  # not the 0.975 quantile
    assert up.estimate == pytest.approx(math.exp(SLEEP_MEAN))
    assert (up.confidence, up.df, up.n, up.scale) == (0.95, 9, 10, "log")
    # the A/B verdict: "no slowdown shown" iff upper <= BOUND; three pairs at t(0.95, 2) = 2.920
    small = stats.paired_ratio_upper_bound([1.01, 0.99, 1.0], [1.0, 1.0, 1.0])
    assert 1.01 < small.upper < 1.03


# ---- independent samples ---------------------------------------------------------------------------------
def test_welch_difference_ncss():
    iv = stats.welch_difference(YIELD_A, YIELD_B)
    assert iv.estimate == pytest.approx(-8.1153846, abs=5e-8)
    assert iv.se == pytest.approx(53.618547, abs=5e-7)
    assert round(iv.df, 3) == 19.169
    assert (iv.low, iv.high) == pytest.approx((-120.27336, 104.04259), abs=5e-6)
    # the standard errors of the two means combined (the accuracy study's "SE of the difference")
    sa, sb = stats.mean_se(YIELD_A).se, stats.mean_se(YIELD_B).se
    assert iv.se == pytest.approx(math.hypot(sa, sb), rel=1e-12)


# ---- Fieller --------------------------------------------------------------------------------------------
def test_fieller_ratio_dcstats_example():
    # DCSTATS (D. Colquhoun's FIELLER in Python, DCPROGS/DCSTATS example-Fieller.ipynb): a = 14,
    # b = 7, their standard deviations 3 and 2, r = 0, df 10, t = 1.812461 (the 90% level):
    # ratio 2, g = 0.268164, limits 1.051413 and 4.414296.
    f = stats.fieller_ratio(14, 7, 3 ** 2, 2 ** 2, 0.0, 10, confidence=0.90)
    assert f.bounded and f.kind == "bounded"
    assert f.estimate == 2 and f.g == pytest.approx(0.268164, abs=1e-6)
    assert (f.low, f.high) == pytest.approx((1.051413, 4.414296), abs=5e-7)


@pytest.mark.parametrize("confidence,limits", [(0.90, (1.54, 2.64)), (0.95, (1.46, 2.83)),
                                               (0.99, (1.27, 3.36))])
def test_fieller_ratio_graphpad_example(confidence, limits):
    # GraphPad QuickCalcs "CI of a quotient" (Fieller), as quoted in DCSTATS's README: means 14
    # and 7, SDs 3 and 2, N 6 each (SEM 1.22 and 0.82), unpaired, df 10.
    f = stats.fieller_ratio(14, 7, 9 / 6, 4 / 6, 0.0, 10, confidence)
    assert (round(f.low, 2), round(f.high, 2)) == limits


def test_paired_fieller_ratio_reproduces_dcstats_from_samples():
    # 11 pairs whose means are 14 and 7, standard errors 3 and 2, sample covariance 0: the
    # DCSTATS example again (df 10), through the paired function.
    n = 11
    a = [14 + 3 * math.sqrt(n) * u for u in standardized(n)]
    b = [7 + 2 * math.sqrt(n) * v for v in standardized_orthogonal(n)]
    f = stats.paired_fieller_ratio(a, b, confidence=0.90)
    assert f.bounded and f.df == 10
    assert (f.low, f.high) == pytest.approx((1.051413, 4.414296), abs=5e-7)


def test_paired_fieller_ratio_inverts_the_paired_t_test():
    # Fieller's set: the rho for which the t-test of a - rho b does not reject (scipy's own
    # ttest_1samp, an independent computation): p = 1 - confidence at both ends.
    a = [10.2, 12.9, 9.1, 14.3, 11.0, 13.4, 8.8]
    b = [3.1, 4.6, 2.2, 5.3, 3.9, 4.1, 2.5]  # correlated with a
    f = stats.paired_fieller_ratio(a, b, confidence=0.95)
    assert f.bounded and f.low < f.estimate < f.high
    for rho in (f.low, f.high):
        p = sps.ttest_1samp([x - rho * y for x, y in zip(a, b)], 0.0).pvalue
        assert p == pytest.approx(0.05, abs=1e-9)
    inside = sps.ttest_1samp([x - f.estimate * y for x, y in zip(a, b)], 0.0).pvalue
    assert inside == pytest.approx(1.0)


def test_fieller_unbounded_cases():
    # denominator not clearly away from 0: g >= 1, no finite interval, never an exception
    excl = stats.fieller_ratio(14, 1, 9, 4, 0.0, 10)
    assert excl.kind == "exclusive" and not excl.bounded and excl.g > 1
    assert (excl.low, excl.high) == (-math.inf, math.inf)
    r1, r2 = excl.excluded
    t2 = stats.t_quantile(0.975, 10) ** 2

    def quad(rho):  # <= 0 inside Fieller's set
        return (14 - rho * 1) ** 2 - t2 * (9 + rho * rho * 4)
    assert quad(r1) == pytest.approx(0, abs=1e-9) and quad(r2) == pytest.approx(0, abs=1e-9)
    assert quad((r1 + r2) / 2) > 0 and quad(r1 - 1) <= 0 and quad(r2 + 1) <= 0
    assert not r1 < excl.estimate < r2  # the point estimate lies in the set
    whole = stats.fieller_ratio(0.1, 0.1, 1.0, 1.0, 0.0, 10)
    assert whole.kind == "unbounded" and (whole.low, whole.high) == (-math.inf, math.inf)
    zero = stats.paired_fieller_ratio([1.0, 2.0, 3.0], [-1.0, 1.0, 0.0])
    assert math.isnan(zero.estimate) and not zero.bounded and zero.g == math.inf


def test_fieller_without_variance_is_the_point():
    f = stats.paired_fieller_ratio([2.0, 2.0, 2.0], [4.0, 4.0, 4.0])
    assert f.bounded and f.low == pytest.approx(0.5) and f.high == pytest.approx(0.5)


# ---- TOST ----------------------------------------------------------------------------------------------------
def test_tost_lakens_paired_example():
    L = LAKENS
    se = L["sd"] / math.sqrt(L["n"])
    r = stats.tost(L["diff"], se, L["n"] - 1, -L["margin"], L["margin"], alpha=0.05)
    assert r.t_lower == pytest.approx(L["t1"], abs=5e-7)
    assert r.p_lower == pytest.approx(L["p1"], rel=1e-6)
    assert r.t_upper == pytest.approx(L["t2"], abs=5e-7)
    assert r.p_upper == pytest.approx(L["p2"], rel=1e-6)
    assert r.p == r.p_upper and r.df == 64
    assert r.interval == pytest.approx(L["ci90"], abs=5e-8)
    assert r.equivalent


def test_paired_tost_lakens_example_from_samples():
    # 65 pairs whose differences have the example's mean and sd: the same published numbers.
    L = LAKENS
    base = [5.0 + 0.01 * i for i in range(L["n"])]
    a = [x + L["diff"] + L["sd"] * u for x, u in zip(base, standardized(L["n"]))]
    r = stats.paired_tost(a, base, L["margin"])
    assert (r.t_lower, r.t_upper) == pytest.approx((L["t1"], L["t2"]), abs=5e-7)
    assert (r.p_lower, r.p_upper) == pytest.approx((L["p1"], L["p2"]), rel=1e-6)
    assert r.interval == pytest.approx(L["ci90"], abs=5e-8) and r.equivalent


def test_tost_ncss_welch_example_is_not_equivalent():
    iv = stats.welch_difference(YIELD_A, YIELD_B)
    r = stats.tost(iv.estimate, iv.se, iv.df, -110, 110, alpha=0.025)
    assert (round(r.p_lower, 5), round(r.p_upper, 5)) == (0.03628, 0.02002)
    assert r.interval == pytest.approx((-120.27336, 104.04259), abs=5e-6)
    assert not r.equivalent  # p_lower 0.036 > 0.025: the 95% interval crosses -110


def test_tost_decision_flips_at_the_interval_ends():
    d = [y - x for x, y in zip(SLEEP_1, SLEEP_2)]
    zeros = [0.0] * len(d)
    lo, hi = stats.mean_interval(d, confidence=0.90).low, stats.mean_interval(d, confidence=0.90).high
    edge = max(abs(lo), abs(hi))
    assert stats.paired_tost(d, zeros, edge * (1 + 1e-9)).equivalent
    assert not stats.paired_tost(d, zeros, edge * (1 - 1e-9)).equivalent
    r = stats.paired_tost(d, zeros, edge)
    assert r.p == pytest.approx(0.05, abs=1e-9)  # the one-sided test at the edge has p = alpha
    assert not r.equivalent  # p = alpha does not reject: the interval must lie strictly inside


def test_tost_without_variance():
    r = stats.paired_tost([1.0, 1.0, 1.0], [0.9, 0.9, 0.9], margin=0.2)
    assert r.equivalent and r.p == 0.0
    r = stats.paired_tost([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], margin=0.2)
    assert not r.equivalent and r.p == 1.0


# ---- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda: stats.mean_se([1.0]),
    lambda: stats.mean_interval([]),
    lambda: stats.mean_interval([1.0, math.nan]),
    lambda: stats.mean_interval([1.0, 2.0], confidence=1.0),
    lambda: stats.mean_interval([1.0, 2.0], confidence=95),
    lambda: stats.paired_difference([1.0, 2.0], [1.0, 2.0, 3.0]),
    lambda: stats.paired_difference([1.0], [2.0]),
    lambda: stats.paired_difference(["x", "y"], [1.0, 2.0]),
    lambda: stats.paired_ratio([1.0, 0.0], [1.0, 1.0]),
    lambda: stats.paired_ratio([1.0, 2.0], [1.0, -1.0]),
    lambda: stats.paired_ratio_upper_bound([1.0], [1.0]),
    lambda: stats.welch_difference([1.0], [1.0, 2.0]),
    lambda: stats.paired_fieller_ratio([1.0], [1.0]),
    lambda: stats.fieller_ratio(1, 1, -1, 1, 0, 5),
    lambda: stats.fieller_ratio(1, 1, 1, 1, 2, 5),
    lambda: stats.fieller_ratio(1, 1, 1, 1, 0, 0),
    lambda: stats.fieller_ratio(1, math.inf, 1, 1, 0, 5),
    lambda: stats.tost(0, 1, 5, 1, -1),
    lambda: stats.tost(0, 1, 5, -1, 1, alpha=0.5),
    lambda: stats.tost(0, -1, 5, -1, 1),
    lambda: stats.paired_tost([1.0, 2.0], [1.0, 2.0], margin=0),
    lambda: stats.paired_tost([1.0], [1.0], margin=1),
    lambda: stats.t_interval(0, -1, 5),
    lambda: stats.t_upper_bound(0, 1, 5, confidence=0),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("call, says", [
    (lambda: stats.paired_difference([1, 2], [1]), "differ in length"),
    (lambda: stats.paired_ratio_upper_bound([1, 2], [1]), "differ in length"),
    (lambda: stats.t_interval(math.nan, 1, 5), "finite"),
    (lambda: stats.t_upper_bound(math.inf, 1, 5), "finite"),
    (lambda: stats.mean_se(["1", "2"]), "not a sequence of numbers"),
    (lambda: stats.mean_se([True, False]), "not a sequence of numbers"),
])
def test_bad_input_names_the_fault(call, says):
    with pytest.raises(ValueError, match=says):
        call()


def test_missing_scipy_says_how_to_install(monkeypatch):
    import builtins
    import importlib
    import sys
    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name == "scipy" or name.startswith("scipy."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    monkeypatch.delitem(sys.modules, "studies.lib.stats")
    with pytest.raises(ImportError, match=r"needs scipy: apt-get install python3-scipy.*" + sys.executable.replace(".", r"\.")):
        importlib.import_module("studies.lib.stats")
    monkeypatch.setattr(builtins, "__import__", real_import)
    monkeypatch.setitem(sys.modules, "studies.lib.stats", stats)
