"""The policy scorer (credo.train.scoring) against a naive full-logits reference: log-probs and entropy on both
paths (a head with a bias too), which probes ride the recompute and which the update, what the recompute fills,
probe outputs stored and checked, micro-batch views and the merge of their metrics. One tiny Llama per module."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.train.batch import Batch  # noqa: E402
from credo.train.scoring import PolicyScorer, _merge_metrics, _rows_view, policy_forward  # noqa: E402

V = 32


def tiny_llama(seed, head_bias=False):
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32)).eval()
    if head_bias:
        head = torch.nn.Linear(16, V, bias=True)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.copy_(torch.randn(V) * 3)
        model.lm_head = head
    return model


@pytest.fixture(scope="module")
def models():
    return {"policy": tiny_llama(0), "ref": tiny_llama(1), "bias": tiny_llama(2, head_bias=True)}


def make_batch(step=1):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, 7), generator=g)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, 2:] = True
    mask[1, 3:5] = True
    mask[2, 1:] = True
    b = Batch(samples=["s0", "s1", "s2"], problems=["p0", "p1", "p2"], group_ids=torch.tensor([4, 4, 9]), step=step)
    attn = torch.ones_like(ids)
    attn[1, 0] = 0  # a left-padded row: the mask changes what its later tokens see
    b.input_ids, b.attention_mask, b.response_mask, b.loss_mask = ids, attn, mask.clone(), mask
    return b


def naive(model, ids, mask, temperature, attn):
    """log p and entropy of each label from the model's full logits, token by token."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits.double()
    B, T = mask.shape
    lp, ent = torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                logp = (logits[b, t] / temperature).log_softmax(-1)
                lp[b, t] = logp[ids[b, t + 1]]
                ent[b, t] = -(logp.exp() * logp).sum()
    return lp, ent


@pytest.mark.parametrize("hidden_path", [True, False])
@pytest.mark.parametrize("which", ["policy", "bias"])
def test_log_probs_and_entropy_match_the_full_logits(models, hidden_path, which):
    model, batch = models[which], make_batch()
    want_lp, want_ent = naive(model, batch.input_ids, batch.loss_mask, 0.7, batch.attention_mask)
    with torch.no_grad():
        lp, ent = policy_forward(model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=0.7,
                                 chunk_size=4, with_entropy=True, hidden_path=hidden_path)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (3, 6)
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    assert (lp[~batch.loss_mask] == 0).all() and (ent[~batch.loss_mask] == 0).all()
    with torch.no_grad():
        lp2, none = policy_forward(model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=0.7,
                                   chunk_size=4, with_entropy=False, hidden_path=hidden_path)
    assert none is None
    torch.testing.assert_close(lp2, lp)


def test_the_default_path_is_the_hidden_one(models):
    model, batch = models["policy"], make_batch()
    calls = []
    forward = model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        with torch.no_grad():
            policy_forward(model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=1.0,
                           chunk_size=4, with_entropy=False)
    finally:
        del model.forward
    assert calls == []


class Recorder:
    """A probe that records what the scorer hands it and returns given outputs and metrics."""

    def __init__(self, name="rec", outputs=None, metrics=None, rides_update=None, needs_entropy=None):
        self.name, self.outputs, self.metrics, self.seen, self.entered = name, outputs or {}, metrics or {}, [], 0
        if rides_update is not None:
            self.rides_update = rides_update
        if needs_entropy is not None:
            self.needs_entropy = needs_entropy

    def capture(self, model):
        self.entered += 1
        return contextlib.nullcontext()

    def result(self, batch, log_probs, entropy):
        self.seen.append((batch, log_probs, entropy))
        batch.metrics.update(self.metrics(batch) if callable(self.metrics) else self.metrics)
        return {k: (v(batch) if callable(v) else v) for k, v in self.outputs.items()}


def test_probes_ride_the_update_only_on_one_on_policy_pass():
    rides, stays, default = Recorder("a", rides_update=True), Recorder("b", rides_update=False), Recorder("c")
    on_policy = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False,
                             probes=[rides, stays, default])
    assert on_policy.update_probes == [rides] and on_policy.recompute_probes == [stays, default]
    off_policy = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=True,
                              probes=(rides, stays))
    assert off_policy.update_probes == [] and off_policy.recompute_probes == [rides, stays]
    assert (off_policy.temperature, off_policy.chunk_size, off_policy.hidden_path, off_policy.ref_model) == (
        1.0, 4, True, None)


def test_recompute_without_old_log_probs_probes_or_reference_runs_nothing():
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False)
    batch = make_batch()
    scorer.recompute(object(), batch)  # the model is never touched
    assert batch.old_log_probs is None and batch.ref_log_probs is None and batch.weights is None


def test_a_recompute_probe_gets_the_log_probs_without_filling_old_ones(models):
    probe = Recorder(outputs={"score": lambda b: torch.full(b.loss_mask.shape, 2.0)}, needs_entropy=False)
    scorer = PolicyScorer(temperature=0.7, chunk_size=4, hidden_path=True, needs_old_log_probs=False, probes=[probe])
    batch = make_batch()
    scorer.recompute(models["policy"], batch)
    assert batch.old_log_probs is None and probe.entered == 1
    (seen_batch, lp, ent), = probe.seen
    want, _ = naive(models["policy"], batch.input_ids, batch.loss_mask, 0.7, batch.attention_mask)
    assert seen_batch is batch and ent is None  # no probe reads the entropy: none is computed
    torch.testing.assert_close(lp.double(), want, rtol=1e-5, atol=1e-5)
    assert list(batch.extras) == ["rec/score"] and (batch.extras["rec/score"] == 2.0).all()


def test_one_probe_that_reads_entropy_gets_it_computed(models):
    quiet, reader = Recorder("q", needs_entropy=False), Recorder("r")
    scorer = PolicyScorer(temperature=0.7, chunk_size=4, hidden_path=True, needs_old_log_probs=True,
                          probes=[quiet, reader])
    batch = make_batch()
    scorer.recompute(models["policy"], batch)
    want_lp, want_ent = naive(models["policy"], batch.input_ids, batch.loss_mask, 0.7, batch.attention_mask)
    torch.testing.assert_close(reader.seen[0][2].double(), want_ent, rtol=1e-5, atol=1e-5)
    assert quiet.seen[0][2] is reader.seen[0][2]
    torch.testing.assert_close(batch.old_log_probs.double(), want_lp, rtol=1e-5, atol=1e-5)


def test_the_reference_always_takes_the_hidden_path(models):
    ref = models["ref"]
    calls = []
    forward = ref.forward
    ref.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        scorer = PolicyScorer(temperature=0.7, chunk_size=4, hidden_path=False, needs_old_log_probs=False,
                              ref_model=ref)
        batch = make_batch()
        scorer.recompute(object(), batch)
    finally:
        del ref.forward
    assert calls == [] and batch.old_log_probs is None
    want, _ = naive(ref, batch.input_ids, batch.loss_mask, 0.7, batch.attention_mask)
    torch.testing.assert_close(batch.ref_log_probs.double(), want, rtol=1e-5, atol=1e-5)


def test_probe_weights_multiply_into_existing_weights_on_the_recompute(models):
    probe = Recorder(outputs={"weights": lambda b: torch.full(b.loss_mask.shape, 3.0)})
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=True, probes=[probe])
    batch = make_batch()
    batch.weights = torch.full(batch.loss_mask.shape, 0.5)
    scorer.recompute(models["policy"], batch)
    assert (batch.weights == 1.5).all() and batch.extras == {}
    fresh = make_batch()
    scorer.recompute(models["policy"], fresh)
    assert (fresh.weights == 3.0).all()


def test_non_finite_weights_on_loss_tokens_are_an_error_off_them_not(models):
    def weights(b):
        w = torch.ones(b.loss_mask.shape)
        w[~b.loss_mask] = float("nan")
        return w

    probe = Recorder("odd", outputs={"weights": weights})
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False, probes=[probe])
    batch = make_batch()
    scorer.recompute(models["policy"], batch)  # NaN where no loss token is: accepted
    assert torch.equal(batch.weights[batch.loss_mask], torch.ones(int(batch.loss_mask.sum())))
    probe.outputs = {"weights": lambda b: torch.where(b.loss_mask, float("inf"), 1.0)}
    with pytest.raises(ValueError, match=r"^probe 'odd' returned non-finite weights on loss tokens$"):
        scorer.recompute(models["policy"], make_batch())
    probe.outputs = {"score": torch.ones(3, 5)}
    with pytest.raises(ValueError, match=r"^probe 'odd' output 'score' has shape \(3, 5\), expected \[3, 6\] like "
                                         r"batch.loss_mask$"):
        scorer.recompute(models["policy"], make_batch())


# ------------------------------------------------------------------------------------------- the update path
def test_update_forward_without_probes_is_the_plain_scorer(models):
    scorer = PolicyScorer(temperature=0.7, chunk_size=4, hidden_path=True, needs_old_log_probs=False)
    batch = make_batch()
    rows = torch.tensor([2, 1])  # row 1 is the left-padded one
    lp, ent = scorer.update_forward(models["policy"], batch, rows)
    want_lp, want_ent = naive(models["policy"], batch.input_ids[rows], batch.loss_mask[rows], 0.7,
                               batch.attention_mask[rows])
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    assert batch.metrics == {} and batch.weights is None and batch.extras == {}


def test_update_probes_fill_their_rows_and_merge_the_views_metrics(models):
    """Rows [0, 2] then [1]: weights (1 + row index) multiply in, an extra lands on its rows only, and the views'
    metrics merge: perf/* summed, *_max maxed, the rest averaged weighted by the views' loss tokens."""
    def metrics(view):
        first = view.source_rows.tolist() == [0, 2]
        return {"perf/t": 1.0 if first else 2.0, "g_max": 5.0 if first else 4.0, "mean": 1.0 if first else 4.0}

    probe = Recorder(rides_update=True, metrics=metrics, outputs={
        "weights": lambda v: (v.source_rows.float()[:, None] + 1).expand(v.loss_mask.shape).clone(),
        "score": lambda v: torch.full(v.loss_mask.shape, 7.0, dtype=torch.float64)})
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False, probes=[probe])
    batch = make_batch()
    batch.metrics["kept"] = 9.0
    scorer.update_forward(models["policy"], batch, torch.tensor([0, 2]))
    assert batch.weights.tolist() == [[1.0] * 6, [1.0] * 6, [3.0] * 6]
    assert batch.extras["rec/score"].dtype == torch.float64
    assert batch.extras["rec/score"].tolist() == [[7.0] * 6, [0.0] * 6, [7.0] * 6]
    scorer.update_forward(models["policy"], batch, torch.tensor([1]))
    assert batch.weights.tolist() == [[1.0] * 6, [2.0] * 6, [3.0] * 6]
    assert batch.extras["rec/score"].tolist() == [[7.0] * 6] * 3
    # loss tokens: rows 0 and 2 hold 4 + 5 = 9, row 1 holds 2
    assert batch.metrics == {"kept": 9.0, "perf/t": 3.0, "g_max": 5.0, "mean": pytest.approx((1 * 9 + 4 * 2) / 11)}
    assert probe.entered == 2 and all(lp.grad_fn is None and ent.grad_fn is None for _, lp, ent in probe.seen)
    # a new batch starts new counts
    other = make_batch()
    scorer.update_forward(models["policy"], other, torch.tensor([1]))
    scorer.update_forward(models["policy"], other, torch.tensor([0, 2]))
    assert other.metrics["mean"] == pytest.approx((4 * 2 + 1 * 9) / 11)


def test_update_weights_multiply_into_existing_weights(models):
    probe = Recorder(rides_update=True, outputs={"weights": lambda v: torch.full(v.loss_mask.shape, 2.0)})
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False, probes=[probe])
    batch = make_batch()
    batch.weights = torch.full(batch.loss_mask.shape, 0.25)
    rows = torch.tensor([1])
    lp, ent = scorer.update_forward(models["policy"], batch, rows)
    assert batch.weights[:, 0].tolist() == [0.25, 0.5, 0.25]
    want_lp, want_ent = naive(models["policy"], batch.input_ids[rows], batch.loss_mask[rows], 1.0,
                              batch.attention_mask[rows])
    torch.testing.assert_close(lp.double(), want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    # row 1's padded first token matters: without its attention mask the log-probs differ
    unmasked, _ = naive(models["policy"], batch.input_ids[rows], batch.loss_mask[rows], 1.0,
                        torch.ones_like(batch.input_ids[rows]))
    assert not torch.allclose(unmasked, want_lp, atol=1e-3)


def test_an_update_probe_output_of_the_wrong_shape_is_named(models):
    probe = Recorder("odd", rides_update=True, outputs={"weights": torch.ones(3, 6)})
    scorer = PolicyScorer(temperature=1.0, chunk_size=4, hidden_path=True, needs_old_log_probs=False, probes=[probe])
    with pytest.raises(ValueError, match="^" + re.escape("probe 'odd' output 'weights' has shape (3, 6), expected "
                                                         "[1, 6] like batch.loss_mask") + "$"):
        scorer.update_forward(models["policy"], make_batch(), torch.tensor([1]))


def test_a_rows_view_slices_per_sample_fields_only():
    batch = make_batch(step=5)
    batch.extras["x"], batch.metrics["m"] = torch.ones(3, 6), 1.0
    batch.rewards = torch.tensor([0.5, 1.0, 2.0])
    batch.weights = torch.ones(2, 6)  # not [B, ...]: kept whole
    rows = torch.tensor([2, 0])
    view = _rows_view(batch, rows)
    assert view.samples == ["s2", "s0"] and view.problems == ["p2", "p0"]
    assert view.group_ids.tolist() == [9, 4] and view.rewards.tolist() == [2.0, 0.5]
    assert torch.equal(view.input_ids, batch.input_ids[[2, 0]]) and torch.equal(view.loss_mask, batch.loss_mask[[2, 0]])
    assert view.weights is batch.weights and view.step == 5
    assert view.extras == {} and view.metrics == {} and batch.metrics == {"m": 1.0}
    assert view.source_rows is rows and view.source_size == 3


def test_merge_metrics_by_hand():
    into, counts = {}, {}
    _merge_metrics(into, {"perf/a": 1.0, "b_max": 2.0, "c": 3.0}, 0.0, counts)
    _merge_metrics(into, {"perf/a": 0.5, "b_max": 1.0, "c": 9.0}, 0.0, counts)
    assert into == {"perf/a": 1.5, "b_max": 2.0, "c": 3.0}  # no tokens yet: the first value stands
    _merge_metrics(into, {"c": 5.0, "b_max": 7.0}, 2.0, counts)
    _merge_metrics(into, {"c": 2.0}, 6.0, counts)
    assert into == {"perf/a": 1.5, "b_max": 7.0, "c": pytest.approx((5 * 2 + 2 * 6) / 8)}
    assert counts == {"perf/a": 0.0, "b_max": 0.0, "c": 8.0}


def test_a_head_without_a_bias_attribute_scores_as_a_bias_free_one():
    """The hidden path reads the head's `bias` only if it has one (an output embedding may have just `weight`)."""
    from types import SimpleNamespace

    model, batch = tiny_llama(0), make_batch()
    want, _ = naive(model, batch.input_ids, batch.loss_mask, 1.0, batch.attention_mask)
    model.get_output_embeddings = lambda: SimpleNamespace(weight=model.lm_head.weight)
    with torch.no_grad():
        lp, _ = policy_forward(model, batch.input_ids, batch.attention_mask, batch.loss_mask, temperature=1.0,
                               chunk_size=4, with_entropy=False)
    torch.testing.assert_close(lp.double(), want, rtol=1e-5, atol=1e-5)
