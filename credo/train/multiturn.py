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
prompt by IPA's initialised resampling, env.init_resample_frac; credo/train/resample.py). Env seeds, sampling
seeds and resampling anchors are functions of (run seed, step), so a resumed run replays the same episodes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from credo.config import ConfigError
from credo.distributed.engine import all_reduce_sum
from credo.distributed.rollout import Sample
from credo.envs import make_env
from credo.rewards.chat import has_chat_template, plain_prompt
from credo.rewards.tasks import Problem
from credo.train.batch import Batch
from credo.train.registry import register_stage
from credo.train.resample import choose_prefixes, expert_actions
from credo.train.rollout import step_problem_indices, step_seed

EVAL_SEED_BASE = 10**10
"""Held-out episodes use env seeds EVAL_SEED_BASE + i; training seeds are 31-bit hashes, so never equal."""


class EnvFailureError(RuntimeError):
    """Too many of a step's episodes failed (an env raised or hung)."""


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


def call_with_deadline(calls: list, timeout_s: float) -> list[tuple[str, object]]:
    """Run `calls` (zero-argument callables) in daemon threads; each result is ('ok', value), ('error', exc)
    or ('timeout', None) when it has not returned `timeout_s` after the start."""
    out: list = [("timeout", None)] * len(calls)

    def run(i, fn):
        try:
            out[i] = ("ok", fn())
        except BaseException as e:  # noqa: BLE001 - any env error ends only its episode
            out[i] = ("error", e)

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [out[i] if not t.is_alive() else ("timeout", None) for i, t in enumerate(threads)]


@dataclass
class Episode:
    env: object
    env_seed: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    chunk_ids: list[int] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    first_observation: str = ""
    prefix_actions: list[str] = field(default_factory=list)
    version: int = 0
    end: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.end is not None

    def sample(self, fallback_prompt: list[int]) -> Sample:
        meta = {"turn_rewards": self.turn_rewards, "turn_spans": self.turn_spans, "chunk_ids": self.chunk_ids,
                "terminated": self.end == "terminated", "truncated": self.end not in ("terminated", "failed"),
                "end": self.end, "failed": self.end == "failed", "error": self.error, "env_seed": self.env_seed,
                "actions": self.actions, "observations": self.observations, "prefix_actions": self.prefix_actions}
        return Sample(self.prompt_ids or list(fallback_prompt), self.response_ids, self.response_mask, self.log_probs,
                      finished=self.end == "terminated", policy_version=self.version, meta=meta)


def _text(obs, info) -> str:
    """An observation as the model reads it: GEM keeps the board / next-move prompt in info['suffix']."""
    suffix = info.get("suffix") if isinstance(info, dict) else None
    return f"{obs}\n{suffix}" if suffix else str(obs)


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
                     sample_seeds: list[int] | None, prefixes: list[list[str]] | None = None
                     ) -> tuple[list[Episode], dict]:
        """Play one episode per env seed; `sample_seeds[i]` seeds episode i's sampling (None: greedy).
        `prefixes[i]` (IPA's initialised resampling, credo/train/resample.py): actions replayed through episode
        i's env after its reset; they and their observations join the prompt, and the model plays on."""
        c, tok = self.cfg, self.tokenizer
        eps = [Episode(env=self.env_factory(), env_seed=s, prefix_actions=list(p))
               for s, p in zip(env_seeds, prefixes or [[]] * len(env_seeds))]
        timeouts = 0
        # resets one after another: GEM's reset seeds the global `random`, so parallel resets would race
        for e in eps:
            (status, res), = call_with_deadline([lambda e=e: e.env.reset(seed=e.env_seed)], c.step_timeout_s)
            timeouts += status == "timeout"
            if status != "ok":
                e.end, e.error = "failed", f"reset: {status} {res!r}"
                continue
            e.first_observation = _text(*res)
            e.prompt_ids = tok(self.render(Problem(prompt=self.prompt_text(e.first_observation), answer="")),
                               add_special_tokens=False)["input_ids"]
            if e.prefix_actions:
                ok, overran = self._replay(e)
                timeouts += overran
                if not ok:
                    continue
            if len(e.prompt_ids) + 1 > c.max_total_tokens:
                e.end = "max_total_tokens"
        for turn in range(c.max_turns):
            live = [i for i, e in enumerate(eps) if not e.done]  # a resampled episode ends its turns early
            if not live:
                break
            contexts = [eps[i].prompt_ids + eps[i].response_ids for i in live]
            seeds = None if sample_seeds is None else [step_seed(sample_seeds[i], turn, 0) for i in live]
            self.generate_calls += 1
            outs = self.backend.generate(contexts, max_new_tokens=c.max_new_tokens_per_turn, temperature=temperature,
                                         top_p=top_p, seeds=seeds)
            acting = []
            for i, ctx, o in zip(live, contexts, outs):
                e = eps[i]
                room = c.max_total_tokens - len(ctx)
                ids, lps = list(o.response_ids)[:room], list(o.rollout_log_probs)[:room]
                start = len(e.response_ids)
                e.response_ids += ids
                e.response_mask += [1] * len(ids)
                e.log_probs += lps + [0.0] * (len(ids) - len(lps))
                e.chunk_ids += [len(e.turn_spans)] * len(ids)
                e.turn_spans.append([start, start + len(ids)])
                e.version = o.policy_version
                e.actions.append(tok.decode(ids, skip_special_tokens=True))
                if len(o.response_ids) > room:  # the turn did not fit: cut, no env step
                    e.turn_rewards.append(0.0)
                    e.end = "max_total_tokens"
                else:
                    acting.append(i)
            results = call_with_deadline([lambda e=eps[i]: e.env.step(e.actions[-1]) for i in acting], c.step_timeout_s)
            for i, (status, res) in zip(acting, results):
                e = eps[i]
                timeouts += status == "timeout"
                if status != "ok":
                    e.turn_rewards.append(0.0)
                    e.end, e.error = "failed", f"step {turn}: {status} {res!r}"
                    continue
                obs, reward, terminated, truncated, info = res
                e.turn_rewards.append(float(reward))
                e.observations.append(_text(obs, info))
                if terminated:
                    e.end = "terminated"
                elif truncated:
                    e.end = "env_truncated"
                elif len(e.prefix_actions) + len(e.turn_spans) >= c.max_turns:
                    e.end = "max_turns"
                else:
                    ids = tok(self.observation(e.observations[-1]), add_special_tokens=False)["input_ids"]
                    # the next turn needs room for at least one token after the observation
                    if len(e.prompt_ids) + len(e.response_ids) + len(ids) + 1 > c.max_total_tokens:
                        e.end = "max_total_tokens"
                        continue
                    e.response_ids += ids
                    e.response_mask += [0] * len(ids)
                    e.log_probs += [0.0] * len(ids)
                    e.chunk_ids += [-1] * len(ids)
        n = len(eps)
        failures = sum(e.end == "failed" for e in eps)
        stats = {"env/episodes": float(n), "env/failures": float(failures), "env/timeouts": float(timeouts),
                 "env/return_sum": sum(sum(e.turn_rewards) for e in eps if e.end != "failed"),
                 "env/turns_sum": float(sum(len(e.turn_spans) for e in eps)),
                 "env/terminated": float(sum(e.end == "terminated" for e in eps)),
                 "env/overflow": float(sum(e.end == "max_total_tokens" for e in eps))}
        if prefixes is not None:
            stats["env/resampled"] = float(sum(bool(e.prefix_actions) for e in eps))
            stats["env/prefix_turns_sum"] = float(sum(len(e.prefix_actions) for e in eps))
        return eps, stats

    def _replay(self, e: Episode) -> tuple[bool, int]:
        """Step episode `e`'s env through its prefix actions, appending each action (+ EOS) and observation to its
        prompt. (ok, timeouts): not ok (the episode ended as failed) when the env fails or the prefix ends the game."""
        tok = self.tokenizer
        for k, action in enumerate(e.prefix_actions):
            (status, res), = call_with_deadline([lambda a=action: e.env.step(a)], self.cfg.step_timeout_s)
            if status != "ok":
                e.end, e.error = "failed", f"prefix step {k}: {status} {res!r}"
                return False, int(status == "timeout")
            obs, _, terminated, truncated, info = res
            if terminated or truncated:  # an expert prefix stops before the expert's last turn: not expected
                e.end, e.error = "failed", f"prefix step {k}: the game ended during the replayed prefix"
                return False, 0
            e.prompt_ids = e.prompt_ids + tok(action, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] \
                + tok(self.observation(_text(obs, info)), add_special_tokens=False)["input_ids"]
        return True, 0

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
                                       sample_seeds=sample_seeds, prefixes=prefixes)
        elapsed = time.perf_counter() - t0
        tot = all_reduce_sum(torch.tensor(list(stats.values()), dtype=torch.float64)).tolist()
        s = dict(zip(stats, tot))
        n, ok = s["env/episodes"], s["env/episodes"] - s["env/failures"]
        if s["env/failures"] > self.cfg.max_failure_frac * n:
            first = next((e.error for e in eps if e.error), "on another rank")
            raise EnvFailureError(f"env '{self.cfg.id}': {int(s['env/failures'])} of {int(n)} episodes failed at step "
                                  f"{step} (more than env.max_failure_frac = {self.cfg.max_failure_frac}); first error: {first}")
        samples = [e.sample(self.fallback_prompt) for e in eps]
        problems = [Problem(prompt=e.first_observation, answer="", meta={"env_seed": e.env_seed}) for e in eps]
        batch = Batch(samples=samples, problems=problems, group_ids=torch.tensor([j for j in games for _ in range(G)]),
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

    def resample_prefixes(self, env_seeds: list[int], sample_seeds: list[int]) -> list[list[str]]:
        """The first round(env.init_resample_frac * G) episodes of each game start from an expert prefix."""
        on = round(self.cfg.init_resample_frac * self.G)
        experts = {s: expert_actions(self.env_factory(), s, self.cfg.max_turns) for s in dict.fromkeys(env_seeds)}
        resampled = [i % self.G < on for i in range(len(env_seeds))]
        return choose_prefixes([experts[s] for s in env_seeds], resampled, [step_seed(s, -2, 0) for s in sample_seeds])

    def evaluate(self, n: int, *, temperature: float, seed: int) -> float:
        """Mean return of `n` held-out episodes (env seeds EVAL_SEED_BASE + i, this rank's share), over all ranks."""
        mine = list(range(n))[self.rank::self.world]
        greedy = temperature == 0
        eps, _ = self.run_episodes([EVAL_SEED_BASE + i for i in mine], temperature=1.0 if greedy else temperature,
                                   top_p=1.0, sample_seeds=None if greedy else [step_seed(seed, -1, i) for i in mine])
        tot = all_reduce_sum(torch.tensor([sum(sum(e.turn_rewards) for e in eps), float(len(eps))], dtype=torch.float64))
        return float(tot[0] / tot[1])

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
    """`eval/return`: the mean return of env.eval_episodes held-out episodes at run.eval_temperature."""

    metric = "eval/return"

    def __init__(self, source: MultiTurnRollout, episodes: int, *, temperature: float, seed: int):
        self.source, self.episodes, self.temperature, self.seed = source, episodes, temperature, seed

    def __call__(self) -> float:
        return self.source.evaluate(self.episodes, temperature=self.temperature, seed=self.seed)


class EnvReward:
    """The `env` reward stage: a sample's reward is its episode's return (sum of turn rewards); failed episodes
    are invalid (no loss, no say in baselines)."""

    def __call__(self, batch: Batch) -> None:
        batch.rewards = torch.tensor([float(sum(s.meta["turn_rewards"])) for s in batch.samples])
        batch.valid = torch.tensor([not s.meta["failed"] for s in batch.samples])
        batch.metrics["reward/failures"] = 0
        batch.metrics["reward/timeouts"] = 0

    def close(self) -> None:
        pass


def multiturn_source(ctx, **kwargs) -> MultiTurnRollout:
    if ctx.env is None or not ctx.env.id:
        raise ConfigError("config key 'stages.rollout' = 'multiturn' needs env.id")
    if kwargs:
        raise ConfigError(f"config key 'stages.rollout_kwargs': the multiturn source takes its settings from the env: "
                          f"section, got {sorted(kwargs)}")
    return MultiTurnRollout(ctx.env, ctx.tokenizer, ctx.backend, seed=ctx.seed, rank=ctx.rank, world=ctx.world,
                            render=ctx.render, **ctx.rollout)


multiturn_source = register_stage("rollout", "multiturn")(multiturn_source)


def env_reward(ctx, **kwargs) -> EnvReward:
    if kwargs:
        raise ConfigError(f"config key 'stages.reward_kwargs': the env reward takes none, got {sorted(kwargs)}")
    return EnvReward()


env_reward = register_stage("reward", "env")(env_reward)
