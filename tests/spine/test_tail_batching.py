"""Tail batching (RollPacker, arXiv 2509.21009): the race rule, the hf backend's chunked race, and the rollout source.

- `race_winners` against a brute-force reading of the rule (each group's R0-th finish, the P0 earliest groups).
- The hf race decodes what the model says: every kept response's sampler log-probs equal the model's own log-probs
  recomputed from scratch (so the KV cache carried across chunks, with rows dropped, is right); with one chunk (no
  row ever dropped) it draws exactly what `HFBackend.generate` draws from the same seeds.
- The source: P0 x R0 samples a step, the losers of short rounds queue up and return in a long round of full-length
  responses, every drawn prompt is trained exactly once, and a source rebuilt from `state_dict` mid-run draws the
  same batches as the one that went on (resume).
"""

from __future__ import annotations

import random

import pytest
import torch

transformers = pytest.importorskip("transformers")

from credo.distributed.race import hf_race, race_winners  # noqa: E402
from credo.distributed.rollout import HFBackend, seeds_digest  # noqa: E402
from credo.tasks.problem import Problem  # noqa: E402
from credo.train.scoring import policy_forward  # noqa: E402
from credo.schedules.tail_batching import TailBatchingRollout  # noqa: E402

V, EOS, PAD = 40, 2, 0


class Tok:
    """A tokenizer of digits and letters, one token per character (ids from 3), enough for encode_prompts."""

    eos_token_id, pad_token_id, chat_template = EOS, PAD, None

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[3 + (ord(c) % (V - 3)) for c in t] for t in texts]}


class Task:
    """`n` training problems whose prompts differ in length."""

    def __init__(self, n: int = 60):
        self.problems = [Problem(prompt="x" * (1 + i % 5) + str(i), answer=str(i)) for i in range(n)]

    def __len__(self):
        return len(self.problems)

    def train(self, i):
        return self.problems[i]


def model_with_eos_rate(seed: int = 0, eos_scale: float = 5.0):
    """A tiny Qwen2 whose EOS logit is raised so sampled responses end after very different lengths."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, intermediate_size=96, max_position_embeddings=128,
                                   eos_token_id=EOS, pad_token_id=PAD)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] = model.model.embed_tokens.weight.mean(0) * eos_scale
    return model


def naive_winners(finish, groups, need, groups_needed):
    """The rule read literally: a group completes at its need-th smallest finish step; the first groups_needed groups
    (ties: lower group) win, each keeping its need earliest finishers (ties: lower request)."""
    when = {}
    for g in sorted(set(groups)):
        steps = sorted((finish[j], j) for j in range(len(finish)) if groups[j] == g and finish[j] is not None)
        if len(steps) >= need:
            when[g] = (steps[need - 1][0], [j for _, j in steps[:need]])
    if len(when) < groups_needed:
        return None
    order = sorted(when, key=lambda g: (when[g][0], g))[:groups_needed]
    return [(g, when[g][1]) for g in order]


def test_race_winners_follow_the_rule():
    rng = random.Random(0)
    for _ in range(300):
        n_groups, per, need = rng.randint(1, 6), rng.randint(1, 5), 0
        need = rng.randint(1, per)
        groups = [g for g in range(n_groups) for _ in range(per)]
        finish = [rng.choice([None, *range(6)]) for _ in groups]
        rng.shuffle(groups)
        wanted = rng.randint(1, n_groups)
        assert race_winners(finish, groups, need=need, groups_needed=wanted) == naive_winners(finish, groups, need, wanted)


def _race_inputs(n_prompts=5, responses=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, V, (2 + i % 4,), generator=g).tolist() for i in range(n_prompts)]
    return ([p for p in prompts for _ in range(responses)], [i for i in range(n_prompts) for _ in range(responses)],
            [1000 + j for j in range(n_prompts * responses)])


def test_hf_race_log_probs_are_the_models_own_after_chunks_drop_rows():
    model = model_with_eos_rate()
    backend = HFBackend(model, Tok())
    prompts, groups, seeds = _race_inputs()
    res = backend.generate_race(prompts, groups, need=2, groups_needed=3, max_new_tokens=30, temperature=0.8,
                                top_p=1.0, seeds=seeds, chunk_tokens=3)
    kept = [s for s in res.samples if s is not None]
    lengths = sorted(len(s.response_ids) for s in kept)
    assert lengths[0] < 6 and lengths[-1] > 12  # responses end at very different steps: rows left between chunks
    assert any(s is None for s in res.samples)  # and the race aborted some
    for s, step in zip(res.samples, res.finish_steps):
        if s is None:
            continue
        assert step == len(s.response_ids) - 1 and s.finished == (s.response_ids[-1] == EOS)
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        mask = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
        mask[0, len(s.prompt_ids) - 1:] = True
        with torch.no_grad():
            lp, _ = policy_forward(model, ids, torch.ones_like(ids), mask, temperature=0.8, chunk_size=64,
                                   with_entropy=False)
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), lp[0, mask[0]], rtol=1e-4, atol=1e-4)
    assert res.decoded_tokens >= sum(len(s.response_ids) for s in kept)


def test_hf_race_in_one_chunk_draws_what_generate_draws():
    model = model_with_eos_rate(seed=1)
    backend = HFBackend(model, Tok())
    prompts, groups, seeds = _race_inputs(seed=2)
    res = hf_race(backend, prompts, groups, need=2, groups_needed=3, max_new_tokens=25, temperature=1.0, top_p=1.0,
                  seed=seeds_digest(seeds), chunk_tokens=25)
    plain = backend.generate(prompts, max_new_tokens=25, temperature=1.0, top_p=1.0, seeds=seeds)
    for s, p in zip(res.samples, plain):
        assert s.response_ids == p.response_ids and s.finished == p.finished
        assert s.rollout_log_probs == pytest.approx(p.rollout_log_probs, abs=1e-6)
    finish = [len(p.response_ids) - 1 for p in plain]
    assert race_winners(res.finish_steps, groups, need=2, groups_needed=3) == naive_winners(finish, groups, 2, 3)


def make_source(backend, **kw):
    args = dict(prompt_ratio=1.5, max_responses=3, chunk_tokens=4, seed=7, prompts_per_step=4, group_size=2,
                max_new_tokens=24, temperature=1.0, top_p=1.0)
    return TailBatchingRollout(Task(), Tok(), backend, **{**args, **kw})


def test_rounds_queue_the_losers_and_train_every_drawn_prompt_once():
    backend = HFBackend(model_with_eos_rate(seed=3), Tok())
    src = make_source(backend)
    trained, kinds = [], []
    for step in range(1, 10):
        b = src.rollout(step)
        assert len(b) == 8 and b.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        assert all(b.problems[2 * i] is b.problems[2 * i + 1] for i in range(4))
        kinds.append(b.metrics["rollout/long_round"])
        trained += [b.problems[2 * i].answer for i in range(4)]
        if kinds[-1]:  # a long round: exactly R0 responses a prompt, run to the end (EOS or the cap)
            assert b.metrics["rollout/aborted_responses"] == 0
            assert all(s.finished or len(s.response_ids) == 24 for s in b.samples)
        else:  # ceil(1.5 * 4) = 6 prompts x 3 raced, 4 x 2 kept
            assert b.metrics["rollout/aborted_responses"] == 6 * 3 - 8
            assert b.metrics["rollout/queued_prompts"] == 2
        assert b.metrics["rollout/queue_len"] == len(src.queue)
    assert kinds == [0, 0, 1, 0, 0, 1, 0, 0, 1]  # two short rounds queue 4 prompts, then a long round takes them
    drawn = [src.task.train(src.problem_index(d)).answer for d in range(src.drawn)]
    assert sorted(trained) == sorted(drawn) and len(set(drawn)) == len(drawn) == 36  # each drawn once, trained once
    assert src.epoch() == pytest.approx(36 / 60)


def test_a_source_restored_from_its_state_draws_the_same_batches():
    backend = HFBackend(model_with_eos_rate(seed=4), Tok())
    a = make_source(backend)
    for step in range(1, 5):
        a.rollout(step)
    state = a.state_dict()
    assert state == {"ranks": [{"drawn": a.drawn, "queue": a.queue}]} and a.queue
    b = make_source(backend)
    b.load_state_dict(state)
    for step in range(5, 8):
        x, y = a.rollout(step), b.rollout(step)
        assert [s.response_ids for s in x.samples] == [s.response_ids for s in y.samples]
        assert x.metrics == y.metrics
    fresh = make_source(backend)  # without the state, step 5 is a short round of the first prompts
    assert fresh.rollout(5).metrics["rollout/long_round"] == 0.0 and a.queue != fresh.queue


def test_epochs_draw_every_problem_once_with_ranks_interleaved():
    backend = HFBackend(model_with_eos_rate(), Tok())
    ranks = [make_source(backend, rank=r, world=2) for r in range(2)]
    n = len(ranks[0].task)
    for epoch in range(2):
        got = [src.problem_index(d) for src in ranks for d in range(epoch * n // 2, (epoch + 1) * n // 2)]
        assert sorted(got) == list(range(n))
    assert ranks[0].problem_index(0) != ranks[1].problem_index(0)


def test_a_backend_without_a_race_is_refused():
    class Plain:
        def generate(self, *a, **k):
            return []

    with pytest.raises(ValueError, match="needs a backend that can stop requests early"):
        make_source(Plain())


@pytest.mark.parametrize("overrides,key", [
    (["rollout.tail_batching={max_responses: 2}"], "rollout.tail_batching.max_responses"),
    (["stages.schedule=tail_batching", "stages.schedule_kwargs={max_responses: 2}"],
     "stages.schedule_kwargs.max_responses"),
    (["rollout.tail_batching={}", "rollout.max_staleness=1"], "rollout.max_staleness"),
    (["rollout.tail_batching=5"], "rollout.tail_batching"),
])
def test_bad_tail_batching_settings_are_refused_by_check_naming_the_key(overrides, key):
    """At load (a wrong type) or by the run plan (`credo check`), before any warm-up."""
    from credo.config import ConfigError, load_recipe
    from credo.plan import resolve_plan

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_plan(load_recipe("recipes/longtail.yaml", overrides))
