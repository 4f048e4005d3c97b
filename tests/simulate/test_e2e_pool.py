"""benchmarks/e2e_pool.py: pooled tokens/s is total tokens over total time (not a mean of rates), and a round's
ratio pairs the runs of that round; the committed long-tail figures come out of the committed summaries."""

import importlib.util
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("e2e_pool", REPO / "benchmarks" / "e2e_pool.py")
pool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pool)


def test_pooled_rate_weights_each_invocation_by_its_time():
    fast = {"steps": 10, "s_per_step": 0.5, "tokens_per_step": 100}  # 1000 tokens in 5 s
    slow = {"steps": 30, "s_per_step": 2.0, "tokens_per_step": 100}  # 3000 tokens in 60 s
    assert pool.pooled_tokens_per_s([fast, slow]) == pytest.approx(4000 / 65)
    assert pool.pooled_tokens_per_s([fast, slow]) != pytest.approx((200 + 50) / 2)  # not the mean of the rates


def test_round_ratios_pair_runs_and_refuse_unequal_rounds():
    s = {"results": {"a": {"run_tokens_per_s": [200, 300]}, "trl": {"run_tokens_per_s": [100, 150]}}}
    assert pool.round_ratios([s, s], "a", "trl") == [2.0, 2.0, 2.0, 2.0]
    s["results"]["trl"]["run_tokens_per_s"] = [100]
    with pytest.raises(ValueError, match="rounds do not pair"):
        pool.round_ratios([s], "a", "trl")


def test_the_committed_long_tail_figures():
    import json

    files = [REPO / "docs" / "results" / f"e2e_longtail_2026-12-05{x}.json" for x in "bcd"]
    summaries = [json.loads(f.read_text()) for f in files]
    ratio = (pool.pooled_tokens_per_s([s["results"]["chunked_packed"] for s in summaries])
             / pool.pooled_tokens_per_s([s["results"]["trl"] for s in summaries]))
    assert round(ratio, 2) == 2.33  # docs/tail_batching.md, "Early release with packing"
    logs = [math.log(r) for r in pool.round_ratios(summaries, "chunked_packed", "trl")]
    assert len(logs) == 10 and round(math.exp(sum(logs) / len(logs)), 2) == 2.29
