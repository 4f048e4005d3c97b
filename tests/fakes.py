"""The test doubles shared by the stage tests: a character tokenizer and a scripted rollout backend.

Both stand in for a part only where a test checks the code around it (a reward stage's bookkeeping, a judge's
parsing), never for what the test is about; the end-to-end tests use real tokenizers and models.
"""

from __future__ import annotations

import time

from credo.distributed.rollout import Sample

SPECIAL = 0
"""The one special token id of `CharTok`: decoded as '<s>', dropped with skip_special_tokens."""


class CharTok:
    """One id per character (`ord`), so ids decode back to the text exactly; id 0 is a special token.

    Records every call: `calls` as ("encode", add_special_tokens) / ("decode", skip_special_tokens), and the same
    flags in `encodes` / `decodes`."""

    def __init__(self):
        self.calls, self.encodes, self.decodes = [], [], []

    def __call__(self, text, add_special_tokens=True):
        self.calls.append(("encode", add_special_tokens))
        self.encodes.append(add_special_tokens)
        if isinstance(text, (list, tuple)):
            return {"input_ids": [[ord(c) for c in t] for t in text]}
        return {"input_ids": [ord(c) for c in text]}

    def batch_decode(self, rows, skip_special_tokens=False):
        self.calls.append(("decode", skip_special_tokens))
        self.decodes.append(skip_special_tokens)
        return ["".join("" if (i == SPECIAL and skip_special_tokens) else "<s>" if i == SPECIAL else chr(i)
                        for i in row) for row in rows]


class ScriptedBackend:
    """A rollout backend that answers each prompt (ids of a CharTok text) with `answer(prompt_text)`; records the
    calls (count, batch sizes, seeds) and sleeps `delay` seconds per call."""

    def __init__(self, answer, delay: float = 0.0):
        self.answer, self.delay, self.calls, self.sizes, self.seeds = answer, delay, 0, [], []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        self.calls += 1
        self.sizes.append(len(prompts))
        self.seeds.append(seeds)
        time.sleep(self.delay)
        out = []
        for p in prompts:
            text = self.answer("".join(chr(i) for i in p))
            out.append(Sample(p, [ord(c) for c in text], [1] * len(text), [0.0] * len(text), True))
        return out

    def sync_weights(self, model, version) -> None:
        pass

    def close(self) -> None:
        pass


def recipe_with(**sections):
    """A recipe with these sections' fields set (`run={"seed": 5}, rollout={"group_size": 2}`), loaded strictly: what
    a test hands `StageContext(recipe=...)` for the run-wide settings a stage reads (seed, sampling, dtype, ...)."""
    from credo.config import load_recipe

    run = {"name": "test", **sections.get("run", {})}  # run.name is the one key a recipe must set
    return load_recipe({**sections, "run": run})


def sharp_tiny_policy(cache_dir, scale: float):
    """(model, tokenizer) of a 1-layer tiny policy (built under CREDO_CACHE=`cache_dir`) with every weight multiplied
    by `scale`: a random model far from uniform, so sampled tokens and truncation's kept sets vary."""
    import pytest
    import torch

    from credo.config import TinyModelConfig
    from credo.models import build_tiny_model, load_causal_lm, load_tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_CACHE", str(cache_dir))
        path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                                                intermediate_size=64))
    torch.manual_seed(0)
    model = load_causal_lm(str(path))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model, load_tokenizer(str(path))
