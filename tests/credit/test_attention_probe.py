"""The attention_credit probe: weights on the recompute, label-shifted, baselines, registry and a tiny run."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.config import ConfigError  # noqa: E402
from credo.credit import model_flow_gamma, model_rhythm_gamma  # noqa: E402
from credo.families.attention.probe import AttentionCreditProbe  # noqa: E402
from credo.train.batch import Batch  # noqa: E402
from credo.train.scoring import PolicyScorer  # noqa: E402

# (prompt length, response length) per sample; the last sample does not train (loss mask off).
SHAPES = [(6, 24), (9, 14), (4, 19)]


def tiny_qwen2():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=4, vocab_size=50,
                                      max_position_embeddings=128)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def make_batch(step: int = 1) -> Batch:
    """A packed batch as `pack` lays it out: right-padded, [B, T = L - 1] label-aligned masks."""
    g = torch.Generator().manual_seed(5)
    width = max(p + r for p, r in SHAPES)
    B = len(SHAPES)
    ids = torch.zeros(B, width, dtype=torch.long)
    attn = torch.zeros(B, width, dtype=torch.long)
    resp = torch.zeros(B, width - 1, dtype=torch.bool)
    for b, (p, r) in enumerate(SHAPES):
        ids[b, : p + r] = torch.randint(1, 50, (p + r,), generator=g)
        attn[b, : p + r] = 1
        resp[b, p - 1 : p + r - 1] = True  # column j is token j+1: the response tokens p..p+r-1
    loss = resp.clone()
    loss[2] = False
    batch = Batch(samples=[], problems=[], group_ids=torch.arange(B), step=step)
    batch.input_ids, batch.attention_mask, batch.response_mask, batch.loss_mask = ids, attn, resp, loss
    batch.advantages = torch.where(loss, torch.tensor([1.0, -1.0, 0.5])[:, None], torch.zeros(()))
    return batch


def recompute(probe, batch=None):
    """The probe on the recompute forward (an off-policy update needs that forward anyway)."""
    batch = make_batch() if batch is None else batch
    scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=True,
                          probes=[probe])
    scorer.recompute(tiny_qwen2(), batch)
    return batch


def token_masks(batch):
    response = torch.zeros(batch.attention_mask.shape, dtype=torch.bool)
    response[:, 1:] = batch.response_mask
    return response


@pytest.mark.parametrize("strategy", ["local", "global", "coupled"])
def test_rhythm_weights_are_gamma_of_the_next_token(strategy):
    probe = AttentionCreditProbe(strategy, layers=[1, 2], window=4, h_lo=2, h_hi=8)
    batch = recompute(probe)
    gamma = model_rhythm_gamma(tiny_qwen2(), batch.input_ids, batch.attention_mask, token_masks(batch),
                               layers=[1, 2], strategy=strategy, window=4, h_lo=2, h_hi=8)
    B, T = batch.loss_mask.shape
    for b in range(B):
        for j in range(T):  # loop form of the shift: the weight of loss column j is gamma of token j+1
            assert batch.weights[b, j].item() == pytest.approx(gamma[b, j + 1].item())
    assert (batch.weights[batch.response_mask] > 1).any()
    assert (batch.weights[~batch.response_mask] == 1).all()
    on = batch.weights[batch.loss_mask]
    assert batch.metrics["credit/gamma_mean"] == pytest.approx(on.mean().item())
    assert batch.metrics["credit/gamma_max"] == pytest.approx(on.max().item())
    assert batch.metrics["credit/amplified_frac"] == pytest.approx((on > 1).float().mean().item())


def test_flow_weights_use_the_last_response_tokens_as_answer():
    probe = AttentionCreditProbe("flow", layers=[1, 2, 3], answer_tokens=3, block_size=4)
    batch = recompute(probe)
    response = token_masks(batch)
    answer = torch.zeros_like(response)
    for b, (p, r) in enumerate(SHAPES):
        answer[b, p + r - 3 : p + r] = True
    gamma = model_flow_gamma(tiny_qwen2(), batch.input_ids, batch.attention_mask, response, answer, layers=[1, 2, 3])
    torch.testing.assert_close(batch.weights, gamma[:, 1:], rtol=0, atol=1e-6)
    assert (batch.weights > 1).any()


def test_random_baseline_amplifies_forty_percent_and_follows_the_seed():
    batch = recompute(AttentionCreditProbe("random", seed=3))
    for b, (_, r) in enumerate(SHAPES[:2]):
        amplified = (batch.weights[b] > 1).sum().item()
        assert amplified == int(0.4 * r + 0.5)  # nearest integer to 40% of the loss tokens
        assert (batch.weights[b][~batch.loss_mask[b]] == 1).all()
        assert set(batch.weights[b].unique().tolist()) <= {1.0, 1.5}
    assert (batch.weights[2] == 1).all()  # no loss tokens, nothing amplified
    again = recompute(AttentionCreditProbe("random", seed=3))
    other_step = recompute(AttentionCreditProbe("random", seed=3), make_batch(step=2))
    assert torch.equal(batch.weights, again.weights)
    assert not torch.equal(batch.weights, other_step.weights)


def test_entropy_baseline_picks_the_highest_entropy_tokens():
    class Keep:  # records the recompute's entropy next to the probe under test
        name = "keep"

        def capture(self, model):
            import contextlib
            return contextlib.nullcontext()

        def result(self, batch, log_probs, entropy):
            return {"entropy": entropy}

    batch = make_batch()
    scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=True,
                          probes=[Keep(), AttentionCreditProbe("entropy", gamma_amp=2.0)])
    scorer.recompute(tiny_qwen2(), batch)
    entropy = batch.extras["keep/entropy"]
    for b in range(2):
        cols = batch.loss_mask[b].nonzero().flatten().tolist()
        ranked = sorted(cols, key=lambda j: -entropy[b, j].item())
        top = set(ranked[: int(0.4 * len(cols) + 0.5)])
        assert {j for j in cols if batch.weights[b, j] == 2.0} == top


def test_bad_probe_settings_name_the_key():
    with pytest.raises(ConfigError, match="strategy"):
        AttentionCreditProbe("anchors")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['edge_threshold'\]"):
        AttentionCreditProbe("coupled", edge_threshold=0.1)
    with pytest.raises(ConfigError, match="unknown key"):
        AttentionCreditProbe("random", window=3)
    with pytest.raises(ConfigError, match=r"'stages.probe_kwargs.attention_credit.answer_tokens' = 0, expected a "
                                          r"positive int"):
        AttentionCreditProbe("flow", answer_tokens=0)
    # every key the local-window strategies document is accepted
    local = dict(head_quantile=0.9, window=3, h_lo=0.1, h_hi=0.9, k=2, alpha=0.5, tau_waad=0.1, tau_delta=0.2,
                 block_size=8, scores_per_step=2)
    for strategy in ("local", "global", "coupled"):
        assert AttentionCreditProbe(strategy, **local).credit_kwargs == local


def test_probe_factory_seeds_from_the_run_unless_given():
    from types import SimpleNamespace

    from credo.families.attention.probe import make_attention_credit_probe

    ctx = SimpleNamespace(seed=7, rank=1)
    assert (make_attention_credit_probe(ctx).seed, make_attention_credit_probe(ctx).rank) == (7, 1)
    assert make_attention_credit_probe(ctx, seed=3, strategy="flow").seed == 3


def test_registered_name_resolves_through_the_recipe_check():
    from credo.config import load_recipe
    from credo.train.registry import resolve

    from credo.family import builtin_families

    factory = resolve("probe", "attention_credit", "stages.probes[0]", builtin_families()).factory
    assert factory.__name__ == "make_attention_credit_probe"
    load_recipe("recipes/quickstart.yaml", ["stages.probes=[attention_credit]",
                                            "stages.probe_kwargs={attention_credit: {strategy: flow}}"])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["coupled", "flow"])
def test_two_training_steps_through_a_recipe(tmp_path, strategy):
    from credo.config import load_recipe
    from credo.trainer import Trainer
    from tests.e2e.common import read_rows, tiny_overrides

    overrides = tiny_overrides(tmp_path / strategy, **{
        "run.steps": 2, "run.eval_every": 0, "rollout.max_new_tokens": 8,
        "stages.probes": "[attention_credit]",
        "stages.probe_kwargs": f"{{attention_credit: {{strategy: {strategy}, window: 2, h_lo: 1, h_hi: 4, answer_tokens: 2}}}}"
        if strategy != "flow" else "{attention_credit: {strategy: flow, answer_tokens: 2}}",
    })
    trainer = Trainer(load_recipe("recipes/quickstart.yaml", overrides))
    try:
        run_dir = trainer.fit()
    finally:
        trainer.close()
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 1.0 <= row["credit/gamma_mean"] <= row["credit/gamma_max"] <= 1.75
        assert 0.0 < row["credit/amplified_frac"] <= 1.0


@pytest.mark.parametrize("strategy", ["coupled", "flow", "random"])
def test_sign_mode_positive_leaves_negative_advantage_samples_alone(strategy):
    # make_batch: sample 0 has advantage +1, sample 1 has -1 on its loss tokens.
    batch = recompute(AttentionCreditProbe(strategy, layers=[1, 2], sign_mode="positive"))
    assert (batch.weights[1] == 1).all()
    assert (batch.weights[0] > 1).any()


@pytest.mark.parametrize("strategy", ["coupled", "flow", "random", "entropy"])
def test_riding_the_update_forward_equals_the_recompute(strategy):
    # One on-policy pass: no recompute forward; the probe rides the update's micro-batch forwards
    # (rows [0, 1] then [2]) and must give the recompute's weights and metrics.
    kwargs = {"layers": [1, 2], "answer_tokens": 3} if strategy in ("coupled", "flow") else {}
    want = recompute(AttentionCreditProbe(strategy, seed=4, **kwargs))
    batch = make_batch()
    scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=False,
                          probes=[AttentionCreditProbe(strategy, seed=4, **kwargs)])
    model = tiny_qwen2()
    scorer.recompute(model, batch)
    assert batch.weights is None and batch.old_log_probs is None  # no forward ran
    for rows in (torch.tensor([0, 1]), torch.tensor([2])):
        lp, ent = scorer.update_forward(model, batch, rows)
        ref_lp, ref_ent = scorer(model, batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows],
                                 with_entropy=True)
        torch.testing.assert_close(lp, ref_lp) and torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(batch.weights, want.weights, rtol=0, atol=1e-6)
    assert (batch.weights > 1).any()
    for key in ("credit/gamma_mean", "credit/gamma_max", "credit/amplified_frac"):
        assert batch.metrics[key] == pytest.approx(want.metrics[key]), key
    assert batch.metrics["perf/credit_s"] > 0


def test_a_baseline_without_hooks_times_only_its_own_work():
    import time

    probe = AttentionCreditProbe("random", seed=4)
    batch = make_batch()
    t = time.perf_counter()
    out = probe.result(batch, torch.zeros(batch.loss_mask.shape), None)
    wall = time.perf_counter() - t
    assert out["weights"].shape == batch.loss_mask.shape
    assert 0 <= batch.metrics["perf/credit_s"] <= wall  # no forward hooks ran, so no hook time is added
