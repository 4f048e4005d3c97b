"""The shop's scripted expert: ask, search, compare, buy; with probability `noise` a random valid call instead.

The expert uses only what an agent has seen (the request, the past purchases, the user's answers, the result pages
and viewed products; the env keeps that record):
1. ask about each attribute the user would tell and has not (in ATTRIBUTES order): `<ask>size</ask>`;
2. take each implicit attribute from the past purchases (their majority value);
3. search with every attribute it knows, once per change of what it knows: `<search>mug acme red wool m</search>`;
4. compare: the first product of the page whose shown attributes all match; if a known attribute is off the page
   (material at level 'hard'), view the product before buying it and skip it if it misses: `<view>17</view>`;
5. buy it: `\\boxed{17}`.
With every attribute known, the target is the only product matching the full query and ranks first (search.py),
so the noiseless expert buys the target in (askable attributes + 2) turns, + 1 when it must view: every level's
`max_turns` leaves room, so its success rate is 1.0 (tests/multiturn/shop/test_expert.py).

A noisy turn (probability `noise`) is a uniform choice of: a question about a random attribute, a search for a
random non-empty subset of the known words, viewing or buying a random product of the last page (of the
catalogue before any search). The expert then goes on from the state that call left.
"""

from __future__ import annotations

import random

from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES
from credo.families.multiturn.envs.shop.user import majority_history


def wanted(env) -> dict[str, str]:
    """What the agent knows it wants: the stated and answered attributes, and the implicit ones from history."""
    want = dict(env.known)
    for f in env.user.implicit:
        value = majority_history(env.user, f)
        if value is not None:
            want[f] = value
    return {f: want[f] for f in ATTRIBUTES if f in want}


def planned_action(env) -> str:
    """The noiseless expert's next call (module docstring, steps 1-5)."""
    for f in env.user.askable:
        if f not in env.known:
            return f"<ask>{f}</ask>"
    want = wanted(env)
    query = " ".join(want.values())
    if env.last_query != query:
        return f"<search>{query}</search>"
    shown = set(env.page_fields)
    for pid in env.page:
        words = env.cat.words(pid)
        if any(words[f] != v for f, v in want.items() if f in shown):
            continue
        off_page = [f for f in want if f not in shown]
        if off_page and pid not in env.viewed:
            return f"<view>{pid}</view>"
        if any(words[f] != want[f] for f in off_page):
            continue  # viewed, and it misses an attribute the page did not show
        return f"\\boxed{{{pid}}}"
    # nothing on the page matches (only after a noisy call changed the page): buy the best-ranked product
    return f"\\boxed{{{env.page[0]}}}" if env.page else f"<search>{query}</search>"


def random_action(env, rng: random.Random) -> str:
    """A uniformly chosen valid call (module docstring)."""
    kind = rng.randrange(4)
    if kind == 0:
        return f"<ask>{rng.choice(ATTRIBUTES)}</ask>"
    if kind == 1:
        words = list(wanted(env).values())
        picked = [w for w in words if rng.random() < 0.5] or [rng.choice(words)]
        return f"<search>{' '.join(picked)}</search>"
    pid = rng.choice(env.page) if env.page else rng.randrange(len(env.cat))
    return f"<view>{pid}</view>" if kind == 2 else f"\\boxed{{{pid}}}"


def expert_action(env, rng: random.Random, noise: float = 0.0) -> str:
    """The expert's next call on `env` (a ShopEnv mid-episode): a random one with probability `noise`."""
    if rng.random() < noise:
        return random_action(env, rng)
    return planned_action(env)
