"""The `agent` rollout source: an unmodified agent run through credo's gateway, its captured tokens the batch.

Per step (`rollout(step)`): the step's task rows are drawn as the default source draws problems
(`step_problem_indices(seed, step, len(task), prompts_per_step)`); the agent (`rollout.agent`) runs `group_size`
times on each row (GRPO's group), at most `agent.max_concurrent` at once, each episode with its own API key, against
one `credo.gateway.Gateway` served for the whole run from the run's rollout backend (`backend_sampler`: the tokens
are sampled by the same engine, at the same weights, as the default source's; a sample's policy version is the
trainer step of its weights). The gateway samples at the run's rollout.temperature and top_p (a request that sets
another value is refused: the trainer scores the tokens at them).

Each episode's trajectories (`EpisodeStore.take`: mask 1 = exactly the sampled tokens, 0 = template and tool text)
get the agent's reward on their last turn and any per-turn rewards reported through `POST /credo/reward` on the turn
they name (`credo.gateway.rewards.attach_episode_reward`), i.e. `meta["turn_rewards"]` and `meta["failed"]` as the
multi-turn source writes them: the `agent` reward stage (the sum of turn rewards) with any outcome estimator
(GRPO on the episode rewards), or the multi-turn family's `turn_credit` stage (ReBN, IPA with turns as chunks).
All trajectories of an episode (a drift split, `n > 1`) are in its row's group.

With cluster.engine: ray the run's rollout backend is the Ray pool (`RayRolloutBackend`: the gateway samples through
its `generate`, and `sync` pushes the weights to its workers), and with agent.placement: ray each episode's agent is a
Ray task (`credo.distributed.ray.agents.RayAgentRunner`) calling the gateway, which then listens where the workers can
reach it (`gateway_host`), always behind the run's key.

An agent that raises, hangs past agent.timeout_s or returns no reward fails its own episode (a placeholder sample,
masked out; counted in agent/failures, agent/timeouts); more than agent.max_failure_frac failed episodes in a step
stop the run with `EnvFailureError` naming the agent and the first error.
"""

from __future__ import annotations

import time

import torch

from credo.errors import ConfigError, EnvFailureError
from credo.distributed.rollout import Sample
from credo.families.multiturn.source import EnvReward
from credo.tasks import Problem
from credo.train.batch import Batch
from credo.train.rollout import step_problem_indices

GATEWAY_COUNTERS = ("gateway/requests", "gateway/retokenization_drift", "gateway/forks", "gateway/errors")


class AgentRollout:
    """See the module docstring. `task` is an `AgentTask` (its `row(index, split)`)."""

    def __init__(self, cfg, agent, task, tokenizer, backend, *, seed: int, prompts_per_step: int, group_size: int,
                 temperature: float, top_p: float, max_context: int | None = None, rank: int = 0, world: int = 1,
                 cluster=None, **_):
        from credo.gateway.agents import load_agent

        self.cfg, self.task, self.tokenizer, self.backend = cfg, task, tokenizer, backend
        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.agent_spec = agent
        self.agent_name = agent if isinstance(agent, str) else getattr(agent, "__name__", repr(agent))
        self.seed, self.P, self.G, self.temperature, self.top_p = seed, prompts_per_step, group_size, temperature, top_p
        self.max_context, self.rank, self.world = max_context, rank, world
        self.gateway = None
        self.evaluations = 0
        self.cluster = cluster  # the run's Ray parts (credo.train.cluster.Cluster) with cluster.engine: ray, else None
        self.runner = None  # agent.placement: ray: the RayAgentRunner, made with the gateway
        if cfg.placement == "ray" and cluster is None:
            raise ConfigError("config key 'agent.placement' = 'ray' needs the run's Ray cluster (cluster.engine: ray)")

    # ------------------------------------------------------------------------------------ the gateway
    def serve(self):
        """The run's gateway, started on first use (127.0.0.1, a free port, a random key)."""
        if self.gateway is None:
            import logging

            from credo.families.agent.build import chat_template
            from credo.gateway import Gateway, backend_sampler

            for name in ("httpx", "httpx2"):  # the agents' HTTP clients would log every call at INFO in credo's log
                logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))

            host = "127.0.0.1"
            if self.cfg.placement == "ray":
                from credo.distributed.ray.agents import RayAgentRunner, gateway_host

                self.cluster.check_role("agent")  # against the live cluster, before any agent task is queued
                host = gateway_host(self.cluster.cfg)
                self.runner = self.cluster.track(RayAgentRunner.from_cluster(self.cluster.cfg))
            self.gateway = Gateway(backend_sampler(self.backend), self.tokenizer, model_name=self.cfg.model_name,
                                   max_tokens=self.cfg.max_tokens, max_context=self.max_context,
                                   sampling={"temperature": self.temperature, "top_p": self.top_p},
                                   batch_window_s=self.cfg.batch_window_ms / 1000, host=host,
                                   chat_template=chat_template(self.cfg.chat_template)).start()
        return self.gateway

    def play(self, rows: list[dict], prefix: str, *, temperature: float, top_p: float) -> tuple[list, dict, float]:
        """(EpisodeResult per row, the gateway counters' increments, seconds): one episode per row."""
        from credo.gateway.agents import run_episodes

        gw = self.serve()
        gw.service.sampling = {"temperature": temperature, "top_p": top_p}
        before = dict(gw.store.counters)
        t0 = time.perf_counter()
        run = run_episodes if self.runner is None else self.runner.run
        # on Ray the workers get the entry point (they import it) when the recipe named one, not this process's function
        agent = self.agent if self.runner is None or not isinstance(self.agent_spec, str) else self.agent_spec
        results = run(agent, rows, gw, model=self.cfg.model_name, max_concurrent=self.cfg.max_concurrent,
                      timeout_s=self.cfg.timeout_s, prefix=prefix)
        elapsed = time.perf_counter() - t0
        gw.service.sampling = {"temperature": self.temperature, "top_p": self.top_p}
        return results, {k: gw.store.counters.get(k, 0) - before.get(k, 0) for k in GATEWAY_COUNTERS}, elapsed

    # ------------------------------------------------------------------------------------ the stage
    def rollout(self, step: int) -> Batch:
        P, G = self.P, self.G
        per_rank = P // self.world
        games = list(range(self.rank * per_rank, (self.rank + 1) * per_rank))
        idx = step_problem_indices(self.seed, step, len(self.task), P)
        rows = {j: self.task.row(idx[j], "train") for j in games}
        groups = [j for j in games for _ in range(G)]
        # the episode ids seed the gateway's sampling (credo.gateway.server.call_seeds): a function of (seed, step)
        results, counters, elapsed = self.play([rows[j] for j in groups], f"seed{self.seed}-step{step}-r{self.rank}",
                                               temperature=self.temperature, top_p=self.top_p)
        failed = [r for r in results if r.error is not None]
        if len(failed) > self.cfg.max_failure_frac * len(results):
            raise EnvFailureError(f"agent '{self.agent_name}': {len(failed)} of {len(results)} episodes failed at step "
                                  f"{step} (more than agent.max_failure_frac = {self.cfg.max_failure_frac}); first "
                                  f"error: {failed[0].error}")
        samples, problems, gids = [], [], []
        for res, group in zip(results, groups):
            for s in res.trajectories or [self.placeholder(res)]:
                # the gateway's [start, end) turn spans as the multi-turn source names them (`turns` is a
                # transcript's role-marked turns to the rollout dump)
                s.meta["turn_spans"] = [list(t) for t in s.meta.pop("turns", [])]
                s.meta.update(error=res.error, agent_reward=res.reward, rewards=dict(res.rewards), task=res.task)
                samples.append(s)
                problems.append(Problem(prompt="", answer="", meta={"task": res.task, "episode": res.episode}))
                gids.append(group)
        batch = Batch(samples=samples, problems=problems, group_ids=torch.tensor(gids, device="cpu"), step=step)
        batch.metrics.update(episode_metrics(results, samples, elapsed))
        batch.metrics.update(counters)
        return batch

    def placeholder(self, res) -> Sample:
        """The sample of an episode with no trajectory (its agent failed, or made no call): masked out."""
        return Sample([self.tokenizer.eos_token_id], [], [], [], False, 0,
                      meta={"episode": res.episode, "calls": [], "turn_rewards": [], "failed": True})

    def evaluate_with_metrics(self, n: int, *, temperature: float, seed: int) -> tuple[float, dict[str, float]]:
        """Mean reward of `n` held-out episodes (rows 0..n-1 of the 'eval' split; a failed episode counts 0)."""
        self.evaluations += 1
        rows = [self.task.row(i, "eval") for i in range(n)]
        results, _, _ = self.play(rows, f"seed{self.seed}-eval{self.evaluations}-r{self.rank}",
                                  temperature=temperature, top_p=1.0)
        failures = sum(r.error is not None for r in results)
        return sum(r.reward for r in results) / max(len(results), 1), {"eval/agent_failures": float(failures)}

    def evaluate(self, n: int, *, temperature: float, seed: int) -> float:
        return self.evaluate_with_metrics(n, temperature=temperature, seed=seed)[0]

    def sync(self, model: torch.nn.Module, step: int) -> None:
        self.backend.sync_weights(model, step)

    def state_dict(self) -> dict:
        return {}  # rows and sampling seeds are functions of (seed, step)

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        self.backend.close()


def episode_metrics(results: list, samples: list[Sample], elapsed: float) -> dict[str, float]:
    """agent/*: episodes, failures, timeouts, the mean reward of the kept episodes, trajectories and turns."""
    ok = [r for r in results if r.error is None]
    kept = [s for s in samples if not s.meta["failed"]]
    return {"agent/episodes": len(results), "agent/failures": len(results) - len(ok),
            "agent/timeouts": sum(r.error == "the agent ran past its timeout" for r in results),
            "agent/no_calls": sum(r.error is None and not r.trajectories for r in results),
            "agent/reward_mean": sum(r.reward for r in ok) / len(ok) if ok else float("nan"),
            "agent/trajectories_per_episode": len(kept) / len(ok) if ok else 0.0,
            "agent/turns_mean": sum(len(s.meta["turn_rewards"]) for s in kept) / len(kept) if kept else 0.0,
            "perf/episodes_per_s": len(results) / max(elapsed, 1e-9)}


class AgentEvaluator:
    """`eval/agent_reward`: the mean reward of agent.eval_episodes held-out episodes at run.eval_temperature."""

    metric = "eval/agent_reward"

    def __init__(self, source: AgentRollout, episodes: int, *, temperature: float, seed: int):
        self.source, self.episodes, self.temperature, self.seed = source, episodes, temperature, seed
        self.extra_metrics: dict[str, float] = {}

    def __call__(self) -> float:
        score, self.extra_metrics = self.source.evaluate_with_metrics(self.episodes, temperature=self.temperature,
                                                                      seed=self.seed)
        return score


class AgentReward(EnvReward):
    """The `agent` reward stage: a sample's reward is its trajectory's summed turn rewards (the agent's reward on its
    last turn, reported per-turn rewards on theirs); failed episodes are invalid (no loss, no say in baselines).
    The multi-turn family's `env` stage computes exactly this from the same sample fields."""


def agent_source(ctx, **kwargs) -> AgentRollout:
    """stages.rollout: agent; its settings are rollout.agent and the `agent:` section (ctx.section)."""
    if kwargs:
        raise ConfigError(f"config key 'stages.rollout_kwargs': the agent source takes its settings from rollout.agent "
                          f"and the agent: section, got {sorted(kwargs)}")
    agent = ctx.recipe.rollout.agent
    if not agent:
        raise ConfigError("config key 'stages.rollout' = 'agent' needs rollout.agent: 'pkg.module:run_episode'")
    from credo.models import model_context

    context = model_context(ctx.policy_path) if ctx.policy_path else None
    rollout = {k: v for k, v in ctx.rollout.items() if k in ("prompts_per_step", "group_size", "temperature", "top_p")}
    return AgentRollout(ctx.section, agent, ctx.task, ctx.tokenizer, ctx.backend, seed=ctx.seed, rank=ctx.rank,
                        world=ctx.world, max_context=context, cluster=ctx.cluster, **rollout)


def agent_reward(ctx, **kwargs) -> AgentReward:
    """stages.reward: agent (what the agent returned, and its per-turn reports)."""
    if kwargs:
        raise ConfigError(f"config key 'stages.reward_kwargs': the agent reward takes none, got {sorted(kwargs)}")
    return AgentReward()
