"""The catalogue's near-duplicate structure, BM25 ranking against a textbook reference, determinism by seed."""

import math
import random
from collections import Counter, defaultdict

import numpy as np
import pytest

from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES, build_catalogue
from credo.families.multiturn.envs.shop.search import SearchIndex, index_for
from credo.families.multiturn.envs.shop.user import sample_user


@pytest.mark.parametrize("args", [(200, 0, 3, (4, 4, 4, 3, 3)), (3000, 1, 6, (12, 12, 10, 8, 5))])
def test_families_are_near_duplicates_and_products_unique(args):
    n, _, family_size, vocab = args
    cat = build_catalogue(*args)
    assert len(cat) == n and cat.attrs.shape == (n, 5)
    rows = [tuple(int(v) for v in r) for r in cat.attrs]
    assert len(set(rows)) == n  # a full description names one product
    members = defaultdict(list)
    for i, f in enumerate(cat.family):
        members[int(f)].append(i)
    sizes = Counter(len(m) for m in members.values())
    assert max(sizes) <= family_size and sizes[family_size] >= 0.9 * len(members)
    for ids in members.values():
        (base,) = [i for i in ids if cat.base[i]]
        for i in ids:
            if i == base:
                continue
            differs = [ATTRIBUTES[c] for c in range(5) if rows[i][c] != rows[base][c]]
            assert 1 <= len(differs) <= 2 and "category" not in differs, (rows[i], rows[base])
            assert 0.8 * cat.price[base] - 0.5 <= cat.price[i] <= 1.25 * cat.price[base] + 0.5
    for c, k in enumerate(vocab):
        assert set(cat.attrs[:, c].tolist()) <= set(range(k))
    assert cat.rating.min() >= 25 and cat.rating.max() <= 50


def test_catalogue_user_and_episode_are_functions_of_the_seeds():
    a, b = build_catalogue(500, 7, 4, (6, 6, 6, 4, 4)), build_catalogue.__wrapped__(500, 7, 4, (6, 6, 6, 4, 4))
    assert a is not b  # built twice, not the cache
    for field in ("attrs", "price", "rating", "family", "base"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    other = build_catalogue.__wrapped__(500, 8, 4, (6, 6, 6, 4, 4))
    assert not np.array_equal(a.attrs, other.attrs)
    kw = dict(stated=("category",), implicit=("brand",), n_history=3, distractors=1)
    assert sample_user(a, 42, **kw) == sample_user(b, 42, **kw)
    assert len({sample_user(a, s, **kw).target for s in range(50)}) > 30

    def episode(seed):
        env = make_env("credo:Shop-v0-easy")
        out = [env.reset(seed=seed)[0]]
        rng = random.Random(seed)
        for _ in range(6):
            obs, r, term, trunc, _ = env.step(env.expert_action(rng, 0.5))
            out.append((obs, r))
            if term or trunc:
                break
        return out

    assert episode(3) == episode(3) and episode(3) != episode(4)


def naive_bm25(docs, query, k1=1.2, b=0.75):
    """Textbook BM25 over word lists, one document at a time (no index, no numpy)."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    terms = []
    for t in query.lower().replace(",", " ").split():
        if t not in terms:
            terms.append(t)
    scores = []
    for d in docs:
        s = 0.0
        for t in terms:
            tf = d.count(t)
            if tf == 0:
                continue
            df = sum(1 for other in docs if t in other)
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
            s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
        scores.append(s)
    return scores


def test_bm25_ranking_matches_a_textbook_reference():
    cat = build_catalogue(300, 3, 3, (5, 5, 5, 4, 3))
    index = SearchIndex(cat)
    docs = [[cat.vocab[f][int(v)] for f, v in zip(ATTRIBUTES, row)] for row in cat.attrs]
    rng = random.Random(0)
    vocab = [w for f in ATTRIBUTES for w in cat.vocab[f]] + ["zebra", "s"]
    for trial in range(60):
        query = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 5)))
        max_price = rng.choice([None, 40, 120])
        ref = naive_bm25(docs, query)
        keep = [i for i in range(len(docs)) if ref[i] > 0 and (max_price is None or cat.price[i] <= max_price)]
        keep.sort(key=lambda i: (-round(ref[i], 9), -int(cat.rating[i]), i))
        got = index.search(query, {"max_price": max_price} if max_price else {}, k=7)
        assert got == keep[:7], (query, max_price)


def test_a_full_description_ranks_its_product_first():
    cat = build_catalogue(5000, 0, 6, (12, 12, 10, 8, 5))
    index = index_for(cat)
    for pid in random.Random(1).sample(range(len(cat)), 200):
        assert index.search(" ".join(cat.words(pid).values()), k=1) == [pid]
