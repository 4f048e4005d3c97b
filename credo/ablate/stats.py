"""Statistics over seeds for `credo ablate` and `credo report`.

Student-t intervals of a mean, Welch's two-sample t-test, the paired t-test (variants that share each seed's
warm-up), Hedges' g with its noncentral-t interval (independent groups), g_av for paired designs (Cumming's d_av,
Hedges-corrected, with Algina & Keselman's interval), and Holm-Bonferroni adjusted p-values over one table's
comparisons. The seeds of a variant are independent draws of the metric. The statistics (means, variances,
standard errors, degrees of freedom, t) are computed here; scipy supplies only the Student-t distribution's
quantile and tail (`scipy.special.stdtrit`, `stdtr`), the noncentral t's cdf (`nctdtr`) and log-gamma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import gammaln, nctdtr, stdtr, stdtrit

NAN = float("nan")


@dataclass(frozen=True)
class MeanCI:
    """A metric over one variant's seeds."""

    n: int
    """Number of finite values (finished seeds that logged the metric)."""
    mean: float
    """Their mean; nan when n = 0."""
    std: float
    """Their sample standard deviation (divisor n - 1); nan when n < 2."""
    low: float
    """Lower end of the Student-t confidence interval of the mean; nan when n < 2."""
    high: float
    """Upper end of that interval; nan when n < 2."""


@dataclass(frozen=True)
class WelchDiff:
    """mean(a) - mean(b) with Welch's unequal-variance t-test."""

    diff: float
    """Difference of the means; nan when either group is empty."""
    low: float
    """Lower end of the confidence interval of the difference; nan when either group has n < 2."""
    high: float
    """Upper end of that interval."""
    df: float
    """Welch-Satterthwaite degrees of freedom; nan when either group has n < 2 or both have zero variance."""
    t: float
    """diff / standard error; +-inf when both variances are 0 and the means differ, nan when 0 / 0."""
    p: float
    """Two-sided p-value of t."""
    d: float = NAN
    """Cohen's d: diff in units of the pooled standard deviation
    sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2)); +-inf when both variances are 0 and the
    means differ, nan when either group has n < 2 or 0 / 0. The testbed's "separation in std"."""

    @property
    def excludes_zero(self) -> bool:
        """Whether the confidence interval lies wholly above or below 0 (False when it is nan)."""
        return self.low > 0 or self.high < 0


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t distribution with df degrees of freedom (df may be fractional)."""
    return float(stdtrit(df, q))


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for T ~ Student-t(df)."""
    return float(2.0 * stdtr(df, -abs(t)))


def _mean_var(values: list[float]) -> tuple[int, float, float]:
    n = len(values)
    if n == 0:
        return 0, NAN, NAN
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else NAN
    return n, mean, var


def mean_ci(values: list[float], confidence: float = 0.95) -> MeanCI:
    """Mean, sample standard deviation and the Student-t confidence interval of the mean.

    The interval is mean +- t(1 - (1 - confidence) / 2, n - 1) * s / sqrt(n), with s the sample standard
    deviation: exact for normally distributed values, approximate otherwise. With n = 1 there is no estimate
    of the spread, so std and the interval are nan (reported as "—"); with zero variance the interval is
    the single point mean.

    Args:
        values: one number per seed (finite floats).
        confidence: the interval's coverage, 0.95 for a 95% interval.
    """
    n, mean, var = _mean_var(values)
    if n < 2:
        return MeanCI(n=n, mean=mean, std=NAN, low=NAN, high=NAN)
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(var / n)
    return MeanCI(n=n, mean=mean, std=math.sqrt(var), low=mean - half, high=mean + half)


def welch_diff(a: list[float], b: list[float], confidence: float = 0.95) -> WelchDiff:
    """mean(a) - mean(b), its Welch confidence interval and Welch's two-sided t-test p-value.

    Welch's test does not assume equal variances: with v = var / n per group (sample variance, divisor
    n - 1), the standard error is se = sqrt(v_a + v_b), t = (mean_a - mean_b) / se, and the
    Welch-Satterthwaite degrees of freedom are df = (v_a + v_b)^2 / (v_a^2 / (n_a - 1) + v_b^2 / (n_b - 1)).
    The interval is diff +- t(1 - (1 - confidence) / 2, df) * se and p = P(|T_df| >= |t|), as
    scipy.stats.ttest_ind(a, b, equal_var=False) gives them.

    Also Cohen's d, the difference in units of the pooled standard deviation (see `WelchDiff.d`).

    Edge cases: a group with n < 2 has no variance estimate, so everything but diff is nan. Both variances
    0 (every seed gave the same value within each group): se = 0, the interval is the single point diff,
    df is nan, and t = +-inf with p = 0 when the means differ, t = p = nan when they are equal.

    Args:
        a: one number per seed of the variant.
        b: one number per seed of the baseline.
        confidence: the interval's coverage, 0.95 for a 95% interval.
    """
    return welch_from_moments(*_mean_var(a), *_mean_var(b), confidence=confidence)


def welch_from_moments(n_a: int, mean_a: float, var_a: float, n_b: int, mean_b: float, var_b: float,
                       confidence: float = 0.95) -> WelchDiff:
    """`welch_diff` from each group's size, mean and sample variance (divisor n - 1) instead of its values:
    for a published table that kept only those (benchmarks/legacy_table_stats.py)."""
    diff = mean_a - mean_b
    if n_a < 2 or n_b < 2:
        return WelchDiff(diff=diff, low=NAN, high=NAN, df=NAN, t=NAN, p=NAN)
    pooled = math.sqrt(((n_a - 1) * var_a + (n_b - 1) * var_b) / (n_a + n_b - 2))
    d = diff / pooled if pooled > 0 else (math.copysign(math.inf, diff) if diff != 0 else NAN)
    v_a, v_b = var_a / n_a, var_b / n_b
    se = math.sqrt(v_a + v_b)
    if se == 0:
        t = math.copysign(math.inf, diff) if diff != 0 else NAN
        return WelchDiff(diff=diff, low=diff, high=diff, df=NAN, t=t, p=0.0 if diff != 0 else NAN, d=d)
    df = (v_a + v_b) ** 2 / (v_a ** 2 / (n_a - 1) + v_b ** 2 / (n_b - 1))
    t = diff / se
    half = t_quantile(0.5 + confidence / 2, df) * se
    return WelchDiff(diff=diff, low=diff - half, high=diff + half, df=df, t=t, p=two_sided_p(t, df), d=d)


# ------------------------------------------------------------------ paired differences, effect size, Holm


@dataclass(frozen=True)
class PairedDiff:
    """mean(a - b) over matched pairs (the same seed and warm-up) with the paired t-test."""

    n: int
    """Number of pairs."""
    diff: float
    """Mean of the per-pair differences (= mean(a) - mean(b) over the pairs)."""
    low: float
    """Lower end of the Student-t confidence interval of the mean difference; nan when n < 2."""
    high: float
    """Upper end of that interval."""
    df: float
    """n - 1; nan when n < 2."""
    t: float
    """diff / (sd of the differences / sqrt(n)); +-inf when every pair differs by the same nonzero amount."""
    p: float
    """Two-sided p-value of t (as scipy.stats.ttest_rel gives it)."""


def paired_diff(a: list[float], b: list[float], confidence: float = 0.95) -> PairedDiff:
    """The paired t-test of a against b, a[i] and b[i] being one pair (e.g. one seed with its warm-up).

    Pairing removes what the two members of a pair share (here the warm-up and the seed's data order) from
    the comparison: the statistic is the one-sample t of the differences a[i] - b[i]. Edge cases: n < 2
    gives diff only; differences that are all equal give se = 0, the interval the point diff, and
    t = +-inf, p = 0 (nan, nan when they are all 0).
    """
    if len(a) != len(b):
        raise ValueError(f"paired_diff: {len(a)} values against {len(b)}; expected one value of each per pair")
    n, mean, var = _mean_var([x - y for x, y in zip(a, b)])
    if n < 2:
        return PairedDiff(n=n, diff=mean, low=NAN, high=NAN, df=NAN, t=NAN, p=NAN)
    se = math.sqrt(var / n)
    if se == 0:
        t = math.copysign(math.inf, mean) if mean != 0 else NAN
        return PairedDiff(n=n, diff=mean, low=mean, high=mean, df=n - 1, t=t, p=0.0 if mean != 0 else NAN)
    half = t_quantile(0.5 + confidence / 2, n - 1) * se
    t = mean / se
    return PairedDiff(n=n, diff=mean, low=mean - half, high=mean + half, df=n - 1, t=t, p=two_sided_p(t, n - 1))


@dataclass(frozen=True)
class EffectSize:
    """A standardized difference of means: Hedges' g (independent groups) or g_av (paired), bias-corrected."""

    g: float
    """J(df) * (mean_a - mean_b) / s (s pooled for 'g', the root mean of the two variances for 'g_av'); +-inf when
    the standardizer is 0 and the means differ."""
    low: float
    """Lower end of its confidence interval (noncentral t); nan when undefined (too few values, or g infinite)."""
    high: float
    """Upper end of that interval."""
    kind: str = "g"
    """'g' (Hedges' g, independent groups) or 'g_av' (paired: `paired_g_av`)."""


def hedges_correction(df: float) -> float:
    """J(df) = Gamma(df/2) / (sqrt(df/2) Gamma((df-1)/2)), the exact small-sample bias factor of Cohen's d
    (Hedges 1981); about 1 - 3 / (4 df - 1). df = n_a + n_b - 2 > 1."""
    return math.exp(gammaln(df / 2) - gammaln((df - 1) / 2)) / math.sqrt(df / 2)


def _ncp_for_cdf(q: float, df: float, t: float) -> float:
    """The noncentrality lambda at which P(T <= t) = q for T ~ noncentral t(df, lambda); the cdf falls as lambda rises."""
    def excess(ncp: float) -> float:
        return float(nctdtr(df, ncp, t)) - q

    lo, hi = t - 2.0, t + 2.0
    while excess(lo) < 0:
        lo -= 2 * (t - lo + 1)
    while excess(hi) > 0:
        hi += 2 * (hi - t + 1)
    for _ in range(200):  # bisection: the cdf is monotone in lambda; stop at the float resolution
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def hedges_g(a: list[float], b: list[float], confidence: float = 0.95) -> EffectSize:
    """Hedges' g of a against b with its confidence interval (groups treated as independent).

    d = (mean_a - mean_b) / s_p, s_p = sqrt(((n_a-1) s_a^2 + (n_b-1) s_b^2) / (n_a + n_b - 2)); g = J(df) d.
    Interval: t = d / sqrt(1/n_a + 1/n_b) follows a noncentral t with df = n_a + n_b - 2 degrees of freedom
    and noncentrality delta * sqrt(...) under normality; the interval of delta inverts its cdf at t
    (Steiger & Fouladi 1997) and is scaled by J like g. At n = 5 per group it is wide (g = 3 gives about
    [1.1, 4.8]): a separation of 3 std is a point estimate, its lower end the guaranteed part.
    """
    return hedges_g_from_moments(*_mean_var(a), *_mean_var(b), confidence=confidence)


def hedges_g_from_moments(n_a: int, mean_a: float, var_a: float, n_b: int, mean_b: float, var_b: float,
                          confidence: float = 0.95) -> EffectSize:
    """`hedges_g` from each group's size, mean and sample variance (divisor n - 1) instead of its values."""
    if n_a < 2 or n_b < 2:
        return EffectSize(g=NAN, low=NAN, high=NAN)
    df = n_a + n_b - 2
    pooled = math.sqrt(((n_a - 1) * var_a + (n_b - 1) * var_b) / df)
    diff = mean_a - mean_b
    if pooled == 0:
        g = math.copysign(math.inf, diff) if diff != 0 else NAN
        return EffectSize(g=g, low=NAN, high=NAN)
    j, scale = hedges_correction(df), math.sqrt(1 / n_a + 1 / n_b)
    d = diff / pooled
    alpha = 1 - confidence
    t = d / scale
    low, high = _ncp_for_cdf(1 - alpha / 2, df, t) * scale, _ncp_for_cdf(alpha / 2, df, t) * scale
    return EffectSize(g=j * d, low=j * low, high=j * high)


def paired_g_av(a: list[float], b: list[float], confidence: float = 0.95) -> EffectSize:
    """g_av of a against b for paired values (a[i], b[i] one pair): Cumming's d_av, Hedges-corrected.

    d_av = mean(a - b) / s_av with s_av = sqrt((s_a^2 + s_b^2) / 2), the two conditions' own standard deviations
    (Cumming 2012, *Understanding the New Statistics*, ch. 11; Lakens 2013, doi:10.3389/fpsyg.2013.00863), and
    g_av = J(n - 1) d_av with n pairs (Cumming's small-sample correction for a paired design; `hedges_correction`).
    Why g_av and not g_z (the mean difference over the differences' std): g_av is in the units of the seeds'
    spread, as the independent-groups g is, so "the variants separate by 3 std" means the same in both designs;
    g_z grows as the pairs correlate, however little the two distributions separate. Pairing still sharpens the
    test (the paired t), not the effect size.

    Interval (approximate, Algina & Keselman 2003, doi:10.1177/0013164403256358): the paired t = mean(a - b) /
    (s_diff / sqrt(n)) follows a noncentral t with n - 1 degrees of freedom and noncentrality
    delta_av * sqrt(n) * s_av / s_diff; the interval of that noncentrality (inverting its cdf at t) is mapped to
    delta_av with the sample ratio s_av / s_diff taken as known, then scaled by J like g_av.

    Edge cases: fewer than 3 pairs (J(n - 1) needs n - 1 > 1): nan. s_av = 0 (no spread in either variant):
    +-inf when the means differ, nan when equal. Differences all equal (s_diff = 0): g_av with no interval.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_g_av: {len(a)} values against {len(b)}; expected one value of each per pair")
    n, mean_a, var_a = _mean_var(a)
    _, mean_b, var_b = _mean_var(b)
    if n < 3:
        return EffectSize(g=NAN, low=NAN, high=NAN, kind="g_av")
    diff = mean_a - mean_b
    s_av = math.sqrt((var_a + var_b) / 2)
    if s_av == 0:
        return EffectSize(g=math.copysign(math.inf, diff) if diff != 0 else NAN, low=NAN, high=NAN, kind="g_av")
    j = hedges_correction(n - 1)
    _, _, var_d = _mean_var([x - y for x, y in zip(a, b)])
    if var_d == 0:
        return EffectSize(g=j * diff / s_av, low=NAN, high=NAN, kind="g_av")
    s_d = math.sqrt(var_d)
    t = diff / (s_d / math.sqrt(n))
    alpha = 1 - confidence
    scale = s_d / (math.sqrt(n) * s_av)  # noncentrality -> delta_av
    low, high = _ncp_for_cdf(1 - alpha / 2, n - 1, t) * scale, _ncp_for_cdf(alpha / 2, n - 1, t) * scale
    return EffectSize(g=j * diff / s_av, low=j * low, high=j * high, kind="g_av")


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given; nan stays nan and is not counted in the family.

    With the m finite p-values sorted ascending p_(1) <= ... <= p_(m), the adjusted value of p_(k) is
    max over j <= k of min(1, (m - j + 1) p_(j)): a comparison is declared at level alpha exactly when Holm's
    step-down procedure (reject p_(k) while p_(k) <= alpha / (m - k + 1)) rejects it. Controls the chance of
    any false verdict in the family at alpha, with no assumption about how the comparisons depend on one another.
    """
    finite = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(finite)
    out = [NAN] * len(p_values)
    running = 0.0
    for k, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out
