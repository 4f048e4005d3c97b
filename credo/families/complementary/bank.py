"""The experience bank of Complementary RL (arXiv 2603.17621): lessons distilled by the extractor, one entry per
task key, retrieved per task, injected into the actor's prompt, versioned, with add / merge / delete consolidation.

An entry is `(id, key, text, version, score, uses, step)`. The bank's own `version` counts every change (add,
merge, delete); an entry's `version` counts the changes of that entry, so `(id, version)` names the exact text an
episode was shown (the conditional advantage groups by it).

Consolidation (the paper names add / merge / delete; the rules below are inferred):

    consolidate(key, text, gain)   the extractor's best candidate for `key`, with its paired gain (the actor's
                                   success with it minus with the current entry, or with nothing when there is none)
        gain <= add_min            nothing (the candidate did not help)
        no entry for key           add: a new entry (id = next id, version 1, score = gain)
        same text as the entry     merge: the entry stays, its score moves toward the gain (running mean), uses + 1
        other text                 merge: the text is replaced (it beat the entry on paired rollouts), version + 1
    observe(key, gain)             an entry's measured help on the actor's own batch (with it minus without it)
                                   moves its score (running mean over its uses)
    prune(...)                     delete: entries with uses >= min_uses and score < delete_below, then the
                                   lowest-scored while more than `capacity` remain

Retrieval is by task key (`retrieve`), or by similarity (`retrieve_similar`): the entry whose key's embedding is
closest to the query's by cosine, if at least `threshold`. The embedding is a hashed character n-gram vector
(`ngram_embedding`, no model needed); an embedding model can be passed instead.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

OPS = ("add", "merge", "replace", "delete", "none")


@dataclass
class Entry:
    id: int
    """Stable id of the entry (kept across merges)."""
    key: str
    """Task key: the env's task id, or the task's first observation (similarity retrieval)."""
    text: str
    """The lesson, as injected into the actor's prompt."""
    version: int = 1
    """Changes of this entry (1 at its add; + 1 at each text replacement)."""
    score: float = 0.0
    """Running mean of its measured help (paired gains and the actor batch's with-minus-without)."""
    uses: int = 1
    """How many measurements the score averages."""
    step: int = 0
    """Train step of its last change."""


class ExperienceBank:
    """Lessons by task key (see the module docstring). All state is JSON: `state_dict` / `load_state_dict`."""

    def __init__(self, *, add_min: float = 0.0, capacity: int = 1024, min_uses: int = 4, delete_below: float = 0.0):
        self.add_min, self.capacity, self.min_uses, self.delete_below = add_min, capacity, min_uses, delete_below
        self.entries: dict[str, Entry] = {}
        self.version = 0
        self.next_id = 0
        self.counts = {op: 0 for op in OPS}

    def __len__(self) -> int:
        return len(self.entries)

    # ---- retrieval
    def retrieve(self, key: str) -> Entry | None:
        return self.entries.get(key)

    def retrieve_similar(self, query: str, threshold: float, embed=None) -> Entry | None:
        """The entry whose key is most similar to `query` (cosine of `embed`), if at least `threshold`; ties go to
        the lower id."""
        embed = embed or ngram_embedding
        q = embed(query)
        best, best_sim = None, -2.0
        for e in sorted(self.entries.values(), key=lambda e: e.id):
            sim = cosine(q, embed(e.key))
            if sim > best_sim:
                best, best_sim = e, sim
        return best if best is not None and best_sim >= threshold else None

    # ---- consolidation
    def consolidate(self, key: str, text: str, gain: float, step: int) -> str:
        """Add, merge or replace the entry of `key` with the candidate `text` of paired gain `gain`; the op's name."""
        if gain <= self.add_min:
            op = "none"
        elif key not in self.entries:
            self.entries[key] = Entry(id=self.next_id, key=key, text=text, score=gain, step=step)
            self.next_id += 1
            op = "add"
        else:
            e = self.entries[key]
            if e.text == text:
                op = "merge"
                self._observe(e, gain)
            else:  # it beat the entry on paired rollouts: the entry's text is replaced, its id kept
                e.text, e.version, e.score, e.uses = text, e.version + 1, gain, 1
                op = "replace"
            e.step = step
        self.counts[op] += 1
        self.version += op != "none"
        return op

    def observe(self, key: str, gain: float) -> None:
        """Fold one measurement of the entry's help into its score (no change of text or version)."""
        if key in self.entries:
            self._observe(self.entries[key], gain)

    @staticmethod
    def _observe(e: Entry, gain: float) -> None:
        e.uses += 1
        e.score += (gain - e.score) / e.uses

    def delete(self, key: str) -> None:
        del self.entries[key]
        self.counts["delete"] += 1
        self.version += 1

    def prune(self) -> list[str]:
        """Delete entries that stopped helping (uses >= min_uses and score < delete_below), then the lowest-scored
        (ties: the oldest id) while more than `capacity` remain. Returns the deleted keys."""
        gone = [k for k, e in self.entries.items() if e.uses >= self.min_uses and e.score < self.delete_below]
        for k in gone:
            self.delete(k)
        while len(self.entries) > self.capacity:
            k = min(self.entries.values(), key=lambda e: (e.score, e.id)).key
            self.delete(k)
            gone.append(k)
        return gone

    # ---- state
    def state_dict(self) -> dict:
        return {"entries": [asdict(e) for e in sorted(self.entries.values(), key=lambda e: e.id)],
                "version": self.version, "next_id": self.next_id, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.entries = {d["key"]: Entry(**d) for d in state["entries"]}
        self.version, self.next_id, self.counts = state["version"], state["next_id"], dict(state["counts"])


def ngram_embedding(text: str, *, n: int = 3, dim: int = 256) -> list[float]:
    """A unit vector of hashed character n-gram counts (md5 of each n-gram, mod `dim`): a model-free embedding."""
    padded = f" {text} "
    v = [0.0] * dim
    for i in range(max(1, len(padded) - n + 1)):
        h = int.from_bytes(hashlib.md5(padded[i:i + n].encode()).digest()[:4], "little")
        v[h % dim] += 1.0
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def cosine(a: list[float], b: list[float]) -> float:
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (na * nb) if na and nb else 0.0
