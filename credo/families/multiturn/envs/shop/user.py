"""The simulated shopper: a hidden target product and a persona (stated needs, a budget, past purchases).

A user is drawn from the env seed. Of the target's five attributes,
- `stated` ones are in the opening request ("want: shoe red wool; budget $60; ..."),
- `implicit` ones are never said: the user's past purchases show them ("past: acme hat, acme mug": two of the
  user's earlier buys of brand acme), and a question about one gets "as usual" (ShopSimulator's personalisation
  cues: the agent must read the profile, not ask),
- every other one is `askable`: the user answers a question about it truthfully and says nothing else.

One question reveals one attribute (the first the question names); without that limit a single question could ask
for everything and "engaging the user" would cost nothing. The budget is the target's price rounded up to ten
dollars; past purchases are of other categories. With `distractors` > 0, that many past purchases carry a
different value of each implicit attribute (the majority still carries the target's), so the cue must be weighed.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES, Catalogue

QUESTION_WORDS = {
    "category": ("category", "type", "kind"),
    "brand": ("brand", "make", "maker"),
    "colour": ("colour", "color"),
    "material": ("material", "fabric", "made"),
    "size": ("size",),
    "budget": ("budget", "price", "cost", "spend"),
}
"""Words that make a question about a field (matched as whole words, case-insensitive)."""


@dataclass
class User:
    target: int
    """The product id the user wants (hidden from the agent)."""
    words: dict
    """The target's attribute words, field -> word."""
    budget: int
    """Dollars; the target costs at most this."""
    stated: tuple
    """Fields said in the opening request."""
    implicit: tuple
    """Fields shown only by past purchases."""
    history: list
    """Past purchases, each a dict field -> word over ('category',) + implicit."""

    @property
    def askable(self) -> tuple:
        return tuple(f for f in ATTRIBUTES if f not in self.stated and f not in self.implicit)


def sample_user(cat: Catalogue, seed: int | None, *, stated: tuple, implicit: tuple, n_history: int = 2,
                distractors: int = 0) -> User:
    """The user of env seed `seed`: a uniform target product, its budget and a purchase history."""
    rng = random.Random(seed)
    target = rng.randrange(len(cat))
    words = cat.words(target)
    history = []
    if implicit:
        cats = [c for c in cat.vocab["category"] if c != words["category"]] or list(cat.vocab["category"])
        for k in range(n_history):
            item = {"category": rng.choice(cats)}
            for f in implicit:
                others = [w for w in cat.vocab[f] if w != words[f]]
                item[f] = rng.choice(others) if k < distractors and others else words[f]
            history.append(item)
        rng.shuffle(history)
    budget = int(math.ceil(int(cat.price[target]) / 10) * 10)
    return User(target=target, words=words, budget=budget, stated=tuple(stated), implicit=tuple(implicit),
                history=history)


def request_text(user: User) -> str:
    """The opening request: 'want: shoe red wool; budget $60; past: acme hat, acme mug' (no past without implicit
    fields)."""
    want = " ".join(user.words[f] for f in ATTRIBUTES if f in user.stated)
    text = f"want: {want}; budget ${user.budget}"
    if user.history:
        items = [" ".join(h[f] for f in ATTRIBUTES if f in user.implicit) + " " + h["category"] for h in user.history]
        text += "; past: " + ", ".join(items)
    return text


def asked_field(question: str) -> str | None:
    """The field a question is about: the one whose word comes first in it, or None."""
    text = question.lower()
    first, where = None, len(text) + 1
    for field, keys in QUESTION_WORDS.items():
        for key in keys:
            m = re.search(rf"\b{key}\b", text)
            if m and m.start() < where:
                first, where = field, m.start()
    return first


def answer(user: User, question: str) -> tuple[str, str | None]:
    """(reply, field asked): the truth about one field, 'as usual' for an implicit one, '?' for none."""
    field = asked_field(question)
    if field is None:
        return "user: ?", None
    if field == "budget":
        return f"budget: ${user.budget}", field
    if field in user.implicit:
        return f"{field}: as usual", field
    return f"{field}: {user.words[field]}", field


def majority_history(user: User, field: str) -> str | None:
    """The most common value of `field` among the past purchases (first seen wins a tie), or None."""
    counts: dict[str, int] = {}
    for h in user.history:
        if field in h:
            counts[h[field]] = counts.get(h[field], 0) + 1
    return max(counts, key=counts.get) if counts else None
