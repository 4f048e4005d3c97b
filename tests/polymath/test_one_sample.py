"""The one-sample batch: P copies of the one problem x G responses, drawn by a real tiny model, against a naive
reference of the layout and of the seeds (sha256 of 'seed:step:salt', written out here, not imported); the copies
split over ranks like the default source's prompts; the seeds fix the responses (so a resume redraws them)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from credo.config import TinyModelConfig
from credo.distributed.rollout import HFBackend
from credo.families.polymath.source import OneSampleRollout
from credo.models import build_tiny_model, load_causal_lm, load_tokenizer
from credo.tasks import Problem
from credo.tasks.render import plain_prompt

P, G = 3, 4
PROBLEM = Problem(prompt="58*4=", answer="8*4+0=32,5*4+3=23>232", meta={"result": 232, "discipline": "mul"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_CACHE", str(tmp_path_factory.mktemp("cache")))
        path = build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1,
                                                intermediate_size=64))
    torch.manual_seed(0)
    model = load_causal_lm(str(path))
    with torch.no_grad():  # not near-uniform, so the sampled responses differ from seed to seed
        for p in model.parameters():
            p.mul_(6.0)
    return model, load_tokenizer(str(path))


class Recording(HFBackend):
    """The real backend, keeping each generate call's prompts and seeds."""

    calls: list

    def generate(self, prompts, **kw):
        self.calls = getattr(self, "calls", []) + [(prompts, kw["seeds"])]
        return super().generate(prompts, **kw)


def naive_seed(seed: int, step: int, salt: int) -> int:
    digest = hashlib.sha256(("%d:%d:%d" % (seed, step, salt)).encode()).digest()
    return (digest[0] | digest[1] << 8 | digest[2] << 16 | digest[3] << 24) & (2 ** 31 - 1)


def source(tiny, *, group="copy", rank=0, world=1, seed=7):
    model, tok = tiny
    backend = Recording(model, tok)
    src = OneSampleRollout(PROBLEM, tok, backend, group=group, seed=seed, prompts_per_step=P, group_size=G,
                           max_new_tokens=8, temperature=1.0, top_p=1.0, rank=rank, world=world, render=plain_prompt)
    return src, backend


@pytest.mark.parametrize("group", ["copy", "all"])
def test_batch_is_copies_of_the_one_problem_with_seeds_of_seed_step_copy_response(tiny, group):
    src, backend = source(tiny, group=group)
    batch = src.rollout(5)
    _, tok = tiny
    want_ids = [tok.convert_tokens_to_ids(c) for c in "58*4="]
    assert len(batch) == P * G
    assert all(p is PROBLEM for p in batch.problems)
    assert all(s.prompt_ids == want_ids for s in batch.samples)
    prompts, seeds = backend.calls[-1]
    assert prompts == [want_ids] * (P * G)
    want_seeds = []
    for copy in range(P):
        for response in range(G):
            want_seeds.append(naive_seed(7, 5, 1 + copy * G + response))
    assert seeds == want_seeds and len(set(seeds)) == P * G
    want_groups = [c for c in range(P) for _ in range(G)] if group == "copy" else [0] * (P * G)
    assert batch.group_ids.tolist() == want_groups
    assert len({tuple(s.response_ids) for s in batch.samples}) > 1  # the copies' seeds really differ


def test_the_same_step_redraws_the_same_responses_and_another_step_does_not(tiny):
    a, _ = source(tiny)
    b, _ = source(tiny)
    first = [s.response_ids for s in a.rollout(3).samples]
    assert [s.response_ids for s in b.rollout(3).samples] == first
    assert [s.response_ids for s in b.rollout(4).samples] != first


def test_ranks_split_the_copies_and_keep_the_global_seeds_and_groups(tiny):
    whole, wb = source(tiny, world=1)
    whole.rollout(2)
    P2 = 4  # two ranks need an even number of copies
    model, tok = tiny
    parts = []
    for rank in range(2):
        backend = Recording(model, tok)
        src = OneSampleRollout(PROBLEM, tok, backend, seed=7, prompts_per_step=P2, group_size=G, max_new_tokens=8,
                               temperature=1.0, top_p=1.0, rank=rank, world=2, render=plain_prompt)
        batch = src.rollout(2)
        parts.append((backend.calls[-1][1], batch.group_ids.tolist()))
    seeds = parts[0][0] + parts[1][0]
    assert seeds == [naive_seed(7, 2, 1 + i) for i in range(P2 * G)]
    assert parts[0][1] == [0] * G + [1] * G and parts[1][1] == [2] * G + [3] * G
    assert wb.calls[-1][1] == seeds[:P * G]  # rank shares are slices of the one-process batch's seeds
