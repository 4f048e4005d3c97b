"""Delta weight pushes without Ray: a delta applied to the last pushed weights gives the new weights bit for bit,
whatever the encoding each tensor gets, and its byte count is what it sends."""

from __future__ import annotations

import torch

from credo.distributed.ray.weights import apply_delta, diff_state, load_full, nbytes, state_digest, wire_state


def test_each_encoding_round_trips_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    last = {"few": torch.randn(1000, generator=g), "many": torch.randn(37, 5, generator=g).bfloat16(),
            "all": torch.randn(64, generator=g), "same": torch.randn(8, generator=g),
            "zero": torch.zeros(4), "reshaped": torch.randn(6, generator=g)}
    new = {k: v.clone() for k, v in last.items()}
    new["few"][torch.randperm(1000, generator=g)[:5]] += 1
    new["many"][torch.rand(37, 5, generator=g) < 0.5] += 1
    new["all"] += 1
    new["zero"][1] = -0.0  # equal as a number, other bits: must travel
    new["reshaped"] = new["reshaped"].reshape(2, 3)
    new["added"] = torch.ones(3)
    d = diff_state(last, new)
    assert list(d.sparse) == ["few"] and list(d.masked) == ["many", "zero"] and set(d.dense) == {"all", "reshaped", "added"}
    assert "same" not in d.dense and "zero" in d.masked  # 1 byte of mask + 4 of value < 4 of index + 4 of value
    target = {k: v.clone() for k, v in last.items()}
    target["reshaped"] = target["reshaped"].reshape(2, 3)
    target["added"] = torch.zeros(3)
    apply_delta(target, d)
    assert state_digest(target) == state_digest(new)
    assert torch.equal(target["zero"].view(torch.int32), new["zero"].view(torch.int32))
    raw = {k: v.reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in last.items()}
    raw_new = {k: v.reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in new.items()}
    size = {k: v.element_size() for k, v in new.items()}
    changed = sum(raw[k][i:i + size[k]] != raw_new[k][i:i + size[k]] for k in last if k != "reshaped"
                  for i in range(0, len(raw[k]), size[k]))  # element by element, on the raw bytes
    assert d.changed == changed + new["reshaped"].numel() + new["added"].numel()
    sent = sum(t.numel() * t.element_size() for t in d.dense.values())
    sent += sum(i.numel() * i.element_size() + v.numel() * v.element_size() for i, v in d.sparse.values())
    sent += sum(m.numel() + v.numel() * v.element_size() for m, v in d.masked.values())
    assert d.sent_bytes == sent < d.full_bytes == nbytes(new)


def test_a_tied_model_after_deltas_equals_a_full_load():
    """Real Adam steps on a tied tiny model, pushed as bf16 deltas into one copy and as full states into another."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    trainer = Qwen2ForCausalLM(cfg)
    by_delta, by_full = Qwen2ForCausalLM(cfg).bfloat16(), Qwen2ForCausalLM(cfg).bfloat16()
    last = wire_state(trainer, torch.bfloat16)
    load_full(by_delta.state_dict(keep_vars=True), last)
    opt = torch.optim.Adam(trainer.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 12))
    for _ in range(3):
        trainer(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        new = wire_state(trainer, torch.bfloat16)
        assert "lm_head.weight" not in new  # the tied head travels once, as the embedding
        apply_delta(by_delta.state_dict(keep_vars=True), diff_state(last, new))
        load_full(by_full.state_dict(keep_vars=True), new)
        last = new
        assert state_digest(by_delta.state_dict()) == state_digest(by_full.state_dict())
        assert by_delta.lm_head.weight is by_delta.model.embed_tokens.weight
    assert state_digest(wire_state(by_delta, None)) == state_digest(last)
