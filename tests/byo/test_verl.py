"""credo.integrations.verl against the installed verl: credo's losses and estimators through verl's own calls.

verl 0.9.1 pins transformers below 5.11, under credo's, so it lives in a venv of its own and these tests skip in
credo's venv (and so in CI's `make test`). Run them with `make test-verl` (creates .venv-verl: the CPU torch of
constraints-cpu.txt, verl, and credo from this checkout).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed here: it pins transformers<5.11, below credo's pin; "
                                   "run these tests in their own venv with `make test-verl`")

from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import credo.integrations.verl as credo_verl  # noqa: E402
from credo import algos  # noqa: E402

B, P, T = 6, 3, 7


def actor_config(loss_mode: str, agg_mode: str, **fields) -> ActorConfig:
    """verl's actor config as verl builds it from a YAML section (omega_conf_to_dataclass)."""
    section = {"_target_": "verl.workers.config.ActorConfig", "strategy": "fsdp", "rollout_n": 2,
               "ppo_mini_batch_size": B, "ppo_micro_batch_size_per_gpu": B, "loss_agg_mode": agg_mode,
               "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": loss_mode}, **fields}
    config = omega_conf_to_dataclass(section)
    assert isinstance(config, ActorConfig)
    return config


def batch(seed: int, *, dp_size: int = 1, global_counts: bool = False, is_weights=None) -> tuple[TensorDict, torch.Tensor]:
    """A padded micro-batch as verl's actor receives it, and the current log-probs over every real token
    (prompt and response, verl's no-padding layout) as a leaf tensor to take gradients against."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    mask[4, 5:] = 0
    attention = torch.cat([torch.ones(B, P), mask], 1).long()
    old = -torch.rand(B, T, generator=g) * 3
    fields = {"prompts": torch.randint(3, 100, (B, P), generator=g), "responses": torch.randint(3, 100, (B, T), generator=g),
              "attention_mask": attention, "response_mask": mask, "old_log_probs": old,
              # both signs, so PPO's upper clip (A > 0) and dual clip (A < 0) both act
              "advantages": torch.tensor([1.5, -2.0, 0.7, -0.4, 2.2, -1.1]).unsqueeze(1).expand(B, T).clone()}
    if is_weights is not None:
        fields["rollout_is_weights"] = is_weights
    data = TensorDict(fields, batch_size=[B])
    tu.assign_non_tensor_data(data, "dp_size", dp_size)
    tu.assign_non_tensor_data(data, "batch_num_tokens", int(mask.sum()) * dp_size + 3 if global_counts else None)
    tu.assign_non_tensor_data(data, "global_batch_size", B * dp_size + 1 if global_counts else None)
    # current log-probs: the old ones moved by up to +-1.2 nats, so ratios leave [0.8, 1.2] and reach past c = 3
    moved = old + (torch.rand(B, T, generator=g) - 0.5) * 2.4
    moved[1, :2] = old[1, :2] + 1.5  # A < 0 and ratio e^1.5 = 4.5 > 3: the dual clip binds
    seq_log_probs = [torch.cat([-torch.rand(P, generator=g), moved[i, :int(mask[i].sum())]]) for i in range(B)]
    # verl shifts the model output one token left (position t predicts token t + 1): put each response
    # log-prob one slot earlier, so the response slice verl takes is exactly `moved`
    flat = torch.cat([torch.cat([s[1:], s[:1]]) for s in seq_log_probs])
    return data, flat.detach().requires_grad_()


def response_view(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] response values of a flat no-padding tensor (verl's shift: token t + 1 at position t), 0 in padding."""
    out = torch.zeros(mask.shape, dtype=flat.dtype)
    offset = 0
    for i, n in enumerate(mask.sum(1).long().tolist()):
        out[i, :n] = flat[offset + P - 1:offset + P + n - 1]
        offset += P + n
    return out


def verl_loss(loss_mode: str, agg_mode: str, seed: int = 0, **kw) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(loss, d loss / d log-probs, metrics) of verl's actor loss call (`verl.workers.utils.losses.ppo_loss`)."""
    fields = kw.pop("fields", {})
    data, log_probs = batch(seed, **kw)
    loss, metrics = ppo_loss(actor_config(loss_mode, agg_mode, **fields), {"log_probs": log_probs}, data)
    loss.backward()
    return loss.detach(), log_probs.grad, metrics


AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("counts", ["local", "global"])
def test_credo_ppo_equals_verls_vanilla_loss_and_gradient(agg_mode, counts):
    kw = {"dp_size": 2, "global_counts": True} if counts == "global" else {}
    ours, g_ours, m_ours = verl_loss("credo_ppo", agg_mode, **kw)
    theirs, g_theirs, m_theirs = verl_loss("vanilla", agg_mode, **kw)
    assert g_ours.abs().sum() > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-6, atol=1e-7)
    # the clip and the dual clip both acted, and credo's metrics reach verl's metric dict
    assert m_ours["actor/clipfrac_high"].values[0] > 0 and m_ours["actor/dual_clipfrac"].values[0] > 0
    assert m_theirs["actor/pg_clipfrac_lower"].values[0] > 0


def test_verls_actor_fields_reach_the_credo_loss():
    """clip_ratio_low/high, clip_ratio_c and verl's rollout-correction weights, as verl's vanilla reads them."""
    w = torch.rand(B, T, generator=torch.Generator().manual_seed(5)) * 2
    fields = {"clip_ratio_low": 0.1, "clip_ratio_high": 0.35, "clip_ratio_c": 2.5}
    ours, g_ours, _ = verl_loss("credo_ppo", "token-mean", is_weights=w, fields=fields)
    theirs, g_theirs, _ = verl_loss("vanilla", "token-mean", is_weights=w, fields=fields)
    default, _, _ = verl_loss("credo_ppo", "token-mean", is_weights=w)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(ours, default)  # the fields changed the loss


def test_credo_mipu_runs_through_verls_loss_call_with_verls_correction_weights():
    """A credo-only loss: verl's token-level truncated IS weights (threshold 2) are MIPU's min(pi_old / mu, 2),
    so verl's loss call with credo_mipu equals credo's mipu computing its weights from the sampler log-probs."""
    data, log_probs = batch(1)
    old, mask = data["old_log_probs"], data["response_mask"]
    mu = old + torch.randn(B, T, generator=torch.Generator().manual_seed(2)) * 0.6
    weights, _, _ = compute_rollout_correction_and_rejection_mask(old, mu, mask, rollout_is="token",
                                                                  rollout_is_threshold=2.0)
    ours, g_ours, metrics = verl_loss("credo_mipu", "seq-mean-token-mean", seed=1,
                                      is_weights=weights.batch["rollout_is_weights"])
    resp = response_view(log_probs.detach(), mask).requires_grad_()
    ref, _ = algos.POLICY_LOSSES["mipu"](resp, old, data["advantages"], mask, rollout_log_probs=mu, w_max=2.0,
                                         agg_mode="seq-mean-token-mean")
    ref.backward()
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(response_view(g_ours, mask), resp.grad, rtol=1e-6, atol=1e-7)
    assert "actor/mipu_w_mean" in metrics
    ppo_only, _, _ = verl_loss("credo_ppo", "seq-mean-token-mean", seed=1)
    assert not torch.allclose(ours, ppo_only)  # the weights acted
    assert g_ours.abs().sum() > 0


def advantage_batch(seed: int) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(8, 5)
    mask[3, 2:] = 0
    rewards = torch.zeros(8, 5)
    rewards[torch.arange(8), (mask.sum(1) - 1).long()] = torch.rand(8, generator=g).round() + torch.rand(8, generator=g)
    import numpy as np

    uids = np.array(["p0", "p0", "p0", "p0", "p1", "p1", "p1", "p1"], dtype=object)
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uids})


def estimate(name: str, data: DataProto, config: AlgoConfig) -> torch.Tensor:
    """verl's generic advantage call (`ray_trainer.compute_advantage` for every estimator but gae and grpo; that
    module imports verl's serving stack, which its wheel does not install): the registry, these keywords."""
    fn = core_algos.get_adv_estimator_fn(name)
    kwargs = {"token_level_rewards": data.batch["token_level_rewards"], "response_mask": data.batch["response_mask"],
              "config": config, "index": data.non_tensor_batch["uid"]}
    if name == "grpo":  # ray_trainer's own branch for verl's grpo passes the flag, not the config
        kwargs = {**kwargs, "norm_adv_by_std_in_grpo": config.norm_adv_by_std_in_grpo}
        del kwargs["config"]
    advantages, returns = fn(**kwargs)
    assert torch.equal(advantages, returns)
    return advantages


@pytest.mark.parametrize("name, norm_std", [("grpo", True), ("grpo", False), ("rloo", True)])
def test_credo_estimators_equal_verls(name, norm_std):
    config = AlgoConfig(norm_adv_by_std_in_grpo=norm_std)
    ours = estimate(f"credo_{name}", advantage_batch(0), config)
    theirs = estimate(name, advantage_batch(0), config)
    assert ours.abs().sum() > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_importing_verl_registers_credo_through_the_entry_point():
    """A fresh interpreter that imports only verl (as verl's Ray workers do) finds credo's names."""
    code = ("import sys, verl\nfrom verl.trainer.ppo import core_algos as c\n"
            "assert 'credo.integrations.verl' in sys.modules\n"
            "print(sorted(n for n in c.POLICY_LOSS_REGISTRY if n.startswith('credo_')))\n"
            "print(sorted(n for n in c.ADV_ESTIMATOR_REGISTRY if n.startswith('credo_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    losses, estimators = out.stdout.strip().splitlines()[-2:]
    assert losses == str(sorted(f"credo_{n}" for n in algos.POLICY_LOSSES))
    assert estimators == str(sorted(f"credo_{n}" for n in credo_verl.OUTCOME_ESTIMATORS))


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match="verl loss_agg_mode 'token-sum' has no credo equivalent"):
        verl_loss("credo_ppo", "token-sum")
    with pytest.raises(ValueError, match="'nope' is not in credo.algos.POLICY_LOSSES"):
        credo_verl.register_loss("credo_nope", "nope")
    with pytest.raises(ValueError, match="'gae' is not an outcome estimator"):
        credo_verl.verl_advantage_estimator("gae")
    assert core_algos.get_policy_loss_fn("credo_cispo").__name__ == "credo_cispo"
