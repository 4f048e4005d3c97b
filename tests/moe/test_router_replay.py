"""Router replay (R3, arXiv 2510.11370; credo.moe): the replayed forward against a hand-forced gate, the router's
gradient, capture on the hf backend against a manual forward, and the scorer's plumbing (padded, packed, counted)."""

from __future__ import annotations

import pytest
import torch

from credo import moe
from tests.moe.common import forced_block_forward, own_experts, tiny_moe


def random_routing(B: int, L: int, layers: int, experts: int, k: int, seed: int = 0) -> torch.Tensor:
    """[B, L, layers, k] distinct experts per (token, layer), drawn at random (not what the router would pick)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(B * L * layers)]).view(B, L, layers, k)


def ids(B=2, L=7, seed=1):
    return torch.randint(3, 128, (B, L), generator=torch.Generator().manual_seed(seed))


def hand_forced(model, input_ids, routing):
    """The model's logits with every sparse block replaced by `forced_block_forward` at `routing [B, L, layers, k]`."""
    flat = routing.flatten(0, 1)
    blocks = [layer.mlp for layer in model.model.layers]
    for i, block in enumerate(blocks):
        block.forward = forced_block_forward(block, flat[:, i])
    try:
        return model(input_ids=input_ids).logits
    finally:
        for block in blocks:
            del block.forward


def test_replayed_forward_equals_a_hand_forced_gate():
    model = tiny_moe()
    x = ids()
    routing = random_routing(*x.shape, layers=2, experts=4, k=2)
    with torch.no_grad(), moe.route(model, routing.flatten(0, 1), replay=True):
        replayed = model(input_ids=x).logits
    with torch.no_grad():
        reference = hand_forced(model, x, routing)
        free = model(input_ids=x).logits
    torch.testing.assert_close(replayed, reference, rtol=1e-5, atol=1e-5)
    assert (replayed - free).abs().max() > 1e-3  # the record was not the router's own choice: replay changed it


def test_a_record_of_the_models_own_choice_replays_to_the_same_logits_and_compare_only_is_bitwise():
    model = tiny_moe(seed=3)
    x = ids(seed=4)
    own = own_experts(model, x)
    with torch.no_grad():
        free = model(input_ids=x).logits
        counts = moe.RoutingCounts()
        with moe.route(model, own.flatten(0, 1), replay=False, counts=counts):
            compared = model(input_ids=x).logits
        with moe.route(model, own.flatten(0, 1), replay=True):
            replayed = model(input_ids=x).logits
    assert torch.equal(compared, free)  # compare-only leaves the forward untouched
    torch.testing.assert_close(replayed, free, rtol=1e-6, atol=1e-6)
    assert (counts.used, counts.own, counts.slots) == (0, 0, x.numel() * 2)
    assert all("forward" not in r.__dict__ for r in moe.routers(model))  # the block restored the class's forward


def test_gradient_reaches_the_router_weights_as_through_the_hand_forced_gate():
    x = ids()
    routing = random_routing(*x.shape, layers=2, experts=4, k=2, seed=5)
    grads = []
    for replayed in (True, False):
        model = tiny_moe()
        if replayed:
            with moe.route(model, routing.flatten(0, 1), replay=True):
                loss = model(input_ids=x).logits.square().mean()
        else:
            loss = hand_forced(model, x, routing).square().mean()
        loss.backward()
        grads.append([layer.mlp.gate.weight.grad.clone() for layer in model.model.layers])
    for g_replay, g_hand in zip(*grads):
        assert g_replay.abs().sum() > 0
        torch.testing.assert_close(g_replay, g_hand, rtol=1e-4, atol=1e-6)


def test_counts_and_partial_records():
    """Slots recorded as -1 route themselves and are not counted; a differing record is counted as used (compare
    only) or as own (replay), never both under replay."""
    model = tiny_moe(seed=2)
    x = ids(B=1, L=5, seed=6)
    own = own_experts(model, x)
    record = own.clone()
    record[0, 1, 0] = torch.tensor([e for e in range(4) if e not in own[0, 1, 0].tolist()][:2])  # one slot differs
    record[0, 4] = -1  # position 4: not recorded in any layer
    for replay, used in ((False, 1), (True, 0)):
        counts = moe.RoutingCounts()
        with torch.no_grad(), moe.route(model, record.flatten(0, 1), replay=replay, counts=counts):
            model(input_ids=x)
        assert (counts.used, counts.own, counts.slots) == (used, 1, 4 * 2)


def test_shape_errors_name_the_routing():
    model = tiny_moe()
    with pytest.raises(ValueError, match=r"expected \[tokens, 2, top_k\]"):
        with moe.route(model, torch.zeros(14, 3, 2, dtype=torch.long), replay=True):
            pass
    with pytest.raises(ValueError, match="recorded routing has shape"):
        with torch.no_grad(), moe.route(model, torch.zeros(5, 2, 2, dtype=torch.long), replay=True):
            model(input_ids=ids())  # 14 tokens, 5 recorded
    with pytest.raises(ValueError, match="no MoE router"):
        with moe.route(torch.nn.Linear(2, 2), torch.zeros(1, 1, 1), replay=True):
            pass


def test_hf_capture_records_the_experts_of_a_manual_forward():
    from credo.distributed.rollout import HFBackend
    from credo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    model = tiny_moe(seed=7)
    backend = HFBackend(model, tok)
    prompts = [tok.encode("12+34="), tok.encode("1+2="), tok.encode("7+40=")]  # different lengths: left padding
    samples = backend.generate(prompts, max_new_tokens=5, temperature=1.0, top_p=1.0, seeds=[1, 2, 3], routing=True)
    for s in samples:
        n = len(s.prompt_ids) + len(s.response_ids) - 1
        assert s.routed_experts.shape == (n, 2, 2) and s.routed_experts.dtype == torch.int16
        ref = own_experts(model, torch.tensor([s.prompt_ids + s.response_ids]))[0, :n]
        assert torch.equal(s.routed_experts.long().sort(-1).values, ref.sort(-1).values)
    assert backend.generate(prompts, max_new_tokens=5, temperature=1.0, top_p=1.0, seeds=[1, 2, 3])[0].routed_experts is None
    with pytest.raises(ValueError, match="needs an MoE model"):
        HFBackend(torch.nn.Linear(2, 2), tok).generate(prompts, max_new_tokens=2, temperature=1.0, top_p=1.0,
                                                       seeds=[1, 2, 3], routing=True)


def _batch(model, routing_rows):
    """A packed-ready batch of three samples of different lengths with their recorded routing."""
    from credo.distributed.rollout import Sample
    from credo.train.batch import Batch, pack_batch

    lens = [(4, 3), (2, 5), (6, 1)]
    g = torch.Generator().manual_seed(9)
    samples = []
    for i, (p, r) in enumerate(lens):
        s = Sample(torch.randint(3, 128, (p,), generator=g).tolist(), torch.randint(3, 128, (r,), generator=g).tolist(),
                   [1] * r, [0.0] * r, True)
        s.routed_experts = routing_rows[i, :p + r - 1].to(torch.int16)
        samples.append(s)
    batch = Batch(samples=samples, problems=[None] * 3, group_ids=torch.arange(3))
    batch.valid = torch.ones(3, dtype=torch.bool)
    pack_batch(batch, pad_id=0, overlong_filter=False)
    return batch


@pytest.mark.parametrize("layout", ["padded", "packed", "token_budget"])
def test_the_scorer_replays_in_every_layout_as_the_hand_forced_gate(layout):
    from credo.train.scoring import PolicyScorer

    model = tiny_moe(seed=11)
    routing = random_routing(3, 7, layers=2, experts=4, k=2, seed=12)
    batch = _batch(model, routing)
    assert batch.routed_experts.shape == (3, 6, 2, 2)
    scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=True,
                          packed=layout == "packed", micro_batch_tokens=8 if layout == "token_budget" else 0,
                          router_replay=True)
    scorer.recompute(model, batch)
    with torch.no_grad():
        for i, s in enumerate(batch.samples):
            seq = torch.tensor([s.prompt_ids + s.response_ids])
            full = torch.full((1, seq.shape[1], 2, 2), -1, dtype=torch.long)
            full[0, :seq.shape[1] - 1] = s.routed_experts.long()
            full[0, -1] = own_experts(model, seq)[0, -1]  # the last position routes itself (nothing reads it)
            ref = hand_forced(model, seq, full).log_softmax(-1)[0, :-1].gather(-1, seq[0, 1:, None])[:, 0]
            p = len(s.prompt_ids)
            torch.testing.assert_close(batch.old_log_probs[i, p - 1:p - 1 + len(s.response_ids)], ref[p - 1:],
                                       rtol=1e-5, atol=1e-5)
    assert batch.routing_counts.used == 0 and batch.routing_counts.slots == sum(
        len(s.prompt_ids) + len(s.response_ids) - 1 for s in batch.samples) * 2


def test_the_update_forward_replays_and_counts_only_as_pi_old():
    from credo.train.mismatch import routing_metrics
    from credo.train.scoring import PolicyScorer

    model = tiny_moe(seed=13)
    batch = _batch(model, random_routing(3, 7, layers=2, experts=4, k=2, seed=14))
    rows = torch.arange(3)
    for replay in (True, False):
        batch.routing_counts = None
        scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=False,
                              router_replay=replay)
        lp, _ = scorer.update_forward(model, batch, rows)  # one on-policy pass: this forward is pi_old's
        lp.sum().backward()
        assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0
        metrics = routing_metrics(batch)
        assert metrics["moe/routing_disagreement"] == (0.0 if replay else metrics["moe/router_disagreement"])
        assert metrics["moe/router_disagreement"] > 0.3  # a random record: most slots differ from the router's own
        model.zero_grad()
    batch.routing_counts, batch.old_log_probs = None, torch.zeros_like(batch.loss_mask, dtype=torch.float32)
    scorer.update_forward(model, batch, rows)  # a later pass: pi_old came from the recompute, nothing is counted
    assert batch.routing_counts is None and routing_metrics(batch) == {}


def test_replay_without_a_record_is_an_error_naming_the_key():
    from credo.train.scoring import PolicyScorer

    model = tiny_moe()
    batch = _batch(model, random_routing(3, 7, layers=2, experts=4, k=2))
    batch.routed_experts = None
    scorer = PolicyScorer(temperature=1.0, chunk_size=64, hidden_path=True, needs_old_log_probs=True,
                          router_replay=True)
    with pytest.raises(ValueError, match="algo.router_replay"):
        scorer.recompute(model, batch)
