"""credo.credit.attention against plain-Python loops of the paper's equations (arXiv 2510.13554, Eq. 7-19).

The loops below are written from the docstrings, one token at a time, without the vectorised code's tricks;
ties (integer-valued inputs) and response masks with holes make every comparison and rounding rule matter.
"""

from __future__ import annotations

import math

import pytest
import torch

from credo.credit.attention import (
    RHYTHM_STRATEGIES,
    _window_max,
    attention_rhythm_gamma,
    fai,
    group_heads,
    head_span,
    rhythm_gamma,
    waad,
)
from tests.credit._helpers import random_attention


def naive_top(values, rows, q, largest=True):
    """Indices of the nearest-integer (halves up, at least 1) q share of the response tokens; ties by position."""
    cand = [i for i in range(len(values)) if rows[i]]
    if not cand or q == 0:
        return set()
    count = min(len(cand), max(1, math.floor(q * len(cand) + 0.5 + 1e-9)))
    cand.sort(key=lambda i: ((-values[i]) if largest else values[i], i))
    return set(cand[:count])


def naive_rhythm(w, f, rows, strategy, q=0.4, gamma_amp=1.5, k=3, alpha=0.5, tau_waad=None, tau_delta=None,
                 adv=None, sign_mode="both"):
    n = len(w)
    g = gamma_amp - 1.0
    delta = [abs(w[t] - w[t + 1]) if t + 1 < n and rows[t] and rows[t + 1] else 0.0 for t in range(n)]
    gamma = [1.0] * n
    if strategy == "local":
        for t in naive_top(delta, rows, q):
            gamma[t] += g
    elif strategy == "global":
        for t in naive_top(f, rows, q):
            gamma[t] += g
    else:
        anchors = naive_top(f, rows, q)
        resp_w = sorted(w[t] for t in range(n) if rows[t])
        tw = tau_waad if tau_waad is not None else (resp_w[(len(resp_w) - 1) // 2] if resp_w else math.nan)
        top_d = naive_top(delta, rows, q)
        td = tau_delta if tau_delta is not None else min((delta[t] for t in top_d), default=math.inf)
        intro = set()
        for t in range(n):
            best, at = -math.inf, None
            for u in range(t - 1, t - k - 1, -1):  # closest first; a later one must be strictly larger
                if u >= 0 and rows[u] and delta[u] > best:
                    best, at = delta[u], u
            dominated = t in anchors and w[t] <= tw and best >= td
            if t in anchors:
                gamma[t] += (1 - alpha) * g if dominated else g
            if dominated:
                intro.add(at)
        for u in intro:
            if rows[u]:
                gamma[u] += alpha * g
    for t in range(n):
        if not rows[t]:
            gamma[t] = 1.0
        elif sign_mode == "positive" and not adv[t] >= 0:
            gamma[t] = 1.0
        elif sign_mode == "negative" and not adv[t] < 0:
            gamma[t] = 1.0
    return gamma


def naive_waad(a, window):
    n = a.shape[-1]
    m = a.reshape(-1, n, n).mean(0).tolist()
    return [sum(m[t][s] * min(t - s, window) for s in range(t + 1)) for t in range(n)]


def naive_fai(a, rows, h_lo, h_hi):
    n = a.shape[-1]
    m = a.reshape(-1, n, n).mean(0).tolist()
    out = []
    for s in range(n):
        ts = [t for t in range(n) if rows[t] and s + h_lo <= t <= min(n - 1, s + h_hi)]
        out.append(sum(m[t][s] for t in ts) / len(ts) if ts else 0.0)
    return out


def naive_span(a, rows):
    n = a.shape[-1]
    heads = a.reshape(-1, n, n).tolist()
    r = [t for t in range(n) if rows[t]]
    spans = [sum(h[t][s] * (t - s) for t in r for s in range(t + 1)) / max(len(r), 1) for h in heads]
    return torch.tensor(spans, dtype=a.dtype).reshape(a.shape[:-2])


def _inputs(seed, n=14, hole=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 4, (n,), generator=g).double()  # ties in WAAD and in Delta
    f = torch.randint(0, 5, (n,), generator=g).double()
    rows = torch.rand(n, generator=g) < 0.8 if hole else torch.ones(n, dtype=torch.bool)
    adv = torch.randint(-1, 2, (n,), generator=g).double()  # -1, 0, 1
    return w, f, rows, adv


SETTINGS = [
    {},
    dict(q=0.25),
    dict(q=0.5, gamma_amp=2.0),
    dict(k=1),
    dict(k=2, alpha=0.0),
    dict(k=2, alpha=1.0),
    dict(alpha=0.3, q=0.3),
    dict(tau_waad=1.0),
    dict(tau_delta=2.0),
    dict(tau_waad=0.0, tau_delta=0.0, q=0.6),
    dict(gamma_amp=0.5),
]


@pytest.mark.parametrize("strategy", RHYTHM_STRATEGIES)
@pytest.mark.parametrize("settings", SETTINGS, ids=[str(s) for s in SETTINGS])
def test_rhythm_gamma_matches_the_loop(strategy, settings):
    for seed in range(6):
        w, f, rows, adv = _inputs(seed, hole=seed % 2 == 0)
        for sign_mode in ("both", "positive", "negative"):
            got = rhythm_gamma(w, f, strategy=strategy, response_mask=rows, advantages=adv, sign_mode=sign_mode,
                               **settings)
            want = naive_rhythm(w.tolist(), f.tolist(), rows.tolist(), strategy, adv=adv.tolist(),
                                sign_mode=sign_mode, **settings)
            assert got.dtype == torch.float64 and got.shape == (14,)
            torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12,
                                       msg=lambda m: f"seed {seed} {sign_mode}: {m}")


def test_rhythm_gamma_defaults_are_coupled_both_and_the_paper_constants():
    # without a response mask every token is a response token
    for seed in range(8):
        w, f, _, _ = _inputs(seed, n=20, hole=False)
        want = naive_rhythm(w.tolist(), f.tolist(), [True] * 20, "coupled")
        torch.testing.assert_close(rhythm_gamma(w, f), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_rhythm_gamma_on_a_batch_matches_the_loop_row_by_row():
    w = torch.stack([_inputs(s)[0] for s in range(3)])
    f = torch.stack([_inputs(s)[1] for s in range(3)])
    rows = torch.stack([_inputs(s)[2] for s in range(3)])
    out = rhythm_gamma(w.float(), f, response_mask=rows, k=2)
    assert out.dtype == torch.float32  # the multipliers take WAAD's dtype
    for b in range(3):
        want = naive_rhythm(w[b].tolist(), f[b].tolist(), rows[b].tolist(), "coupled", k=2)
        torch.testing.assert_close(out[b], torch.tensor(want, dtype=torch.float32))


def test_rhythm_gamma_detaches_and_names_its_bad_arguments():
    w, f, rows, adv = _inputs(0)
    out = rhythm_gamma(w.requires_grad_(), f.requires_grad_(), strategy="global")
    assert not out.requires_grad
    with pytest.raises(ValueError, match=r"^strategy='Local', expected one of \('local', 'global', 'coupled'\)$"):
        rhythm_gamma(w, f, strategy="Local")
    with pytest.raises(ValueError, match=r"^k=0, expected a look-back window of at least 1 token$"):
        rhythm_gamma(w, f, k=0)
    for alpha in (-0.1, 1.1):
        with pytest.raises(ValueError, match=rf"^alpha={alpha}, expected a value in \[0, 1\]$"):
            rhythm_gamma(w, f, alpha=alpha)
    with pytest.raises(ValueError, match=r"^fai has shape \[13\], expected \[14\] like waad$"):
        rhythm_gamma(w, f[1:], strategy="coupled")
    with pytest.raises(ValueError, match=r"^fai has shape None, expected \[14\] like waad$"):
        rhythm_gamma(w, None, strategy="coupled")
    with pytest.raises(ValueError, match=r"^response_mask has shape \[13\], expected \[14\]$"):
        rhythm_gamma(w, f, response_mask=rows[1:])
    # the local rule reads no FAI, whatever its shape
    assert rhythm_gamma(w, f[1:], strategy="local").shape == (14,)


def test_window_max_ties_go_to_the_closest_token_and_skip_the_prompt():
    delta = torch.tensor([5.0, 5.0, 0.0, 7.0, 1.0])
    rows = torch.ones(5, dtype=torch.bool)
    best, at = _window_max(delta, rows, 2)
    # t=2: {1: 5, 0: 5} -> the closer 1; t=3: {2: 0, 1: 5} -> 1; t=4: {3: 7, 2: 0} -> 3
    assert best.tolist() == [-math.inf, 5.0, 5.0, 5.0, 7.0]
    assert at.tolist() == [0, 0, 1, 1, 3] and at.dtype == torch.long
    # token 1 outside the response: t=2 sees only token 0, t=3 only token 2
    rows[1] = False
    best, at = _window_max(delta, rows, 2)
    assert best.tolist() == [-math.inf, 5.0, 5.0, 0.0, 7.0] and at.tolist() == [0, 0, 0, 2, 3]
    # a batch of rows with k = 3
    best, at = _window_max(torch.stack([delta, -delta]), torch.ones(2, 5, dtype=torch.bool), 3)
    assert best[1].tolist() == [-math.inf, -5.0, -5.0, 0.0, 0.0] and at[1].tolist() == [0, 0, 1, 2, 2]


# --- head_span / group_heads / waad / fai --------------------------------------------------------


def test_head_span_waad_and_fai_match_the_loops_on_random_maps():
    maps = random_attention(2, 3, n=16, seed=3)  # [L, H, N, N]
    rows = torch.arange(16) >= 5
    rows[9] = False
    span, local, global_ = head_span(maps, rows)
    torch.testing.assert_close(span, naive_span(maps, rows.tolist()))
    # default quantile 0.3: round(1.8) = 2 heads in each group
    assert local.shape == global_.shape == (2, 3) and int(local.sum()) == int(global_.sum()) == 2
    assert span[local].max() < span[~local].min() and span[global_].min() > span[~global_].max()
    span_all, _, _ = head_span(maps[0])
    torch.testing.assert_close(span_all, naive_span(maps[0], [True] * 16))
    for window in (0, 1, 3):
        torch.testing.assert_close(waad(maps, window), torch.tensor(naive_waad(maps, window), dtype=torch.float64))
    torch.testing.assert_close(waad(maps), torch.tensor(naive_waad(maps, 10), dtype=torch.float64))  # W = 10
    for h_lo, h_hi in ((0, 0), (1, 3), (2, 15), (15, 15), (16, 20)):
        torch.testing.assert_close(fai(maps, rows, h_lo, h_hi),
                                   torch.tensor(naive_fai(maps, rows.tolist(), h_lo, h_hi), dtype=torch.float64))


def test_fai_defaults_are_ten_and_one_hundred():
    maps = random_attention(2, n=112, seed=5)
    want = torch.tensor(naive_fai(maps, [True] * 112, 10, 100), dtype=torch.float64)
    torch.testing.assert_close(fai(maps), want)
    # rows 0..9 of the map count for no column; column 0 counts rows 10..100 (not 101..111)
    torch.testing.assert_close(fai(maps)[0], maps.mean(0)[10:101, 0].mean())
    assert bool((fai(maps)[102:] == 0).all())  # fewer than 10 rows ahead


def test_spans_and_windows_ignore_the_upper_triangle_of_a_non_causal_map():
    # weight on future keys (s > t) has distance 0 for the span and WAAD, and is never in FAI's horizon
    a = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.2, 0.7]], dtype=torch.float64)
    span, _, _ = head_span(a[None])
    # rows: 0 -> 0; 1 -> 0.2 * 1; 2 -> 0.1 * 2 + 0.2 * 1 = 0.4; mean over 3 rows = 0.2
    torch.testing.assert_close(span, torch.tensor([0.2], dtype=torch.float64))
    torch.testing.assert_close(waad(a, 1), torch.tensor([0.0, 0.2, 0.3], dtype=torch.float64))
    torch.testing.assert_close(fai(a, h_lo=0, h_hi=2), torch.tensor([0.8 / 3, 0.25, 0.7], dtype=torch.float64))


def test_group_heads_default_quantile_ties_and_bounds():
    span = torch.tensor([3.0, 1.0, 1.0, 2.0, 5.0, 5.0, 0.0, 4.0, 2.0, 3.0])
    local, global_ = group_heads(span)  # 0.3 * 10 = 3 heads each
    assert local.tolist() == [False, True, True, False, False, False, True, False, False, False]
    assert global_.tolist() == [False, False, False, False, True, True, False, True, False, False]
    local, global_ = group_heads(span, 1.0)
    assert bool(local.all()) and bool(global_.all())
    local, global_ = group_heads(span, 0.01)  # at least one head
    assert local.tolist().index(True) == 6 and global_.tolist().index(True) == 4 and int(global_.sum()) == 1
    for quantile in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=rf"^quantile={quantile}, expected a value in \(0, 1\]$"):
            group_heads(span, quantile)


def test_argument_errors_name_the_window_the_horizon_and_the_map_shape():
    a = random_attention(2, n=5, seed=0)
    with pytest.raises(ValueError, match=r"^window=-1, expected a non-negative int$"):
        waad(a, -1)
    for h_lo, h_hi in ((3, 2), (-1, 4)):
        with pytest.raises(ValueError, match=rf"^h_lo={h_lo}, h_hi={h_hi}, expected 0 <= h_lo <= h_hi$"):
            fai(a, None, h_lo, h_hi)
    with pytest.raises(ValueError, match=r"^attention has shape \[5\], expected \[\.\.\., N, N\]$"):
        waad(torch.ones(5))
    with pytest.raises(ValueError, match=r"^attention has shape \[2, 5, 4\], expected \[H, N, N\] or \[L, H, N, N\]$"):
        head_span(a[:, :, :4])
    with pytest.raises(ValueError, match=r"^response_mask has shape \[4\], expected \[5\]$"):
        head_span(a, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^response_mask has shape \[4\], expected \[5\]$"):
        fai(a, torch.ones(4, dtype=torch.bool))


# --- attention_rhythm_gamma ----------------------------------------------------------------------


def _composed(attention, rows, head_quantile=0.3, window=10, h_lo=10, h_hi=100, **rule):
    span = naive_span(attention, rows.tolist())
    local, global_ = group_heads(span, head_quantile)
    w = naive_waad(attention[local], window)
    f = naive_fai(attention[global_], rows.tolist(), h_lo, h_hi)
    return torch.tensor(naive_rhythm(w, f, rows.tolist(), **rule), dtype=torch.float64)


def test_attention_rhythm_gamma_defaults_match_the_loops():
    attention = random_attention(2, 5, n=40, seed=2)
    rows = torch.arange(40) >= 6
    out = attention_rhythm_gamma(attention, rows)
    torch.testing.assert_close(out, _composed(attention, rows, strategy="coupled"))
    assert bool((out > 1).any())


def test_attention_rhythm_gamma_passes_every_keyword():
    attention = random_attention(3, 4, n=24, seed=6)
    rows = torch.arange(24) >= 4
    adv = torch.tensor([1.0, -1.0]).repeat(12)
    kw = dict(head_quantile=0.2, window=3, h_lo=2, h_hi=6)
    rule = dict(q=0.3, gamma_amp=2.0, k=2, alpha=0.25, tau_waad=0.9, tau_delta=0.05)
    for strategy in RHYTHM_STRATEGIES:
        out = attention_rhythm_gamma(attention, rows, strategy=strategy, advantages=adv, sign_mode="negative",
                                     **kw, **rule)
        want = _composed(attention, rows, strategy=strategy, adv=adv.tolist(), sign_mode="negative", **kw, **rule)
        torch.testing.assert_close(out, want)
        assert bool((out > 1).any())
    # all rows when no response mask is given
    out = attention_rhythm_gamma(attention, strategy="global", **kw)
    torch.testing.assert_close(out, _composed(attention, torch.ones(24, dtype=torch.bool), strategy="global", **kw))
