"""HFBackend and pack: the vectorised paths against per-sample loops, and sampler log-probs against the model."""

import random

import pytest
import torch

from credo.distributed.rollout import HFBackend, Sample, response_lengths
from credo.train.batch import pack
from tests.fakes import sharp_tiny_policy


def naive_cut(row: list[int], eos: int, pad: int) -> tuple[int, bool]:
    out = []
    for t in row:
        out.append(t)
        if t == eos:
            return len(out), True
    while out and out[-1] == pad and pad != eos:
        out.pop()
    return len(out), False


@pytest.mark.parametrize("pad,eos", [(0, 1), (1, 1)])
def test_response_lengths_match_a_per_row_loop(pad, eos):
    rng = random.Random(0)
    rows = [[rng.choice([pad, eos, 2, 3, 4]) for _ in range(7)] for _ in range(300)]
    rows += [[pad] * 7, [eos] * 7, [2] * 7, [2, pad, 3, pad, pad, pad, pad]]
    lengths, finished = response_lengths(torch.tensor(rows), eos, pad)
    want = [naive_cut(r, eos, pad) for r in rows]
    assert lengths.tolist() == [n for n, _ in want]
    assert finished.tolist() == [f for _, f in want]


def naive_pack(samples, pad_id):
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    B = len(samples)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros(B, width, dtype=torch.long)
    resp = torch.zeros(B, width - 1, dtype=torch.bool)
    rlp = torch.zeros(B, width - 1)
    for i, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.response_ids)
        for j, t in enumerate(s.prompt_ids + s.response_ids):
            ids[i, j] = t
            attn[i, j] = 1
        for j in range(n):  # label-aligned: column p-1+j predicts response token j
            resp[i, p - 1 + j] = bool(s.response_mask[j])
            rlp[i, p - 1 + j] = s.rollout_log_probs[j] if s.rollout_log_probs else 0.0
    return ids, attn, resp, rlp


def test_pack_matches_per_token_reference():
    rng = random.Random(1)
    samples = []
    for _ in range(40):
        p, n = rng.randint(1, 6), rng.randint(0, 5)
        samples.append(Sample([rng.randint(2, 9) for _ in range(p)], [rng.randint(2, 9) for _ in range(n)],
                              [rng.randint(0, 1) for _ in range(n)], [rng.uniform(-3, 0) for _ in range(n)],
                              finished=rng.random() < 0.5))
    samples.append(Sample([5, 6], [7], [1], [], True))  # a backend without sampler log-probs
    for got, want in zip(pack(samples, 0), naive_pack(samples, 0)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_pack_names_the_bad_sample():
    good = Sample([3, 4], [5], [1], [-0.5], True)
    with pytest.raises(ValueError, match="sample 1 has an empty prompt_ids"):
        pack([good, Sample([], [5], [1], [-0.5], True)], 0)
    with pytest.raises(ValueError, match="sample 1: response_mask has 1 and rollout_log_probs 1 entries for 2"):
        pack([good, Sample([3], [5, 6], [1], [-0.5], True)], 0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 8.0)
    return model, tok


def prompts_of(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_sampler_log_probs_are_the_models_and_responses_cut_at_eos(tiny):
    model, tok = tiny
    prompts = prompts_of(tok, ["1+2=", "33+4=", "7=", "12+34="]) * 3  # mixed lengths: left padding matters
    T = 0.7
    samples = HFBackend(model, tok).generate(prompts, max_new_tokens=6, temperature=T, top_p=1.0,
                                             seeds=list(range(len(prompts))))
    assert len({tuple(s.response_ids) for s in samples}) > 1
    for s, p in zip(samples, prompts):
        assert s.prompt_ids == p
        assert s.response_mask == [1] * len(s.response_ids)
        assert s.finished == (tok.eos_token_id in s.response_ids)
        if s.finished:
            assert s.response_ids.index(tok.eos_token_id) == len(s.response_ids) - 1
        else:
            assert len(s.response_ids) == 6
        # teacher-forced recompute of every sampled token, one sequence at a time (no padding)
        ids = torch.tensor([p + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float() / T
        want = logits.log_softmax(-1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), want, atol=2e-4, rtol=0)


def test_seeds_fix_the_samples_and_blocks_agree_when_greedy(tiny):
    model, tok = tiny
    prompts = prompts_of(tok, ["1+2=", "5+6=", "8+8=", "3+1=", "9+9="])
    kw = dict(max_new_tokens=5, temperature=1.0, top_p=1.0)
    a = HFBackend(model, tok).generate(prompts, seeds=[1, 2, 3, 4, 5], **kw)
    b = HFBackend(model, tok).generate(prompts, seeds=[1, 2, 3, 4, 5], **kw)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    one = HFBackend(model, tok).generate(prompts, seeds=None, **kw)
    blocks = HFBackend(model, tok, max_batch=2).generate(prompts, seeds=None, **kw)
    assert [s.response_ids for s in one] == [s.response_ids for s in blocks]
    with pytest.raises(ValueError, match="max_batch must be >= 0"):
        HFBackend(model, tok, max_batch=-1)
