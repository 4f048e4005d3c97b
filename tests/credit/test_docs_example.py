"""The rhythm-credit example of docs/credit.md runs and agrees with the dense path."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from credo.credit import attention_from_qk, attention_rhythm_gamma
from tests.credit._helpers import random_qk

DOC = Path(__file__).resolve().parents[2] / "docs" / "credit.md"


def load_example():
    text = DOC.read_text()
    block = re.search(
        r"<!-- example: rhythm_advantages -->\s*```python\n(.*?)```\s*<!-- end example -->", text, re.S
    )
    assert block, "docs/credit.md lost its rhythm_advantages example block"
    namespace = {}
    exec(compile(block.group(1), str(DOC), "exec"), namespace)
    return namespace["rhythm_advantages"]


def test_docs_example_matches_dense_rhythm_credit():
    rhythm_advantages = load_example()
    B, T, layers = 2, 40, 2
    lengths = [40, 31]  # row 1 is right-padded
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    response_mask = torch.zeros(B, T, dtype=torch.bool)
    response_mask[0, 12:] = True
    response_mask[1, 9:31] = True
    advantages = torch.where(response_mask, advantages, 0.0)
    qk = [
        [random_qk(heads=4, kv_heads=2, n=n, d=8, seed=10 * b + layer) for layer in range(layers)]
        for b, n in enumerate(lengths)
    ]
    out = rhythm_advantages(advantages, response_mask, qk)
    for b, n in enumerate(lengths):
        maps = torch.stack([attention_from_qk(q, k) for q, k in qk[b]])  # [L, H, N, N]
        gamma = attention_rhythm_gamma(maps, response_mask[b, :n])
        torch.testing.assert_close(out[b, :n], advantages[b, :n] * gamma)
        assert (gamma > 1).any()
    torch.testing.assert_close(out[1, 31:], advantages[1, 31:])  # padding untouched
