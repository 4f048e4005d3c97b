"""g_av, the effect size of a paired-by-seed comparison (issue 57, B.4), against a naive reference written with
numpy and scipy's noncentral t; and `credo report` using it for paired comparisons, Hedges' g for Welch ones."""

import math
import random
from pathlib import Path

import numpy as np
import pytest
import scipy.special
import scipy.stats

from credo.ablate.report import summarize_records
from credo.ablate.spec import Comparison, Metric, load_sweep
from credo.ablate.results import read_results
from credo.ablate.stats import hedges_g, paired_g_av

REPO = Path(__file__).resolve().parents[2]


def _root(f, lo, hi):
    for _ in range(80):  # the interval's ends to about 1e-22 of the starting bracket
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def naive_g_av(a, b):
    """Cumming's d_av times J(n - 1), written from the textbook formulas with numpy and Gamma functions."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = len(a)
    s_av = np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    d_av = (a.mean() - b.mean()) / s_av
    df = n - 1
    j = scipy.special.gamma(df / 2) / (np.sqrt(df / 2) * scipy.special.gamma((df - 1) / 2))
    s_d = np.std(a - b, ddof=1)
    t = (a.mean() - b.mean()) / (s_d / np.sqrt(n))
    lo = _root(lambda ncp: scipy.stats.nct.cdf(t, df, ncp) - 0.975, t - 60, t + 60)
    hi = _root(lambda ncp: scipy.stats.nct.cdf(t, df, ncp) - 0.025, t - 60, t + 60)
    scale = s_d / (np.sqrt(n) * s_av)
    return j * d_av, j * lo * scale, j * hi * scale


@pytest.mark.parametrize("n", [3, 5, 8])
def test_g_av_against_a_naive_reference(n):
    rng = random.Random(n)
    for _ in range(4):
        shared = [rng.gauss(0, 0.05) for _ in range(n)]  # the warm-up each pair shares
        a = [s + rng.gauss(0.03, 0.02) for s in shared]
        b = [s + rng.gauss(0.0, 0.03) for s in shared]
        r = paired_g_av(a, b)
        g, lo, hi = naive_g_av(a, b)
        assert r.kind == "g_av"
        assert r.g == pytest.approx(g, rel=1e-10)
        assert (r.low, r.high) == pytest.approx((lo, hi), rel=1e-6, abs=1e-9)
        assert r.low < r.g < r.high


def test_g_av_is_not_the_independent_groups_g_and_edge_cases():
    a, b = [0.61, 0.64, 0.60, 0.66, 0.62], [0.55, 0.59, 0.52, 0.58, 0.56]
    # equal n: the pooled and the averaged variances agree, so d is the same and only J differs (J(4) vs J(8))
    ratio = paired_g_av(a, b).g / hedges_g(a, b).g
    assert ratio == pytest.approx(math.exp(scipy.special.gammaln(2) - scipy.special.gammaln(1.5)) / math.sqrt(2)
                                  / (math.exp(scipy.special.gammaln(4) - scipy.special.gammaln(3.5)) / 2), rel=1e-12)
    assert math.isnan(paired_g_av([1.0, 2.0], [0.0, 0.5]).g)  # 2 pairs: J(1) is undefined
    assert paired_g_av([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]).g == math.inf  # no spread at all, means differ
    same = paired_g_av([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])  # every pair differs by 0.5: a point, no interval
    assert same.g == pytest.approx(0.5 / math.sqrt(math.pi), rel=1e-12)  # s_av = 1, J(2) = 1 / sqrt(pi)
    assert math.isnan(same.low) and math.isnan(same.high)
    with pytest.raises(ValueError, match="one value of each per pair"):
        paired_g_av([1.0, 2.0, 3.0], [1.0])


def _record(variant, seed, value, warmup):
    return {"sweep": "s", "variant": variant, "seed": seed, "warmup_key": warmup, "final": {},
            "curves": {"m": {"0": 0.0, "10": value}}}


def test_report_uses_g_av_for_paired_and_hedges_g_for_welch():
    a, b = [0.61, 0.64, 0.60, 0.66, 0.62], [0.55, 0.59, 0.52, 0.58, 0.56]
    paired = [_record("x", s, v, f"w{s}") for s, v in enumerate(a)] + [_record("y", s, v, f"w{s}") for s, v in enumerate(b)]
    welch = [_record("x", s, v, f"wx{s}") for s, v in enumerate(a)] + [_record("y", s, v, f"wy{s}") for s, v in enumerate(b)]
    metric = Metric("m", "final", label="m final")
    for records, test, kind, ref in [(paired, "paired", "g_av", naive_g_av(a, b)[0]), (welch, "Welch", "g", hedges_g(a, b).g)]:
        c = summarize_records(records, [metric], comparisons=[Comparison("x", "y", ">")]).named[0]
        assert (c.test, c.g.kind) == (test, kind)
        assert c.g.g == pytest.approx(ref, rel=1e-10)


def test_the_8_update_separation_is_2_7_under_g_av():
    """docs/reproductions.md's `ppo > ppo_noclip` at 8 updates a batch: paired by seed, g_av 2.72 (3.07 as if
    the groups were independent)."""
    sweep = load_sweep(REPO / "recipes/testbed/separation_8updates.yaml")
    records = read_results(REPO / sweep.results)
    s = summarize_records(records, sweep.metrics, variants=list(sweep.variants), baseline=sweep.baseline,
                          comparisons=sweep.comparisons)
    noclip = next(c for c in s.named if c.b == "ppo_noclip")
    ppo, other = s.variant("ppo").values[sweep.metrics[0].label], s.variant("ppo_noclip").values[sweep.metrics[0].label]
    seeds = sorted(ppo)
    assert noclip.g.kind == "g_av" and noclip.g.g == pytest.approx(naive_g_av([ppo[k] for k in seeds],
                                                                             [other[k] for k in seeds])[0], rel=1e-10)
    assert round(noclip.g.g, 2) == 2.72
