"""P-GenRM's training data on CPU (arXiv 2602.12116): synthetic users, evaluation chains, the CRE reward.

The paper's P-GenRM reads a user's preference history (few-shot (question, chosen, rejected) events), the
current question and two responses, and writes an *evaluation chain*: a persona and personalised criteria
(PART 1), then per-response scores (PART 2). It is trained by PSI (SFT on chains an instruction LLM wrote from
the user's whole history) and CRE (GRPO on R = alpha * PR + beta * OR). This module is that data for a tiny
character-level model; `credo.families.judges.pgenrm.scaling` is the test-time scaling evaluation.

Users (the issue's "synthetic users whose preferences follow a few hidden rules"). Every answer to a+b comes
in three compact styles: bare "57", with its carry "57c1", worded "sum57" (strictly longer in that order). A
user follows one hidden rule:

    short    the shorter answer          verbose   the longer answer
    carry    the one showing the carry   plain     the one without the carry mark   (`plain` is added here:
             with it every single event fits exactly two rules, so a few shots often leave the rule open)

Each user has a stored history of `history_len` events (a share `history_noise` of them flipped: real users
are inconsistent); only `shots` of them fit in the prompt. So the prompt under-determines the rule on a good
share of items (`meta["consistent_rules"]` lists the rules that fit the shots), which is where test-time
scaling can help. Held-out users (`eval_users`) are disjoint from the training users.

Item (one line, about 20 characters per event):

    prompt  "23+34=57>57c1;12+45=sum57>57c1;41+17=58c1?sum58:"   shots as chosen>rejected; then r1?r2:
    chain   "carry:c+ cw \\boxed{8, 3}"                           persona:rubric, style tags, then the scores

The gold chain (PSI's target) names the user's *real* rule and its rubric, tags each response's style (b, c, w:
the per-response criterion judgements of the paper's PART 2: with them the scores are a lookup on the chain's own
words; a first version without them left a tiny model's scores at chance), and scores the response that
rule prefers 8 and the other 3. Inferred: the paper's PSI translator sees the user's whole history, so its persona
is the real preference even when the few shots in the prompt are ambiguous; the fixed 8/3 scores stand for the
paper's weighted 1-10 rubric sums (only their order matters to accuracy).

`score` is CRE's mixed reward R = alpha * PR + beta * OR. OR = 1[the higher-scored response is the user's
chosen one] (a tie or an unparseable chain: 0). PR: the paper does not say how the process reward is computed
(LLM judge or rule); here it is rule-checked, 0.5 * 1[persona == real rule] + 0.5 * 1[rubric == that rule's
rubric]. Defaults alpha = 0.5, beta = 1.0 are inferred (the paper's Table 7 sweep values were not recovered).
The hard-negative curriculum (which turns PR off late) is not built.
"""

from __future__ import annotations

import math
import random

from credo.config import ConfigError
from credo.families.judges.pgenrm.judge import parse_evaluation_chain
from credo.families.judges.untrusted import defuse
from credo.tasks import Problem

USER_RULES = ("short", "verbose", "carry", "plain")
RUBRIC = {"short": "len-", "verbose": "len+", "carry": "c+", "plain": "c-"}
CHOSEN_SCORE, REJECTED_SCORE = 8, 3


def compact_styles(a: int, b: int) -> dict[str, str]:
    """The right answer to a+b as bare "57", with its carry "57c1" and worded "sum57" (lengths L < L+2 < L+3)."""
    s = a + b
    return {"bare": str(s), "carry": f"{s}c{(a % 10 + b % 10) // 10}", "worded": f"sum{s}"}


def user_prefers(rule: str, x: str, y: str) -> bool:
    """True when a user following `rule` strictly prefers response x to y."""
    if rule == "short":
        return len(x) < len(y)
    if rule == "verbose":
        return len(x) > len(y)
    if rule == "carry":
        return "c" in x and "c" not in y
    if rule == "plain":
        return "c" in y and "c" not in x
    raise ValueError(f"rule is {rule!r}, expected one of {USER_RULES}")


def _event(rule: str, rng: random.Random) -> tuple[str, str, str]:
    """(question, chosen, rejected) on a fresh question, from a pair of styles `rule` strictly orders."""
    while True:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        x, y = rng.sample(list(compact_styles(a, b).values()), 2)
        if user_prefers(rule, x, y):
            return f"{a}+{b}=", x, y
        if user_prefers(rule, y, x):
            return f"{a}+{b}=", y, x


def stored_history(rule: str, n: int, noise: float, seed: int) -> list[tuple[str, str, str]]:
    """A user's n stored events; each flipped (chosen <-> rejected) with probability `noise`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        q, c, r = _event(rule, rng)
        out.append((q, r, c) if rng.random() < noise else (q, c, r))
    return out


PROMPT_DELIMITERS = (">", ";", "?", ":")
"""The separators of a P-GenRM prompt; deleted from the responses shown in it (`untrusted.defuse`)."""


def render_prompt(shots: list[tuple[str, str, str]], question: str, r1: str, r2: str) -> str:
    """Shots as "q chosen>rejected;", then "q r1?r2:"; every response defused, so none can end its slot."""
    def d(text: str) -> str:
        return defuse(text, PROMPT_DELIMITERS)

    return "".join(f"{q}{d(c)}>{d(r)};" for q, c, r in shots) + f"{question}{d(r1)}?{d(r2)}:"


TAGS = {"bare": "b", "carry": "c", "worded": "w"}


def style_tag(response: str) -> str:
    """The one-letter style of a response: b(are), c(arry) or w(orded)."""
    return "w" if response.startswith("sum") else "c" if "c" in response else "b"


def gold_chain(rule: str, r1: str, r2: str, first_chosen: bool) -> str:
    """persona:rubric, the two responses' style tags (the per-response criterion judgements), the scores."""
    s = (CHOSEN_SCORE, REJECTED_SCORE) if first_chosen else (REJECTED_SCORE, CHOSEN_SCORE)
    return f"{rule}:{RUBRIC[rule]} {style_tag(r1)}{style_tag(r2)} \\boxed{{{s[0]}, {s[1]}}}"


def analysis_text(chain: str) -> str:
    """The chain's persona and rubric ("carry:c+"): its first word."""
    words = chain.split()
    return words[0] if words else ""


def consistent_rules(shots: list[tuple[str, str, str]], rules=USER_RULES) -> list[str]:
    """The rules every shot agrees with (ambiguous shots: more than one; a flipped event can leave none)."""
    return [r for r in rules if all(user_prefers(r, c, x) for _, c, x in shots)]


def _int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"task.kwargs.{name} = {v!r}: expected an integer >= {lo}")
    return v


def _num(name: str, v, lo: float, hi: float | None = None, hi_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v
    ok = ok and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        want = f">= {lo}" if hi is None else f"in [{lo}, {hi}{')' if hi_open else ']'}"
        raise ConfigError(f"task.kwargs.{name} = {v!r}: expected a number {want}")
    return float(v)


class PersonalJudgeTask:
    """Personalised pairwise judging for P-GenRM (see the module docstring).

    Args:
        train_size: training items (item i belongs to training user i % num_users).
        eval_size: held-out items, pair j to held-out user j % eval_users.
        seed: the users' world (rules, histories, items).
        num_users / eval_users: training / held-out users (disjoint).
        shots: history events shown in the prompt (k); history_len: events stored per user (>= shots).
        history_noise: share of stored events flipped, in [0, 0.5).
        rules: the hidden rules users are spread over (round robin), a subset of USER_RULES.
        alpha, beta: weights of PR and OR in the CRE reward.
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, num_users: int = 200, eval_users: int = 40,
                 shots: int = 2, history_len: int = 12, history_noise: float = 0.1, rules=USER_RULES,
                 alpha: float = 0.5, beta: float = 1.0):
        self.num_users, self.eval_users = _int("num_users", num_users, 1), _int("eval_users", eval_users, 1)
        self.shots = _int("shots", shots, 1)
        self.history_len = _int("history_len", history_len, 1)
        if self.history_len < self.shots:
            raise ConfigError(f"task.kwargs.history_len = {history_len}: expected >= task.kwargs.shots = {shots}")
        self.noise = _num("history_noise", history_noise, 0, 0.5, hi_open=True)
        self.alpha, self.beta = _num("alpha", alpha, 0), _num("beta", beta, 0)
        if self.alpha + self.beta == 0:
            raise ConfigError("task.kwargs.alpha and task.kwargs.beta are both 0: the reward would be constant")
        if (isinstance(rules, str) or not rules or len(set(rules)) != len(rules)
                or any(r not in USER_RULES for r in rules)):
            raise ConfigError(f"task.kwargs.rules = {rules!r}: expected a list of distinct names from "
                              f"{list(USER_RULES)}")
        if eval_size < self.eval_users:
            raise ConfigError(f"task.eval_size = {eval_size}: expected >= task.kwargs.eval_users = {eval_users} "
                              "(every held-out user judges at least one pair)")
        self.rules, self.seed, self.train_size = tuple(rules), seed, train_size
        n = self.num_users + self.eval_users  # user u < num_users trains; the others are held out
        self.user_rule = [self.rules[u % len(self.rules)] for u in range(n)]
        self.history = [stored_history(self.user_rule[u], self.history_len, self.noise, hash_seed(seed, "user", u))
                        for u in range(n)]
        self._eval = [self._item(self.num_users + j % self.eval_users, hash_seed(seed, "eval", j))
                      for j in range(eval_size)]

    def __len__(self) -> int:
        return self.train_size

    def train(self, i: int) -> Problem:
        i %= self.train_size
        return self._item(i % self.num_users, hash_seed(self.seed, "train", i))

    def eval_problems(self) -> list[Problem]:
        return self._eval

    def shots_of(self, user: int, seed: int) -> list[tuple[str, str, str]]:
        """`shots` events of the user's stored history, drawn without replacement by `seed`."""
        return random.Random(seed).sample(self.history[user], self.shots)

    def _item(self, user: int, seed: int) -> Problem:
        rng = random.Random(seed)
        rule = self.user_rule[user]
        q, chosen, rejected = _event(rule, rng)  # the current pair, never flipped: the user's real preference
        first = rng.random() < 0.5
        r1, r2 = (chosen, rejected) if first else (rejected, chosen)
        shots = self.shots_of(user, rng.randrange(2**31))
        meta = {"user": user, "rule": rule, "question": q, "responses": (r1, r2), "chosen": 0 if first else 1,
                "shots": shots, "consistent_rules": consistent_rules(shots, self.rules)}
        return Problem(prompt=render_prompt(shots, q, r1, r2), answer=gold_chain(rule, r1, r2, first), meta=meta)

    def with_shots(self, problem: Problem, shots: list[tuple[str, str, str]]) -> str:
        """The prompt of `problem`'s pair under other shots (Pro-M rescoring with a neighbour's history)."""
        m = problem.meta
        return render_prompt(shots, m["question"], *m["responses"])

    def outcome(self, response: str, problem: Problem) -> float:
        """OR: 1.0 when the chain scores the user's chosen response strictly higher."""
        return float(prefers_chosen(parse_evaluation_chain(response), problem.meta["chosen"]) == 1.0)

    def process(self, response: str, problem: Problem) -> float:
        """PR (rule-checked): half for the persona naming the real rule, half for that rule's rubric."""
        persona, _, rubric = analysis_text(response).partition(":")
        rule = problem.meta["rule"]
        return 0.5 * (persona.strip() == rule) + 0.5 * (rubric.strip() == RUBRIC[rule])

    def score(self, response: str, problem: Problem) -> float:
        """CRE's mixed reward R = alpha * PR + beta * OR."""
        return self.alpha * self.process(response, problem) + self.beta * self.outcome(response, problem)


def prefers_chosen(pair: tuple[float, float] | None, chosen: int) -> float:
    """1.0 when `pair` scores response `chosen` higher, 0.0 when lower, 0.5 for a tie or None (the expected
    accuracy of a random pick: how the scaling evaluation counts them)."""
    if pair is None or pair[0] == pair[1]:
        return 0.5
    return float((pair[0] > pair[1]) == (chosen == 0))


def hash_seed(*parts) -> int:
    """A 31-bit seed that is a pure function of `parts` (Python's hash() of a str is salted per process)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little") & 0x7FFFFFFF
