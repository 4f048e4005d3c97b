"""Statistics over seeds for `credo ablate`: Student-t intervals of a mean and Welch's two-sample t-test.

Both treat the seeds of a variant as independent draws of the metric. The statistics (means, variances,
standard errors, Welch-Satterthwaite degrees of freedom, t) are computed here; scipy supplies only the
Student-t distribution's quantile (`scipy.special.stdtrit`) and tail (`scipy.special.stdtr`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import stdtr, stdtrit

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
    n_a, mean_a, var_a = _mean_var(a)
    n_b, mean_b, var_b = _mean_var(b)
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
