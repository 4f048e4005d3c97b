"""The trainer-side half of the vLLM weight sync, without an engine (no vLLM needed, fast)."""

from __future__ import annotations

import pytest
import torch

from credo.distributed.weight_sync import (
    dedupe_tied,
    full_state_dict,
    pack_state_dict,
    refresh_tied_layers,
    unwrap_model,
)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_model(request):
    from transformers import AutoModelForCausalLM

    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model

    return AutoModelForCausalLM.from_pretrained(build_tiny_model(TinyModelConfig(tie_word_embeddings=request.param)),
                                                dtype=torch.float32)


class Wrapper(torch.nn.Module):
    """Stands in for a DeepSpeed engine / DDP: the real model sits at `.module`."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_full_state_dict_sends_each_tensor_once(hf_model):
    state = full_state_dict(Wrapper(hf_model))
    full = hf_model.state_dict()
    tied = hf_model.config.tie_word_embeddings
    expected = [k for k in full if not (tied and k == "lm_head.weight")]
    assert list(state) == expected
    assert "model.embed_tokens.weight" in state
    for k in expected:
        assert torch.equal(state[k], full[k])
    # no two entries share memory (safetensors would refuse them)
    ptrs = [t.untyped_storage().data_ptr() for t in state.values()]
    assert len(set(ptrs)) == len(ptrs)


def test_pack_round_trips(hf_model):
    from safetensors.torch import load

    state = full_state_dict(hf_model)
    state["extra.t"] = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous view
    back = load(pack_state_dict(state))
    assert sorted(back) == sorted(state)  # safetensors keeps its own order; push_weights sends the names
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)


def test_dedupe_keeps_first_name_per_storage():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    out = dedupe_tied({"x": a, "y": b, "x_alias": a, "row": a[1], "empty0": torch.empty(0), "empty1": torch.empty(0)})
    # `row` is a view at another offset and shape: a different tensor, kept
    assert list(out) == ["x", "y", "row", "empty0", "empty1"]


def test_unwrap_model():
    inner = torch.nn.Linear(2, 2)

    class Compiled(torch.nn.Module):  # what torch.compile returns: the original at `_orig_mod`
        def __init__(self, m):
            super().__init__()
            self._orig_mod = m

    assert unwrap_model(Wrapper(Compiled(Wrapper(inner)))) is inner
    assert unwrap_model(inner) is inner


class CountingMethod:
    def __init__(self):
        self.calls = 0

    def process_weights_after_loading(self, layer):
        self.calls += 1


class Layer(torch.nn.Module):
    def __init__(self, weight=None):
        super().__init__()
        self.weight = weight if weight is not None else torch.nn.Parameter(torch.randn(3, 2))
        self.quant_method = CountingMethod()


def test_refresh_tied_layers_reprocesses_only_aliases():
    model = torch.nn.Module()
    model.embed = Layer()
    model.body = Layer()
    model.head = Layer(model.embed.weight)  # vLLM's tie: the same Parameter object
    assert refresh_tied_layers(model) == ["head"]
    assert (model.embed.quant_method.calls, model.body.quant_method.calls, model.head.quant_method.calls) == (0, 0, 1)
