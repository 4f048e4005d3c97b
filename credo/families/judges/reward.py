"""An LLM judge as the reward model: `JudgeReward`, the reward stage `judge` (recipe section `judge:`).

A generative reward model (GRM) reads the question and the policy's response(s) and writes a
critique and a verdict in ``\\boxed{}``; the reward comes from the verdict (pairwise: RM-NLHF,
arXiv 2601.07349; pointwise 0-10: CE-RM, arXiv 2601.20327).

- The judge is a separate model from the policy (its own weights, tokenizer and engine), frozen.
- All of a step's judge prompts (every group of the rank's batch) go to the judge in ONE generate
  call, run on the round-1 `RewardWorker` under `reward.timeout_s`: a call that raises or times out
  masks the step's samples and is counted in `reward/failures` (`reward/timeouts`); only
  `judge.max_consecutive_failures` failed steps in a row stop the run.
- A judgement that does not parse (no box, two verdicts, 11/10, unicode digits ...) masks its sample
  like a failed reward call (pairwise: a sample with no parseable comparison) and is counted in
  `reward/unparseable_frac` (the share of the step's judgements).
- The verdict is parsed from the judge's own continuation only; the policy's text goes into the prompt
  defused (`credo.families.judges.untrusted`). `judge/format_in_answer` is the share of the step's responses
  that contain the verdict format themselves (a box the judge's parser would read as a verdict).
- Pointwise reward: (score - lo) / (hi - lo) in [0, 1]. Pairwise reward: the share of its comparisons
  a response wins; response i meets i+1 .. i+opponents of its group (cyclically) as A, the other as B.
"""

from __future__ import annotations

import time

import torch

from credo.config import ConfigError
from credo.families.judges.parse import parse_pairwise_verdict, parse_pointwise_score
from credo.families.judges.prompts import DEFAULTS, pairwise_prompt, pointwise_prompt
from credo.families.judges.untrusted import contains_verdict
from credo.rewards.worker import RewardFunctionError, RewardWorker
from credo.train.batch import Batch
from credo.train.registry import StageContext


def question_text(problem) -> str:
    """The question a judge sees: the problem's prompt (chat messages joined by their content)."""
    p = problem.prompt
    return p if isinstance(p, str) else "\n".join(str(m.get("content", "")) for m in p)


def own_continuation(prompt_ids: list[int], response_ids: list[int]) -> list[int]:
    """The judge's own tokens: `response_ids` without a leading copy of the whole prompt (a backend that returns
    prompt + continuation would otherwise hand the parser the policy's text)."""
    n = len(prompt_ids)
    return list(response_ids[n:]) if n and list(response_ids[:n]) == list(prompt_ids) else list(response_ids)


def judge_requests(questions: list[str], responses: list[str], *, group_size: int, mode: str, template: str,
                   lo: float = 0, hi: float = 10, opponents: int = 1) -> tuple[list[str], list[tuple[int, ...]]]:
    """The judge prompts of a batch and the sample indices each one judges.

    Args:
        questions, responses: B each, groups of `group_size` consecutive samples.

    Returns:
        (prompts, targets): pointwise one prompt per sample, targets[k] = (i,); pairwise
        B * opponents prompts, targets[k] = (i, j) with i shown as A and j as B.
    """
    B = len(responses)
    if B % group_size:
        raise ValueError(f"responses has {B} entries, expected a multiple of group_size={group_size}")
    if mode == "pointwise":
        return ([pointwise_prompt(q, r, template=template, lo=lo, hi=hi) for q, r in zip(questions, responses)],
                [(i,) for i in range(B)])
    prompts, targets = [], []
    for start in range(0, B, group_size):
        for s in range(1, opponents + 1):
            for k in range(group_size):
                i, j = start + k, start + (k + s) % group_size
                prompts.append(pairwise_prompt(questions[i], responses[i], responses[j], template=template))
                targets.append((i, j))
    return prompts, targets


def judge_rewards(outputs: list[str], targets: list[tuple[int, ...]], n: int, *, mode: str, lo: float = 0,
                  hi: float = 10) -> tuple[list[float], list[bool], int]:
    """Rewards [n], valid [n] and the number of unparseable judgements from the judge's `outputs`.

    Pointwise: reward = (score - lo) / (hi - lo); a sample whose judgement does not parse is invalid.
    Pairwise: each parseable comparison gives its winner 1 and its loser 0; reward = the mean over a
    sample's parseable comparisons; a sample with none is invalid.
    """
    wins, seen, bad = [0.0] * n, [0] * n, 0
    for text, tgt in zip(outputs, targets):
        if mode == "pointwise":
            s = parse_pointwise_score(text, lo, hi)
            if s is None:
                bad += 1
                continue
            wins[tgt[0]] += (s - lo) / (hi - lo)
            seen[tgt[0]] += 1
        else:
            v = parse_pairwise_verdict(text)
            if v is None:
                bad += 1
                continue
            i, j = tgt
            wins[i if v == "A" else j] += 1.0
            seen[i] += 1
            seen[j] += 1
    rewards = [w / c if c else 0.0 for w, c in zip(wins, seen)]
    return rewards, [c > 0 for c in seen], bad


class JudgeReward:
    """Score a batch with a judge model served by `backend` (hf or vllm); see the module docstring.

    Args:
        backend: a rollout backend holding the judge (`generate(prompts, ...) -> list[Sample]`).
        judge_tokenizer: the judge's tokenizer; policy_tokenizer decodes the policy's responses.
        worker: a `RewardWorker` whose function is `self.generate` (timeout, failure isolation).
    """

    def __init__(self, backend, judge_tokenizer, policy_tokenizer, *, group_size: int, mode: str, template: str,
                 max_new_tokens: int, temperature: float, lo: float = 0, hi: float = 10, opponents: int = 1,
                 timeout_s: float = 10.0, max_consecutive_failures: int = 3, seed: int = 0):
        self.backend, self.tok, self.policy_tok = backend, judge_tokenizer, policy_tokenizer
        self.G, self.mode, self.template = group_size, mode, template
        self.max_new_tokens, self.temperature, self.lo, self.hi = max_new_tokens, temperature, lo, hi
        self.opponents, self.seed = opponents, seed
        self.max_consecutive_failures, self.consecutive_failures = max_consecutive_failures, 0
        self.worker = RewardWorker(self.generate, timeout_s=timeout_s, workers=1, max_failure_frac=1.0)
        self.generate_calls = 0

    def generate(self, prompts: list[str], step: int) -> list[str]:
        """One generate call for all `prompts`; greedy at temperature 0."""
        self.generate_calls += 1
        ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        seeds = None if self.temperature == 0 else [self.seed * 1_000_003 + step * 100_003 + i for i in range(len(ids))]
        samples = self.backend.generate(ids, max_new_tokens=self.max_new_tokens, temperature=self.temperature or 1.0,
                                        top_p=1.0, seeds=seeds)
        return self.tok.batch_decode([own_continuation(p, s.response_ids) for p, s in zip(ids, samples)],
                                     skip_special_tokens=True)

    def __call__(self, batch: Batch) -> None:
        responses = self.policy_tok.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=True)
        questions = [question_text(p) for p in batch.problems]
        prompts, targets = judge_requests(questions, responses, group_size=self.G, mode=self.mode,
                                          template=self.template, lo=self.lo, hi=self.hi, opponents=self.opponents)
        t0 = time.perf_counter()
        status, value = self.worker.run_one(prompts, batch.step)
        elapsed = time.perf_counter() - t0
        n, groups = len(responses), len(responses) // self.G
        if status == "ok" and (not isinstance(value, list) or len(value) != len(prompts)):
            raise RewardFunctionError(f"the judge returned {type(value).__name__} of "
                                      f"{len(value) if hasattr(value, '__len__') else '?'} texts for {len(prompts)} prompts")
        if status != "ok":
            self.consecutive_failures += 1
            if self.consecutive_failures >= self.max_consecutive_failures:
                raise RewardFunctionError(f"the judge call failed ({status}) {self.consecutive_failures} steps in a row "
                                          f"(judge.max_consecutive_failures={self.max_consecutive_failures}) at step "
                                          f"{batch.step}; the judge is broken")
            rewards, valid, bad = [0.0] * n, [False] * n, 0
        else:
            self.consecutive_failures = 0
            rewards, valid, bad = judge_rewards(value, targets, n, mode=self.mode, lo=self.lo, hi=self.hi)
        batch.rewards, batch.valid = torch.tensor(rewards), torch.tensor(valid)
        # samples, as FunctionReward counts them (timeouts included in failures)
        batch.metrics["reward/failures"] = n if status != "ok" else 0
        batch.metrics["reward/timeouts"] = n if status == "timeout" else 0
        batch.metrics["reward/unparseable_frac"] = bad / len(prompts) if status == "ok" and prompts else 0.0
        batch.metrics["reward/judge_calls"] = len(prompts)
        batch.metrics["judge/format_in_answer"] = (sum(contains_verdict(r, self.mode, self.lo, self.hi) for r in responses)
                                                   / n if n else 0.0)
        batch.metrics["perf/judge_s"] = elapsed
        batch.metrics["perf/judgements_per_s"] = len(prompts) / elapsed if elapsed > 0 else 0.0

    def close(self) -> None:
        self.worker.close()
        self.backend.close()


def load_judge(ctx: StageContext, path: str, task_name: str = "judge_arithmetic"):
    """(backend, tokenizer, model path) of the judge at `path`, warmed up first on `task_name` when
    judge.warmup_steps > 0."""
    from credo.models import check_vocab, load_causal_lm, load_tokenizer

    j = ctx.section
    if j.warmup_steps:
        path = warm_up_judge(ctx, path, task_name)
    tok = load_tokenizer(path)
    pool = ray_judge_backend(ctx, path)
    if pool is not None:
        return pool, tok, path
    if j.backend == "vllm":
        from credo.distributed.vllm_backend import VLLMBackend

        gpu = torch.cuda.is_available()
        return VLLMBackend(path, dtype="bfloat16" if gpu else "float32", seed=ctx.seed, enforce_eager=not gpu,
                           gpu_memory_utilization=j.vllm_gpu_memory_utilization), tok, path
    from credo.distributed.engine import device
    from credo.distributed.rollout import HFBackend

    model = load_causal_lm(path).to(device()).eval().requires_grad_(False)
    check_vocab(model, tok, path)
    return HFBackend(model, tok), tok, path


def ray_judge_backend(ctx: StageContext, path: str):
    """With cluster.engine: ray and cluster.judge.workers >= 1, the judge (the folder at `path`, after its warm-up)
    on a pool of Ray actors (`RayRolloutBackend`, role 'judge', placed by cluster.judge.resources), logged in
    cluster/judge_* and stopped with the run; None keeps it in this process. The actors sample with per-sample seeds,
    so a judge's texts do not depend on how many actors share a call; greedy judging (judge.temperature: 0, the
    recipes' setting) writes what the local judge writes."""
    cluster = getattr(ctx, "cluster", None)
    if cluster is None or not cluster.cfg.judge.workers:
        return None
    from credo.distributed.ray.config import resources_of
    from credo.distributed.ray.rollout import RayRolloutBackend

    cluster.check_role("judge")  # a ConfigError naming the role, before any judge actor starts
    j, kw = ctx.section, {}
    if j.backend == "vllm":  # as the local vllm judge: bf16 and CUDA graphs on a GPU, fp32 and eager on a CPU
        gpu = "GPU" in resources_of(cluster.cfg.judge)
        kw = dict(model_dtype="bfloat16" if gpu else "float32",
                  vllm_kwargs=dict(seed=ctx.seed, enforce_eager=not gpu,
                                   gpu_memory_utilization=j.vllm_gpu_memory_utilization))
    return cluster.track(RayRolloutBackend.from_cluster(cluster.cfg, path, role="judge", engine=j.backend, **kw))


def judge_warmup_recipe(j, t, task_name: str = "judge_arithmetic"):
    """The SFT recipe that warms the judge `j` (a JudgeConfig) up on a judging task built from the policy's
    arithmetic task config `t`: `judge_arithmetic` (one-turn, judge.mode and judge.template) or
    `ce_rm_arithmetic` (CE-RM's two turns, whose formats are fixed)."""
    from credo.config import ModelConfig, Recipe, SFTConfig, TaskConfig

    kw = {k: v for k, v in t.kwargs.items() if k in ("max_operand", "ops", "fixed_width")}
    if task_name == "judge_arithmetic":
        kw.update(mode=j.mode, template=j.template)
    kw.update(j.warmup_kwargs)
    r = Recipe()
    r.run.name = "judge-warmup"
    r.model = ModelConfig(path=j.path, tiny=j.tiny)
    r.task = TaskConfig(name=task_name, train_size=t.train_size, eval_size=t.eval_size, seed=t.seed,
                        kwargs=kw, chat_template=False)
    r.sft = SFTConfig(enabled=True, steps=j.warmup_steps, batch_size=j.warmup_batch_size, lr=j.warmup_lr,
                      seed=j.warmup_seed)
    return r


def warm_up_judge(ctx: StageContext, base_path: str, task_name: str = "judge_arithmetic") -> str:
    """SFT of the judge on a synthetic judging task of the policy's arithmetic task (`judge_warmup_recipe`,
    cached by `run_sft`)."""
    import logging

    from credo.tasks import make_task
    from credo.sft import run_sft

    r = judge_warmup_recipe(ctx.section, ctx.task_config, task_name)
    path, _ = run_sft(r, base_path, make_task(r.task), log=lambda m: logging.getLogger("credo").info("judge " + m))
    return path


def check_judge_context(tok, model_path: str, ctx: StageContext, template: str) -> None:
    """Judge prompt (longest of the first train problems, empty response) + the policy's max_new_tokens (one judge
    token per policy token, as with a shared tokenizer) + judge.max_new_tokens must fit the judge's context."""
    from transformers import AutoConfig

    try:
        limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    except (OSError, ValueError):
        return
    if limit is None:
        return
    j, n_resp = ctx.section, ctx.rollout["max_new_tokens"]
    questions = [question_text(ctx.task.train(i)) for i in range(min(len(ctx.task), 500))]
    prompts, _ = judge_requests(questions, [""] * len(questions), group_size=1 if j.mode == "pointwise" else
                                len(questions), mode=j.mode, template=template, lo=j.score_range[0],
                                hi=j.score_range[1], opponents=1)
    longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    need = longest + n_resp * (2 if j.mode == "pairwise" else 1) + j.max_new_tokens
    if need > limit:
        raise ConfigError(f"judge context too short: a judge prompt of {longest} tokens + the response(s) "
                          f"(rollout.max_new_tokens={n_resp}) + judge.max_new_tokens={j.max_new_tokens} = {need} > the "
                          f"judge's context of {limit} tokens; shorten judge.template or judge.max_new_tokens")


def judge_stage(ctx: StageContext) -> JudgeReward:
    """The `judge:` section's judge as the reward model."""
    j = ctx.section
    template = j.template or DEFAULTS[j.mode]
    from credo.models import load_tokenizer, resolve_model_path

    base = resolve_model_path(j.path, j.tiny)
    check_judge_context(load_tokenizer(base), base, ctx, template)  # before the warm-up and the model load
    backend, tok, _ = load_judge(ctx, base)
    iso = ctx.reward_isolation
    return JudgeReward(backend, tok, ctx.tokenizer, group_size=ctx.rollout["group_size"], mode=j.mode,
                       template=template, max_new_tokens=j.max_new_tokens, temperature=j.temperature,
                       lo=j.score_range[0], hi=j.score_range[1], opponents=j.opponents,
                       timeout_s=iso["timeout_s"], max_consecutive_failures=j.max_consecutive_failures, seed=ctx.seed)
