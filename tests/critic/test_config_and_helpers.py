"""The critic: recipe section (bad input at check time), the GPU configs, AsyPPO's helpers against naive loops,
and the objective's entropy mask."""

from __future__ import annotations

from credo.plan import resolve_plan
import os
import subprocess
import sys

import pytest
import torch

from credo import algos
from credo.config import ConfigError, load_recipe
from credo.train.objective import Objective
from tests.e2e.common import REPO


@pytest.mark.parametrize("overrides, message", [
    (["algo.advantage=gae"], "'algo.advantage' = 'gae' needs a value model"),
    (["critic.num_critics=1"], "'critic.num_critics' = 1 needs algo.advantage = 'gae'"),
    (["critic.num_critics=9", "algo.advantage=gae"], "'critic.num_critics' = 9 is out of range: expected <= rollout.group_size (8)"),
    (["critic.num_critics=2", "algo.advantage=gae", "critic.low_frac=0.6", "critic.high_frac=0.5"],
     "expected low_frac + high_frac <= 1"),
    (["critic.num_critics=1", "algo.advantage=gae", "critic.low_frac=0.2"], "'critic.num_critics' = 1 is out of range: expected >= 2"),
    (["critic.num_critics=1", "algo.advantage=gae", "critic.kl_in_reward=0.1"], "'critic.kl_in_reward' = 0.1"),
    (["critic.num_critics=1", "algo.advantage=gae", "stages.advantage=tests.spine.test_stages:x"], "'stages.advantage'"),
    (["critic.num_critics=1", "algo.advantage=gae", "critic.value_clip=0"], "'critic.value_clip' = 0.0 is out of range"),
    (["critic.num_critics=1", "algo.advantage=gae", "critic.lr_typo=1"], "unknown config key 'critic.lr_typo'"),
    (["critic.num_critics=1", "algo.advantage=gae", "algo.advantage_kwargs={values: 1}"], "'algo.advantage_kwargs.values'"),
])
def test_bad_critic_settings_fail_at_load_or_check(overrides, message):
    """At load (the section's values) or by the run plan (names and kwargs), before any warm-up."""
    with pytest.raises(ConfigError) as e:
        resolve_plan(load_recipe(REPO / "recipes" / "quickstart.yaml", overrides))
    assert message in str(e.value)


def test_gae_without_a_critic_fails_at_credo_check():
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/quickstart.yaml", "algo.advantage=gae"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "needs a value model" in p.stderr


@pytest.mark.parametrize("name", ["ppo_qwen3_4b", "asyppo_qwen3_4b"])
def test_gpu_configs_pass_credo_check(name):
    """Config loading reads no model: the hub ids are checked at `credo check` without a download."""
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", f"recipes/gpu/{name}.yaml"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(REPO / "recipes" / "gpu" / f"{name}.yaml")
    assert r.model.path == "Qwen/Qwen3-4B-Base" and r.algo.advantage == "gae"
    if name == "asyppo_qwen3_4b":
        c = r.critic
        assert (c.num_critics, c.path, c.low_frac, c.high_frac, c.value_agg) == (2, "Qwen/Qwen3-0.6B-Base", 0.2, 0.2, "mean")
    else:
        assert r.critic.num_critics == 1 and r.critic.low_frac == r.critic.high_frac == 0


@pytest.mark.parametrize("name", ["ppo", "asyppo"])
def test_testbed_recipes_load(name):
    r = load_recipe(REPO / "recipes" / f"{name}.yaml")
    assert r.critic.num_critics == (2 if name == "asyppo" else 1) and r.algo.advantage == "gae"


def test_critic_shards_match_a_naive_count():
    g = torch.tensor([5, 2, 5, 5, 2, 9, 5, 2])
    for M in (1, 2, 3):
        seen: dict[int, int] = {}
        expected = []
        for x in g.tolist():
            expected.append(seen.get(x, 0) % M)
            seen[x] = seen.get(x, 0) + 1
        assert algos.critic_shards(g, M).tolist() == expected


def test_asyppo_masks_match_a_naive_sort():
    torch.manual_seed(0)
    values = torch.randn(3, 4, 6)
    mask = torch.rand(4, 6) > 0.3
    adv_keep, ent_keep = algos.asyppo_masks(values, mask, 0.25, 0.1)
    toks = [(b, t) for b in range(4) for t in range(6) if mask[b, t]]
    sig = {bt: float(torch.tensor([float(values[m][bt]) for m in range(3)]).std(unbiased=False)) for bt in toks}
    ranked = sorted(toks, key=lambda bt: sig[bt])
    n = len(toks)
    low, high = set(ranked[:int(0.25 * n)]), set(ranked[n - int(0.1 * n):])
    for b in range(4):
        for t in range(6):
            assert bool(adv_keep[b, t]) == (mask[b, t].item() and (b, t) not in low)
            assert bool(ent_keep[b, t]) == (mask[b, t].item() and (b, t) not in high)


def _objective(coef=0.1):
    return Objective(algos.POLICY_LOSSES["ppo"], {}, agg_mode="token-mean", entropy_coef=coef, kl_coef=0.0,
                     kl_estimator=None, norm_len=4)


def _inputs():
    torch.manual_seed(3)
    lp = (torch.randn(2, 5) - 1).requires_grad_()
    ent = (torch.rand(2, 5) * 2).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    common = dict(old_log_probs=lp.detach(), advantages=torch.randn(2, 5), mask=mask, rollout_log_probs=lp.detach(),
                  ref_log_probs=None, weights=None, global_tokens=mask.sum(), global_seqs=torch.tensor(2))
    return lp, ent, mask, common


def test_entropy_mask_none_or_all_true_is_todays_objective():
    lp, ent, mask, common = _inputs()
    base, terms, _ = _objective()(lp, ent, **common)
    masked, terms_m, _ = _objective()(lp, ent, **common, entropy_mask=torch.ones_like(mask))
    assert torch.equal(base, masked) and torch.equal(terms["train/entropy"], terms_m["train/entropy"])
    assert "train/entropy_unfiltered" not in terms


def test_entropy_mask_drops_the_bonus_of_filtered_tokens_only():
    lp, ent, mask, common = _inputs()
    keep = torch.tensor([[1, 0, 1, 1, 1], [0, 1, 1, 0, 1]], dtype=torch.bool)
    loss, terms, _ = _objective(0.1)(lp, ent, **common, entropy_mask=keep)
    loss.backward()
    n = int(mask.sum())
    # d loss / d H_t = -coef / n on kept loss tokens, 0 elsewhere (the normaliser stays all loss tokens)
    expected = torch.where(mask & keep, -0.1 / n, 0.0)
    torch.testing.assert_close(ent.grad, expected)
    h = ent.detach()
    torch.testing.assert_close(terms["train/entropy"], (h * (mask & keep)).sum() / n)
    torch.testing.assert_close(terms["train/entropy_unfiltered"], (h * mask).sum() / n)


def test_resuming_a_checkpoint_from_before_the_critic_section_is_no_config_change():
    from credo.config import recipe_to_dict
    from credo.train.state import config_changes

    new = recipe_to_dict(load_recipe(REPO / "recipes" / "quickstart.yaml"))
    old = {k: v for k, v in new.items() if k != "critic"}
    assert config_changes(old, new) == {}
    on = recipe_to_dict(load_recipe(REPO / "recipes" / "ppo.yaml"))
    assert config_changes({k: v for k, v in on.items() if k != "critic"}, on)["critic.num_critics"] == (None, 1)


def test_explained_variance_matches_its_definition_with_a_biased_critic():
    from credo.families.critic.stage import explained_variance

    g = torch.Generator().manual_seed(0)
    returns = torch.randn(3, 5, generator=g) + 2.0
    values = returns * 0.5 - 1.0 + 0.1 * torch.randn(3, 5, generator=g)  # residuals with a non-zero mean
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, 3:] = mask[2, :2] = False
    r, d = returns[mask].double(), (returns - values)[mask].double()
    want = 1.0 - d.var(unbiased=False).item() / r.var(unbiased=False).item()
    assert explained_variance(returns, values, mask) == pytest.approx(want, rel=1e-9)


def test_unfiltered_entropy_is_normalised_by_the_global_counts():
    """`train/entropy_unfiltered` is aggregated as the bonus term is: over the mini-batch's global counts."""
    obj = Objective(lambda lp, old, adv, mask, **kw: ((lp * 0).sum(), {}), {}, agg_mode="token-mean",
                    entropy_coef=0.0, kl_coef=0.0, kl_estimator=None, norm_len=4)
    ent = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    z = torch.zeros(2, 4)
    _, terms, _ = obj(z, ent, old_log_probs=z, advantages=z, mask=mask, rollout_log_probs=z, ref_log_probs=None,
                      weights=None, global_tokens=torch.tensor(12.0), global_seqs=torch.tensor(4.0),
                      entropy_mask=torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.bool))
    # this rank's 6 loss tokens are half of the mini-batch's 12
    assert float(terms["train/entropy_unfiltered"]) == pytest.approx((1 + 2 + 3 + 4 + 5 + 6) / 12)
    assert float(terms["train/entropy"]) == pytest.approx((1 + 3 + 6) / 12)


def test_critic_stage_builds_one_engine_per_critic_with_its_own_head_seed(monkeypatch):
    """The critic family's stage without DeepSpeed: each critic's value model gets a distinct, run-seeded head, the
    critic's own model (critic.path with critic.tiny) and the policy dtype's bf16 flag."""
    import credo.distributed.engine as eng
    import credo.families.critic.value_model as vm
    import credo.models as models
    from credo.config import recipe_class
    from credo.families.critic.stage import critic_stage
    from credo.train.registry import StageContext

    loaded, built = [], []
    monkeypatch.setattr(models, "resolve_model_path", lambda path, tiny: f"/resolved/{path}/{tiny.hidden_size}")
    monkeypatch.setattr(vm, "load_value_model", lambda path, **kw: loaded.append((path, kw)) or object())
    monkeypatch.setattr(eng, "build_engine", lambda model, **kw: built.append(kw) or model)
    r = recipe_class()()
    r.run.seed, r.model.dtype = 3, "bfloat16"
    r.critic.num_critics, r.critic.path, r.critic.tiny.hidden_size = 2, "tiny", 48
    r.rollout.prompts_per_step, r.rollout.group_size = 4, 4

    def ctx():  # what the builder hands the stage
        return StageContext(rank=0, world=1, recipe=r, tokenizer="tok", policy_path="/policy", section=r.critic)

    stage = critic_stage(ctx())
    assert len(stage.engines) == 2
    assert [p for p, _ in loaded] == ["/resolved/tiny/48"] * 2
    seeds = [kw["head_seed"] for _, kw in loaded]
    assert len(set(seeds)) == 2
    assert all(kw["dtype"] == "bfloat16" and kw["actor_path"] == "/policy" for _, kw in loaded)
    assert all(kw["bf16"] is True for kw in built)
    # each engine takes the critic's optimizer settings; its smallest shard is 4 prompts x (4 // 2 critics) samples
    from credo.train.update import grad_accum_steps

    c = r.critic
    assert built == [dict(lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, grad_clip=c.grad_clip,
                          zero_stage=r.optim.zero_stage, warmup_steps=c.warmup_steps, micro_batch=c.micro_batch_size,
                          grad_accum=grad_accum_steps(4 * 2, c.mini_batches, c.micro_batch_size), bf16=True)] * 2
    r.run.seed = 4  # another run seed, other heads
    loaded.clear()
    critic_stage(ctx())
    assert not set(seeds) & {kw["head_seed"] for _, kw in loaded}
