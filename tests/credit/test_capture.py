"""Attention credit captured in one forward pass equals the dense functions on eager attention maps."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.credit import attention_rhythm_gamma, flow_gamma, flow_throughput  # noqa: E402
from credo.credit.capture import (  # noqa: E402
    attention_modules,
    capture_qk,
    default_layers,
    model_flow_gamma,
    model_rhythm_gamma,
)

CONFIGS = {
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, vocab_size=50, max_position_embeddings=128,
    ),
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, vocab_size=50, max_position_embeddings=128,
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=4, vocab_size=50, max_position_embeddings=128,
    ),
}

# (prompt length, response length, answer length) of the three sequences.
SHAPES = [(7, 26, 4), (12, 9, 3), (5, 17, 5)]
RHYTHM_KW = dict(window=4, h_lo=2, h_hi=9, head_quantile=0.3)
LAYERS = [1, 2, 3]


def tiny_model(name: str, attn: str = "eager", dtype=torch.float32):
    torch.manual_seed(0)
    config = CONFIGS[name]()
    config._attn_implementation = attn
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.to(dtype).eval()


def sequences(seed: int = 1):
    """Unpadded (ids [n], response [n], answer [n]) per sequence."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for prompt, response, answer in SHAPES:
        n = prompt + response
        ids = torch.randint(1, 50, (n,), generator=g)
        resp = torch.arange(n) >= prompt
        ans = (torch.arange(n) >= n - answer)
        out.append((ids, resp, ans))
    return out


def pad(seqs, side: str):
    """Padded batch tensors; pad id 0 (a real vocabulary id: masking must be what excludes it)."""
    width = max(len(ids) for ids, _, _ in seqs)
    ids_b = torch.zeros(len(seqs), width, dtype=torch.long)
    attn_b = torch.zeros(len(seqs), width, dtype=torch.long)
    resp_b = torch.zeros(len(seqs), width, dtype=torch.bool)
    ans_b = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, (ids, resp, ans) in enumerate(seqs):
        n = len(ids)
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        ids_b[b, cols], attn_b[b, cols], resp_b[b, cols], ans_b[b, cols] = ids, 1, resp, ans
    return ids_b, attn_b, resp_b, ans_b


def eager_maps(model, ids, layers):
    """[L, H, n, n] maps of one unpadded sequence, from the eager model itself."""
    with torch.no_grad():
        out = model(input_ids=ids[None], output_attentions=True)
    return torch.stack([out.attentions[i][0] for i in layers])


def batch_eager_maps(model, seqs, side, layers):
    """Per sequence, its [L, H, n, n] maps over its n real tokens in the padded batch's eager forward.

    They are also checked against the sequence run alone: equal up to float32 rounding of RoPE at
    shifted positions (left padding), which is why the exact reference is the batch's own maps.
    """
    ids_b, attn_b, _, _ = pad(seqs, side)
    with torch.no_grad():
        out = model(input_ids=ids_b, attention_mask=attn_b, output_attentions=True)
    maps = []
    for b, (ids, _, _) in enumerate(seqs):
        real = attn_b[b].bool()
        m = torch.stack([out.attentions[i][b] for i in layers])[:, :, real][:, :, :, real]
        torch.testing.assert_close(m, eager_maps(model, ids, layers), rtol=0, atol=1e-6)
        assert torch.allclose(m.sum(-1), torch.ones(())), "row-stochastic reference"
        maps.append(m.double())
    return maps


def scatter_back(gamma_rows, attn_b):
    """Per-sequence [n] results into a [B, N] tensor with 1.0 on padding."""
    out = torch.ones(attn_b.shape, dtype=torch.float64)
    for b, g in enumerate(gamma_rows):
        out[b, attn_b[b].bool()] = g.double()
    return out


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("strategy", ["local", "global", "coupled"])
def test_rhythm_gamma_matches_dense_on_eager_maps(name, side, strategy):
    model = tiny_model(name)
    seqs = sequences()
    maps = batch_eager_maps(model, seqs, side, LAYERS)
    expected = [
        attention_rhythm_gamma(m, resp, strategy=strategy, **RHYTHM_KW) for m, (_, resp, _) in zip(maps, seqs)
    ]
    ids_b, attn_b, resp_b, _ = pad(seqs, side)
    got = model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=LAYERS, strategy=strategy, **RHYTHM_KW)
    want = scatter_back(expected, attn_b)
    assert got.shape == ids_b.shape
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
    assert (got[attn_b == 0] == 1.0).all()
    for b in range(len(seqs)):  # the rule selected something: the comparison is not all ones
        assert (got[b] > 1.0).any()


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("normalize", [True, False])
def test_flow_gamma_matches_dense_on_eager_maps(name, side, normalize):
    model = tiny_model(name)
    seqs = sequences(seed=2)
    maps = batch_eager_maps(model, seqs, side, LAYERS)
    expected = [
        flow_gamma(flow_throughput(m, ~resp, ans, normalize=normalize), response_mask=resp)
        for m, (_, resp, ans) in zip(maps, seqs)
    ]
    ids_b, attn_b, resp_b, ans_b = pad(seqs, side)
    got = model_flow_gamma(model, ids_b, attn_b, resp_b, ans_b, layers=LAYERS, normalize=normalize, block_size=5)
    torch.testing.assert_close(got.double(), scatter_back(expected, attn_b), rtol=0, atol=1e-4)
    assert (got[attn_b == 0] == 1.0).all()
    for b in range(len(seqs)):
        assert (got[b] > 1.0).any()


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_default_layers_and_paper_defaults_match_dense(name):
    # The paper's defaults (window 10, FAI horizon 10..100) and default_layers.
    model = tiny_model(name)
    seqs = sequences(seed=3)
    layers = default_layers(4)
    maps = batch_eager_maps(model, seqs, "left", layers)
    expected = [attention_rhythm_gamma(m, resp) for m, (_, resp, _) in zip(maps, seqs)]
    ids_b, attn_b, resp_b, _ = pad(seqs, "left")
    got = model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=None)
    torch.testing.assert_close(got.double(), scatter_back(expected, attn_b), rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2", "llama"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_sdpa_gives_the_same_gamma_as_eager(name, side):
    eager, sdpa = tiny_model(name, "eager"), tiny_model(name, "sdpa")
    ids_b, attn_b, resp_b, ans_b = pad(sequences(seed=4), side)
    for model_fn, extra in ((model_rhythm_gamma, ()), (model_flow_gamma, (ans_b,))):
        a = model_fn(eager, ids_b, attn_b, resp_b, *extra, layers=LAYERS)
        b = model_fn(sdpa, ids_b, attn_b, resp_b, *extra, layers=LAYERS)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_storage_device_keeps_states_there_and_changes_nothing():
    model = tiny_model("qwen2")
    ids_b, attn_b, resp_b, ans_b = pad(sequences(), "right")
    with capture_qk(model, [1], storage_device="meta") as cap:
        with torch.no_grad():
            model(input_ids=ids_b, attention_mask=attn_b)
    assert cap.states[1]["q"].device.type == "meta" and cap.compute_device.type == "cpu"
    a = model_flow_gamma(model, ids_b, attn_b, resp_b, ans_b, layers=[1, 2])
    b = model_flow_gamma(model, ids_b, attn_b, resp_b, ans_b, layers=[1, 2], storage_device="cpu")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_captured_states_reproduce_eager_maps():
    # The captured q/k (after RoPE, GQA expanded by the streaming code) give the eager softmax.
    from credo.credit import attention_from_qk

    model = tiny_model("qwen2", dtype=torch.float64)
    ids, _, _ = sequences()[0]
    with capture_qk(model, [0, 3]) as cap:
        with torch.no_grad():
            model(input_ids=ids[None])
    q, k = cap.stacked()  # [L, B, H, N, d]
    assert q.shape == (2, 1, 4, len(ids), 16) and k.shape == (2, 1, 2, len(ids), 16)
    maps = attention_from_qk(q[:, 0], k[:, 0], scale=cap.scale)
    # eager takes the softmax in float32 even for a float64 model
    torch.testing.assert_close(maps, eager_maps(model, ids, [0, 3]), rtol=0, atol=1e-6)


def test_default_layers_middle_third():
    # Hand-computed: 36 layers -> middle third 12..23, linspace 12, 14.75, 17.5, 20.25, 23.
    assert default_layers(36) == [12, 15, 18, 20, 23]
    assert default_layers(28) == [9, 11, 14, 16, 18]  # 9..18: 9, 11.25, 13.5, 15.75, 18
    assert default_layers(4) == [1, 2]
    assert default_layers(1) == [0]
    with pytest.raises(ValueError, match="num_layers"):
        default_layers(0)


def test_layer_out_of_range_names_the_depth():
    model = tiny_model("llama")
    ids_b, attn_b, resp_b, _ = pad(sequences(), "right")
    with pytest.raises(ValueError, match=r"layers \[4\] out of range: the model has 4 decoder layers"):
        model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=[1, 4])


def test_unknown_attention_class_names_the_class():
    class MyAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)
            self.k_proj = torch.nn.Linear(4, 4)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = MyAttention()

    model = torch.nn.Sequential(Layer(), Layer())
    with pytest.raises(TypeError, match="MyAttention"):
        attention_modules(model)
    with pytest.raises(ValueError, match="Linear has no decoder layer"):
        attention_modules(torch.nn.Linear(2, 2))


def test_unknown_keyword_and_bad_mask_shape_are_errors():
    model = tiny_model("qwen2")
    ids_b, attn_b, resp_b, ans_b = pad(sequences(), "right")
    with pytest.raises(TypeError, match="gamma_flow"):
        model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=[1], gamma_flow=2.0)
    with pytest.raises(ValueError, match="answer_mask has shape"):
        model_flow_gamma(model, ids_b, attn_b, resp_b, ans_b[:, 1:], layers=[1])


def test_capture_without_forward_is_an_error():
    model = tiny_model("qwen2")
    with capture_qk(model, [2]) as cap:
        pass
    with pytest.raises(RuntimeError, match=r"layers \[2\]"):
        cap.stacked()


def test_hooks_are_removed_and_non_finite_states_are_an_error():
    model = tiny_model("llama")
    ids_b, attn_b, resp_b, _ = pad(sequences(), "right")
    model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=[1, 2])
    for layer in model.model.layers:
        attn = layer.self_attn
        assert not attn._forward_pre_hooks and not attn.q_proj._forward_hooks and not attn.k_proj._forward_hooks
    with torch.no_grad():  # a NaN norm weight poisons the states of layer 2 onwards
        model.model.layers[2].input_layernorm.weight[0] = float("nan")
    with pytest.raises(ValueError, match=r"sequence 0: non-finite query states on real tokens at layers \[2, 3\]"):
        model_rhythm_gamma(model, ids_b, attn_b, resp_b, layers=[1, 2, 3])


class _Wrapped(torch.nn.Module):
    """A plain torch module around a decoder: it has no `base_model_prefix`, so the capture runs it whole."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def test_a_model_without_base_model_prefix_is_run_whole():
    model = tiny_model("qwen2")
    ids_b, attn_b, resp_b, ans_b = pad(sequences(), "right")
    for model_fn, extra in ((model_rhythm_gamma, ()), (model_flow_gamma, (ans_b,))):
        direct = model_fn(model, ids_b, attn_b, resp_b, *extra, layers=LAYERS)
        wrapped = model_fn(_Wrapped(model), ids_b, attn_b, resp_b, *extra, layers=LAYERS)
        torch.testing.assert_close(wrapped, direct, rtol=0, atol=0)


def test_error_messages_name_the_class_the_mask_and_the_function():
    # an attention class of a supported name without the projections the hooks read
    attn_cls = type("LlamaAttention", (torch.nn.Module,), {})
    layer = torch.nn.Module()
    layer.self_attn = attn_cls()
    with pytest.raises(TypeError, match=r"^attention module class LlamaAttention lacks attributes "
                                        r"\['q_proj', 'k_proj', 'head_dim', 'scaling', 'config'\] the capture hooks read$"):
        attention_modules(torch.nn.Sequential(layer))
    model = tiny_model("qwen2")
    ids_b, attn_b, resp_b, _ = pad(sequences(), "right")
    with pytest.raises(ValueError, match=rf"^attention_mask has shape \[3, {ids_b.shape[1] - 1}\], expected "
                                         rf"\[3, {ids_b.shape[1]}\] like input_ids$"):
        model_rhythm_gamma(model, ids_b, attn_b[:, 1:], resp_b, layers=[1])
    from credo.credit.capture import rhythm_gamma_from_qk

    with capture_qk(model, [1]) as cap:
        model(input_ids=ids_b, attention_mask=attn_b)
    with pytest.raises(TypeError, match=r"^rhythm_gamma_from_qk got unexpected keyword arguments \['gamma_flow'\]"):
        rhythm_gamma_from_qk(cap, attn_b, resp_b, gamma_flow=2.0)


def test_a_one_layer_capture_and_a_misshapen_advantage_for_the_flow():
    from credo.credit.capture import flow_gamma_from_qk

    model = tiny_model("llama")
    ids_b, attn_b, resp_b, ans_b = pad(sequences(), "right")
    with capture_qk(model, [2]) as cap:
        model(input_ids=ids_b, attention_mask=attn_b)
    q, k = cap.sequence(1, torch.arange(4))
    assert q.shape == (1, 4, 4, 16) and k.shape == (1, 2, 4, 16)
    n = ids_b.shape[1]
    with pytest.raises(ValueError, match=rf"^advantages has shape \[3, {n - 1}\], expected \[3, {n}\] like the "
                                         r"captured input_ids$"):
        flow_gamma_from_qk(cap, attn_b, resp_b, ans_b, advantages=torch.ones(3, n - 1))
