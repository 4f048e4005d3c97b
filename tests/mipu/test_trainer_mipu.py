"""MIPU on the trainer: a rejected step leaves the whole trainer state and the rollout engine as they were, an
accepted one keeps the candidate; T_post and the mismatch metrics of a real step against naive loops; the
induced mismatch of a bf16 rollout copy. Tiny model, in process, a few seconds per trainer."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch

from credo.config import load_recipe
from tests.e2e.common import tiny_overrides
from tests.e2e.rewards import starts_with_digit

FIXED_PROMPTS = [[5, 9, 14, 3], [7, 2, 11], [12, 4, 8, 6, 10]]


def make_trainer(out_dir, **extra):
    from credo.trainer import Trainer

    over = {"run.eval_every": 0, "run.plot": False, "run.save_every": 0, **extra}
    return Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(out_dir, **over)))


def engine_log_probs(trainer) -> list[list[float]]:
    """The rollout engine's sampled tokens and log-probs on fixed prompts and seeds."""
    out = trainer.c.source.backend.generate(FIXED_PROMPTS * 2, max_new_tokens=4, temperature=1.0, top_p=1.0,
                                            seeds=[11, 12, 13, 14, 15, 16])
    return [s.response_ids + s.rollout_log_probs for s in out]


def fingerprint(trainer) -> dict:
    """Parameters, Adam moments and step counts, fp32 master partitions, LR schedule and every RNG, copied."""
    e = trainer.engine
    base = getattr(e.optimizer, "optimizer", e.optimizer)
    moments = [(k, v.clone() if torch.is_tensor(v) else v) for st in base.state.values() for k, v in sorted(st.items())]
    return {
        "params": {k: v.detach().clone() for k, v in e.module.named_parameters()},
        "moments": moments,
        "fp32": [t.detach().clone() for t in getattr(e.optimizer, "single_partition_of_fp32_groups", [])],
        "sched": (e.lr_scheduler.last_epoch, list(e.lr_scheduler.get_last_lr()), e.global_steps),
        "torch_rng": torch.get_rng_state().clone(),
        "py_rng": random.getstate(),
        "np_rng": pickle_np(np.random.get_state()),
    }


def pickle_np(state):
    return (state[0], state[1].copy(), *state[2:])


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """Two steps with step 2 on and a bf16 rollout copy: step 1 forced to accept, step 2 to reject. Records the
    state before each step, the candidate (inside the validation), and the state after."""
    trainer = make_trainer(tmp_path_factory.mktemp("gate") / "run", **{"mipu.enabled": True,
                                                                        "rollout.dtype": "bfloat16"})
    (gate,) = trainer.c.hooks
    rec: dict = {"tokenizer": trainer.c.tokenizer}
    t_post = gate.t_post

    def spy_t_post(step):
        rec[step, "candidate"] = fingerprint(trainer)
        rec[step, "candidate_engine"] = engine_log_probs(trainer)
        rec[step, "candidate_model"] = copy.deepcopy(trainer.engine.module)
        generate, seen = gate.backend.generate, []

        def spy_generate(prompts, **kw):
            seen.extend(generate(prompts, **kw))
            return seen[-len(prompts):]

        gate.backend.generate = spy_generate
        try:
            value = t_post(step)
        finally:
            gate.backend.generate = generate
        rec[step, "val_samples"], rec[step, "t_post"] = list(seen), value
        return value

    gate.t_post = spy_t_post
    update = trainer.updater.update

    def spy_update(batch):
        rec[batch.step, "batch"] = batch
        rec[batch.step, "pre_update_model"] = copy.deepcopy(trainer.engine.module)
        return update(batch)

    trainer.updater.update = spy_update
    try:
        for step, c in ((1, 1e9), (2, -1e9)):  # accept iff T_post >= -c: always, then never
            gate.c_start = gate.c_end = c
            rec[step, "before"] = fingerprint(trainer)
            rec[step, "before_engine"] = engine_log_probs(trainer)
            rec[step, "row"] = trainer.train_step(step)
            rec[step, "after"] = fingerprint(trainer)
            rec[step, "after_engine"] = engine_log_probs(trainer)
    finally:
        trainer.close()
    return rec


def test_rejected_step_restores_everything_bitwise_and_resyncs_the_engine(gated):
    before, cand, after = gated[2, "before"], gated[2, "candidate"], gated[2, "after"]
    assert gated[2, "row"]["mipu/accepted"] == 0.0 and gated[2, "row"]["mipu/rollback_rate"] == 0.5
    # the candidate really moved (else the restore below would prove nothing)
    assert not same(before["params"], cand["params"]) and not same(before["moments"], cand["moments"])
    assert before["sched"] != cand["sched"]
    for key in ("params", "moments", "fp32", "sched", "torch_rng", "py_rng", "np_rng"):
        assert same(before[key], after[key]), key
    assert before["moments"], "step 1 was accepted: the optimizer holds moments"
    # the engine sampled differently with the candidate, and exactly as before the step after the re-sync
    assert gated[2, "candidate_engine"] != gated[2, "before_engine"]
    assert gated[2, "after_engine"] == gated[2, "before_engine"]


def test_accepted_step_keeps_the_candidate_and_the_engine_follows_it(gated):
    before, cand, after = gated[1, "before"], gated[1, "candidate"], gated[1, "after"]
    assert gated[1, "row"]["mipu/accepted"] == 1.0
    assert not same(before["params"], after["params"])
    for key in ("params", "moments", "fp32", "sched"):
        assert same(cand[key], after[key]), key
    assert gated[1, "after_engine"] == gated[1, "candidate_engine"] != gated[1, "before_engine"]


def naive_token_log_probs(model, prompt: list[int], response: list[int]) -> list[float]:
    """log pi of each response token from a full forward and log-softmax of the whole vocabulary (T = 1)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    out = []
    for t, tok in enumerate(response):
        row = logits[len(prompt) + t - 1]
        out.append(float(row[tok] - torch.logsumexp(row, 0)))
    return out


def test_t_post_matches_a_naive_loop(gated):
    samples, model, tokenizer = gated[1, "val_samples"], gated[1, "candidate_model"], gated["tokenizer"]
    G = 4  # mipu.val_group_size default
    assert len(samples) == 8 * G  # mipu.val_prompts default
    texts = tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
    rewards = starts_with_digit(texts, [None] * len(texts))
    terms = []
    for i0 in range(0, len(samples), G):
        grp = rewards[i0:i0 + G]
        mean = sum(grp) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
        for j in range(G):
            s = samples[i0 + j]
            a = (grp[j] - mean) / (std + 1e-6) if std > 0 else grp[j] - mean
            pi = naive_token_log_probs(model, s.prompt_ids, s.response_ids)
            d = [p - m for p, m in zip(pi, s.rollout_log_probs)]
            rho = math.exp(sum(d) / len(d))
            terms.append(rho * a)
    naive = -sum(terms) / len(terms)
    t_post, val_reward = gated[1, "t_post"]
    assert t_post == pytest.approx(naive, abs=1e-7)
    assert gated[1, "row"]["mipu/t_post"] == t_post
    assert val_reward == pytest.approx(sum(rewards) / len(rewards))
    assert any(abs(x) > 1e-3 for x in terms), "all advantages ~0: the comparison would be trivial"


def naive_quantile(sorted_vals, q):
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (pos - lo) * (sorted_vals[hi] - sorted_vals[lo])


def test_mismatch_metrics_match_a_naive_loop(gated):
    batch, model, row = gated[1, "batch"], gated[1, "pre_update_model"], gated[1, "row"]
    d = []
    for i, s in enumerate(batch.samples):
        if not bool(batch.valid[i]):
            continue
        pi = naive_token_log_probs(model, s.prompt_ids, s.response_ids)
        d += [p - m for p, m, keep in zip(pi, s.rollout_log_probs, s.response_mask) if keep]
    r = [math.exp(x) for x in d]
    k3 = sum(ri - 1 - x for ri, x in zip(r, d)) / len(d)
    ds = sorted(d)
    assert row["mismatch/k3"] == pytest.approx(k3, rel=1e-3, abs=1e-10)
    assert k3 > 1e-8, "a bf16 rollout copy differs from the fp32 trainer"
    for q, key in ((0.01, "p1"), (0.5, "p50"), (0.99, "p99")):
        assert row[f"mismatch/log_ratio_{key}"] == pytest.approx(naive_quantile(ds, q), abs=2e-6)
    assert row["mismatch/ess"] == pytest.approx(sum(r) ** 2 / (len(r) * sum(x * x for x in r)), abs=1e-9)
    assert row["mismatch/max_ratio"] == pytest.approx(max(r), abs=2e-6)


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_fp32_rollout_has_no_mismatch_and_bf16_has_some(tmp_path, dtype, gated):
    extra = {} if dtype is None else {"rollout.dtype": dtype}
    trainer = make_trainer(tmp_path / "run", **extra)
    try:
        row = trainer.train_step(1)
    finally:
        trainer.close()
    bf16 = gated[1, "row"]["mismatch/k3"]
    assert 0 <= row["mismatch/k3"] < 1e-10 and bf16 > 1000 * max(row["mismatch/k3"], 1e-12)
    assert abs(row["mismatch/log_ratio_p99"]) < 1e-4 < abs(gated[1, "row"]["mismatch/log_ratio_p99"])
    assert "mipu/accepted" not in row
