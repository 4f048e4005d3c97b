"""RM-NLHF's stage in detail (credo.families.judges.rm_nlhf): the hashed n-gram features against a counting reference, MetaRM's
seeded initialisation, prediction and Adam updates, every reward and metric of a hand-built batch with a scripted
similarity and MetaRM, and the factory's defaults and config error."""

import math
import zlib
from collections import Counter

import pytest
import torch

from credo.config import ConfigError
from credo.distributed.rollout import Sample
from credo.families.judges.critique_similarity import rouge_similarity
from credo.tasks import Problem
from credo.train.batch import Batch
from credo.train.registry import StageContext, resolve
from credo.families.judges.rm_nlhf import MetaRM, RMNLHFReward, rm_nlhf_rewards, rm_nlhf_stage, text_features
from tests.fakes import CharTok, recipe_with


def naive_features(text, dim=256, n=3):
    t = "^" + text + "$"
    grams = Counter(t[k:k + n] for k in range(len(t) - n + 1)) if len(t) >= n else Counter([t])
    v = [0.0] * dim
    for g, c in grams.items():
        v[zlib.crc32(g.encode()) % dim] += c
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def test_text_features_count_hashed_character_ngrams():
    texts = ["carry lost", "", "a", "aaaa"]
    got = text_features(texts)
    assert got.shape == (4, 256) and got.dtype == torch.float32
    for row, t in zip(got.tolist(), texts):
        assert row == pytest.approx(naive_features(t), abs=1e-6)
    # "" -> "^$", shorter than a trigram: the whole of it is one feature
    assert got[1, zlib.crc32(b"^$") % 256].item() == 1.0 and got[1].count_nonzero().item() == 1
    assert text_features(["abcd"], dim=8, n=2)[0].tolist() == pytest.approx(naive_features("abcd", 8, 2), abs=1e-6)


def test_metarm_initialises_from_its_seed():
    m = MetaRM(seed=3)
    g = torch.Generator().manual_seed(3)
    shapes = [(32, 512), (32,), (1, 32), (1,)]
    want = [torch.randn(s, generator=g) * 0.1 for s in shapes]
    got = [m.net[0].weight, m.net[0].bias, m.net[2].weight, m.net[2].bias]
    assert [tuple(p.shape) for p in got] == shapes and isinstance(m.net[1], torch.nn.Tanh)
    for p, w in zip(got, want):
        assert torch.equal(p.detach(), w)
    assert m.dim == 256 and list(m.parameters()) == [p for group in m.opt.param_groups for p in group["params"]]


def test_metarm_predicts_a_sigmoid_of_its_mlp_over_both_feature_sets():
    m = MetaRM(dim=16, hidden=4, seed=1)
    ctx, crit = ["07+45=", "01+01="], ["carry lost", "ok"]
    x = torch.cat([text_features(ctx, 16), text_features(crit, 16)], -1)
    assert torch.equal(m.features(ctx, crit), x)
    W1, b1, W2, b2 = (p.detach() for p in (m.net[0].weight, m.net[0].bias, m.net[2].weight, m.net[2].bias))
    want = [1 / (1 + math.exp(-(float(W2[0] @ torch.tanh(W1 @ row + b1)) + float(b2[0])))) for row in x]
    assert m.predict(ctx, crit).tolist() == pytest.approx(want, abs=1e-6)
    assert m.predict([], []).shape == (0,)


def test_metarm_update_returns_the_mse_before_and_takes_adam_steps_of_its_lr():
    ctx, crit, y = ["1+1=", "2+2=", "3+3="], ["carry lost", "ok", "stray dot"], torch.tensor([1.0, 0.0, 0.5])
    for lr in (1e-2, 0.05):
        m = MetaRM(seed=0) if lr == 1e-2 else MetaRM(seed=0, lr=lr)
        before = [p.detach().clone() for p in m.parameters()]
        mse = float(torch.mean((m.predict(ctx, crit) - y) ** 2))
        assert m.update(ctx, crit, y, steps=1) == pytest.approx(mse, rel=1e-6)
        # Adam's first step moves each parameter by lr * g / (|g| + eps): lr wherever the gradient is not tiny
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(m.parameters(), before))
        assert moved == pytest.approx(lr, rel=1e-3)
    assert math.isnan(MetaRM().update([], [], torch.zeros(0)))


def test_metarm_update_takes_twenty_steps_by_default():
    ctx, crit, y = ["1+1=", "2+2="], ["carry lost", "ok"], torch.tensor([1.0, 0.0])
    a, b = MetaRM(seed=0), MetaRM(seed=0)
    first = a.update(ctx, crit, y)
    losses = [b.update(ctx, crit, y, steps=1) for _ in range(20)]
    assert first == losses[0] and losses[-1] < losses[0]
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-7)


def test_reward_formula_keeps_the_similarity_dtype():
    out = rm_nlhf_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([False, True]),
                          torch.tensor([0.25, 0.75], dtype=torch.float64), lam=2.0, gate_on_outcome=False)
    assert out.dtype == torch.float32 and out.tolist() == [1.5, 1.0]
    gated = rm_nlhf_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([False, True]), None,
                            lam=2.0, gate_on_outcome=True)
    assert gated.tolist() == [1.0, 0.0]
    assert rm_nlhf_rewards(torch.tensor([0.0]), torch.tensor([0.5]), torch.tensor([True]), None, 1.0).tolist() == [0.5]


# ---- RMNLHFReward on a hand-built batch ----

class Outcome:
    """The verifier stage: fixed rewards and validity."""

    def __init__(self, rewards, valid):
        self.rewards, self.valid, self.closed = rewards, valid, 0

    def __call__(self, batch):
        batch.rewards = torch.tensor(self.rewards)
        batch.valid = torch.tensor(self.valid)

    def close(self):
        self.closed += 1


class Similarity:
    """0.8 for an exact match, else 0.2; records its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, cands, refs):
        self.calls.append((cands, refs))
        return [0.8 if c == r else 0.2 for c, r in zip(cands, refs)]


class RecordingMetaRM(MetaRM):
    """A MetaRM whose updates and predictions are recorded and scripted."""

    def __init__(self):
        super().__init__()
        self.updates, self.predicts = [], []

    def update(self, contexts, critiques, targets, steps=20):
        self.updates.append((contexts, critiques, targets.tolist(), steps))
        return 0.125

    def predict(self, contexts, critiques):
        self.predicts.append((contexts, critiques))
        return torch.tensor([0.5 + 0.25 * i for i in range(len(critiques))])


def problem(question, human, critique, error="other"):
    meta = {"has_human_critique": human, "critique": critique, "error": error}
    if question is not None:
        meta["question"] = question
    return Problem(f"{question}#", "", meta)


def batch_of(problems, texts):
    samples = [Sample([1], [ord(c) for c in t], [1] * len(t), [0.0] * len(t), True) for t in texts]
    return Batch(samples=samples, problems=problems, group_ids=torch.zeros(len(texts), dtype=torch.long))


PROBLEMS = [problem("1+1=", True, "carry lost"), problem("2+2=", True, "stray dot"), problem("3+3=", False, "bad digit"),
            problem("4+4=", True, "ok"), problem(None, False, "dropped")]
TEXTS = ["carry lost \\boxed{A}", "bad \\boxed{B}", "no bad digit here \\boxed{A}", "ok \\boxed{A}", "x \\boxed{B}"]


def test_similarity_for_human_items_and_metrics_without_metarm():
    outcome, sim, tok = Outcome([1.0, 0.0, 1.0, 1.0, 0.0], [True, True, True, False, True]), Similarity(), CharTok()
    stage = RMNLHFReward(outcome, tok, lam=0.5, similarity=sim)
    batch = batch_of(PROBLEMS, TEXTS)
    stage(batch)
    # the critique is the text before the first box; human items 0, 1, 3
    assert sim.calls == [(["carry lost", "bad", "ok"], ["carry lost", "stray dot", "ok"])]
    assert tok.decodes == [True]
    assert batch.rewards.tolist() == pytest.approx([1.4, 0.1, 1.0, 1.4, 0.0])
    m = batch.metrics
    assert m["reward/outcome_mean"] == pytest.approx(0.5)  # valid: 1, 0, 1, 0
    assert m["reward/similarity_mean"] == pytest.approx(0.5)  # human and valid: 0.8, 0.2
    # right and valid: items 0 and 2; item 0 names "carry lost", item 2 does not contain "bad digit"
    assert m["reward/critique_correct_frac"] == 1.0
    assert "reward/metarm_mse" not in m
    stage.close()
    assert outcome.closed == 1


def test_the_outcome_gate_and_a_wrong_critique():
    problems = [problem("1+1=", True, "carry lost"), problem("2+2=", False, "stray dot")]
    texts = ["carry lost \\boxed{A}", "nothing \\boxed{A}"]
    stage = RMNLHFReward(Outcome([0.0, 1.0], [True, True]), CharTok(), lam=1.0, similarity=Similarity(),
                         gate_on_outcome=True)
    batch = batch_of(problems, texts)
    stage(batch)
    assert batch.rewards.tolist() == [0.0, 1.0]  # item 0's similarity 0.8 is gated off by its wrong label
    assert batch.metrics["reward/critique_correct_frac"] == 0.0  # item 1 is right but does not name "stray dot"


def test_metarm_learns_on_human_items_and_scores_the_others():
    outcome, meta = Outcome([1.0, 0.0, 1.0, 1.0, 0.0], [True] * 5), RecordingMetaRM()
    stage = RMNLHFReward(outcome, CharTok(), lam=0.5, similarity=Similarity(), metarm=meta, metarm_steps=7)
    batch = batch_of(PROBLEMS, TEXTS)
    stage(batch)
    assert meta.updates == [(["1+1=", "2+2=", "4+4="], ["carry lost", "bad", "ok"], pytest.approx([0.8, 0.2, 0.8]), 7)]
    assert meta.predicts == [(["3+3=", ""], ["no bad digit here", "x"])]  # no question: an empty context
    # items 2 and 4 get MetaRM's 0.5 and 0.75
    assert batch.rewards.tolist() == pytest.approx([1.4, 0.1, 1.25, 1.4, 0.375])
    assert batch.metrics["reward/metarm_mse"] == 0.125
    assert batch.metrics["reward/similarity_mean"] == pytest.approx(0.6)


def test_metarm_with_only_human_items_is_not_asked():
    meta = RecordingMetaRM()
    stage = RMNLHFReward(Outcome([1.0], [True]), CharTok(), lam=0.5, similarity=Similarity(), metarm=meta)
    batch = batch_of(PROBLEMS[:1], TEXTS[:1])
    stage(batch)
    assert meta.predicts == [] and meta.updates[0][3] == 20 and batch.rewards.tolist() == pytest.approx([1.4])


def test_metrics_are_nan_without_their_samples():
    meta = MetaRM()
    sim = Similarity()
    stage = RMNLHFReward(Outcome([1.0, 1.0], [False, False]), CharTok(), lam=0.5, similarity=sim, metarm=meta)
    batch = batch_of([problem("1+1=", False, "a"), problem("2+2=", False, "b")], ["a \\boxed{A}", "b \\boxed{A}"])
    stage(batch)
    m = batch.metrics
    assert sim.calls == [] and math.isnan(m["reward/metarm_mse"])  # no human item to learn from
    assert all(math.isnan(m[k]) for k in ("reward/outcome_mean", "reward/similarity_mean",
                                          "reward/critique_correct_frac"))
    assert 1.0 < batch.rewards[0].item() < 1.5  # MetaRM's prediction in (0, 1), weighted by 0.5


# ---- the factory ----

def ctx(seed=0):
    return StageContext(rank=0, world=1, recipe=recipe_with(run={"seed": seed}), tokenizer=CharTok(), default=Outcome([1.0], [True]))


def test_the_stage_defaults(caplog):
    c = ctx(seed=5)
    stage = rm_nlhf_stage(c)
    assert stage.outcome is c.default and stage.tok is c.tokenizer
    assert (stage.lam, stage.gate, stage.metarm_steps) == (0.5, False, 20)
    assert isinstance(stage.metarm, MetaRM) and stage.metarm.opt.param_groups[0]["lr"] == 1e-2
    assert torch.equal(stage.metarm.net[0].weight, MetaRM(seed=5).net[0].weight)
    assert callable(stage.sim)


def test_the_stage_passes_its_kwargs_on():
    stage = rm_nlhf_stage(ctx(), lam=0.0, similarity="rouge_l", gate_on_outcome=True, metarm=False, metarm_steps=3)
    assert (stage.lam, stage.gate, stage.metarm, stage.metarm_steps) == (0.0, True, None, 3)
    assert stage.sim is rouge_similarity
    stage = rm_nlhf_stage(ctx(), similarity="rouge_l", metarm_lr=0.2)
    assert stage.metarm.opt.param_groups[0]["lr"] == 0.2


def test_a_negative_lam_names_the_key():
    with pytest.raises(ConfigError, match=r"^config key 'stages\.reward_kwargs\.lam' = -0\.5 is out of range: expected >= 0$"):
        rm_nlhf_stage(ctx(), lam=-0.5)


def test_the_stage_is_registered():
    from credo.family import builtin_families

    assert resolve("reward", "rm_nlhf", "stages.reward", builtin_families()).factory is rm_nlhf_stage
