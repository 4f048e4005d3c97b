"""The shop's search engine: BM25 over each product's attribute words, hard filters, a ranked page.

A product's document is its five attribute words (ATTRIBUTES: category, brand, colour, material, size); a query is
free text, split into lowercase words. Score (Robertson/Sparck Jones BM25, the Lucene IDF that is never negative):

    score(d, q) = sum over distinct query words t in d of  idf(t) * tf(t,d) (k1 + 1) / (tf(t,d) + k1 (1 - b + b |d| / avgdl))
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

Every document has five words, so |d| = avgdl and a word's weight is its idf: a product matching a superset of
another's query words scores strictly higher, and the product that matches a full description ranks first.
Only products matching at least one query word are ranked (a query of filters alone ranks every product that
passes them). Ties: higher rating first, then the smaller id. Filters: `field=value` keeps products whose field is
that word (an unknown word matches nothing), `max_price` / `min_price` bound the price, `min_rating` the rating.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np

from credo.families.multiturn.envs.shop.catalogue import ATTRIBUTES, Catalogue

WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def query_words(text: str) -> list[str]:
    """Distinct lowercase words of `text`, in order of first appearance."""
    return list(dict.fromkeys(WORD.findall(text.lower())))


class SearchIndex:
    """Postings of every attribute word: word -> [df] int64 product ids, and its BM25 weight in a document."""

    def __init__(self, catalogue: Catalogue):
        self.cat = catalogue
        n = len(catalogue)
        self.field_of: dict[str, int] = {}
        self.postings: dict[str, np.ndarray] = {}
        for col, field in enumerate(ATTRIBUTES):
            values = catalogue.attrs[:, col]
            for v, word in enumerate(catalogue.vocab[field]):
                self.field_of[word] = col
                self.postings[word] = np.flatnonzero(values == v)
        doc_len = len(ATTRIBUTES)  # one word per field; kept general in the formula below
        avgdl = float(doc_len)
        tf = 1.0
        norm = tf * (K1 + 1) / (tf + K1 * (1 - B + B * doc_len / avgdl))
        self.weight = {w: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) * norm for w, p in self.postings.items()}
        self.neg_rating = -catalogue.rating.astype(np.int64)
        self.ids = np.arange(n)

    def scores(self, words: list[str]) -> np.ndarray:
        """[n] float64 BM25 score of every product for the distinct `words` (unknown words score nothing)."""
        out = np.zeros(len(self.cat))
        for w in dict.fromkeys(words):
            if w in self.postings:
                out[self.postings[w]] += self.weight[w]
        return out

    def mask(self, filters: dict) -> np.ndarray:
        """[n] bool: products passing every filter. Keys: an attribute name (value: its word), max_price,
        min_price, min_rating (stars, e.g. 4.0). A filter value outside the vocabulary keeps nothing."""
        keep = np.ones(len(self.cat), dtype=bool)
        for key, value in filters.items():
            if key in ATTRIBUTES:
                word = str(value).lower()
                col = ATTRIBUTES.index(key)
                hit = np.zeros_like(keep)
                if self.field_of.get(word) == col:
                    hit[self.postings[word]] = True
                keep &= hit
            elif key == "max_price":
                keep &= self.cat.price <= float(value)
            elif key == "min_price":
                keep &= self.cat.price >= float(value)
            elif key == "min_rating":
                keep &= self.cat.rating >= round(float(value) * 10)
            else:
                raise KeyError(key)
        return keep

    def search(self, text: str, filters: dict | None = None, k: int = 5) -> list[int]:
        """The ids of the top `k` products for query `text` under `filters`, best first (ties: rating, then id)."""
        words = query_words(text)
        s = self.scores(words)
        keep = self.mask(filters or {})
        if words:
            keep &= s > 0
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            return []
        score = s[idx]
        if len(idx) > k:  # only the products scoring at least the k-th best score (ties included) can be on the page
            kth = np.partition(score, len(score) - k)[len(score) - k]
            top = score >= kth
            idx, score = idx[top], score[top]
        # lexsort sorts by the last key first: score descending, rating descending, id ascending
        order = np.lexsort((idx, self.neg_rating[idx], -score))
        return [int(i) for i in idx[order[:k]]]


@functools.lru_cache(maxsize=16)
def index_for(catalogue: Catalogue) -> SearchIndex:
    """One index per catalogue (catalogues are cached and compared by identity)."""
    return SearchIndex(catalogue)
