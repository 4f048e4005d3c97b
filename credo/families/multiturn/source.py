"""The multi-turn rollout source: many GEM-protocol episodes at once, one batched generate call per turn.

    prompt | turn 0 (model, mask 1) | obs 0 (env, mask 0) | turn 1 (mask 1) | obs 1 (mask 0) | ... | turn K-1

The prompt is the rendered first observation (the recipe's prompt renderer: the chat template if any). A
model turn is what the backend samples, up to and including its EOS (the turn's end), at most
env.max_new_tokens_per_turn tokens; its text without special tokens is the action. The observation that
follows is rendered by the turn format (`observation_renderer`): with a chat template, the template's own
user turn and assistant header; without one, '\\n{observation}\\n'. No observation follows the last turn.
So the chunks of IPA (maximal runs of response mask 1) are exactly the model's turns.

Each turn, every live episode's context is sampled in ONE `backend.generate` call (hf or vllm). Env resets
and steps run in daemon threads with a deadline (env.step_timeout_s): a call that raises or overruns ends its
episode as failed (masked out by the `env` reward stage, counted in env/failures) and nobody waits for it
past the deadline; a hung call is abandoned (a daemon thread cannot block the process's exit). More failures
than env.max_failure_frac of a step's episodes stop the run with `EnvFailureError` naming the env.

Per sample `meta`: turn_rewards, turn_spans (response-index [start, end) of each model turn), chunk_ids (per
response token: the turn index, -1 on observation tokens), terminated, truncated, end ('terminated',
'env_truncated', 'max_turns', 'max_total_tokens', 'failed'), failed, error, env_seed, actions, observations
(the env's reply to each action, the last one included), prefix_actions (expert actions replayed into the
prompt by IPA's initialised resampling, env.init_resample_frac; credo/families/multiturn/resample.py). Env seeds, sampling
seeds and resampling anchors are functions of (run seed, step), so a resumed run replays the same episodes.
"""

from __future__ import annotations

import time

import torch

from credo.errors import ConfigError, EnvFailureError
from credo.distributed.engine import all_reduce_sum
from credo.families.multiturn.envs import make_env
from credo.tasks.render import has_chat_template, plain_prompt
from credo.tasks import Problem
from credo.train.batch import Batch
from credo.families.multiturn.env_metrics import held_out_means
from credo.families.multiturn.episodes import (Episode, call_with_deadline, env_step, episode_stats, model_turn,
                                               reset_episodes)
from credo.families.multiturn.resample import choose_prefixes, expert_actions
from credo.families.multiturn.trajectories import play_trajectories
from credo.train.rollout import step_problem_indices, step_seed

EVAL_SEED_BASE = 10**10
"""Held-out episodes use env seeds EVAL_SEED_BASE + i; training seeds are 31-bit hashes, so never equal."""


def turn_format(tokenizer, render, template: str = "auto"):
    """`(prompt_text, observation)`: the first observation as a problem prompt (before `render`) and the renderer of
    later observations. With a chat template (when `render` applies one), the first observation is the user
    message; without, it is rendered as every other observation block, so each model turn follows the same text."""
    chat = render(Problem(prompt="\x01", answer="")) != "\x01"
    observation = observation_renderer(tokenizer, template if chat or template != "auto" else "\n{observation}\n")
    return (lambda text: text) if chat else observation, observation


def observation_renderer(tokenizer, template: str = "auto"):
    """`fn(observation_text) -> str`: the text that follows a model turn (which ends with the model's EOS).

    'auto' takes the block a chat template puts between an assistant message's end-of-turn token and the next
    assistant header (the user turn holding the observation); a tokenizer without a chat template gets
    '\\n{observation}\\n'.
    """
    if template == "auto":
        if not has_chat_template(tokenizer):
            template = "\n{observation}\n"
        else:
            a, o, eos = "\x01ASSISTANT\x01", "\x01OBSERVATION\x01", tokenizer.eos_token
            msgs = [{"role": "user", "content": "\x01Q\x01"}, {"role": "assistant", "content": a},
                    {"role": "user", "content": o}]
            full = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            at = full.find(a + eos)
            if at < 0 or o not in full[at:]:
                raise ConfigError("config key 'env.observation_template' = 'auto': the chat template does not end an "
                                  f"assistant turn with the EOS token {eos!r}; set a template with '{{observation}}'")
            template = full[at + len(a + eos):].replace("{", "{{").replace("}", "}}").replace(o, "{observation}")
    if not template.format(observation=""):
        raise ConfigError("config key 'env.observation_template' renders an empty observation block: expected at least "
                          "one token between turns (it separates the turns' chunks)")
    return lambda text: template.format(observation=text)


class MultiTurnRollout:
    """Plays `prompts_per_step` env seeds x `group_size` episodes per step (the G episodes of a seed are one
    group, GRPO's), this rank's share of them. See the module docstring for the layout and failure handling."""

    def __init__(self, env_cfg, tokenizer, backend, *, seed: int, prompts_per_step: int, group_size: int,
                 temperature: float, top_p: float, rank: int = 0, world: int = 1, render=plain_prompt,
                 env_factory=None, **_):
        self.cfg, self.tokenizer, self.backend, self.render = env_cfg, tokenizer, backend, render
        self.seed, self.P, self.G, self.temperature, self.top_p = seed, prompts_per_step, group_size, temperature, top_p
        self.rank, self.world = rank, world
        self.env_factory = env_factory or (lambda: make_env(env_cfg.id, **dict(env_cfg.kwargs)))
        self.prompt_text, self.observation = turn_format(tokenizer, render, env_cfg.observation_template)
        self.fallback_prompt = [tokenizer.eos_token_id]
        self.generate_calls = 0

    # ------------------------------------------------------------------------------------ episodes
    def run_episodes(self, env_seeds: list[int], *, temperature: float, top_p: float,
                     sample_seeds: list[int] | None, prefixes: list[list[str]] | None = None,
                     envs: list | None = None) -> tuple[list[Episode], dict]:
        """Play one episode per env seed; `sample_seeds[i]` seeds episode i's sampling (None: greedy).
        `prefixes[i]` (IPA's initialised resampling, credo/families/multiturn/resample.py): actions replayed
        through episode i's env after its reset; they and their observations join the prompt, and the model
        plays on. `envs[i]`: episode i's env (None: a fresh one from the env factory each). Returns the episodes
        and the step's summed statistics (`episode_stats`)."""
        c = self.cfg
        envs = envs if envs is not None else [self.env_factory() for _ in env_seeds]
        eps = [Episode(env=env, env_seed=s, prefix_actions=list(p))
               for env, s, p in zip(envs, env_seeds, prefixes or [[]] * len(env_seeds))]
        first = lambda obs: self.render(Problem(prompt=self.prompt_text(obs), answer=""))
        timeouts = reset_episodes(eps, self.tokenizer, first, self.observation, c)
        if c.trajectory_async:  # no per-turn barrier: each episode advances as its own env step returns
            more, calls = play_trajectories(eps, self.backend, self.tokenizer, c, self.observation,
                                            temperature=temperature, top_p=top_p, sample_seeds=sample_seeds)
            self.generate_calls += calls
            return eps, episode_stats(eps, timeouts + more, resampled=prefixes is not None)
        for turn in range(c.max_turns):
            live = [i for i, e in enumerate(eps) if not e.done]  # a resampled episode ends its turns early
            if not live:
                break
            seeds = None if sample_seeds is None else [step_seed(sample_seeds[i], turn, 0) for i in live]
            self.generate_calls += 1
            acting = model_turn(eps, live, self.backend, self.tokenizer, c, temperature=temperature, top_p=top_p,
                                seeds=seeds)
            timeouts += env_step(eps, acting, self.tokenizer, self.observation, c, turn)
        return eps, episode_stats(eps, timeouts, resampled=prefixes is not None)

    # ------------------------------------------------------------------------------------ the stage
    def rollout(self, step: int) -> Batch:
        P, G = self.P, self.G
        per_rank = P // self.world
        games = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))
        # a game's env seed: the step's game index drawn like PromptRollout's problems, hashed to a 31-bit seed
        idx = step_problem_indices(self.seed, step, 2**31 - 1, P)
        env_seeds = [idx[j] for j in games for _ in range(G)]
        sample_seeds = [step_seed(self.seed, step, 1 + j * G + g) for j in games for g in range(G)]
        t0 = time.perf_counter()
        prefixes = self.resample_prefixes(env_seeds, sample_seeds) if self.cfg.init_resample_frac > 0 else None
        eps, stats = self.run_episodes(env_seeds, temperature=self.temperature, top_p=self.top_p,
                                       sample_seeds=sample_seeds, prefixes=prefixes, envs=self.step_envs(env_seeds))
        elapsed = time.perf_counter() - t0
        tot = all_reduce_sum(torch.tensor(list(stats.values()), dtype=torch.float64, device="cpu")).tolist()
        s = dict(zip(stats, tot))
        n, ok = s["env/episodes"], s["env/episodes"] - s["env/failures"]
        if s["env/failures"] > self.cfg.max_failure_frac * n:
            first = next((e.error for e in eps if e.error), "on another rank")
            raise EnvFailureError(f"env '{self.cfg.id}': {int(s['env/failures'])} of {int(n)} episodes failed at step "
                                  f"{step} (more than env.max_failure_frac = {self.cfg.max_failure_frac}); first error: {first}")
        samples = [e.sample(self.fallback_prompt) for e in eps]
        problems = [Problem(prompt=e.first_observation, answer="", meta={"env_seed": e.env_seed}) for e in eps]
        batch = Batch(samples=samples, problems=problems, group_ids=torch.tensor([j for j in games for _ in range(G)], device="cpu"),
                      step=step)
        batch.metrics.update({
            "env/failures": int(s["env/failures"]), "env/timeouts": int(s["env/timeouts"]),
            "env/return_mean": s["env/return_sum"] / ok if ok else float("nan"),
            "env/turns_mean": s["env/turns_sum"] / n, "env/terminated_frac": s["env/terminated"] / n,
            "env/overflow_frac": s["env/overflow"] / n, "perf/episodes_per_s": len(eps) / max(elapsed, 1e-9)})
        if prefixes is not None:
            batch.metrics.update({"env/resampled_frac": s["env/resampled"] / n,
                                  "env/prefix_turns_mean": s["env/prefix_turns_sum"] / n})
        return batch

    def step_envs(self, env_seeds: list[int]) -> list | None:
        """The envs of a training step's episodes; None: a fresh env per episode (a subclass may prepare them)."""
        return None

    def eval_envs(self, env_seeds: list[int]) -> list | None:
        """The envs of held-out episodes; None: a fresh env per episode."""
        return None

    def resample_prefixes(self, env_seeds: list[int], sample_seeds: list[int]) -> list[list[str]]:
        """The first round(env.init_resample_frac * G) episodes of each game start from an expert prefix."""
        on = round(self.cfg.init_resample_frac * self.G)
        experts = {s: expert_actions(self.env_factory(), s, self.cfg.max_turns) for s in dict.fromkeys(env_seeds)}
        resampled = [i % self.G < on for i in range(len(env_seeds))]
        return choose_prefixes([experts[s] for s in env_seeds], resampled, [step_seed(s, -2, 0) for s in sample_seeds])

    def evaluate(self, n: int, *, temperature: float, seed: int) -> float:
        """Mean return of `n` held-out episodes (env seeds EVAL_SEED_BASE + i, this rank's share), over all ranks."""
        return self.evaluate_with_metrics(n, temperature=temperature, seed=seed)[0]

    def evaluate_with_metrics(self, n: int, *, temperature: float, seed: int) -> tuple[float, dict[str, float]]:
        """`evaluate`'s mean return, and the means of the envs' own episode metrics as `eval/<name>`
        (`env_metrics.held_out_means`; {} for an env that reports none)."""
        mine = list(range(n))[self.rank::self.world]
        greedy = temperature == 0
        seeds = [EVAL_SEED_BASE + i for i in mine]
        eps, _ = self.run_episodes(seeds, temperature=1.0 if greedy else temperature, top_p=1.0,
                                   sample_seeds=None if greedy else [step_seed(seed, -1, i) for i in mine],
                                   envs=self.eval_envs(seeds))
        tot = all_reduce_sum(torch.tensor([sum(sum(e.turn_rewards) for e in eps), float(len(eps))], dtype=torch.float64))
        return float(tot[0] / tot[1]), held_out_means(eps)

    def generate(self, prompts, *, temperature: float, seeds):
        return self.backend.generate(prompts, max_new_tokens=self.cfg.max_new_tokens_per_turn, temperature=temperature,
                                     top_p=1.0, seeds=seeds)

    def sync(self, model: torch.nn.Module, step: int) -> None:
        self.backend.sync_weights(model, step)

    def state_dict(self) -> dict:
        return {}  # env seeds and sampling seeds are functions of (seed, step)

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        self.backend.close()


class EnvEvaluator:
    """`eval/return`: the mean return of env.eval_episodes held-out episodes at run.eval_temperature; in
    `extra_metrics` after each call, the means of the envs' own episode metrics (`eval/<name>`, e.g. the shop's
    eval/shop/success and eval/shop/fail_*; credo/families/multiturn/env_metrics.py)."""

    metric = "eval/return"

    def __init__(self, source: MultiTurnRollout, episodes: int, *, temperature: float, seed: int):
        self.source, self.episodes, self.temperature, self.seed = source, episodes, temperature, seed
        self.extra_metrics: dict[str, float] = {}
        """eval/<name> of the last evaluation (the trainer logs them beside eval/return)."""

    def __call__(self) -> float:
        with_metrics = getattr(self.source, "evaluate_with_metrics", None)
        if with_metrics is None:  # a source that gives the return alone (its own `evaluate`)
            return self.source.evaluate(self.episodes, temperature=self.temperature, seed=self.seed)
        score, self.extra_metrics = with_metrics(self.episodes, temperature=self.temperature, seed=self.seed)
        return score


class EnvReward:
    """The `env` reward stage: a sample's reward is its episode's return (sum of turn rewards); failed episodes
    are invalid (no loss, no say in baselines)."""

    def __call__(self, batch: Batch) -> None:
        batch.rewards = torch.tensor([float(sum(s.meta["turn_rewards"])) for s in batch.samples], device="cpu")
        batch.valid = torch.tensor([not s.meta["failed"] for s in batch.samples], device="cpu")
        batch.metrics["reward/failures"] = 0
        batch.metrics["reward/timeouts"] = 0

    def close(self) -> None:
        pass


def multiturn_source(ctx, **kwargs) -> MultiTurnRollout:
    """stages.rollout: multiturn; its settings are the `env:` section (ctx.section)."""
    if ctx.section is None or not ctx.section.id:
        raise ConfigError("config key 'stages.rollout' = 'multiturn' needs env.id")
    if kwargs:
        raise ConfigError(f"config key 'stages.rollout_kwargs': the multiturn source takes its settings from the env: "
                          f"section, got {sorted(kwargs)}")
    rollout = dict(ctx.rollout)
    factory = ray_env_factory(ctx)
    if factory is not None:  # envs in Ray env actors; otherwise the rollout settings' own factory (default: none)
        rollout["env_factory"] = factory
    return MultiTurnRollout(ctx.section, ctx.tokenizer, ctx.backend, seed=ctx.seed, rank=ctx.rank, world=ctx.world,
                            render=ctx.render, **rollout)


def ray_env_factory(ctx):
    """With cluster.engine: ray and cluster.env.workers >= 1, the envs live in env actors (`RayEnvPool`: env steps
    leave the trainer process; failures and timeouts keep their meaning); None keeps them in this process."""
    cluster = getattr(ctx, "cluster", None)
    if cluster is None or not cluster.cfg.env.workers:
        return None
    import functools

    from credo.distributed.ray.envs import RayEnvPool

    cluster.check_role("env")  # a ConfigError naming the role, before any env actor starts
    e = ctx.section
    pool = RayEnvPool.from_cluster(cluster.cfg, functools.partial(make_env, e.id, **dict(e.kwargs)),
                                   timeout_s=e.step_timeout_s)
    return cluster.track(pool).make_env



def env_reward(ctx, **kwargs) -> EnvReward:
    """stages.reward: env (the episode return)."""
    if kwargs:
        raise ConfigError(f"config key 'stages.reward_kwargs': the env reward takes none, got {sorted(kwargs)}")
    return EnvReward()

