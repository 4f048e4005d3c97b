"""A seeded synthetic product catalogue with families of near-duplicates (the ShopSimulator-style env's shop).

A product has five text attributes (category, brand, colour, material, size: one word each, every word unique
across all fields so a query word names its field), a price in whole dollars and a rating in tenths of a star.
Products come in families: a base product and `family_size - 1` near-duplicates, each differing from the base
in one or two of brand, colour, material and size, with the same category and a price within -20% .. +25% of
the base's. No two products share all five attributes, so a product is the one that matches a full description.
ShopSimulator's Catalog-Fine holds ~120 highly similar items per sub-category; `family_size` and the vocabulary
sizes set how dense the near-duplicates are here.

    cat = build_catalogue(n_products=200, seed=0, family_size=3, vocab=(4, 4, 4, 3, 3))
    cat.attrs[i]      # [5] value indices of product i, one per ATTRIBUTES field
    cat.word(i, "colour") -> "red";  cat.line(i, ("brand", "colour", "price")) -> "#17 acme red $55"

Catalogues are cached by their arguments (`build_catalogue` is an lru_cache): the rollout source makes a fresh
env per episode, and they all share one read-only catalogue and its search index.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from credo.errors import ConfigError  # a bad env.kwargs value: one line naming it (docs/getting-started.md)

ATTRIBUTES = ("category", "brand", "colour", "material", "size")
"""The text attributes of a product, in the order of `Catalogue.attrs`' columns and of a product line."""

VOCABULARY = {
    "category": ("shoe", "hat", "bag", "mug", "lamp", "coat", "sock", "desk", "sofa", "vase",
                 "belt", "tent", "kite", "rug", "fan", "pen", "cup", "bed", "jar", "bowl"),
    "brand": ("acme", "zeta", "nova", "orca", "kilo", "vela", "juno", "onyx", "lark", "moss",
              "pike", "odin", "faro", "yeti", "wren", "luna", "miro", "axel", "ivo", "koda"),
    "colour": ("red", "blue", "tan", "grey", "pink", "gold", "teal", "lime", "navy", "plum", "jade", "rust"),
    "material": ("wool", "silk", "jute", "felt", "hemp", "iron", "oak", "clay", "cork", "wax"),
    "size": ("s", "m", "l", "xs", "xl"),
}
"""Every field's words; a vocabulary of sizes (4, 4, 4, 3, 3) uses the first 4 categories, 4 brands, ..."""

VARIANT_FIELDS = (1, 2, 3, 4)
"""Columns a near-duplicate may change (brand, colour, material, size); the category stays the family's."""

FULL_VOCAB = tuple(len(VOCABULARY[a]) for a in ATTRIBUTES)


@dataclass(frozen=True, eq=False)  # identity hash: the search index is cached per catalogue
class Catalogue:
    """`attrs`: [n, 5] int16 value indices; `price`: [n] int32 dollars; `rating`: [n] int16 tenths of a star;
    `family`: [n] int32 family id (the near-duplicates of a product share it); `base`: [n] bool, the family's
    first (unmutated) product; `vocab`: the words of each field actually used."""

    attrs: np.ndarray
    price: np.ndarray
    rating: np.ndarray
    family: np.ndarray
    base: np.ndarray
    vocab: dict

    def __len__(self) -> int:
        return len(self.price)

    def word(self, i: int, field: str) -> str:
        return self.vocab[field][int(self.attrs[i, ATTRIBUTES.index(field)])]

    def words(self, i: int) -> dict[str, str]:
        return {f: self.vocab[f][int(v)] for f, v in zip(ATTRIBUTES, self.attrs[i])}

    def line(self, i: int, fields: tuple[str, ...]) -> str:
        """One product as a terse line: '#' and its id (an anchor a tiny model can copy the id from), then `fields` in
        order ('price' -> '$55', 'rating' -> '4.2*')."""
        parts = [f"#{i}"]
        for f in fields:
            if f == "price":
                parts.append(f"${int(self.price[i])}")
            elif f == "rating":
                parts.append(f"{int(self.rating[i]) / 10:.1f}*")
            else:
                parts.append(self.word(i, f))
        return " ".join(parts)


def _check(n_products: int, family_size: int, vocab: tuple[int, ...]) -> None:
    if len(vocab) != len(ATTRIBUTES):
        raise ConfigError(f"env.kwargs.vocab = {vocab}: expected {len(ATTRIBUTES)} sizes, one per {ATTRIBUTES}")
    for field, k, full in zip(ATTRIBUTES, vocab, FULL_VOCAB):
        if not 1 <= k <= full:
            raise ConfigError(f"env.kwargs.vocab: {field} size {k}, expected 1..{full}")
    if family_size < 1:
        raise ConfigError(f"env.kwargs.family_size = {family_size}, expected >= 1")
    room = int(np.prod(vocab))
    if not 1 <= n_products <= room // 2:
        raise ConfigError(f"env.kwargs.n_products = {n_products}: expected 1..{room // 2} (half of the {room} distinct "
                         f"products the vocabulary {vocab} can describe, so near-duplicates still fit)")


def _families(rng: np.random.Generator, n_families: int, width: int, vocab: tuple[int, ...]) -> np.ndarray:
    """[n_families, width, 5] value indices: a uniform base, then `width - 1` candidate variants that change one or
    two of its variant fields (those with more than one value) to another value each."""
    k = np.asarray(vocab)
    base = rng.integers(0, k, size=(n_families, 5))
    out = np.repeat(base[:, None, :], width, axis=1)
    free = np.asarray([f for f in VARIANT_FIELDS if vocab[f] > 1])
    if width == 1 or len(free) == 0:
        return out
    shape = (n_families, width - 1)
    # a random order of the free fields per variant; change the first one, and the second with probability 1/2
    order = free[np.argsort(rng.random(shape + (len(free),)), axis=-1)]
    changes = 1 + (rng.random(shape) < 0.5) * (len(free) > 1)
    for j in range(min(2, len(free))):
        field = order[..., j]
        offset = rng.integers(1, k[field])  # 1 .. k-1: a different value
        variants = out[:, 1:, :]
        rows, cols = np.nonzero(changes > j)
        f = field[rows, cols]
        variants[rows, cols, f] = (variants[rows, cols, f] + offset[rows, cols]) % k[f]
    return out


def _kept(codes: np.ndarray, family_size: int) -> np.ndarray:
    """[F, W] bool: which candidates of `codes` ([F, W] product codes, column 0 the bases) join the catalogue.

    Bases first (a base equal to an earlier family's leaves its family out), then one candidate column at a time:
    a candidate joins when its family has fewer than `family_size` members and nobody holds its code yet (the
    first of equal candidates in the column wins), so no two kept products are equal."""
    n_fam, width = codes.shape
    kept = np.zeros(codes.shape, dtype=bool)
    _, first = np.unique(codes[:, 0], return_index=True)
    kept[first, 0] = True
    held = codes[kept[:, 0], 0]
    members = kept[:, 0].astype(np.int64)
    for col in range(1, width):
        open_ = np.flatnonzero(kept[:, 0] & (members < family_size))
        cand = codes[open_, col]
        free = ~np.isin(cand, held)
        _, first = np.unique(cand[free], return_index=True)
        join = open_[np.flatnonzero(free)[first]]
        kept[join, col] = True
        members[join] += 1
        held = np.concatenate([held, codes[join, col]])
    return kept


@functools.lru_cache(maxsize=16)
def build_catalogue(n_products: int = 1000, seed: int = 0, family_size: int = 4,
                    vocab: tuple[int, ...] = FULL_VOCAB) -> Catalogue:
    """`n_products` products in families of up to `family_size`, all from `seed` (module docstring).

    A product equal to an earlier one is dropped (a family whose base is taken goes whole), so crowded families
    end smaller; product ids are shuffled, so a family's members are not neighbours. About 1 s for 100k products.
    """
    vocab = tuple(int(k) for k in vocab)
    _check(n_products, family_size, vocab)
    rng = np.random.default_rng(seed)
    radix = np.cumprod((1,) + vocab[:-1])
    n_fam = int(np.ceil(n_products / family_size * 1.1)) + 8
    while True:  # in the rare case crowded families left too few products: more families, from the same stream
        fams = _families(rng, n_fam, 1 + 3 * (family_size - 1), vocab)  # three candidates per variant
        kept = _kept(fams @ radix, family_size)
        if kept.sum() >= n_products:
            break
        n_fam *= 2
    kept &= np.cumsum(kept.ravel()).reshape(kept.shape) <= n_products  # whole families first, the last one cut
    fam_id, slot = np.nonzero(kept)
    attrs = fams[fam_id, slot]
    base_price = rng.integers(8, 201, size=len(fams))
    factor = np.where(slot == 0, 1.0, rng.uniform(0.8, 1.25, size=len(slot)))
    price = np.maximum(1, np.rint(base_price[fam_id] * factor)).astype(np.int32)
    order = rng.permutation(n_products)
    return Catalogue(
        attrs=attrs[order].astype(np.int16), price=price[order],
        rating=rng.integers(25, 51, size=n_products).astype(np.int16),
        family=np.unique(fam_id, return_inverse=True)[1][order].astype(np.int32), base=(slot == 0)[order],
        vocab={a: VOCABULARY[a][:k] for a, k in zip(ATTRIBUTES, vocab)},
    )
