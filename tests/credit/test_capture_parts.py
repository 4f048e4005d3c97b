"""The parts of credo.credit.capture on one tiny Llama built once: layer choice, hooks, checks, packing, kwargs.

The references are the dense functions of credo.credit on the eager model's own attention maps (the
capture's documented contract), the HF attention module's own q/k projections, or values worked by hand.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.credit import attention_rhythm_gamma, flow_gamma, flow_throughput  # noqa: E402
from credo.credit.capture import (  # noqa: E402
    QKCapture,
    _check_layers,
    _check_masks,
    _rotate_half,
    _split_kwargs,
    attention_modules,
    capture_qk,
    default_layers,
    flow_gamma_from_qk,
    model_flow_gamma,
    model_rhythm_gamma,
    rhythm_gamma_from_qk,
)

from tests.credit.test_capture import scatter_back  # noqa: E402

# three sequences, lengths 9, 6, 8; token ids 1..39 (id 0 is padding, id 45 is poisoned by a test)
LENGTHS = (9, 6, 8)
PROMPTS = (3, 2, 4)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, vocab_size=50, max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    m = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return m.eval()  # float32 (a float64 eager forward turns left-padding rows NaN)


def batch(side="left"):
    g = torch.Generator().manual_seed(7)
    width = max(LENGTHS)
    ids = torch.zeros(3, width, dtype=torch.long)
    attn = torch.zeros(3, width, dtype=torch.long)
    resp = torch.zeros(3, width, dtype=torch.bool)
    ans = torch.zeros(3, width, dtype=torch.bool)
    for b, (n, p) in enumerate(zip(LENGTHS, PROMPTS)):
        cols = torch.arange(n) if side == "right" else torch.arange(width - n, width)
        ids[b, cols] = torch.randint(1, 40, (n,), generator=g)
        attn[b, cols] = 1
        resp[b, cols[p:]] = True
        ans[b, cols[-2:]] = True
    return ids, attn, resp, ans


def dense_maps(model, ids, attn, layers):
    """Per sequence, the eager [L, H, n, n] maps over its real tokens."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, output_attentions=True)
    maps = []
    for b in range(ids.shape[0]):
        real = attn[b].bool()
        maps.append(torch.stack([out.attentions[i][b] for i in layers])[:, :, real][:, :, :, real])
    return maps


scatter = scatter_back  # per-sequence rows into [B, N], 1.0 on padding


def captured(model, layers, ids, attn):
    with capture_qk(model, layers) as cap:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=attn)
    return cap


# --- default_layers / _check_layers / attention_modules ------------------------------------------


def test_default_layers_round_halves_up_and_deduplicate():
    # L=2: middle third 0..1, points 0, .25, .5, .75, 1 -> 0, 0, 1, 1, 1
    assert default_layers(1) == [0]
    assert default_layers(2) == [0, 1]
    # L=3: 1..1 -> [1]
    assert default_layers(3) == [1]
    # L=5: 1..3, points 1, 1.5, 2, 2.5, 3 -> 1, 2, 2, 3, 3
    assert default_layers(5) == [1, 2, 3]
    # L=6: 2..3, points 2, 2.25, 2.5, 2.75, 3 -> 2, 2, 3, 3, 3
    assert default_layers(6) == [2, 3]
    # L=12: 4..7, points 4, 4.75, 5.5, 6.25, 7 -> 4, 5, 6, 6, 7
    assert default_layers(12) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match=r"^num_layers=-3, expected a positive int$"):
        default_layers(-3)


def test_check_layers_keeps_the_given_order_and_names_each_bad_list():
    assert _check_layers(None, 4) == [1, 2]
    assert _check_layers([3, 0], 4) == [3, 0]
    assert _check_layers((2,), 4) == [2]
    with pytest.raises(ValueError, match=r"^layers is empty, expected at least one decoder layer index$"):
        _check_layers([], 4)
    with pytest.raises(ValueError, match=r"^layers \[-1\] out of range: the model has 4 decoder layers \(valid 0\.\.3\)$"):
        _check_layers([0, -1], 4)
    with pytest.raises(ValueError, match=r"^layers \[1\.0, 4\] out of range"):
        _check_layers([1.0, 3, 4], 4)
    with pytest.raises(ValueError, match=r"^layers=\[1, 2, 1\] has duplicates, expected distinct layer indices$"):
        _check_layers([1, 2, 1], 4)


def test_attention_modules_are_the_decoder_layers_in_depth_order(model):
    found = attention_modules(model)
    assert found == [layer.self_attn for layer in model.model.layers]
    with pytest.raises(ValueError, match=r"^Linear has no decoder layer with a 'self_attn' module; expected a "
                                         r"Llama/Qwen-style decoder with attention classes \('LlamaAttention', "):
        attention_modules(torch.nn.Linear(2, 2))
    layer = torch.nn.Module()
    layer.self_attn = type("GPT2Attention", (torch.nn.Module,), {})()
    with pytest.raises(TypeError, match=r"^attention module class GPT2Attention is not supported by the q/k capture "
                                        r"hooks \(supported: LlamaAttention, Qwen2Attention, Qwen3Attention\)$"):
        attention_modules(torch.nn.Sequential(layer))
    # a self_attn that is not a module is not a decoder layer
    plain = torch.nn.Module()
    plain.self_attn = "not a module"
    with pytest.raises(ValueError, match="has no decoder layer"):
        attention_modules(torch.nn.Sequential(plain))


def test_rotate_half_swaps_and_negates_the_halves():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert _rotate_half(x).tolist() == [[-3.0, -4.0, 1.0, 2.0]]


# --- QKCapture ---------------------------------------------------------------------------------


def test_qkcapture_defaults_and_completeness():
    cap = QKCapture(layers=[2, 0], scale=0.5)
    assert cap.states == {} and cap.compute_device is None and cap.hook_s == 0.0
    cap.states[2] = {"q": torch.zeros(1)}  # no key states: incomplete
    cap.states[0] = {"q": torch.zeros(1), "k": torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r"^no query/key states were captured for layers \[2\]: run one forward "
                                           r"pass of the model inside capture_qk \(the hooks saw none for these "
                                           r"layers\)$"):
        cap.check_complete()
    with pytest.raises(RuntimeError, match=r"layers \[2\]"):
        _ = cap.shape
    with pytest.raises(RuntimeError, match=r"layers \[2\]"):
        cap.sequence(0, torch.arange(1))


def test_capture_holds_the_post_rope_states_of_the_projections(model):
    ids, attn, _, _ = batch("right")
    layers = [3, 1]
    cap = captured(model, layers, ids, attn)
    assert cap.layers == [3, 1] and cap.scale == 8 ** -0.5  # head_dim 32 / 4 = 8
    assert cap.compute_device == torch.device("cpu") and cap.hook_s > 0.0
    assert cap.shape == (3, 9)
    for i in layers:
        assert set(cap.states[i]) == {"q", "k"}  # the RoPE tables are dropped once both are captured
    # the reference: the module's own projections of its input, rotated by HF's apply_rotary_pos_emb
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    seen = {}
    attn1 = model.model.layers[1].self_attn

    def grab(module, args, kwargs):
        seen["h"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["pe"] = kwargs["position_embeddings"]

    handle = attn1.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=attn)
    finally:
        handle.remove()
    h = seen["h"]
    q = attn1.q_proj(h).view(3, 9, 4, 8).transpose(1, 2)
    k = attn1.k_proj(h).view(3, 9, 2, 8).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, *seen["pe"])
    torch.testing.assert_close(cap.states[1]["q"], q.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(cap.states[1]["k"], k.detach(), rtol=0, atol=1e-6)
    assert cap.states[1]["q"].dtype == torch.float32 and not cap.states[1]["q"].requires_grad
    # stacked and sequence read those states, layer by layer in the given order
    sq, sk = cap.stacked()
    assert sq.shape == (2, 3, 4, 9, 8) and sk.shape == (2, 3, 2, 9, 8)
    assert torch.equal(sq[1], cap.states[1]["q"]) and torch.equal(sk[0], cap.states[3]["k"])
    tokens = torch.tensor([0, 2, 5])
    qs, ks = cap.sequence(2, tokens)
    assert torch.equal(qs[0], cap.states[3]["q"][2][:, tokens]) and torch.equal(ks[1], cap.states[1]["k"][2][:, tokens])


def test_only_the_first_forward_is_captured(model):
    ids, attn, _, _ = batch("right")
    with capture_qk(model, [2]) as cap:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=attn)
            first_q, first_k = cap.states[2]["q"].clone(), cap.states[2]["k"].clone()
            model(input_ids=(ids + 1) % 40, attention_mask=attn)
    assert torch.equal(cap.states[2]["q"], first_q) and torch.equal(cap.states[2]["k"], first_k)
    assert set(cap.states[2]) == {"q", "k"}


def test_layers_with_different_scales_are_an_error(model):
    modules = attention_modules(model)
    old = modules[2].scaling
    modules[2].scaling = 0.25
    try:
        with pytest.raises(ValueError, match=r"^layers \[1, 2\] use different attention scales "
                                             rf"\[0\.25, {old}\], expected one$"):
            with capture_qk(model, [1, 2]):
                pass
        with capture_qk(model, [2]) as cap:  # one layer: its own scale
            pass
        assert cap.scale == 0.25
    finally:
        modules[2].scaling = old


def _hidden_and_rope(model, n=5):
    h = torch.randn(1, n, 32, generator=torch.Generator().manual_seed(3))
    cos, sin = model.model.rotary_emb(h, torch.arange(n)[None])
    return h, (cos, sin)


def test_position_embeddings_are_read_from_keywords_or_the_second_argument(model):
    attn1 = model.model.layers[1].self_attn
    h, pe = _hidden_and_rope(model)
    with capture_qk(model, [1]) as by_kw:
        with torch.no_grad():
            attn1(hidden_states=h, position_embeddings=pe, attention_mask=None)
    with capture_qk(model, [1]) as by_pos:
        with torch.no_grad():
            attn1(h, pe, None)
    assert by_kw.states[1]["q"].shape == (1, 4, 5, 8)
    torch.testing.assert_close(by_pos.states[1]["q"], by_kw.states[1]["q"], rtol=0, atol=0)
    torch.testing.assert_close(by_pos.states[1]["k"], by_kw.states[1]["k"], rtol=0, atol=0)
    # without them: an error naming the class and the layer, for a call with one or two arguments
    message = (r"^LlamaAttention \(layer 1\) was called without position_embeddings=\(cos, sin\); "
               r"the capture hooks expect the transformers 5\.x attention signature$")
    for args, kwargs in (((h,), {}), ((h, None), {}), ((h,), {"position_embeddings": None})):
        with pytest.raises(RuntimeError, match=message):
            with capture_qk(model, [1]):
                with torch.no_grad():
                    attn1(*args, **kwargs)
    # the hooks are gone after an error
    assert not attn1._forward_pre_hooks and not attn1.q_proj._forward_hooks and not attn1.k_proj._forward_hooks


def test_a_sliding_window_shorter_than_the_sequence_is_an_error(model):
    ids, attn, _, _ = batch("right")  # 9 tokens
    attn2 = model.model.layers[2].self_attn
    try:
        attn2.sliding_window = 9  # as long as the sequence: full causal attention, fine
        assert captured(model, [2], ids, attn).shape == (3, 9)
        attn2.sliding_window = 8
        with pytest.raises(ValueError, match=r"^layer 2 \(LlamaAttention\) uses sliding-window attention \(window 8\) "
                                             r"over 9 tokens; the capture assumes full causal attention$"):
            captured(model, [2], ids, attn)
    finally:
        del attn2.sliding_window


def test_partial_rotary_embeddings_are_an_error(model):
    attn1 = model.model.layers[1].self_attn
    h, (cos, sin) = _hidden_and_rope(model)
    with pytest.raises(ValueError, match=r"^layer 1: RoPE cos has last dim 4, expected head_dim 8 "
                                         r"\(partial rotary embeddings are not supported\)$"):
        with capture_qk(model, [1]):
            with torch.no_grad():
                attn1(h, (cos[..., :4], sin[..., :4]), None)


# --- argument checks ----------------------------------------------------------------------------


def test_split_kwargs_names_the_unknown_and_the_accepted_keys():
    _split_kwargs({"a": 1}, ("a", "b"), "f")
    with pytest.raises(TypeError, match=r"^f got unexpected keyword arguments \['c', 'd'\] \(accepted: \['a', 'b'\]\)$"):
        _split_kwargs({"d": 1, "a": 2, "c": 3}, ("b", "a"), "f")


def test_check_masks_names_each_mask():
    ids = torch.zeros(2, 3, dtype=torch.long)
    _check_masks(ids, attention_mask=torch.ones(2, 3), response_mask=None)
    with pytest.raises(ValueError, match=r"^response_mask has shape \[2, 4\], expected \[2, 3\] like input_ids$"):
        _check_masks(ids, attention_mask=torch.ones(2, 3), response_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"^input_ids has shape \[1, 2, 3\], expected \[B, N\]$"):
        _check_masks(ids[None])


def test_model_functions_check_their_masks_before_the_forward(model):
    ids, attn, resp, ans = batch()
    with pytest.raises(ValueError, match=r"^response_mask has shape \[3, 8\], expected \[3, 9\] like input_ids$"):
        model_rhythm_gamma(model, ids, attn, resp[:, 1:], layers=[1])
    with pytest.raises(ValueError, match=r"^answer_mask has shape \[3, 8\], expected \[3, 9\] like input_ids$"):
        model_flow_gamma(model, ids, attn, resp, ans[:, 1:], layers=[1])
    with pytest.raises(ValueError, match=r"^response_mask has shape \[3, 8\], expected \[3, 9\] like input_ids$"):
        model_flow_gamma(model, ids, attn, resp[:, 1:], ans, layers=[1])


def test_from_qk_functions_check_the_batch_against_the_capture(model):
    ids, attn, resp, ans = batch()
    cap = captured(model, [1], ids, attn)
    bad = torch.ones(3, 8, dtype=torch.bool)
    for name, args in (("attention_mask", (bad, resp)), ("response_mask", (attn, bad))):
        with pytest.raises(ValueError, match=rf"^{name} has shape \[3, 8\], expected \[3, 9\] like the captured input_ids$"):
            rhythm_gamma_from_qk(cap, *args)
    with pytest.raises(ValueError, match=r"^advantages has shape \[3, 8\], expected \[3, 9\] like the captured"):
        rhythm_gamma_from_qk(cap, attn, resp, advantages=bad.float(), sign_mode="positive")
    with pytest.raises(ValueError, match=r"^answer_mask has shape \[3, 8\], expected \[3, 9\] like the captured"):
        flow_gamma_from_qk(cap, attn, resp, bad)
    with pytest.raises(TypeError, match=r"^flow_gamma_from_qk got unexpected keyword arguments \['window'\] "
                                        r"\(accepted: \['block_size', 'edge_threshold', 'gamma_flow', 'normalize', "
                                        r"'q', 'scores_per_step', 'sign_mode'\]\)$"):
        flow_gamma_from_qk(cap, attn, resp, ans, window=3)
    with pytest.raises(TypeError, match=r"^rhythm_gamma_from_qk got unexpected keyword arguments \['normalize'\] "
                                        r"\(accepted: \['alpha', 'block_size', 'gamma_amp', 'h_hi', 'h_lo', "
                                        r"'head_quantile', 'k', 'q', 'scores_per_step', 'sign_mode', 'tau_delta', "
                                        r"'tau_waad', 'window'\]\)$"):
        rhythm_gamma_from_qk(cap, attn, resp, normalize=True)


# --- non-finite states --------------------------------------------------------------------------


def test_non_finite_states_on_padding_are_ignored_and_on_real_tokens_named(model):
    embed = model.model.embed_tokens.weight
    saved = embed[[0, 45]].clone()
    ids, attn, resp, _ = batch("right")
    try:
        with torch.no_grad():
            embed[0] = float("nan")  # padding id: only padding slots of layer 0 are NaN
        g = model_rhythm_gamma(model, ids, attn, resp, layers=[0], strategy="global")
        assert bool(torch.isfinite(g).all()) and bool((g[attn == 0] == 1.0).all())
        with torch.no_grad():
            embed[45] = float("nan")
        poisoned = ids.clone()
        poisoned[1, 3] = 45  # a real token of sequence 1 only
        with pytest.raises(ValueError, match=r"^sequence 1: non-finite query states on real tokens at layers \[0\]$"):
            model_rhythm_gamma(model, poisoned, attn, resp, layers=[0])
    finally:
        with torch.no_grad():
            embed[[0, 45]] = saved


def test_non_finite_keys_alone_are_named_as_keys(model):
    k_proj = model.model.layers[2].self_attn.k_proj
    saved = k_proj.weight.clone()
    ids, attn, resp, ans = batch("left")
    try:
        with torch.no_grad():
            k_proj.weight[0, 0] = float("inf")
        with pytest.raises(ValueError, match=r"^sequence 0: non-finite key states on real tokens at layers \[2\]$"):
            model_flow_gamma(model, ids, attn, resp, ans, layers=[2])
    finally:
        with torch.no_grad():
            k_proj.weight.copy_(saved)


# --- the reductions against the dense functions -------------------------------------------------


def test_an_empty_batch_mask_gives_float32_ones(model):
    ids, attn, resp, ans = batch()
    cap = captured(model, [1], ids, attn)
    none = torch.zeros_like(attn)
    for out in (rhythm_gamma_from_qk(cap, none, resp), flow_gamma_from_qk(cap, none, resp, ans)):
        assert out.dtype == torch.float32 and out.shape == (3, 9) and bool((out == 1).all())


def test_a_padding_column_no_sequence_uses_changes_nothing(model):
    # right padding plus one more all-padding column: the packed width (9) is less than N (10)
    ids, attn, resp, ans = batch("right")
    pad_col = torch.zeros(3, 1, dtype=torch.long)
    ids2, attn2 = torch.cat([ids, pad_col], 1), torch.cat([attn, pad_col], 1)
    resp2, ans2 = torch.cat([resp, pad_col.bool()], 1), torch.cat([ans, pad_col.bool()], 1)
    layers = [1, 2]
    a = model_rhythm_gamma(model, ids, attn, resp, layers=layers, strategy="local")
    b = model_rhythm_gamma(model, ids2, attn2, resp2, layers=layers, strategy="local")
    assert b.shape == (3, 10) and bool((b[:, 9] == 1).all())
    torch.testing.assert_close(b[:, :9], a, rtol=0, atol=1e-5)
    a = model_flow_gamma(model, ids, attn, resp, ans, layers=layers)
    b = model_flow_gamma(model, ids2, attn2, resp2, ans2, layers=layers)
    torch.testing.assert_close(b[:, :9], a, rtol=0, atol=1e-5)
    assert bool((b[:, 9] == 1).all())


@pytest.mark.parametrize("side", ["left", "right"])
def test_every_rhythm_keyword_reaches_the_rule(model, side):
    ids, attn, resp, _ = batch(side)
    layers = [0, 2]
    adv = torch.linspace(-1, 1, 27).reshape(3, 9)
    kw = dict(window=2, h_lo=1, h_hi=3, head_quantile=0.5, q=0.6, gamma_amp=3.0, k=2, alpha=0.25,
              tau_waad=5.0, tau_delta=0.0)
    maps = dense_maps(model, ids, attn, layers)
    for sign_mode in ("negative", "positive"):
        want = scatter([attention_rhythm_gamma(m, resp[b][attn[b].bool()], strategy="coupled",
                                               advantages=adv[b][attn[b].bool()], sign_mode=sign_mode, **kw)
                        for b, m in enumerate(maps)], attn)
        got = model_rhythm_gamma(model, ids, attn, resp, layers=layers, strategy="coupled", advantages=adv,
                                 sign_mode=sign_mode, block_size=3, scores_per_step=20, **kw)
        assert got.dtype == torch.float32 and got.shape == (3, 9)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
        assert bool((got > 1).any()) and bool((got[attn == 0] == 1).all())
    # the default strategy is the coupled one; every default equals the dense function's
    want = scatter([attention_rhythm_gamma(m, resp[b][attn[b].bool()]) for b, m in enumerate(maps)], attn)
    torch.testing.assert_close(model_rhythm_gamma(model, ids, attn, resp, layers=layers).double(), want,
                               rtol=0, atol=1e-4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_every_flow_keyword_reaches_the_rule(model, side):
    ids, attn, resp, ans = batch(side)
    layers = [1, 3]
    adv = -torch.linspace(-1, 1, 27).reshape(3, 9)
    maps = dense_maps(model, ids, attn, layers)

    def dense(b, m, **kw):
        real = attn[b].bool()
        r, a = resp[b][real], ans[b][real]
        t = flow_throughput(m.mean(dim=(0, 1)), ~r, a, edge_threshold=kw.pop("edge_threshold", 0.0),
                            normalize=kw.pop("normalize", True))
        return flow_gamma(t, response_mask=r, **{key: v[b][real] if key == "advantages" else v for key, v in kw.items()})

    kw = dict(edge_threshold=0.05, normalize=False, q=0.7, gamma_flow=2.5, sign_mode="positive")
    want = scatter([dense(b, m, advantages=adv, **kw) for b, m in enumerate(maps)], attn)
    got = model_flow_gamma(model, ids, attn, resp, ans, layers=layers, advantages=adv, block_size=2,
                           scores_per_step=10, **kw)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
    assert bool((got == 2.5).any()) and bool((got[attn == 0] == 1).all())
    want = scatter([dense(b, m) for b, m in enumerate(maps)], attn)
    torch.testing.assert_close(model_flow_gamma(model, ids, attn, resp, ans, layers=layers).double(), want,
                               rtol=0, atol=1e-4)


def test_storage_on_cpu_and_the_default_layers(model):
    ids, attn, resp, ans = batch()
    a = model_rhythm_gamma(model, ids, attn, resp)
    b = model_rhythm_gamma(model, ids, attn, resp, layers=[1, 2], storage_device="cpu")
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    c = model_flow_gamma(model, ids, attn, resp, ans)
    d = model_flow_gamma(model, ids, attn, resp, ans, layers=[1, 2], storage_device=torch.device("cpu"))
    torch.testing.assert_close(c, d, rtol=0, atol=0)


class _NoHead(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise AssertionError("the LM head ran")


def test_the_forward_runs_the_decoder_body_without_the_lm_head_and_without_grad(model):
    ids, attn, resp, ans = batch()
    want_r = model_rhythm_gamma(model, ids, attn, resp, layers=[1])
    want_f = model_flow_gamma(model, ids, attn, resp, ans, layers=[1])
    head, grad_seen = model.lm_head, []
    handle = model.model.register_forward_hook(lambda m, a, o: grad_seen.append(torch.is_grad_enabled()))
    try:
        model.lm_head = _NoHead()
        torch.testing.assert_close(model_rhythm_gamma(model, ids, attn, resp, layers=[1]), want_r, rtol=0, atol=0)
        torch.testing.assert_close(model_flow_gamma(model, ids, attn, resp, ans, layers=[1]), want_f, rtol=0, atol=0)
    finally:
        model.lm_head = head
        handle.remove()
    assert grad_seen == [False, False]


def test_the_reductions_use_the_modules_own_attention_scale(model):
    # every layer scaled by 10 instead of head_dim ** -0.5: the eager maps and the captured path agree
    # (with 8 ** -0.5 instead, the selected tokens differ)
    ids, attn, resp, ans = batch("left")
    modules = attention_modules(model)
    old = modules[0].scaling
    layers = [1, 2]
    try:
        for m in modules:
            m.scaling = 10.0
        maps = dense_maps(model, ids, attn, layers)
        for strategy in ("local", "global"):
            want = scatter([attention_rhythm_gamma(m, resp[b][attn[b].bool()], strategy=strategy, h_lo=1, h_hi=4)
                            for b, m in enumerate(maps)], attn)
            got = model_rhythm_gamma(model, ids, attn, resp, layers=layers, strategy=strategy, h_lo=1, h_hi=4)
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
        want = scatter([flow_gamma(flow_throughput(m.mean(dim=(0, 1)), ~resp[b][attn[b].bool()],
                                                   ans[b][attn[b].bool()]), response_mask=resp[b][attn[b].bool()])
                        for b, m in enumerate(maps)], attn)
        got = model_flow_gamma(model, ids, attn, resp, ans, layers=layers)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)
    finally:
        for m in modules:
            m.scaling = old


def test_the_head_quantile_reaches_the_global_heads_of_the_fai():
    # the global strategy ranks tokens by the FAI of the global heads only, so the head quantile decides which
    # heads' FAI is averaged; each quantile must match the dense function's, and the quantiles must differ. The
    # shared model's near-uniform attention ranks tokens alike in every head, so this one has sharper attention
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
        vocab_size=50, max_position_embeddings=64, initializer_range=0.5,
    )
    sharp = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ids, attn, resp, _ = batch()
    layers = [0, 1, 2, 3]
    maps = dense_maps(sharp, ids, attn, layers)
    got = {}
    for hq in (0.0625, 1.0):  # 1 of the 16 (layer, head) pairs, or all of them
        kw = dict(strategy="global", head_quantile=hq, q=0.3, gamma_amp=2.0, h_lo=1, h_hi=2)
        want = scatter([attention_rhythm_gamma(m, resp[b][attn[b].bool()], **kw) for b, m in enumerate(maps)], attn)
        got[hq] = model_rhythm_gamma(sharp, ids, attn, resp, layers=layers, **kw).double()
        torch.testing.assert_close(got[hq], want, rtol=0, atol=1e-4)
    assert not torch.equal(got[0.0625], got[1.0])
