"""Paired differences, Hedges' g with its interval, and Holm's adjustment against scipy.stats and against
naive references written differently, at the edge cases (n = 2, ties, zero variance)."""

import math
import random

import pytest
import scipy.stats

from credo.ablate.stats import hedges_correction, hedges_g, holm, paired_diff

# ------------------------------------------------------------------------------------------- paired


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_paired_diff_agrees_with_scipy_ttest_rel(n):
    rng = random.Random(n)
    for _ in range(40):
        shared = [rng.gauss(0, 1) for _ in range(n)]  # the warm-up each pair shares
        a = [s + rng.gauss(0.3, 0.2) for s in shared]
        b = [s + rng.gauss(0.0, 0.2) for s in shared]
        r = paired_diff(a, b)
        ref = scipy.stats.ttest_rel(a, b)
        ci = ref.confidence_interval(0.95)
        assert r.t == pytest.approx(ref.statistic, rel=1e-10) and r.p == pytest.approx(ref.pvalue, rel=1e-9)
        assert (r.low, r.high) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)
        assert r.df == n - 1 and r.n == n


def test_paired_diff_by_hand_and_edge_cases():
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3) = 3.4641, df 2;
    # p = 1 - |t| / sqrt(2 + t^2) (closed form of the 2-df t) = 1 - 3.4641 / sqrt(14) = 0.07418
    r = paired_diff([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    assert r.diff == 2.0 and r.t == pytest.approx(2 * math.sqrt(3), rel=1e-12)
    assert r.p == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), rel=1e-10)
    same = paired_diff([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])  # every pair differs by 0.5: no spread at all
    assert (same.diff, same.low, same.high, same.t, same.p) == (0.5, 0.5, 0.5, math.inf, 0.0)
    tied = paired_diff([1.0, 2.0], [1.0, 2.0])
    assert tied.diff == 0.0 and math.isnan(tied.t) and math.isnan(tied.p)
    one = paired_diff([1.0], [0.5])
    assert one.diff == 0.5 and math.isnan(one.low) and math.isnan(one.p)
    with pytest.raises(ValueError, match="one value of each per pair"):
        paired_diff([1.0, 2.0], [1.0])


def test_pairing_removes_the_shared_part():
    """A warm-up shift common to both members of a pair widens Welch's interval, not the paired one."""
    from credo.ablate.stats import welch_diff

    shift = [0.0, 0.05, -0.04, 0.03, -0.02]
    a = [0.60 + s + e for s, e in zip(shift, [0.001, -0.002, 0.0, 0.002, -0.001])]
    b = [0.58 + s for s in shift]
    paired, welch = paired_diff(a, b), welch_diff(a, b)
    assert paired.diff == pytest.approx(welch.diff)
    assert paired.p < 0.001 < 0.05 < welch.p
    assert paired.high - paired.low < (welch.high - welch.low) / 10


# -------------------------------------------------------------------------------------- Hedges' g


def test_hedges_correction_against_gamma_and_its_approximation():
    for df in (2, 3, 4, 8, 18, 40):
        exact = math.gamma(df / 2) / (math.sqrt(df / 2) * math.gamma((df - 1) / 2))
        assert hedges_correction(df) == pytest.approx(exact, rel=1e-12)
        assert hedges_correction(df) == pytest.approx(1 - 3 / (4 * df - 1), abs=0.03 if df < 8 else 1e-3)
    assert hedges_correction(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-12)  # Gamma(1) / Gamma(1/2)


def _bisect(f, lo, hi):
    """Root of a decreasing f on [lo, hi] by plain bisection (the test's own root finder)."""
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("a,b", [([0.61, 0.64, 0.60, 0.66, 0.62], [0.55, 0.57, 0.52, 0.58, 0.56]),
                                 ([1.0, 2.0], [0.0, 0.5]),              # n = 2
                                 ([3.0, 3.0, 4.0], [3.0, 3.0, 4.0]),   # ties, g = 0
                                 ([0.2, 0.1, 0.4, 0.3], [0.5, 0.6, 0.2, 0.7, 0.9, 0.4])])
def test_hedges_g_and_its_interval_against_scipy_nct(a, b):
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    sa = sum((x - ma) ** 2 for x in a)
    sb = sum((x - mb) ** 2 for x in b)
    df = na + nb - 2
    d = (ma - mb) / math.sqrt((sa + sb) / df)
    j = math.gamma(df / 2) / (math.sqrt(df / 2) * math.gamma((df - 1) / 2))
    scale = math.sqrt(1 / na + 1 / nb)
    t = d / scale
    # the interval's ends are the noncentralities at which scipy's noncentral t puts t at its 97.5% / 2.5% point
    lo = _bisect(lambda ncp: scipy.stats.nct.cdf(t, df, ncp) - 0.975, t - 40, t + 40)
    hi = _bisect(lambda ncp: scipy.stats.nct.cdf(t, df, ncp) - 0.025, t - 40, t + 40)
    r = hedges_g(a, b)
    assert r.g == pytest.approx(j * d, rel=1e-12, abs=1e-15)
    assert r.low == pytest.approx(j * lo * scale, rel=1e-6, abs=1e-9)
    assert r.high == pytest.approx(j * hi * scale, rel=1e-6, abs=1e-9)
    assert r.low < r.g < r.high


def test_hedges_g_interval_covers_the_true_effect_95_percent_of_the_time():
    rng = random.Random(7)
    delta, n, trials = 1.5, 5, 1500
    covered = 0
    for _ in range(trials):
        a = [rng.gauss(delta, 1) for _ in range(n)]
        b = [rng.gauss(0, 1) for _ in range(n)]
        r = hedges_g(a, b)
        covered += r.low / hedges_correction(2 * n - 2) <= delta <= r.high / hedges_correction(2 * n - 2)
    # the interval of delta (before J) is exact under normality: 95% +- 3 binomial standard errors
    assert abs(covered / trials - 0.95) < 3 * math.sqrt(0.95 * 0.05 / trials)


def test_hedges_g_edge_cases():
    assert math.isnan(hedges_g([1.0], [0.0, 1.0]).g)
    flat = hedges_g([2.0, 2.0], [1.0, 1.0])  # zero variance in both, means differ
    assert flat.g == math.inf and math.isnan(flat.low)
    assert math.isnan(hedges_g([1.0, 1.0], [1.0, 1.0]).g)


# -------------------------------------------------------------------------------------------- Holm


def holm_by_step_down(p_values, alpha):
    """Which hypotheses Holm's step-down procedure rejects at level alpha (the textbook procedure)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = set()
    for k, i in enumerate(order):
        if p_values[i] <= alpha / (len(p_values) - k):
            rejected.add(i)
        else:
            break
    return rejected


def naive_holm(p_values):
    """The adjusted p-value as the smallest level at which the step-down procedure rejects (a scan of the
    candidate levels), and 1 for a hypothesis no level below 1 rejects."""
    m = len(p_values)
    candidates = sorted({(m - k) * p for k, p in enumerate(sorted(p_values))})
    return [min(1.0, next((a for a in candidates if i in holm_by_step_down(p_values, a * (1 + 1e-12))), 1.0))
            for i in range(m)]


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.5 (m = 4): 4*0.01 = 0.04; 3*0.02 = 0.06; 2*0.03 = 0.06; 1*0.5 = 0.5
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    # monotone: 0.04 -> 3 * 0.04 = 0.12 but an earlier adjusted value is larger
    assert holm([0.045, 0.04, 0.3]) == pytest.approx([0.12, 0.12, 0.3])
    assert holm([0.2]) == [0.2] and holm([]) == []
    assert holm([0.6, 0.9]) == [1.0, 1.0]  # capped at 1


def test_holm_against_the_step_down_procedure_with_ties():
    rng = random.Random(3)
    for m in (1, 2, 3, 6, 8):
        for _ in range(60):
            p = [round(rng.random() ** 3, 2) for _ in range(m)]  # rounding makes ties
            assert holm(p) == pytest.approx(naive_holm(p), abs=1e-12), p


def test_holm_leaves_nan_out_of_the_family():
    out = holm([0.01, float("nan"), 0.02])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
