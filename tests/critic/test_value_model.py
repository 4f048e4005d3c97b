"""Value models on real tiny LMs and DeepSpeed engines: head shape and init, the value convention, the
tokenizer check, training on a fixed batch, and the stage's state_dict round trip, bit for bit."""

from __future__ import annotations

import shutil

import pytest
import torch

from credo.config import ConfigError, TinyModelConfig
from credo.distributed.engine import build_engine, setup_distributed
from credo.families.critic.value_model import ValueModel, load_value_model
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from tests.critic.test_stage import make_batch

TINY = TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def tiny_path():
    return str(build_tiny_model(TINY))


def test_head_shape_init_and_rng(tiny_path):
    lm, lm2 = load_causal_lm(tiny_path), load_causal_lm(tiny_path)
    state = torch.get_rng_state()
    a, b = ValueModel(lm, head_seed=0), ValueModel(lm2, head_seed=1)
    assert torch.equal(torch.get_rng_state(), state)  # building a critic draws nothing from the global RNG
    assert a.value_head.weight.shape == (1, 64) and torch.equal(a.value_head.bias, torch.zeros(1))
    assert 0.005 < float(a.value_head.weight.std()) < 0.05  # N(0, 0.02^2)
    assert not torch.equal(a.value_head.weight, b.value_head.weight)  # mini-critics start apart
    assert not hasattr(a, "lm_head")
    ids = torch.randint(4, 60, (3, 7))
    v = a(ids, torch.ones_like(ids))
    assert v.shape == (3, 6) and v.dtype == torch.float32


def test_value_column_j_sees_tokens_up_to_j_only(tiny_path):
    """Label-aligned like log-probs: column j is V(state after token j), the state that generates token j+1."""
    model = ValueModel(load_causal_lm(tiny_path), head_seed=0).eval()
    ids = torch.randint(4, 60, (1, 8))
    base = model(ids, torch.ones_like(ids))
    j = 4
    later = ids.clone()
    later[0, j + 1] = (later[0, j + 1] + 1 - 4) % 56 + 4  # change the token column j scores
    now = ids.clone()
    now[0, j] = (now[0, j] + 1 - 4) % 56 + 4
    v_later, v_now = model(later, torch.ones_like(ids)), model(now, torch.ones_like(ids))
    assert torch.equal(v_later[0, :j + 1], base[0, :j + 1])
    assert not torch.allclose(v_now[0, j], base[0, j])


def test_a_critic_with_another_tokenizer_is_an_error_naming_both(tiny_path, tmp_path):
    other = tmp_path / "critic"
    shutil.copytree(tiny_path, other)
    tok = load_tokenizer(str(other))
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    with pytest.raises(ConfigError) as e:
        load_value_model(str(other), dtype="float32", head_seed=0, actor_tokenizer=load_tokenizer(tiny_path),
                         actor_path=tiny_path)
    assert str(other) in str(e.value) and tiny_path in str(e.value) and "tokenizer" in str(e.value)


def _stage(tiny_path, num_critics=2, **kw):
    from credo.families.critic.stage import CriticAdvantage

    setup_distributed()
    tok = load_tokenizer(tiny_path)
    engines = [build_engine(load_value_model(tiny_path, dtype="float32", head_seed=m, actor_tokenizer=tok,
                                             actor_path=tiny_path),
                            lr=1e-2, betas=[0.9, 0.999], weight_decay=0.01, grad_clip=1.0, zero_stage=1, warmup_steps=2,
                            micro_batch=2, grad_accum=2, bf16=False) for m in range(num_critics)]
    args = dict(gae_kwargs={"gamma": 1.0, "lam": 0.95}, value_agg="mean", whiten=False, kl_in_reward=0.0, kl=None,
                low_frac=0.2, high_frac=0.2, value_clip=0.2, epochs=1, mini_batches=1, micro_batch_size=2,
                grad_accum=2, critic_only_steps=0, zero_stage=1, world=1)
    args.update(kw)
    return CriticAdvantage(engines, **args)


def test_critic_training_reduces_value_loss_on_a_fixed_batch(tiny_path):
    stage = _stage(tiny_path, num_critics=1, low_frac=0.0, high_frac=0.0, epochs=4)
    losses = []
    for _ in range(4):
        b = make_batch([3, 2, 3, 1], rewards=[1.0, 0.0, 1.0, 0.0], group_ids=[0, 0, 1, 1])
        stage(b)
        losses.append(b.metrics["critic/value_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def _params(stage):
    return [{k: v.detach().clone() for k, v in e.module.state_dict().items()} for e in stage.engines]


def test_state_dict_round_trip_is_bit_exact(tiny_path):
    stage = _stage(tiny_path)
    warm = make_batch([3, 2, 3, 1], rewards=[1.0, 0.0, 1.0, 0.0], group_ids=[0, 0, 1, 1])
    stage(warm)  # optimizer moments and the LR schedule are non-trivial from here
    snap = stage.state_dict()
    first = make_batch([2, 3, 1, 3], rewards=[0.0, 1.0, 1.0, 0.0], group_ids=[0, 0, 1, 1], step=4)
    stage(first)
    after_first = _params(stage)
    stage.load_state_dict(snap)
    for e, s in zip(stage.engines, snap["critics"]):
        for k, v in e.module.state_dict().items():
            assert torch.equal(v, s["module"][k]), k
    again = make_batch([2, 3, 1, 3], rewards=[0.0, 1.0, 1.0, 0.0], group_ids=[0, 0, 1, 1], step=4)
    stage(again)
    for a, b in zip(after_first, _params(stage)):
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert torch.equal(first.advantages, again.advantages)
    keys = [k for k in first.metrics if not k.startswith("perf/")]
    assert {k: first.metrics[k] for k in keys} == {k: again.metrics[k] for k in keys}
