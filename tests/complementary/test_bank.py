"""The experience bank's consolidation and retrieval against naive references written differently."""

from __future__ import annotations

import math
import random

import pytest

from credo.families.complementary.bank import ExperienceBank, cosine, ngram_embedding


def reference_run(events, *, add_min, capacity, min_uses, delete_below):
    """A bank as a list of rows replayed from the event log (no dict, no dataclass): returns the final rows
    [id, key, text, version, score, uses] sorted by id, the bank version and the op counts."""
    rows, version, next_id, counts = [], 0, 0, {"add": 0, "merge": 0, "replace": 0, "delete": 0, "none": 0}

    def find(key):
        return next((r for r in rows if r[1] == key), None)

    for ev in events:
        if ev[0] == "cons":
            _, key, text, gain = ev
            row = find(key)
            if not gain > add_min:
                counts["none"] += 1
                continue
            version += 1
            if row is None:
                rows.append([next_id, key, text, 1, gain, 1])
                next_id += 1
                counts["add"] += 1
            elif row[2] == text:
                # running mean: the score is the mean of every measurement since the text was set
                row[5] += 1
                row[4] = row[4] * (row[5] - 1) / row[5] + gain / row[5]
                counts["merge"] += 1
            else:
                row[2], row[3], row[4], row[5] = text, row[3] + 1, gain, 1
                counts["replace"] += 1
        elif ev[0] == "obs":
            row = find(ev[1])
            if row is not None:
                row[5] += 1
                row[4] = row[4] * (row[5] - 1) / row[5] + ev[2] / row[5]
        else:  # prune
            keep = []
            for r in rows:
                if r[5] >= min_uses and r[4] < delete_below:
                    version += 1
                    counts["delete"] += 1
                else:
                    keep.append(r)
            rows = keep
            while len(rows) > capacity:
                worst = sorted(rows, key=lambda r: (r[4], r[0]))[0]
                rows = [r for r in rows if r is not worst]
                version += 1
                counts["delete"] += 1
    return sorted(rows), version, counts


@pytest.mark.parametrize("seed", range(5))
def test_consolidation_matches_the_replayed_reference(seed):
    rng = random.Random(seed)
    settings = dict(add_min=0.0, capacity=rng.choice([2, 3, 10]), min_uses=rng.choice([1, 2, 3]), delete_below=0.05)
    keys, texts = [f"vault {i}" for i in range(5)], [f"code {i}" for i in range(1, 4)]
    events = []
    for _ in range(200):
        u = rng.random()
        if u < 0.6:
            events.append(("cons", rng.choice(keys), rng.choice(texts), rng.choice([-0.25, 0.0, 0.25, 0.5, 1.0])))
        elif u < 0.9:
            events.append(("obs", rng.choice(keys), rng.choice([-0.5, 0.0, 0.5])))
        else:
            events.append(("prune",))
    bank = ExperienceBank(**settings)
    for step, ev in enumerate(events):
        if ev[0] == "cons":
            bank.consolidate(ev[1], ev[2], ev[3], step)
        elif ev[0] == "obs":
            bank.observe(ev[1], ev[2])
        else:
            bank.prune()
    rows, version, counts = reference_run(events, **settings)
    got = sorted([e.id, e.key, e.text, e.version, e.score, e.uses] for e in bank.entries.values())
    assert [r[:4] + [r[5]] for r in got] == [r[:4] + [r[5]] for r in rows]
    assert all(math.isclose(a[4], b[4], abs_tol=1e-12) for a, b in zip(got, rows))
    assert bank.version == version and bank.counts == counts
    assert counts["add"] > 0 and counts["delete"] > 0 and counts["replace"] > 0 and counts["merge"] > 0


def test_state_round_trip_and_an_empty_bank():
    bank = ExperienceBank()
    assert bank.retrieve("vault 0") is None and bank.retrieve_similar("vault 0", 0.0) is None and len(bank) == 0
    assert bank.consolidate("vault 0", "code 4", 0.0, 1) == "none"  # no gain: not added
    assert bank.consolidate("vault 0", "code 4", 0.5, 1) == "add"
    assert bank.consolidate("vault 0", "code 5", 0.25, 2) == "replace"
    again = ExperienceBank()
    again.load_state_dict(bank.state_dict())
    assert again.state_dict() == bank.state_dict()
    e = again.retrieve("vault 0")
    assert (e.id, e.text, e.version, e.step) == (0, "code 5", 2, 2)


def test_similarity_retrieval_against_brute_force():
    rng = random.Random(0)
    bank = ExperienceBank()
    for i in range(6):
        bank.consolidate(f"vault {i} code 1-9", f"code {i}", 1.0, 0)
    queries = ["vault 3 code 1-9", "vault 12 code 1-9", "open the door", "vault 0 code 1-9"]
    for q in queries:
        for threshold in (0.0, 0.8, 0.95):
            best = None
            for key in sorted(bank.entries, key=lambda k: bank.entries[k].id):
                qa, ka = ngram_embedding(q), ngram_embedding(key)
                sim = sum(a * b for a, b in zip(qa, ka))  # unit vectors: the dot product is the cosine
                if best is None or sim > best[0] + 1e-15:
                    best = (sim, key)
            want = bank.entries[best[1]] if best[0] >= threshold else None
            assert bank.retrieve_similar(q, threshold) is want
    assert bank.retrieve_similar("vault 3 code 1-9", 0.999).text == "code 3"  # its own key: cosine 1
    v = ngram_embedding("abc" * rng.randint(1, 5))
    assert math.isclose(cosine(v, v), 1.0)
