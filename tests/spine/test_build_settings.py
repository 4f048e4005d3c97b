"""`credo.train.build`: every recipe setting reaches the part that reads it. One build of the quickstart recipe
(tiny, no warm-up) with non-default settings everywhere, checked part by part, and the builder's helpers called
directly: the fault hook's parser, the reward function, the run folder, stage lookup, the backends, the context
check and the policy path."""

from __future__ import annotations

from credo.plan import resolve_plan
import sys
import types
from pathlib import Path

import pytest
import torch

from credo.config import ConfigError, Recipe, load_recipe, recipe_class
from tests.e2e.common import tiny_overrides

SETTINGS = {
    "run.steps": 2, "run.seed": 5, "run.eval_every": 3, "run.eval_temperature": 0.5, "run.eval_samples": 2,
    "run.save_every": 7, "run.keep_last": 4, "run.dump_rollouts_every": 5, "run.allow_config_change": True,
    "run.max_consecutive_skips": 6, "run.wandb": True, "run.wandb_project": "proj", "run.wandb_mode": "disabled",
    "run.progress": False, "run.plot": False, "run.threads": 1,
    "model.ref_model": True, "sft.steps": 0,
    "rollout.prompts_per_step": 4, "rollout.group_size": 2, "rollout.max_new_tokens": 3, "rollout.temperature": 0.8,
    "rollout.top_p": 0.9, "rollout.hf_max_batch": 3,
    "algo.advantage": "grpo", "algo.advantage_kwargs": "{norm_std: false}", "algo.policy_loss": "cispo",
    "algo.loss_kwargs": "{clip_high: 3.0}", "algo.agg_mode": "seq-mean-token-sum", "algo.kl_coef": 0.05,
    "algo.kl_estimator": "k2", "algo.entropy_coef": 0.01, "algo.overlong_filter": True, "algo.ppo_epochs": 2,
    "algo.mini_batches": 2, "algo.micro_batch_size": 2, "algo.logprob_chunk_size": 16,
    "optim.lr": 2e-3, "optim.betas": "[0.8, 0.95]", "optim.weight_decay": 0.05, "optim.grad_clip": 0.5,
    "optim.warmup_steps": 3, "optim.zero_stage": 0, "optim.lr_schedule": "linear", "optim.min_lr_ratio": 0.2,
    "reward.timeout_s": 7.5, "reward.workers": 2, "reward.max_failure_frac": 0.25,
}


SEEN: list = []  # (kind, the context as the factory saw it, its default) per stage the build made


def passthrough(ctx, kind: str):
    """A stage factory that records its context and returns the built-in stage of its kind."""
    SEEN.append((kind, ctx, ctx.default))
    return ctx.default


class Probe:
    name = "recorded"


def probe(ctx, weight: float = 1.0):
    SEEN.append(("probe", ctx, ctx.default))
    p = Probe()
    p.weight = weight
    return p


STAGES = {
    "stages.rollout": "tests.spine.test_build_settings:passthrough", "stages.rollout_kwargs": "{kind: rollout}",
    "stages.reward": "tests.spine.test_build_settings:passthrough", "stages.reward_kwargs": "{kind: reward}",
    "stages.advantage": "tests.spine.test_build_settings:passthrough", "stages.advantage_kwargs": "{kind: advantage}",
    "stages.probes": "[tests.spine.test_build_settings:probe]",
    "stages.probe_kwargs": "{'tests.spine.test_build_settings:probe': {weight: 0.5}}",
}


def count_calls(mp, *targets) -> dict:
    """Wrap each function (module, name) wherever a module holds it (imported names included): its calls, each with
    the module and function of its caller, go to the returned {name: [(module, function), ...]}."""
    import importlib
    import sys

    calls: dict = {}
    for module, name in targets:
        fn = getattr(importlib.import_module(module), name)
        calls[name] = []

        def wrapper(*a, _fn=fn, _name=name, **k):
            caller = sys._getframe(1)
            calls[_name].append((caller.f_globals.get("__name__"), caller.f_code.co_name))
            return _fn(*a, **k)

        for mod in list(sys.modules.values()):
            if mod is not None and getattr(mod, "__name__", "").startswith("credo") and getattr(mod, name, None) is fn:
                mp.setattr(mod, name, wrapper)
    return calls


def test_build_resolves_every_name_in_one_function(built):
    """The run plan is resolved once; every stage name is resolved inside it (credo.plan), once per stage; no reward
    function is imported and no recipe asked for its families outside it."""
    _, c = built
    assert len(c.calls["resolve_plan"]) == 1
    assert {mod for mod, _ in c.calls["resolve"]} == {"credo.plan"}
    assert len(c.calls["resolve"]) == 4  # rollout, reward, advantage, the one probe
    assert {mod for mod, _ in c.calls["import_reward_fn"]} <= {"credo.plan"}
    assert {mod for mod, _ in c.calls["families_of"]} <= {"credo.plan", "credo.family"}


def _recipe(out: Path, **extra) -> Recipe:
    return load_recipe("recipes/quickstart.yaml", tiny_overrides(out / "run", **{**SETTINGS, **extra}))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from credo.train.build import build

    r = _recipe(tmp_path_factory.mktemp("build-settings"), **STAGES)
    SEEN.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CREDO_FAULT_NAN_STEP", "2,4-5")
        calls = count_calls(mp, ("credo.train.registry", "resolve"), ("credo.plan", "resolve_plan"),
                            ("credo.rewards.worker", "import_reward_fn"), ("credo.family", "families_of"))
        c = build(r)
    c.calls = calls
    c.threads_after_build = torch.get_num_threads()
    torch.set_num_threads(threads)
    yield r, c
    c.source.close()
    c.reward.close()


def test_run_bookkeeping(built):
    from credo.config import recipe_to_dict, recipe_to_yaml

    r, c = built
    assert (c.rank, c.world) == (0, 1)
    assert c.threads_after_build == 1  # run.threads
    assert c.run_dir == Path(r.run.output_dir) and (c.run_dir / "checkpoints").is_dir()
    assert (c.steps, c.eval_every, c.save_every, c.keep_last, c.dump_every) == (2, 3, 7, 4, 5)
    assert c.overlong_filter is True and c.allow_config_change is True and c.resume is None
    assert c.zero_stage == 0
    assert c.config == recipe_to_dict(r) and c.config["algo"]["ppo_epochs"] == 2
    assert c.config_yaml == recipe_to_yaml(r) and "ppo_epochs: 2" in c.config_yaml
    assert c.tracker_args == dict(total_steps=2, progress=False, plot=False,
                                  wandb_cfg={"project": "proj", "mode": "disabled"}, tensorboard_dir=None)


def test_each_stage_factory_gets_the_context_its_default_and_its_settings(built):
    from credo.models import resolve_model_path
    from credo.train.advantage import OutcomeAdvantage
    from credo.train.reward import FunctionReward
    from credo.train.rollout import PromptRollout

    r, c = built
    # the advantage stage comes after the scorer (the critic stage needs it), the probes before it
    assert [kind for kind, _, _ in SEEN] == ["rollout", "reward", "probe", "advantage"]
    ctx = SEEN[-1][1]  # the advantage stage's: the runtime with the source and the scorer in it
    import dataclasses

    runtime = [f.name for f in dataclasses.fields(ctx) if f.name not in ("default", "section", "source", "scorer")]
    assert all(getattr(seen, f) is getattr(ctx, f) for _, seen, _ in SEEN for f in runtime)  # one frozen runtime
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.default = None
    assert SEEN[0][1].source is None and SEEN[1][1].source is c.source  # the source exists once built
    assert SEEN[2][1].scorer is None and ctx.scorer is c.scorer  # the scorer after the probes, before the advantage
    assert [type(d) for _, _, d in SEEN] == [PromptRollout, FunctionReward, type(None), OutcomeAdvantage]
    assert (SEEN[0][2], SEEN[1][2], SEEN[3][2]) == (c.source, c.reward, c.advantage)
    assert (ctx.rank, ctx.world, ctx.seed) == (0, 1, 5)
    assert ctx.tokenizer is c.tokenizer and ctx.task is c.task and ctx.engine is c.engine
    assert ctx.backend is c.source.backend and ctx.render is c.source.render
    assert ctx.rollout == dict(prompts_per_step=4, group_size=2, max_new_tokens=3, temperature=0.8, top_p=0.9)
    assert ctx.section is None and ctx.task_config is r.task  # import-spec stages belong to no family
    assert ctx.source is c.source and ctx.scorer is c.scorer and ctx.ref_model is c.scorer.ref_model
    assert ctx.policy_path == resolve_model_path(r.model.path, r.model.tiny) and ctx.dtype == "float32"
    assert ctx.zero_stage == 0 and ctx.advantage_kwargs == {"norm_std": False}
    assert ctx.reward_isolation == dict(timeout_s=7.5, workers=2, max_failure_frac=0.25)
    assert ctx.default is SEEN[-1][2]  # each call's own default, in its own context
    p, = c.scorer.probes
    assert type(p) is Probe and p.weight == 0.5


def test_the_source_samples_with_the_rollout_settings(built):
    from credo.train.rollout import PromptRollout

    r, c = built
    s = c.source
    assert type(s) is PromptRollout and s.task is c.task and s.tokenizer is c.tokenizer
    assert (s.seed, s.P, s.G, s.max_new_tokens, s.temperature, s.top_p) == (5, 4, 2, 3, 0.8, 0.9)
    assert (s.rank, s.world, s.holdout) == (0, 1, 0)
    assert s.render(c.task.train(0)) == c.task.train(0).prompt  # no chat template, no system prompt
    assert s.backend.max_batch == 3 and s.backend.model is c.engine.module
    assert c.task.train(0).prompt.endswith("=")  # the arithmetic task of the recipe


def test_the_reward_runs_the_recipes_function_with_its_isolation(built):
    from credo.train.reward import FunctionReward
    from tests.e2e.rewards import starts_with_digit

    r, c = built
    assert type(c.reward) is FunctionReward and c.reward.G == 2 and c.reward.tokenizer is c.tokenizer
    w = c.reward.worker
    assert w.fn is starts_with_digit  # a plain group function is called as it is
    assert (w.timeout_s, w.max_failure_frac, w._workers) == (7.5, 0.25, 2)


def test_the_advantage_is_the_recipes_estimator_with_its_settings(built):
    from credo import algos
    from credo.train.advantage import OutcomeAdvantage

    r, c = built
    assert type(c.advantage) is OutcomeAdvantage
    assert c.advantage.estimator is algos.ADVANTAGE_ESTIMATORS["grpo"] and c.advantage.kwargs == {"norm_std": False}


def test_the_scorer_objective_and_updater(built):
    from credo import algos
    from credo.train.update import Updater

    r, c = built
    s = c.scorer
    assert (s.temperature, s.chunk_size, s.hidden_path, s.needs_old_log_probs) == (0.8, 16, True, True)
    ref = s.ref_model
    assert ref is not None and ref is not c.engine.module and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    # the reference starts as the policy's weights
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), c.engine.module.state_dict().values()))
    o = c.objective
    assert o.policy_loss is algos.POLICY_LOSSES["cispo"] and o.loss_kwargs == {"clip_high": 3.0}
    assert (o.agg_mode, o.entropy_coef, o.kl_coef, o.norm_len) == ("seq-mean-token-sum", 0.01, 0.05, 3)
    assert o.kl_estimator is algos.KL_ESTIMATORS["k2"]
    u = c.updater
    assert type(u) is Updater and u.engine is c.engine and u.scorer is s and u.objective is o
    # 4 prompts x 2 samples = 8 per rank, 2 mini-batches of 4, micro-batches of 2: 2 per optimizer step
    assert (u.ppo_epochs, u.mini_batches, u.grad_accum, u.zero_stage, u.world) == (2, 2, 2, 0, 1)
    assert u.fault_nan_steps == frozenset({2, 4, 5})


def test_the_engine_takes_the_optimizer_settings(built):
    r, c = built
    e = c.engine
    assert e.train_micro_batch_size_per_gpu() == 2 and e.gradient_accumulation_steps() == 2
    assert e.gradient_clipping() == 0.5 and e.zero_optimization_stage() == 0 and not e.bfloat16_enabled()
    group = e.optimizer.param_groups[0]
    assert group["initial_lr"] == 2e-3 and group["betas"] == (0.8, 0.95) and group["weight_decay"] == 0.05
    # linear warm-up over 3 steps, then a linear decay to 0.2 x lr at run.steps x ppo_epochs x mini_batches = 8
    want = [1 / 3, 2 / 3, 1.0, 1.0, 0.84, 0.68, 0.52, 0.36, 0.2, 0.2]
    got = [e.lr_scheduler.lr_lambdas[0](s) for s in range(10)]
    assert got == pytest.approx(want)
    assert group["lr"] == pytest.approx(2e-3 / 3)


def test_the_state_hooks_and_evaluator(built):
    from credo.models import resolve_model_path
    from credo.train.evaluate import Evaluator

    r, c = built
    st = c.state
    assert st.engine is c.engine and st.config is c.config
    assert st.components == {"counters": st.counters, "source": c.source, "advantage": c.advantage}
    assert st.sft_key is None and st.policy_path == resolve_model_path(r.model.path, r.model.tiny)  # no warm-up
    assert st.max_consecutive_skips == 6
    assert c.hooks == [] and "mipu" not in st.components  # no active family runs a step hook here
    ev = c.evaluate
    assert type(ev) is Evaluator and ev.source is c.source and ev.task is c.task and ev.tokenizer is c.tokenizer
    assert (ev.seed, ev.temperature, ev.samples, ev.rank, ev.world) == (5, 0.5, 2, 0, 1)
    assert ev.render is c.source.render
    assert ev.metric == "eval/accuracy" and ev.reward_fn is None  # the arithmetic task has a verifier


# ------------------------------------------------------------------------------------------------ helpers
@pytest.mark.parametrize("value, steps", [
    ("", set()), ("3", {3}), ("2,5", {2, 5}), ("3-6", {3, 4, 5, 6}), (" 1 , 4-5 ", {1, 4, 5}), ("7,,", {7}),
    ("0-0", {0}),
])
def test_fault_nan_steps_reads_the_test_hook(monkeypatch, value, steps):
    from credo.train.setup import fault_nan_steps

    monkeypatch.setenv("CREDO_FAULT_NAN_STEP", value)
    assert fault_nan_steps() == frozenset(steps)
    monkeypatch.delenv("CREDO_FAULT_NAN_STEP")
    assert fault_nan_steps() == frozenset()


def trl_style(completions, **kw):
    return [1.0 for _ in completions]


def test_reward_function_key_and_the_verifier():
    from credo.rewards.functions import WeightedRewards
    from credo.tasks import Problem
    from credo.train.setup import reward_function
    from tests.e2e.rewards import starts_with_digit

    r = Recipe()
    r.reward.function = "tests.e2e.rewards:starts_with_digit"
    assert reward_function(r, None, resolve_plan(r).reward_functions) is starts_with_digit
    r.reward.function = "tests.spine.test_build_settings:trl_style"
    fn = reward_function(r, None, resolve_plan(r).reward_functions)
    assert isinstance(fn, WeightedRewards) and fn.fns == [trl_style] and fn.names == ["trl_style"]
    r.reward.function = None

    class Task:
        @staticmethod
        def score(text, problem):
            return 1.0 if text == problem.answer else 0.25

    fn = reward_function(r, Task())
    assert fn(["4", "5"], [Problem("2+2=", "4"), Problem("2+2=", "4")]) == [1.0, 0.25]
    assert fn.__name__ == "score"
    r.task.name = "mytask"
    for task in (object(), types.SimpleNamespace(score=None)):
        with pytest.raises(ConfigError, match=r"^task 'mytask' has no verifier: expected reward.functions \(TRL-style "
                                              r"reward functions, 'module:function'\) or reward.function$"):
            reward_function(r, task)


def test_run_dir_refuses_a_folder_that_holds_a_run_unless_resuming(tmp_path):
    from credo.train.setup import make_run_dir

    r = Recipe()
    r.run.name = "x"
    run = tmp_path / "out"
    r.run.output_dir = str(run)
    assert make_run_dir(r, 1) == run and (run / "checkpoints").is_dir()
    assert [p.name for p in run.iterdir()] == ["checkpoints"]  # the write probe is gone
    assert make_run_dir(r, 1) == run  # an empty run folder is not a run
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "checkpoints" / "step_3").mkdir()
    with pytest.raises(ConfigError, match=rf"^config key 'run.output_dir' = '{run}' already holds a run \(metrics.jsonl, "
                                          r"step_3\); expected run.resume=auto to continue it, or a new run.output_dir$"):
        make_run_dir(r, 1)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"already holds a run \(step_3\);"):
        make_run_dir(r, 1)
    r.run.resume = "auto"
    assert make_run_dir(r, 1) == run


def test_run_dir_that_cannot_be_made_is_a_config_error(tmp_path):
    from credo.train.setup import make_run_dir

    r = Recipe()
    r.run.name = "x"
    (tmp_path / "file").write_text("")
    r.run.output_dir = str(tmp_path / "file" / "run")
    with pytest.raises(ConfigError, match=rf"^config key 'run.output_dir' = '{tmp_path}/file/run' cannot be written "
                                          r"\(Not a directory\); expected a folder this user can create and write$"):
        make_run_dir(r, 1)


def test_stage_calls_the_named_factory_with_the_context_and_its_settings():
    from credo.train.registry import StageContext, build_stage, resolve, settings_of

    ctx = StageContext(rank=0, world=1, default="the default")
    assert resolve("reward", "default", "stages.reward") is None  # the builder keeps ctx.default
    got = resolve("rollout", "tests.spine.test_stage_registry:factory", "stages.rollout")
    assert build_stage(got, ctx, settings_of(got, {"scale": 2.0}, "stages.rollout_kwargs")) == ("built", ctx, 2.0, "a")
    with pytest.raises(ConfigError, match=r"^config key 'stages.probe' = 'nope' is not a known probe stage"):
        resolve("probe", "nope", "stages.probe")


def test_prepare_policy_without_a_warm_up_is_the_model_itself():
    from credo.models import resolve_model_path
    from credo.train.setup import prepare_policy

    r = Recipe()
    r.sft.steps = 0
    assert prepare_policy(r, None, 0, 1) == (resolve_model_path(r.model.path, r.model.tiny), None)
    assert prepare_policy(r, None, 1, 1) == (None, None)  # only rank 0 decides (then broadcasts it)


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32)).eval()


def test_hf_backend_gets_the_policy_module_and_the_rollout_settings(tiny_model):
    from credo.distributed.rollout import HFBackend
    from credo.train.setup import make_backend

    class Tok:
        pad_token_id, eos_token_id = 0, 1

    r = Recipe()
    r.rollout.hf_max_batch = 5
    engine = types.SimpleNamespace(module=tiny_model)
    b = make_backend(resolve_plan(r), engine, Tok(), policy_path="/unused")
    assert type(b) is HFBackend and b.model is tiny_model and b.max_batch == 5 and b.copy is None
    r.rollout.dtype = "bfloat16"  # the sampler is a bf16 copy of the policy
    b = make_backend(resolve_plan(r), engine, Tok(), policy_path="/unused")
    assert b.copy is not None and b.model is not tiny_model
    assert {p.dtype for p in b.model.parameters()} == {torch.bfloat16}


def test_vllm_backend_gets_every_setting_and_quantises_fp8_weights_at_once(monkeypatch):
    from credo.train.setup import make_backend

    made = []

    class FakeVLLM:
        def __init__(self, path, **kw):
            self.path, self.kw, self.synced = path, kw, []
            made.append(self)

        def sync_weights(self, model, version):
            self.synced.append((model, version))

    monkeypatch.setitem(sys.modules, "credo.distributed.vllm_backend", types.SimpleNamespace(VLLMBackend=FakeVLLM))
    r = Recipe()
    r.rollout.backend, r.rollout.vllm_enforce_eager = "vllm", True
    r.rollout.vllm_kv_cache_gib, r.rollout.vllm_gpu_memory_utilization = 3, 0.45
    r.run.seed, r.model.dtype = 9, "bfloat16"
    engine = types.SimpleNamespace(module="the policy")
    b = make_backend(resolve_plan(r), engine, tokenizer=None, policy_path="/p")
    assert b.kw == dict(dtype="bfloat16", seed=9, kv_cache_gib=3, gpu_memory_utilization=0.45, enforce_eager=True,
                        fp8_weights=False, input_embeddings=None)
    assert b.synced == []  # full-precision weights: nothing to do before step 1
    r.rollout.dtype, r.rollout.fp8_weights = "float16", True
    b = make_backend(resolve_plan(r), engine, tokenizer=None, policy_path="/p")
    assert b.kw["dtype"] == "float16" and b.kw["fp8_weights"] is True
    assert b.synced == [("the policy", 0)]


def test_context_check_names_the_longest_prompt_and_skips_a_model_without_a_limit(tmp_path, monkeypatch):
    from transformers import AutoConfig

    from credo.models import resolve_model_path
    from credo.tasks import Problem
    from credo.train.setup import check_context

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"model.tiny.max_position_embeddings": 8}))
    base = resolve_model_path(r.model.path, r.model.tiny)

    class Task:
        def __init__(self, train, evals):
            self.t, self.e = train, evals

        def __len__(self):
            return len(self.t)

        def train(self, i):
            return Problem(self.t[i], "")

        def eval_problems(self):
            return [Problem(p, "") for p in self.e]

    r.rollout.max_new_tokens = 4
    check_context(r, base, Task(["1+1=", "1+2="], ["2+2="]))  # 4 + 4 tokens fill the context of 8 exactly
    with pytest.raises(ConfigError, match=r"^prompt too long: train problem 1 has 6 tokens \+ rollout.max_new_tokens=4 "
                                          r"> the model's context of 8 tokens"):
        check_context(r, base, Task(["1+1=", "11+11=", "1="], ["1+1="]))
    with pytest.raises(ConfigError, match=r"^prompt too long: eval problem 1 has 6 tokens \+ rollout.max_new_tokens=3 "):
        r.rollout.max_new_tokens = 3
        check_context(r, base, Task(["1+1="], ["1", "11+11=", "1+1=2"]))
    # a model whose config has no max_position_embeddings (or none that loads) is not checked here
    cfg = AutoConfig.from_pretrained(base)
    del cfg.max_position_embeddings
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda path: cfg)
    check_context(r, base, Task(["1" * 50], []))
    monkeypatch.setattr(AutoConfig, "from_pretrained", lambda path: (_ for _ in ()).throw(OSError("no config")))
    check_context(r, base, Task(["1" * 50], []))


def test_context_check_counts_the_chat_template_s_tokens(tmp_path):
    import shutil

    from credo.models import load_tokenizer, resolve_model_path
    from credo.tasks import Problem
    from credo.train.setup import check_context

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"model.tiny.max_position_embeddings": 8}))
    base = tmp_path / "templated"
    shutil.copytree(resolve_model_path(r.model.path, r.model.tiny), base)
    tok = load_tokenizer(str(base))
    tok.chat_template = "{% for m in messages %}({{ m['content'] }}){% endfor %}"  # two tokens around each prompt
    tok.save_pretrained(base)

    class Task:
        def __len__(self):
            return 1

        def train(self, i):
            return Problem("1+1=", "")

        def eval_problems(self):
            return []

    r.rollout.max_new_tokens, r.task.chat_template = 4, "auto"
    # "1+1=" is 4 tokens and would fill the context of 8 exactly; rendered "(1+1=)" it is 6
    with pytest.raises(ConfigError, match=r"^prompt too long: train problem 0 has 6 tokens \+ rollout.max_new_tokens=4 "):
        check_context(r, str(base), Task())
    r.task.chat_template = False
    check_context(r, str(base), Task())


# ------------------------------------------------------------------------------------------------ step gate, env task
class _Parts:
    """Distinct stand-ins for what `_step_gate` hands the gate as it is."""

    def __init__(self):
        self.state = types.SimpleNamespace(components={})
        for name in ("source", "backend", "reward", "scorer", "engine", "tokenizer", "render"):
            setattr(self, name, object())


class _Task:
    def __len__(self):
        return 6

    def train(self, i):
        return f"problem {i}"


def _gate(r, rank=1, world=3):
    """The MIPU family's hooks as the builder asks for them (its section in ctx.section)."""
    from credo.families.mipu import FAMILY
    from credo.families.mipu.gate import hooks
    from credo.train.registry import StageContext

    p = _Parts()
    ctx = StageContext(rank=rank, world=world, recipe=r, tokenizer=p.tokenizer, task=_Task(), backend=p.backend,
                       engine=p.engine, render=p.render, section=FAMILY.settings(r))
    (gate,) = hooks(ctx, p)
    return p, gate


def test_step_gate_hands_every_part_and_setting_to_the_gate():
    r = recipe_class()()
    r.mipu.enabled, r.mipu.val_prompts, r.mipu.val_group_size = True, 3, 5
    r.run.seed, r.rollout.max_new_tokens, r.rollout.temperature, r.rollout.top_p = 4, 6, 0.7, 0.8
    p, gate = _gate(r)
    assert gate.mode == "mipu" and gate.state is p.state and gate.name == "mipu"
    for name in ("source", "backend", "reward", "scorer", "engine", "tokenizer", "render"):
        assert getattr(gate, name) is getattr(p, name), name
    assert gate.val_problems == ["problem 3", "problem 4", "problem 5"]  # the last val_prompts training problems
    assert gate.G == 5  # mipu.val_group_size
    assert (gate.seed, gate.rank, gate.world) == (4, 1, 3)
    assert gate.sampling == dict(max_new_tokens=6, temperature=0.7, top_p=0.8)


def test_random_rollback_gate_and_the_inactive_family():
    from credo.families.mipu import FAMILY

    r = recipe_class()()
    r.mipu.random_rollback = 0.3
    p, gate = _gate(r)
    assert gate.mode == "random" and gate.rollback_prob == 0.3 and gate.val_problems == []
    assert FAMILY.active(r) and FAMILY.holdout(r) == 0
    r.mipu.random_rollback = 0.0
    assert not FAMILY.active(r)  # no hook: the trainer runs no gate
    r.mipu.enabled, r.mipu.val_prompts = True, 5
    assert FAMILY.active(r) and FAMILY.holdout(r) == 5  # held out of the default rollout source


def test_a_stateful_hook_joins_the_trainer_state(tmp_path):
    """build() puts every hook with a state_dict into the trainer state (the MIPU gate's rollback window)."""
    from credo.train.build import build

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"mipu.random_rollback": 0.5}))
    c = build(r)
    try:
        assert [h.name for h in c.hooks] == ["mipu"] and c.state.components["mipu"] is c.hooks[0]
    finally:
        c.source.close()
        c.reward.close()


def _env_recipe(tmp_path, **kw):
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"model.tiny.max_position_embeddings": 64}))
    r.env.id = "credo:GuessNumber-v0"
    for k, v in kw.items():
        setattr(r.env, k, v)
    return r


def test_env_task_checks_the_episode_budget_against_the_context(tmp_path):
    from credo.families.multiturn.task import EnvTask
    from credo.models import load_tokenizer, resolve_model_path
    from credo.tasks.render import prompt_renderer
    from credo.families.multiturn.build import task as env_task
    from credo.families.multiturn.source import turn_format

    r = _env_recipe(tmp_path, max_total_tokens=65)
    with pytest.raises(ConfigError, match=r"^config key 'env.max_total_tokens' = 65 is more than the model's context "
                                          r"of 64 tokens \(max_position_embeddings\)$"):
        env_task(r)
    r.env.max_total_tokens = 64
    task = env_task(r)
    tok = load_tokenizer(resolve_model_path(r.model.path, r.model.tiny))
    prompt_text, observation = turn_format(tok, prompt_renderer(tok, r.task.system_prompt, r.task.chat_template),
                                           r.env.observation_template)
    assert type(task) is EnvTask and task.cfg is r.env and task.eos == tok.eos_token
    assert task.prompt_text("first") == prompt_text("first") == "\nfirst\n"  # no chat template: an observation block
    assert task.observation("seen") == observation("seen") == "\nseen\n"


def test_env_task_of_a_model_whose_tokenizer_does_not_load_is_left_to_the_model_load(tmp_path):
    from transformers import LlamaConfig

    from credo.families.multiturn.build import task as env_task

    model_dir = tmp_path / "model"
    LlamaConfig(max_position_embeddings=32).save_pretrained(model_dir)  # a config, no tokenizer
    r = _env_recipe(tmp_path, max_total_tokens=32)
    r.model.path = str(model_dir)
    task = env_task(r)
    assert (task.cfg, task.eos, task.prompt_text, task.observation) == (r.env, "", None, None)
    r.env.max_total_tokens = 33
    with pytest.raises(ConfigError, match=r"context of 32 tokens"):
        env_task(r)


def test_env_task_of_a_model_whose_config_does_not_load_skips_the_context_check(tmp_path):
    from credo.families.multiturn.build import task as env_task

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{not json")  # neither the config nor a tokenizer loads here
    r = _env_recipe(tmp_path, max_total_tokens=10**6)
    r.model.path = str(model_dir)
    task = env_task(r)  # no context to check against: loading the model reports the broken config
    assert (task.cfg, task.eos, task.prompt_text, task.observation) == (r.env, "", None, None)


def test_a_multi_turn_recipe_builds_the_env_stages_and_an_env_evaluator_with_the_run_s_settings(tmp_path):
    from credo.train.build import build
    from credo.families.multiturn.source import EnvEvaluator, EnvReward, MultiTurnRollout

    r = load_recipe("recipes/multiturn.yaml", tiny_overrides(tmp_path / "run", **{
        "run.steps": 1, "run.eval_every": 1, "run.eval_temperature": 0.7, "run.seed": 3, "env.eval_episodes": 5,
        "rollout.prompts_per_step": 2, "rollout.group_size": 2}))
    c = build(r)
    try:
        # the reward stage comes from stages.reward ('env'), the evaluator plays held-out episodes of the source
        assert type(c.source) is MultiTurnRollout and type(c.reward) is EnvReward
        assert type(c.evaluate) is EnvEvaluator and c.evaluate.source is c.source
        assert (c.evaluate.episodes, c.evaluate.temperature, c.evaluate.seed) == (5, 0.7, 3)
    finally:
        c.source.close()
        c.reward.close()


# ------------------------------------------------------------------------------------------------ critic stage
def test_critic_stage_builds_one_engine_per_critic_with_the_critic_settings(tmp_path):
    from credo.distributed.engine import setup_distributed
    from credo.families.critic.value_model import load_value_model
    from credo.models import load_tokenizer, resolve_model_path
    from credo.families.critic.stage import CriticAdvantage, PolicyKL, critic_stage
    from credo.train.registry import StageContext

    setup_distributed()
    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "rollout.prompts_per_step": 4, "rollout.group_size": 4, "run.seed": 3, "algo.advantage": "gae",
        "algo.advantage_kwargs": "{gamma: 0.9}", "critic.num_critics": 2, "critic.lr": 3e-3,
        "critic.betas": "[0.7, 0.8]", "critic.weight_decay": 0.02, "critic.grad_clip": 0.3, "critic.warmup_steps": 2,
        "critic.critic_only_steps": 1, "critic.value_clip": 0.4, "critic.epochs": 3, "critic.mini_batches": 2,
        "critic.micro_batch_size": 1, "critic.value_agg": "min", "critic.whiten": True, "critic.kl_in_reward": 0.1,
        "critic.low_frac": 0.25, "critic.high_frac": 0.3, "optim.zero_stage": 0, "model.ref_model": True}))
    path = resolve_model_path(r.model.path, r.model.tiny)
    tok = load_tokenizer(path)
    scorer, engine, ref = object(), object(), object()

    def ctx(world):  # what the builder hands the critic family's stage
        return StageContext(rank=0, world=world, recipe=r, tokenizer=tok, engine=engine, scorer=scorer,
                            ref_model=ref, policy_path=path, section=r.critic)

    stage = critic_stage(ctx(2))
    assert type(stage) is CriticAdvantage and len(stage.engines) == 2
    assert stage.gae_kwargs == {"gamma": 0.9} and stage.value_agg == "min" and stage.whiten is True
    assert (stage.kl_in_reward, stage.low_frac, stage.high_frac, stage.value_clip) == (0.1, 0.25, 0.3, 0.4)
    assert (stage.epochs, stage.mini_batches, stage.micro, stage.critic_only_steps) == (3, 2, 1, 1)
    assert (stage.zero_stage, stage.world) == (0, 2)
    assert type(stage.kl) is PolicyKL and (stage.kl.scorer, stage.kl.engine, stage.kl.ref_model) == (scorer, engine, ref)
    # the smallest shard: 4 prompts / 2 ranks x (4 samples / 2 critics) = 4; 2 mini-batches of 2, micro-batches
    # of 1: 2 per optimizer step
    assert stage.grad_accum == 2
    for e in stage.engines:
        assert e.train_micro_batch_size_per_gpu() == 1 and e.gradient_accumulation_steps() == 2
        assert e.gradient_clipping() == 0.3 and e.zero_optimization_stage() == 0
        g = e.optimizer.param_groups[0]
        assert g["initial_lr"] == 3e-3 and g["betas"] == (0.7, 0.8) and g["weight_decay"] == 0.02
        assert [e.lr_scheduler.lr_lambdas[0](s) for s in range(3)] == [0.5, 1.0, 1.0]  # 2 warm-up steps
    # critic m's value head is seeded with run.seed * 1000 + m: the two heads differ
    for m, e in enumerate(stage.engines):
        want = load_value_model(path, dtype="float32", head_seed=3000 + m, actor_tokenizer=tok, actor_path=path)
        assert torch.equal(e.module.value_head.weight, want.value_head.weight)
    r.critic.kl_in_reward = 0.0
    assert critic_stage(ctx(1)).kl is None


def test_a_prompt_too_long_stops_the_build_before_the_run_folder_and_the_warm_up(tmp_path):
    from credo.train.build import build

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "model.tiny.max_position_embeddings": 8, "rollout.max_new_tokens": 5}))
    with pytest.raises(ConfigError, match=r"^prompt too long: eval problem 0 has 4 tokens \+ rollout.max_new_tokens=5 "):
        build(r)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ warm-up, two ranks
def test_prepare_policy_runs_the_warm_up_on_rank_0_then_reuses_it(tmp_path, monkeypatch, caplog):
    import logging

    from credo.models import cache_root, resolve_model_path
    from credo.tasks import make_task
    from credo.sft import sft_cache_key
    from credo.train.setup import prepare_policy

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{"sft.steps": 1, "sft.batch_size": 4}))
    base = resolve_model_path(r.model.path, r.model.tiny)
    path, key = prepare_policy(r, make_task(r.task), 0, 1)
    assert key == sft_cache_key(r, base) and Path(path) == cache_root() / "sft" / key  # one step, cached once
    assert (Path(path) / "COMPLETE").exists() and path != base
    with caplog.at_level(logging.INFO, logger="credo"):
        assert prepare_policy(r, make_task(r.task), 0, 1) == (path, key)
    assert [(rec.name, rec.getMessage()) for rec in caplog.records] == [("credo", f"sft: reusing cached warm-up {path}")]


def test_other_ranks_take_rank_0s_policy_and_run_folder(tmp_path, monkeypatch):
    import torch.distributed as dist

    from credo.train.setup import make_run_dir, prepare_policy

    sent = []

    def broadcast(objects, src):  # what rank 0 holds arrives in every rank's list
        sent.append((list(objects), src))
        objects[:] = ["/policy", "key"] if len(objects) == 2 else [str(tmp_path / "from-rank-0")]

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    r = Recipe()
    r.run.name, r.run.output_dir = "x", str(tmp_path / "mine")
    assert prepare_policy(r, None, 1, 2) == ("/policy", "key")
    assert sent == [([None, None], 0)]
    assert make_run_dir(r, 2) == tmp_path / "from-rank-0" and (tmp_path / "from-rank-0" / "checkpoints").is_dir()
    assert sent[1] == ([str(tmp_path / "mine")], 0)
    sent.clear()
    make_run_dir(r, 1)
    assert sent == []  # one process: nothing to broadcast


def test_env_task_renders_with_the_recipes_chat_template_setting(tmp_path):
    from credo.families.multiturn.build import task as env_task

    r = _env_recipe(tmp_path, max_total_tokens=64)
    r.task.chat_template = True  # the tiny tokenizer has no chat template
    with pytest.raises(ConfigError, match=r"^config key 'task.chat_template' = true but the tokenizer has no chat "
                                          r"template"):
        env_task(r)
