"""Pieces of `credo.train.build` called directly (fast): the run folder's name, the reward function, stage
lookup errors, the vLLM backend's arguments and the MIPU gate's settings."""

from __future__ import annotations

from credo.plan import resolve_plan
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from credo.config import ConfigError, Recipe, recipe_class
from tests.fakes import recipe_with


def test_default_run_dir_is_runs_name_timestamp(tmp_path, monkeypatch):
    from credo.train.setup import make_run_dir

    monkeypatch.chdir(tmp_path)
    r = Recipe()
    r.run.output_dir, r.run.name = None, "exp"
    run_dir = make_run_dir(r, 1)
    assert run_dir.parent == Path("runs") / "exp"
    assert re.fullmatch(r"20\d{6}-\d{6}", run_dir.name), run_dir
    assert (tmp_path / run_dir / "checkpoints").is_dir()


def test_reward_functions_are_imported_with_their_weights():
    from credo.train.setup import reward_function

    r = Recipe()
    r.reward.functions = ["tests.e2e.rewards:starts_with_digit", "tests.byo.rewards:has_digit"]
    r.reward.weights = [2.0, 0.5]
    fn = reward_function(r, None, resolve_plan(r).reward_functions)
    assert fn.names == ["starts_with_digit", "has_digit"]
    assert fn.weights == {"starts_with_digit": 2.0, "has_digit": 0.5}


def test_unknown_stage_lists_the_known_ones():
    from credo.train.registry import resolve

    with pytest.raises(ConfigError, match=r"config key 'stages.rollout' = 'nosuch' is not a known rollout stage "
                                          r"\(known: [a-z_]+(, [a-z_]+)*; or give 'package.module:factory'\)"):
        resolve("rollout", "nosuch", "stages.rollout")


@pytest.mark.parametrize("eager", [None, False, True])
def test_vllm_backend_gets_the_policy_and_the_eager_setting(monkeypatch, eager):
    from credo.train.setup import make_backend

    made = {}

    class FakeVLLM:
        def __init__(self, path, **kw):
            made.update(path=path, **kw)

    monkeypatch.setitem(sys.modules, "credo.distributed.vllm_backend", types.SimpleNamespace(VLLMBackend=FakeVLLM))
    r = Recipe()
    r.rollout.backend, r.rollout.vllm_enforce_eager, r.rollout.fp8_weights = "vllm", eager, False
    make_backend(resolve_plan(r), engine=None, tokenizer=None, policy_path="/models/policy")
    assert made["path"] == "/models/policy"
    assert made["enforce_eager"] is (not torch.cuda.is_available() if eager is None else eager)


def test_mipu_gate_takes_the_recipes_threshold_schedule():
    from credo.families.mipu.gate import hooks
    from credo.train.registry import StageContext

    class Task:
        def __len__(self):
            return 10

        def train(self, i):
            return i

    r = recipe_class()()
    r.mipu.enabled, r.mipu.val_prompts, r.mipu.c_start, r.mipu.c_end, r.mipu.anneal_steps = True, 2, 0.3, 0.1, 7
    parts = types.SimpleNamespace(state=None, source=None, reward=None, scorer=None)
    ctx = StageContext(rank=0, world=1, recipe=recipe_with(rollout=dict(max_new_tokens=4, temperature=1.0, top_p=1.0)),
                       task=Task(), section=r.mipu)
    (gate,) = hooks(ctx, parts)
    assert (gate.c_start, gate.c_end, gate.anneal_steps) == (0.3, 0.1, 7)
    assert gate.val_problems == [8, 9]


def test_scorer_takes_the_path_it_was_built_with():
    """hidden_path=True never runs the model's full forward (no [N, V] logits); False (ZeRO-3) does. Both give
    the log-softmax of the logits at the temperature."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from credo.train.scoring import PolicyScorer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32)).eval()
    ids = torch.randint(0, 32, (2, 6))
    attn = torch.ones_like(ids)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, 2:] = True
    with torch.no_grad():
        ref = (model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / 0.7).log_softmax(-1)
    ref = ref.gather(-1, ids[:, 1:, None])[..., 0] * mask
    forward = model.forward
    calls = []
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    for hidden in (True, False):
        calls.clear()
        scorer = PolicyScorer(temperature=0.7, chunk_size=3, hidden_path=hidden, needs_old_log_probs=True)
        with torch.no_grad():
            lp, _ = scorer(model, ids, attn, mask, with_entropy=False)
        assert torch.allclose(lp, ref, atol=1e-5)
        assert bool(calls) is not hidden
        # an explicit hidden_path overrides the built one
        calls.clear()
        with torch.no_grad():
            scorer(model, ids, attn, mask, with_entropy=False, hidden_path=not hidden)
        assert bool(calls) is hidden


def _tiny_llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32)).eval()


def _scoring_batch():
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, 2:] = True
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=mask,
                                 old_log_probs=None, ref_log_probs=None, weights=None, extras={}, metrics={})


def test_scorer_recompute_fills_the_old_and_the_reference_log_probs():
    from credo.train.scoring import PolicyScorer

    policy, ref = _tiny_llama(0), _tiny_llama(1)
    batch = _scoring_batch()
    scorer = PolicyScorer(temperature=1.0, chunk_size=3, hidden_path=True, needs_old_log_probs=True, ref_model=ref)
    scorer.recompute(policy, batch)
    with torch.no_grad():
        want_old, _ = scorer(policy, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=False)
        want_ref, _ = scorer(ref, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=False)
    torch.testing.assert_close(batch.old_log_probs, want_old)
    torch.testing.assert_close(batch.ref_log_probs, want_ref)
    assert not torch.allclose(want_old[batch.loss_mask], want_ref[batch.loss_mask])  # two different models


def test_a_probe_output_of_the_wrong_kind_or_shape_is_named():
    import contextlib

    from credo.train.scoring import PolicyScorer

    class Probe:
        name = "odd"

        def __init__(self, value):
            self.value = value

        def capture(self, model):
            return contextlib.nullcontext()

        def result(self, batch, log_probs, entropy):
            return {"weights": self.value}

    model = _tiny_llama(0)
    for value, got in (([1.0], "list"), (torch.ones(2, 4), r"\(2, 4\)")):
        scorer = PolicyScorer(temperature=1.0, chunk_size=3, hidden_path=True, needs_old_log_probs=False,
                              probes=[Probe(value)])
        with pytest.raises(ValueError, match=rf"^probe 'odd' output 'weights' has shape {got}, expected \[2, 5\] "
                                             r"like batch.loss_mask$"):
            scorer.recompute(model, _scoring_batch())


def test_outcome_advantages_keep_the_rewards_precision():
    """A reward stage that writes float64 rewards gets float64 advantages (tiny reward gaps are not rounded away)."""
    from credo.algos.advantages import grpo
    from credo.distributed.rollout import Sample
    from credo.tasks import Problem
    from credo.train.advantage import OutcomeAdvantage
    from credo.train.batch import Batch, pack_batch

    samples = [Sample([5, 6], [7, 8, 9][:n], [1] * n, [-1.0] * n, True) for n in (3, 2, 3, 1)]
    batch = Batch(samples=samples, problems=[Problem("q", "")] * 4, group_ids=torch.tensor([0, 0, 1, 1]), step=1)
    batch.rewards = torch.tensor([1.0, 1.0 + 1e-9, 0.0, 2.0], dtype=torch.float64)
    batch.valid = torch.ones(4, dtype=torch.bool)
    pack_batch(batch, 0, overlong_filter=False)
    OutcomeAdvantage(grpo, {})(batch)
    adv = batch.advantages
    assert adv.dtype == torch.float64
    total = adv.sum(1).tolist()  # per sample: its advantage times its response length
    assert total[0] < 0 < total[1] and total[2] < 0 < total[3]
    assert (adv != 0).sum(1).tolist() == [3, 2, 3, 1]


# ------------------------------------------------------------------ one build of the quickstart recipe
SEEN_CTX: list = []


class _RecordingReward:
    def __init__(self, ctx):
        SEEN_CTX.append(ctx)

    def __call__(self, batch):
        batch.rewards, batch.valid = torch.zeros(len(batch)), torch.ones(len(batch), dtype=torch.bool)

    def close(self):
        pass


def recording_reward(ctx):
    return _RecordingReward(ctx)


def test_build_passes_the_recipes_settings_to_the_stages(tmp_path):
    """The stage context carries the reward isolation settings; the engine gets the LR
    schedule; Components exposes the task the source draws from."""
    import math

    from tests.invariants.common import components

    import os

    SEEN_CTX.clear()
    threads = torch.get_num_threads()
    with components(tmp_path, **{"optim.lr_schedule": "cosine", "optim.min_lr_ratio": 0.1, "optim.warmup_steps": 0,
                                 "run.steps": 2, "reward.timeout_s": 7.5, "reward.max_failure_frac": 0.25,
                                 "run.threads": 0,
                                 "stages.reward": "tests.spine.test_build_parts:recording_reward"}) as c:
        # run.threads=0: every core for the one process (then back to what this test process had)
        built_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        assert built_threads == os.cpu_count()
        ctx, = SEEN_CTX
        iso = ctx.reward_isolation
        assert (iso["timeout_s"], iso["max_failure_frac"]) == (7.5, 0.25)
        assert ctx.section is None  # an import-spec stage belongs to no family
        assert c.task is ctx.task and c.task.train(0).prompt
        # the stages with a state_dict are part of the trainer state (saved, restored, rolled back with it)
        assert c.state.components["source"] is c.source and c.state.components["advantage"] is c.advantage
        # cosine decay from 1e-3 to 0.1 * 1e-3 over run.steps x ppo_epochs x mini_batches optimizer steps
        total = 2 * c.updater.ppo_epochs * c.updater.mini_batches
        sched = c.engine.lr_scheduler
        lrs = []
        for _ in range(total):
            lrs.append(sched.get_last_lr()[0])
            sched.step()
        want = [1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / total))) for s in range(total)]
        assert lrs == pytest.approx(want, rel=1e-6)
        assert sched.get_last_lr()[0] == pytest.approx(1e-4)
        # the defaults: one on-policy pass (no recompute), no reference model or KL, no evaluation, no tracker,
        # ZeRO-1 (the hidden-state path), the warm-up's policy
        assert c.scorer.needs_old_log_probs is False and c.scorer.hidden_path is True and c.scorer.ref_model is None
        assert c.objective.kl_estimator is None and c.evaluate is None and c.hooks == []
        assert c.tracker_args["wandb_cfg"] is None and c.zero_stage == 1 and c.resume is None
        assert c.state.sft_key is not None and c.state.policy_path != c.config["model"]["path"]


def test_a_prompt_that_fills_the_context_exactly_fits(tmp_path):
    from credo.config import load_recipe
    from credo.models import resolve_model_path
    from credo.tasks import make_task
    from credo.train.setup import check_context
    from tests.e2e.common import tiny_overrides

    # the quickstart's prompts 'a+b=' are 4 tokens: with 4 new tokens they fill a context of 8 exactly
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"model.tiny.max_position_embeddings": 8}))
    base, task = resolve_model_path(r.model.path, r.model.tiny), make_task(r.task)
    check_context(r, base, task)
    r.rollout.max_new_tokens = 5
    with pytest.raises(ConfigError, match=r"^prompt too long: eval problem 0 has 4 tokens \+ rollout.max_new_tokens=5 > "
                                          r"the model's context of 8 tokens \(max_position_embeddings\); shorten"):
        check_context(r, base, task)
