"""P-GenRM's dual-granularity test-time user-based scaling, evaluated per user (arXiv 2602.12116, spec 08 §4).

For every held-out pair of a held-out user (`PersonalJudgeTask.eval_problems()`), a trained judge writes
evaluation chains and the pair's decision is the argmax of the (fused) scores:

    none         one greedy chain with the user's own shots
    Ind-N        N chains sampled at temperature 1.0 with the user's own shots, scores averaged (the released
                 code's `self_runs`; unparseable chains skipped)
    Ind-N+Pro-M  Ind-N fused with one sampled chain per neighbour: the same pair rescored with the shots of
                 each of the M most similar members of the user's nearest prototype,
                 s = (c_self * mean(Ind-N) + c_nb * mean(Pro-M)) / (c_self + c_nb), c_self = c_nb = 0.5
    Ind-(N+M)    N + M own chains (the equal-budget control: the paper's Ind-32 against Ind-16 + Pro-8)

A tie or a pair with no parseable chain counts 0.5 (a random pick's expectation). Accuracy is per user: the
mean over held-out users of each user's accuracy over their pairs (the paper's headline is per pair; its
macro version averages user groups).

Prototypes: members are the training users, embedded, clustered by `kmeans_sphere` into `k_protos`
prototypes. What is embedded (`embed`):
- `history` (default): the user's whole stored history (`history_len` events, more than the `shots` a prompt
  holds), as the mean over events of phi(chosen) - phi(rejected), phi = hashed character 1-3-gram counts with
  digits masked. Inferred stand-in: the paper embeds the chain's analysis text with Qwen3-Embedding-0.6B, text
  that an 8B model wrote from rich histories; a tiny judge's analysis is one of four persona words. The
  chosen-minus-rejected form is the one the paper's prototype refinement feeds on (o_e = tanh(W[h; r+ - r-])).
- `persona`: the paper's choice, phi of the analysis text (persona:rubric) of a greedy chain: one chain on a
  training item per member, the pair's own greedy chain for the query.
The prototype refinement (PrototypeUpdater) is not built: prototypes are the k-means centroids.
"""

from __future__ import annotations

import hashlib
import statistics
import time

import torch

from credo.config import ConfigError
from credo.families.judges.pgenrm.judge import fuse_scores, kmeans_sphere, parse_evaluation_chain, prototype_neighbours
from credo.families.judges.pgenrm.task import analysis_text, hash_seed, prefers_chosen

SETTINGS = ("none", "ind", "ind_pro", "ind_more", "pro")


def text_features(texts: list[str], dim: int = 256) -> torch.Tensor:
    """[len(texts), dim] hashed character 1-3-gram counts, digits masked to '0' (a number's value says nothing
    about a taste; its length and marks do)."""
    out = torch.zeros(len(texts), dim)
    for i, t in enumerate(texts):
        t = "".join("0" if ch.isdigit() else ch for ch in t)
        for n in (1, 2, 3):
            for j in range(len(t) - n + 1):
                h = int.from_bytes(hashlib.blake2b(t[j:j + n].encode(), digest_size=4).digest(), "little")
                out[i, h % dim] += 1.0
    return out


def history_embedding(history: list[tuple[str, str, str]], dim: int = 256) -> torch.Tensor:
    """[dim] mean over the events of phi(chosen) - phi(rejected)."""
    chosen = text_features([c for _, c, _ in history], dim)
    rejected = text_features([r for _, _, r in history], dim)
    return (chosen - rejected).mean(0)


def per_user_accuracy(correct: list[float], users: list[int]) -> float:
    """Mean over users of each user's mean of `correct`."""
    by: dict[int, list[float]] = {}
    for c, u in zip(correct, users):
        by.setdefault(u, []).append(c)
    return statistics.fmean(statistics.fmean(v) for v in by.values())


def pair_correct(chosen: int, greedy: str, own: list[str], neighbours: list[str], n_self: int,
                 c_self: float = 0.5, c_nb: float = 0.5) -> dict[str, float]:
    """{setting: 1 / 0 / 0.5} for one pair: the greedy chain, the first n_self of `own` (Ind-N), all of `own`
    (Ind-(N+M)), Ind-N fused with the neighbours' chains, the neighbours' alone."""
    so = [parse_evaluation_chain(t) for t in own]
    sn = [parse_evaluation_chain(t) for t in neighbours]
    return {"none": prefers_chosen(parse_evaluation_chain(greedy), chosen),
            "ind": prefers_chosen(fuse_scores(so[:n_self], [], 1.0, 0.0), chosen),
            "ind_more": prefers_chosen(fuse_scores(so, [], 1.0, 0.0), chosen),
            "ind_pro": prefers_chosen(fuse_scores(so[:n_self], sn, c_self, c_nb), chosen),
            "pro": prefers_chosen(fuse_scores([], sn, 0.0, 1.0), chosen)}


def check_scaling(n_self: int, m_nb: int, k_protos: int, embed: str, num_users: int) -> None:
    for name, v, lo in (("n_self", n_self, 1), ("m_nb", m_nb, 1), ("k_protos", k_protos, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name} = {v!r}: expected an integer >= {lo}")
    if k_protos > num_users:
        raise ConfigError(f"k_protos = {k_protos}: expected <= task.kwargs.num_users = {num_users} (members)")
    if embed not in ("history", "persona"):
        raise ConfigError(f"embed = {embed!r}: expected 'history' or 'persona'")


def chains(backend, tok, prompts: list[str], *, max_new_tokens: int, seeds: list[int] | None) -> list[str]:
    """One chain per prompt: greedy when `seeds` is None, else sampled at temperature 1.0."""
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out = backend.generate(ids, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seeds=seeds)
    return tok.batch_decode([s.response_ids for s in out], skip_special_tokens=True)


def run_scaling(backend, tok, task, *, n_self: int = 16, m_nb: int = 8, k_protos: int = 8, embed: str = "history",
                c_self: float = 0.5, c_nb: float = 0.5, seed: int = 0, max_new_tokens: int = 32) -> dict:
    """The four settings of the module docstring on `task`'s held-out pairs.

    Returns:
        A JSON-able dict: "per_user" {setting: accuracy}, "per_pair" {setting: accuracy}, the same split by
        whether the shots pin the user's rule ("by_shots": determined / open), "unparseable" (share of greedy,
        self and neighbour chains), "neighbour_same_rule" (share of neighbours whose rule is the user's),
        "prototype_purity", "seconds", "chains", and the settings.
    """
    check_scaling(n_self, m_nb, k_protos, embed, task.num_users)
    problems = task.eval_problems()
    P, S = len(problems), n_self + m_nb
    t0 = time.time()
    prompts = [p.prompt for p in problems]
    greedy = chains(backend, tok, prompts, max_new_tokens=max_new_tokens, seeds=None)
    own = chains(backend, tok, [p for p in prompts for _ in range(S)], max_new_tokens=max_new_tokens,
                 seeds=[hash_seed(seed, "self", i) for i in range(P * S)])
    own = [own[j * S:(j + 1) * S] for j in range(P)]
    t_self = time.time() - t0
    members_u = list(range(task.num_users))
    nb, flat_nb, same, assign = _neighbour_chains(backend, tok, task, problems, greedy, seed=seed, m_nb=m_nb,
                                                  k_protos=k_protos, embed=embed, max_new_tokens=max_new_tokens)
    seconds = time.time() - t0
    parse = parse_evaluation_chain
    correct = {s: [] for s in SETTINGS}
    for p, g, o, n in zip(problems, greedy, own, nb):
        for name, c in pair_correct(p.meta["chosen"], g, o, n, n_self, c_self, c_nb).items():
            correct[name].append(c)
    users = [p.meta["user"] for p in problems]
    pinned = [p.meta["consistent_rules"] == [p.meta["rule"]] for p in problems]
    rules = [task.user_rule[u] for u in members_u]
    purity = sum(max(sum(rules[i] == r for i in range(len(rules)) if assign[i] == c) for r in set(rules))
                 for c in range(k_protos)) / len(rules)

    def split(cs, keep):
        sel = [c for c, k in zip(cs, pinned) if k == keep]
        return statistics.fmean(sel) if sel else None

    n_chains = P * (1 + S) + len(flat_nb)
    return {"per_user": {s: per_user_accuracy(c, users) for s, c in correct.items()},
            "per_pair": {s: statistics.fmean(c) for s, c in correct.items()},
            "by_shots": {"determined": {s: split(c, True) for s, c in correct.items()},
                         "open": {s: split(c, False) for s, c in correct.items()},
                         "determined_frac": sum(pinned) / P},
            "unparseable": {"greedy": sum(parse(g) is None for g in greedy) / P,
                            "self": sum(parse(t) is None for o in own for t in o) / (P * S),
                            "neighbour": sum(parse(t) is None for t in flat_nb) / max(len(flat_nb), 1)},
            "neighbour_same_rule": sum(same) / max(len(same), 1), "prototype_purity": purity,
            "seconds": {"self": round(t_self, 2), "total": round(seconds, 2)}, "chains": n_chains,
            "chains_per_s": round(n_chains / seconds, 1), "pairs": P, "users": len(set(users)),
            "n_self": n_self, "m_nb": m_nb, "k_protos": k_protos, "embed": embed, "c_self": c_self, "c_nb": c_nb,
            "seed": seed, "examples": [{"prompt": p.prompt, "greedy": g, "own": o[:4], "neighbours": n[:4]}
                                       for p, g, o, n in list(zip(problems, greedy, own, nb))[:5]]}


def _neighbour_chains(backend, tok, task, problems, greedy, *, seed: int, m_nb: int, k_protos: int, embed: str,
                      max_new_tokens: int):
    """Pro-M's neighbour chains: the users' prototypes (k-means on the sphere of history or chain embeddings), then
    for each held-out pair up to m_nb members of its nearest prototype as shots. Returns (chains per pair, all
    chains flat, whether each neighbour shares the user's rule, each member's prototype)."""
    members_u = list(range(task.num_users))
    if embed == "history":
        members = torch.stack([history_embedding(task.history[u]) for u in members_u])
        queries = torch.stack([history_embedding(task.history[p.meta["user"]]) for p in problems])
    else:
        mchains = chains(backend, tok, [task.train(u).prompt for u in members_u], max_new_tokens=max_new_tokens,
                         seeds=None)
        members = text_features([analysis_text(c) for c in mchains])
        queries = text_features([analysis_text(c) for c in greedy])
    members = members + 1e-6 * torch.randn(members.shape, generator=torch.Generator().manual_seed(seed))  # no 0 rows
    centroids, assign = kmeans_sphere(members, k_protos, seed=seed)
    nb_prompts, same, counts = [], [], []  # a small prototype can hold fewer than m_nb members
    for j, p in enumerate(problems):
        nbs = prototype_neighbours(queries[j], centroids, members, assign, m_nb).tolist()
        counts.append(len(nbs))
        for w in nbs:
            nb_prompts.append(task.with_shots(p, task.shots_of(members_u[w], hash_seed(seed, "nb", j, w))))
            same.append(task.user_rule[members_u[w]] == p.meta["rule"])
    flat_nb = chains(backend, tok, nb_prompts, max_new_tokens=max_new_tokens,
                     seeds=[hash_seed(seed, "nbchain", i) for i in range(len(nb_prompts))])
    nb, k = [], 0
    for c in counts:
        nb.append(flat_nb[k:k + c])
        k += c
    return nb, flat_nb, same, assign


def load_judge_model(path: str, max_batch: int = 512):
    """(HFBackend, tokenizer) of a trained judge folder (a pgenrm run's final/ or its cached SFT warm-up)."""
    from credo.distributed.rollout import HFBackend
    from credo.models import check_vocab, load_causal_lm, load_tokenizer

    tok = load_tokenizer(path)
    model = load_causal_lm(path).eval().requires_grad_(False)
    check_vocab(model, tok, path)
    return HFBackend(model, tok, max_batch=max_batch), tok
