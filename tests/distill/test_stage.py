"""The distill stage on a real (tiny) trainer: the teacher's log-probs against a naive per-row forward, the reward
form's advantages and their mix, the loss-term form in the objective, and the distill/* metrics of a train step."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.config import load_recipe
from credo.train.batch import pack_batch
from tests.e2e.common import tiny_overrides

TEACHER = {"distill.enabled": True, "distill.teacher": "warmup", "distill.teacher_sft": "{noisy_frac: 0.0, steps: 8}"}


def make_trainer(out_dir, **extra):
    from credo.trainer import Trainer

    over = {"run.eval_every": 0, "run.plot": False, "run.save_every": 0, **TEACHER, **extra}
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(out_dir, **over))
    t = Trainer(r)
    t.recipe_for_test = r
    return t


def naive_teacher_log_probs(folder, input_ids, attention_mask, mask):
    """Each row alone through the teacher, unpadded; log-softmax of the logits, the next token picked by a loop."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = torch.zeros(mask.shape, dtype=torch.float64)
    with torch.no_grad():
        for b in range(input_ids.shape[0]):
            n = int(attention_mask[b].sum())
            logits = model(input_ids=input_ids[b:b + 1, :n]).logits[0].double()
            for t in range(n - 1):
                if mask[b, t]:
                    out[b, t] = logits[t].log_softmax(-1)[int(input_ids[b, t + 1])]
    return out


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = make_trainer(tmp_path_factory.mktemp("distill"), **{"distill.weight": 0.5, "distill.loss_coef": 0.3})
    yield t
    t.close()


def rolled(trainer):
    c = trainer.c
    batch = c.source.rollout(1)
    c.reward(batch)
    pack_batch(batch, c.tokenizer.pad_token_id, overlong_filter=False)
    return batch


def test_reward_form_advantage_is_the_mix_with_the_teachers_naive_log_ratio(trainer):
    from credo.families.distill.teacher import teacher_folder

    c = trainer.c
    stage = c.advantage
    batch = rolled(trainer)
    outcome = copy.copy(batch)
    stage.default(outcome)  # the outcome advantage alone
    stage(batch)
    m = batch.loss_mask
    assert m.any()
    folder, _ = teacher_folder(trainer.recipe_for_test, c.task)
    teacher = naive_teacher_log_probs(folder, batch.input_ids, batch.attention_mask, m)
    coef, scored = batch.target_terms["distill_kl"]
    assert coef == 0.3
    torch.testing.assert_close(scored.double()[m], teacher[m], atol=1e-5, rtol=1e-5)
    want = 0.5 * outcome.advantages.double() + 0.5 * (teacher - batch.rollout_log_probs.double())
    torch.testing.assert_close(batch.advantages.double()[m], want[m], atol=1e-5, rtol=1e-5)
    assert torch.equal(batch.advantages[~m], torch.zeros_like(batch.advantages[~m]))
    d = (batch.rollout_log_probs.double() - teacher)[m]
    assert batch.metrics["distill/reverse_kl"] == pytest.approx(d.mean().item(), abs=1e-5)
    assert batch.metrics["distill/teacher_logprob"] == pytest.approx(teacher[m].mean().item(), abs=1e-5)
    assert batch.metrics["distill/student_logprob"] == pytest.approx(batch.rollout_log_probs[m].double().mean().item(),
                                                                     abs=1e-5)


def test_a_train_step_logs_the_metrics_and_adds_the_loss_term(trainer):
    row = trainer.train_step(1)
    for key in ("distill/reverse_kl", "distill/teacher_logprob", "distill/student_logprob", "train/distill_kl"):
        assert key in row and row[key] == row[key], key
    assert row["distill/reverse_kl"] == pytest.approx(row["distill/student_logprob"] - row["distill/teacher_logprob"],
                                                      abs=1e-5)
    assert row["train/distill_kl"] >= 0
    want = row["train/pg_loss"] + 0.3 * row["train/distill_kl"]  # entropy_coef 0, no reference KL
    assert row["train/loss"] == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_weight_zero_without_a_loss_term_only_measures(trainer):
    stage = trainer.c.advantage
    batch = rolled(trainer)
    outcome = copy.copy(batch)
    stage.default(outcome)
    stage.weight, stage.loss_coef = 0.0, 0.0
    try:
        stage(batch)
    finally:
        stage.weight, stage.loss_coef = 0.5, 0.3
    assert torch.equal(batch.advantages, outcome.advantages) and batch.target_terms == {}
    assert batch.metrics["distill/teacher_logprob"] < 0  # the teacher still scored the tokens
    assert batch.metrics["distill/reverse_kl"] == pytest.approx(
        batch.metrics["distill/student_logprob"] - batch.metrics["distill/teacher_logprob"], abs=1e-6)
