"""The palette family's section, its `credo check` errors, the latents' determinism, the diversity metrics, the task."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from credo.config import load_recipe
from credo.errors import ConfigError
from credo.families.palette.source import DiversityHook, group_diversity, latent_for_seed
from credo.families.palette.task import AddTwoWaysTask, columns_answer, strategy, tens_first_answer
from credo.train.batch import Batch
from credo.distributed.rollout import Sample
from credo.train.build import check_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "recipes", "palette.yaml")


def check(*overrides):
    return list(check_run(load_recipe(RECIPE, list(overrides))).notes)


def test_the_recipe_and_the_gpu_config_pass_credo_check():
    check()
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/gpu/palette_qwen3_4b.yaml"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(os.path.join(REPO, "recipes", "gpu", "palette_qwen3_4b.yaml"))
    assert r.palette.enabled and r.rollout.backend == "vllm" and r.model.path == "Qwen/Qwen3-4B"
    assert (r.rollout.prompts_per_step, r.rollout.group_size, r.palette.latent_dim, r.palette.prefix_len) == (64, 8, 64, 8)


def test_a_prefix_the_context_cannot_hold_is_an_error_naming_the_key():
    # tiny context of 40: prompt "47+86=" is 6 tokens, + 24 new tokens leaves room for a prefix of 10
    small = ["model.tiny.max_position_embeddings=40"]
    check(*small, "palette.prefix_len=10")
    with pytest.raises(ConfigError, match=r"config key 'palette.prefix_len' = 11 does not fit: the prefix \(11\) \+ "
                                          r"(eval|train) problem \d+ \(6 tokens\) \+ rollout.max_new_tokens \(24\) = 41 > "
                                          r"the model's context of 40 tokens .*expected palette.prefix_len <= 10"):
        check(*small, "palette.prefix_len=11")
    with pytest.raises(ConfigError, match="config key 'palette.prefix_len' = 300 does not fit"):
        check("palette.prefix_len=300")
    check(*small, "palette.prefix_len=300", "palette.enabled=false")  # no prefix, nothing to hold


@pytest.mark.parametrize("overrides, message", [
    (["palette.eval_z=[1.0, 2.0]"], r"config key 'palette.eval_z' = \[1.0, 2.0\] is out of range: expected a list of "
                                    r"palette.latent_dim = 8 numbers"),
    (["palette.vae_steps=0", "palette.sft_steps=0"], "config key 'palette.sft_steps' = 0 is out of range"),
    (["stages.rollout=credo.train.rollout:PromptRollout"],
     "config key 'stages.rollout' = 'credo.train.rollout:PromptRollout' cannot be used with palette"),
    (["stages.probes=[attention_credit]"], "config keys 'palette.enabled' and 'stages.probes' cannot be used together"),
    (["rollout.max_staleness=1"], "config keys 'rollout.max_staleness' \\(schedule 'fixed_lag'\\) and 'stages.rollout' = "
                                  "'palette' .* do not combine: the first needs 'batch_state'"),
    (["stages.schedule=overlap"], "config keys 'stages.schedule' = 'overlap' and 'stages.rollout' = 'palette'"),
    (["algo.packing=true"], "config keys 'palette.enabled' and 'algo.packing' cannot be used together"),
    (["algo.micro_batch_tokens=512"], "config keys 'palette.enabled' and 'algo.micro_batch_tokens' cannot be used"),
    (["mipu.enabled=true"], "config keys 'palette.enabled' and 'mipu.enabled' cannot be used together: MIPU's"),
    (["palette.prior_scale=0"], "config key 'palette.prior_scale' = 0"),
    (["palette.prfix_len=3"], "did you mean 'palette.prefix_len'"),
])
def test_bad_settings_are_refused_by_check(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check(*overrides)


def test_a_latent_is_a_function_of_its_seed_and_the_prior():
    a = latent_for_seed(123, 6, prior_scale=1.0, inject_frac=1.0)
    assert torch.equal(a, latent_for_seed(123, 6, prior_scale=1.0, inject_frac=1.0))
    assert not torch.equal(a, latent_for_seed(124, 6, prior_scale=1.0, inject_frac=1.0))
    torch.testing.assert_close(latent_for_seed(123, 6, prior_scale=2.5, inject_frac=1.0), 2.5 * a)
    draws = torch.stack([latent_for_seed(s, 4, prior_scale=1.0, inject_frac=1.0) for s in range(4000)])
    assert abs(float(draws.mean())) < 0.05 and abs(float(draws.std()) - 1) < 0.05  # N(0, I)
    zero = [bool((latent_for_seed(s, 4, prior_scale=1.0, inject_frac=0.3) == 0).all()) for s in range(2000)]
    assert abs(sum(zero) / 2000 - 0.7) < 0.04  # 1 - inject_frac draw no latent (z = 0)


def naive_diversity(texts, groups, labels):
    """Per group, then averaged: distinct texts / size; the entropy of the labels; label shares over all texts."""
    rows = {}
    for t, g, lab in zip(texts, groups, labels):
        rows.setdefault(g, []).append((t, lab))
    distinct = sum(len({t for t, _ in m}) / len(m) for m in rows.values()) / len(rows)
    entropy = 0.0
    for m in rows.values():
        for c in Counter(lab for _, lab in m).values():
            entropy -= c / len(m) * math.log(c / len(m))
    return distinct, entropy / len(rows), Counter(labels)


def test_group_diversity_and_the_hook_against_a_naive_count():
    texts = ["7+6+0=13>13", "7+6+0=13>13", "4+8=12>12", "x", "1+1=02>2", "1+1=02>2", "1+1=02>2", "1+1=02>2"]
    groups = [0, 0, 0, 0, 5, 5, 5, 5]
    labels = [strategy(t) for t in texts]
    distinct, entropy, counts = naive_diversity(texts, groups, labels)
    d = group_diversity(texts, groups, strategy)
    assert d["distinct_frac"] / d["groups"] == pytest.approx(distinct)
    assert d["strategy_entropy"] / d["groups"] == pytest.approx(entropy)
    assert labels[:4] == ["columns", "columns", "tens_first", "other"]

    class CharTok:  # the hook decodes the token ids; here each id is a character code
        def batch_decode(self, rows, skip_special_tokens=True):
            return ["".join(map(chr, r)) for r in rows]

    samples = [Sample([1], [ord(c) for c in t], [1] * len(t), [], True) for t in texts]
    out = DiversityHook(CharTok(), strategy, ("columns", "tens_first", "other")).after_sync(
        1, Batch(samples=samples, problems=[None] * 8, group_ids=torch.tensor(groups)))
    assert out["palette/distinct_frac"] == pytest.approx(distinct)
    assert out["palette/strategy_entropy"] == pytest.approx(entropy)
    assert out["palette/strategy_tens_first_frac"] == pytest.approx(counts["tens_first"] / 8)
    assert out["palette/strategy_columns_frac"] == pytest.approx(counts["columns"] / 8)


def test_the_two_strategies_of_add_two_ways():
    assert columns_answer(47, 86, 2) == "7+6+0=13,4+8+1=13>133"
    assert tens_first_answer(47, 86, 2) == "4+8=12,7+6=13>133"
    task = AddTwoWaysTask(500, 100, seed=0)
    problems = [task.train(i) for i in range(len(task))]
    shares = Counter(p.meta["strategy"] for p in problems)
    assert 0.4 < shares["tens_first"] / len(problems) < 0.6
    for p in problems[:50]:
        assert strategy(p.answer) == p.meta["strategy"]
        assert task.score(p.answer, p) == 1.0
        assert task.score(p.answer[:-1] + "7" if p.answer[-1] != "7" else p.answer[:-1] + "8", p) == 0.0
    assert not {p.prompt for p in task.eval_problems()} & {p.prompt for p in problems}
    assert Counter(p.meta["strategy"] for p in AddTwoWaysTask(300, 10, 0, tens_first_frac=0.0).eval_problems()) == \
        Counter({"columns": 10})
