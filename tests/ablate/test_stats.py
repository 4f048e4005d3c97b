"""credo.ablate.stats against hand-computed values and against scipy.stats."""

import math
import random

import pytest
import scipy.stats

from credo.ablate.stats import mean_ci, t_quantile, welch_diff


def student_t_cdf_df2(t):
    """Closed form of Student's t CDF with 2 degrees of freedom: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def student_t_cdf_df4(t):
    """Closed form with 4 degrees of freedom: 1/2 + 3/8 * t / sqrt(1 + t^2/4) * (1 - t^2 / (12 (1 + t^2/4)))."""
    x = t * t / 4
    return 0.5 + 0.375 * t / math.sqrt(1 + x) * (1 - x / (3 * (1 + x)))


def test_mean_ci_by_hand():
    # values 1, 2, 3: mean 2; squared deviations 1 + 0 + 1 = 2, / (n - 1 = 2) -> variance 1, s = 1
    # t(0.975, df 2): solve 1/2 + t / (2 sqrt(2 + t^2)) = 0.975 -> t / sqrt(2 + t^2) = 0.95
    #   -> t^2 = 0.95^2 * 2 / (1 - 0.95^2) = 1.805 / 0.0975 = 18.5128... -> t = 4.302653
    t = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))
    assert t == pytest.approx(4.302653, abs=1e-6)
    assert student_t_cdf_df2(t_quantile(0.975, 2)) == pytest.approx(0.975, abs=1e-12)
    # half width t * s / sqrt(n) = 4.302653 / sqrt(3) = 2.484138 -> [-0.484138, 4.484138]
    r = mean_ci([1.0, 2.0, 3.0])
    assert (r.n, r.mean, r.std) == (3, 2.0, 1.0)
    assert r.low == pytest.approx(-0.484138, abs=1e-6) and r.high == pytest.approx(4.484138, abs=1e-6)


def test_welch_by_hand_equal_sizes():
    # a = 4, 5, 6 (mean 5, variance 1); b = 1, 2, 3 (mean 2, variance 1); diff = 3
    # v = variance / n = 1/3 each; se = sqrt(2/3) = 0.816497; t = 3 / 0.816497 = 3.674235
    # df = (1/3 + 1/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = (4/9) / (1/9) = 4
    # t(0.975, 4) = 2.776445 (tables: 2.776); CI = 3 -+ 2.776445 * 0.816497 = 3 -+ 2.266958
    r = welch_diff([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
    assert r.diff == 3.0 and r.df == pytest.approx(4.0, abs=1e-12)
    assert r.t == pytest.approx(3.674235, abs=1e-6)
    q = t_quantile(0.975, 4)
    assert q == pytest.approx(2.776, abs=5e-4) and student_t_cdf_df4(q) == pytest.approx(0.975, abs=1e-12)
    assert r.low == pytest.approx(0.733042, abs=1e-6) and r.high == pytest.approx(5.266958, abs=1e-6)
    # two-sided p = 2 * (1 - F_4(3.674235)) = 2 * (1 - 0.989344) = 0.021312
    assert r.p == pytest.approx(2 * (1 - student_t_cdf_df4(3.0 / math.sqrt(2 / 3))), rel=1e-9)
    assert r.p == pytest.approx(0.021312, abs=1e-6) and r.excludes_zero
    # Cohen's d: pooled variance ((3-1)*1 + (3-1)*1) / (3+3-2) = 1, so d = 3 / 1
    assert r.d == pytest.approx(3.0, rel=1e-12)


def test_welch_by_hand_unequal_sizes_and_variances():
    # a = 2, 4, 6, 8: mean 5, squared deviations 9 + 1 + 1 + 9 = 20, variance 20/3, v_a = 20/3 / 4 = 5/3
    # b = 1, 2, 3: mean 2, variance 1, v_b = 1/3; diff 3; se = sqrt(5/3 + 1/3) = sqrt(2); t = 3 / sqrt(2)
    # df = 2^2 / ((5/3)^2 / 3 + (1/3)^2 / 2) = 4 / (25/27 + 1/18) = 4 / (53/54) = 216/53 = 4.0755 (not pooled: 5)
    r = welch_diff([2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 3.0])
    assert r.diff == 3.0 and r.t == pytest.approx(3 / math.sqrt(2), rel=1e-12)
    assert r.df == pytest.approx(216 / 53, rel=1e-12)
    half = t_quantile(0.975, 216 / 53) * math.sqrt(2)
    assert (r.low, r.high) == pytest.approx((3 - half, 3 + half), rel=1e-12)
    # pooled variance ((4-1) 20/3 + (3-1) 1) / (4+3-2) = 22/5, d = 3 / sqrt(4.4) (Welch's se is not pooled)
    assert r.d == pytest.approx(3 / math.sqrt(4.4), rel=1e-12)


def _samples(rng, n, scale, shift):
    return [rng.gauss(shift, scale) for _ in range(n)]


@pytest.mark.parametrize("n_a,n_b", [(2, 2), (3, 5), (5, 5), (4, 9), (10, 3)])
def test_welch_agrees_with_scipy(n_a, n_b):
    rng = random.Random(100 * n_a + n_b)
    for scale_a, scale_b, shift in [(1.0, 1.0, 0.0), (0.01, 0.2, 0.05), (3.0, 0.5, -2.0), (1e-3, 1e-3, 1e-3)]:
        a, b = _samples(rng, n_a, scale_a, shift), _samples(rng, n_b, scale_b, 0.0)
        ref = scipy.stats.ttest_ind(a, b, equal_var=False)
        ci = ref.confidence_interval(0.95)
        r = welch_diff(a, b)
        assert r.t == pytest.approx(ref.statistic, rel=1e-9)
        assert r.p == pytest.approx(ref.pvalue, rel=1e-7, abs=1e-14)
        assert r.df == pytest.approx(ref.df, rel=1e-9)
        assert (r.low, r.high) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)
        assert r.excludes_zero == (ref.pvalue < 0.05)  # the 95% CI excludes 0 exactly when p < 0.05
        # Cohen's d against the pooled-variance t of scipy's Student test: t_pooled = d / sqrt(1/n_a + 1/n_b)
        pooled = scipy.stats.ttest_ind(a, b, equal_var=True).statistic
        assert r.d == pytest.approx(pooled * math.sqrt(1 / n_a + 1 / n_b), rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 5, 30])
def test_mean_ci_agrees_with_scipy(n):
    rng = random.Random(n)
    x = [rng.uniform(0.3, 0.9) for _ in range(n)]
    low, high = scipy.stats.t.interval(0.95, n - 1, loc=sum(x) / n, scale=scipy.stats.sem(x))
    r = mean_ci(x)
    assert (r.low, r.high) == pytest.approx((low, high), rel=1e-10)
    assert r.std == pytest.approx(scipy.stats.tstd(x), rel=1e-12)


def test_one_seed_gives_nan_intervals():
    r = mean_ci([0.7])
    assert r.n == 1 and r.mean == 0.7 and math.isnan(r.std) and math.isnan(r.low) and math.isnan(r.high)
    e = mean_ci([])
    assert e.n == 0 and math.isnan(e.mean)
    d = welch_diff([0.7], [0.4, 0.5])
    assert d.diff == pytest.approx(0.25) and all(math.isnan(x) for x in (d.low, d.high, d.df, d.t, d.p, d.d))
    assert not d.excludes_zero
    assert math.isnan(welch_diff([], [0.4, 0.5]).diff)


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # scipy, on its own constant samples
def test_zero_variance_in_both_groups():
    # every seed gave the same value in each group: se = 0, the CI is the point diff, as scipy reports it
    d = welch_diff([0.5, 0.5, 0.5], [0.25, 0.25])
    ref = scipy.stats.ttest_ind([0.5, 0.5, 0.5], [0.25, 0.25], equal_var=False)
    assert (d.diff, d.low, d.high, d.t, d.p, d.d) == (0.25, 0.25, 0.25, math.inf, 0.0, math.inf)
    assert d.t == ref.statistic and d.p == ref.pvalue and d.excludes_zero
    same = welch_diff([0.5, 0.5], [0.5, 0.5])
    assert same.diff == 0 and (same.low, same.high) == (0, 0) and math.isnan(same.p) and not same.excludes_zero
    # zero variance in one group only: the other group's variance carries it, df = n_other - 1
    one = welch_diff([0.5, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4])
    assert one.df == pytest.approx(3.0)
    assert one.p == pytest.approx(scipy.stats.ttest_ind([0.5] * 3, [0.1, 0.2, 0.3, 0.4], equal_var=False).pvalue)
    assert mean_ci([0.5, 0.5]).low == mean_ci([0.5, 0.5]).high == 0.5
