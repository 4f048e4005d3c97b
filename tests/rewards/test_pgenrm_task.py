"""P-GenRM's task (arXiv 2602.12116): users and gold chains against a reference written from style names, the
CRE reward on hand-made chains, strict keys, the scaling decisions by hand, and the evaluation on a tiny model."""

import re

import pytest
import torch

from credo.config import ConfigError, TaskConfig, load_recipe
from credo.families.judges.pgenrm.judge import kmeans_sphere, parse_evaluation_chain
from credo.families.judges.pgenrm.scaling import (history_embedding, load_judge_model, pair_correct, per_user_accuracy,
                                          run_scaling)
from credo.families.judges.pgenrm.task import USER_RULES, PersonalJudgeTask, compact_styles
from credo.tasks import make_task
from tests.e2e.common import REPO

# the reference: a response's style from its shape, each rule as a ranking of styles (ties = no preference)
RANK = {"short": {"bare": 0, "carry": 1, "worded": 2}, "verbose": {"bare": 2, "carry": 1, "worded": 0},
        "carry": {"carry": 0, "bare": 1, "worded": 1}, "plain": {"bare": 0, "worded": 0, "carry": 1}}

REF_RUBRIC = {"short": "len-", "verbose": "len+", "carry": "c+", "plain": "c-"}


def style(text: str) -> str:
    if re.fullmatch(r"\d+", text):
        return "bare"
    if re.fullmatch(r"\d+c[01]", text):
        return "carry"
    assert re.fullmatch(r"sum\d+", text), text
    return "worded"


def ref_prefers(rule, x, y):
    return RANK[rule][style(x)] < RANK[rule][style(y)]


@pytest.fixture(scope="module")
def task():
    return PersonalJudgeTask(2000, 60, seed=3, num_users=40, eval_users=12, shots=2, history_len=10,
                             history_noise=0.2)


def test_styles_are_right_answers():
    for a, b in ((17, 45), (10, 10), (99, 99)):
        st = compact_styles(a, b)
        assert int(st["bare"]) == a + b and st["worded"] == f"sum{a + b}"
        assert st["carry"] == f"{a + b}c{1 if a % 10 + b % 10 >= 10 else 0}"


def test_items_follow_the_users_rule_by_a_reference(task):
    items = [task.train(i) for i in range(400)] + task.eval_problems()
    for p in items:
        m = p.meta
        r1, r2 = m["responses"]
        chosen, rejected = (r1, r2) if m["chosen"] == 0 else (r2, r1)
        assert ref_prefers(m["rule"], chosen, rejected) and not ref_prefers(m["rule"], rejected, chosen)
        s = parse_evaluation_chain(p.answer)
        assert s[m["chosen"]] > s[1 - m["chosen"]]  # the gold chain scores the preferred one higher
        assert p.answer.split()[:2] == [f"{m['rule']}:{REF_RUBRIC[m['rule']]}", style(r1)[0] + style(r2)[0]]
        shots = "".join(f"{q}{c}>{x};" for q, c, x in m["shots"])
        assert p.prompt == f"{shots}{m['question']}{r1}?{r2}:" and len(m["shots"]) == 2
        assert all(e in task.history[m["user"]] for e in m["shots"])
        ref = [r for r in USER_RULES if all(ref_prefers(r, c, x) for _, c, x in m["shots"])]
        assert m["consistent_rules"] == ref
    train_users = {task.train(i).meta["user"] for i in range(400)}
    eval_users = {p.meta["user"] for p in task.eval_problems()}
    assert train_users == set(range(40)) and eval_users == set(range(40, 52))  # disjoint, all used
    # the shots leave the rule open on a real share of pairs, and pin it on most
    open_share = sum(len(p.meta["consistent_rules"]) != 1 for p in items) / len(items)
    assert 0.2 < open_share < 0.7


def test_history_noise_rate(task):
    flipped = [not ref_prefers(task.user_rule[u], c, x) for u in range(52) for _, c, x in task.history[u]]
    assert 0.1 < sum(flipped) / len(flipped) < 0.3  # 0.2 asked, 520 events
    clean = PersonalJudgeTask(10, 5, seed=3, num_users=8, eval_users=5, history_noise=0.0)
    assert all(ref_prefers(clean.user_rule[u], c, x) for u in range(13) for _, c, x in clean.history[u])


def test_items_are_deterministic_and_seeded():
    a, b = PersonalJudgeTask(50, 10, seed=1, eval_users=5), PersonalJudgeTask(50, 10, seed=1, eval_users=5)
    assert [a.train(i).prompt for i in range(20)] == [b.train(i).prompt for i in range(20)]
    c = PersonalJudgeTask(50, 10, seed=2, eval_users=5)
    assert [a.train(i).prompt for i in range(20)] != [c.train(i).prompt for i in range(20)]


def test_reward_on_hand_made_chains(task):
    p = next(q for q in task.eval_problems() if q.meta["rule"] == "carry")
    good = (8, 3) if p.meta["chosen"] == 0 else (3, 8)
    bad = good[::-1]
    box = lambda s: f"\\boxed{{{s[0]}, {s[1]}}}"  # noqa: E731
    cases = {f"carry:c+ {box(good)}": (1.0, 1.0), f"carry:c+ {box(bad)}": (1.0, 0.0),
             f"carry:len- {box(good)}": (0.5, 1.0), f"short:c+ {box(good)}": (0.5, 1.0),
             f"verbose:len+ {box(good)}": (0.0, 1.0), "carry:c+ \\boxed{5, 5}": (1.0, 0.0),
             "carry:c+ \\boxed{11, 2}": (1.0, 0.0), "carry:c+": (1.0, 0.0), "": (0.0, 0.0)}
    for text, (pr, out) in cases.items():
        assert (task.process(text, p), task.outcome(text, p)) == (pr, out), text
        assert task.score(text, p) == pytest.approx(0.5 * pr + 1.0 * out)
    t2 = PersonalJudgeTask(50, 10, seed=3, eval_users=5, alpha=0.0, beta=2.0)
    q = t2.eval_problems()[0]
    assert t2.score(q.answer, q) == 2.0 and t2.score("x", q) == 0.0


@pytest.mark.parametrize("kwargs, key", [
    ({"shots": 0}, "shots"), ({"shots": 2.5}, "shots"), ({"history_len": 1, "shots": 2}, "history_len"),
    ({"history_noise": 0.5}, "history_noise"), ({"history_noise": -0.1}, "history_noise"),
    ({"alpha": -1}, "alpha"), ({"beta": "x"}, "beta"), ({"beta": float("inf")}, "beta"),
    ({"alpha": 0, "beta": 0}, "alpha"),
    ({"rules": ["short", "long"]}, "rules"), ({"rules": []}, "rules"), ({"rules": "short"}, "rules"),
    ({"num_users": 0}, "num_users"), ({"eval_users": True}, "eval_users"), ({"eval_users": 500}, "eval_size"),
    ({"shotz": 2}, "shotz"),
])
def test_bad_keys_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        make_task(TaskConfig(name="pgenrm_users", train_size=100, eval_size=200, kwargs=kwargs))


def test_history_embeddings_cluster_users_by_rule():
    t = PersonalJudgeTask(10, 4, seed=0, num_users=80, eval_users=4, history_len=12, history_noise=0.1)
    x = torch.stack([history_embedding(h) for h in t.history[:80]])
    _, assign = kmeans_sphere(x, 4, seed=0)
    rules = t.user_rule[:80]
    purity = sum(max(sum(rules[i] == r for i in range(80) if assign[i] == c) for r in USER_RULES)
                 for c in range(4)) / 80
    assert purity > 0.85


def test_scaling_decisions_by_hand():
    right, wrong = "carry:c+ \\boxed{8, 3}", "verbose:len+ \\boxed{3, 8}"  # the chosen response is the first
    got = pair_correct(0, wrong, own=[right, right, wrong, "junk", wrong, wrong], neighbours=[right, right],
                       n_self=4)
    # Ind-4 means (6.33, 4.67) over 3 parsed; Ind-6 (4.67, 6.33); fused with neighbours (8, 3): (7.17, 3.83)
    assert got == {"none": 0.0, "ind": 1.0, "ind_more": 0.0, "ind_pro": 1.0, "pro": 1.0}
    # Ind-N averages the scores, not votes: one confident chain can outweigh two mild ones
    got = pair_correct(0, right, own=["x:y \\boxed{4, 5}", "x:y \\boxed{4, 5}", "x:y \\boxed{9, 1}"], neighbours=[],
                       n_self=3)
    assert got["ind"] == 1.0 and got["ind_pro"] == 1.0 and got["pro"] == 0.5
    got = pair_correct(1, "junk", own=[right, wrong], neighbours=["junk"], n_self=2)
    assert got == {"none": 0.5, "ind": 0.5, "ind_more": 0.5, "ind_pro": 0.5, "pro": 0.5}  # ties and no parse: half
    assert per_user_accuracy([1, 0, 1, 1, 0.5], [7, 7, 8, 8, 9]) == pytest.approx((0.5 + 1 + 0.5) / 3)


def test_run_scaling_on_a_tiny_model_counts_chains_and_is_seeded():
    from credo.config import TinyModelConfig
    from credo.models import resolve_model_path

    path = resolve_model_path("tiny", TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1,
                                                      intermediate_size=128))
    backend, tok = load_judge_model(path)
    t = PersonalJudgeTask(20, 6, seed=0, num_users=12, eval_users=3)
    kw = dict(n_self=3, m_nb=2, k_protos=2, max_new_tokens=6)
    a, b = run_scaling(backend, tok, t, seed=5, **kw), run_scaling(backend, tok, t, seed=5, **kw)
    assert a["chains"] == 6 * (1 + 3 + 2) + 6 * 2 and a["users"] == 3 and a["pairs"] == 6
    assert a["examples"] == b["examples"] and a["per_user"] == b["per_user"]
    c = run_scaling(backend, tok, t, seed=6, **kw)
    assert c["examples"][0]["own"] != a["examples"][0]["own"]
    assert all(0 <= v <= 1 for v in a["per_user"].values())
    with pytest.raises(ConfigError, match="k_protos"):
        run_scaling(backend, tok, t, n_self=1, m_nb=1, k_protos=13)
    with pytest.raises(ConfigError, match="embed"):
        run_scaling(backend, tok, t, embed="text")


def test_recipe_loads_and_fits_the_context():
    r = load_recipe(REPO / "recipes" / "pgenrm.yaml")
    t = make_task(r.task)
    tok_len = max(len(t.train(i).prompt) + len(t.train(i).answer) for i in range(500))
    assert max(len(t.train(i).answer) for i in range(500)) < r.rollout.max_new_tokens  # the chain and its EOS fit
    assert tok_len < r.model.tiny.max_position_embeddings


@pytest.mark.slow
def test_recipe_runs_psi_then_cre_for_a_step(tmp_path):
    from tests.e2e.common import read_rows, run_cli

    o = {"run.output_dir": tmp_path / "run", "run.steps": 1, "run.eval_every": 1, "run.progress": False,
         "run.threads": 1, "model.tiny.num_layers": 1, "model.tiny.hidden_size": 64, "model.tiny.num_heads": 2,
         "model.tiny.num_kv_heads": 1, "model.tiny.intermediate_size": 128, "task.eval_size": 8,
         "task.kwargs": "{num_users: 12, eval_users: 4, shots: 2, history_len: 6}", "sft.steps": 2,
         "sft.batch_size": 8, "rollout.prompts_per_step": 2, "rollout.group_size": 4}
    p = run_cli(["run", "recipes/pgenrm.yaml", *[f"{k}={v}" for k, v in o.items()]], timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = read_rows(tmp_path / "run")
    assert any("eval/accuracy" in r for r in rows) and (tmp_path / "run" / "final" / "config.json").exists()
    train = [r for r in rows if "train/reward_mean" in r]
    assert train and 0 <= train[-1]["train/reward_mean"] <= 1.5  # R = 0.5 PR + OR lies in [0, 1.5]
