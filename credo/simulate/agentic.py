"""Multi-turn agent episodes: per-episode turn counts and environment latency, and the turn-synchronous
baseline (`agentic_sync`).

An episode of T turns decodes a response, waits for the environment (CPU, off the rollout devices; log-normal
latency, cut at the env timeout), appends the observation and decodes again. Its engine keeps earlier turns in
the prefix cache, so a turn prefills only the new observation tokens. The trained sequence is the whole
trajectory (prompt, responses and observations).

`agentic_sync` is the monolithic, synchronous baseline: every turn is a batch barrier (all live episodes decode,
the batch waits for the longest, then all environments step and the batch waits for the slowest), then reward,
training and weight sync run in turn on the same devices. With `turn_barrier: false` the episodes of a step run at
their own pace (environment-level asynchrony) and only the step waits for its last episode.
"""

from __future__ import annotations

import math
import random

from credo.simulate.engine import Request
from credo.simulate.lengths import draw_responses
from credo.simulate.scenario import AgentSpec
from credo.simulate.sim import SimContext, StepRecord, new_prompt, train_phase


def draw_turns(a: AgentSpec, rng: random.Random) -> int:
    """Turns of one episode: round(lognormal(median, sigma)) clipped to 1..max_turns."""
    return min(a.max_turns, max(1, round(math.exp(math.log(a.turns_median) + a.turns_sigma * rng.gauss(0, 1)))))


def env_latency(a: AgentSpec, rng: random.Random) -> float:
    """Seconds of one environment step: lognormal(median, sigma) cut at env_max_s."""
    return min(a.env_max_s, a.env_latency_s * math.exp(a.env_sigma * rng.gauss(0, 1)))


def run_episode(ctx: SimContext, pid: int, ident, turns: int):
    """One episode at its own pace (a SimPy process); returns (trained tokens after the prompt, oldest version)."""
    env, w = ctx.env, ctx.workload
    a, prompt = w.agent, w.lengths.prompt_len
    context, versions = prompt, []
    for t in range(turns):
        n = draw_responses(w.lengths, ident, 1, ctx.rng)[0]
        req = Request(env, context, n, tag=pid, prefill_tokens=prompt if t == 0 else a.obs_tokens)
        ctx.pool.submit(req)
        yield req.done
        versions.append(req.version)
        context += n
        if t < turns - 1:
            yield env.timeout(env_latency(a, ctx.rng))
            context += a.obs_tokens
    yield env.timeout(ctx.spec.costs.reward_sample_s)  # scored on its own (serverless / a reward worker)
    return context - prompt, min(versions)


def run_agentic_sync(ctx: SimContext):
    """Turn-synchronous episodes, then reward, train and sync (a SimPy process)."""
    env, w = ctx.env, ctx.workload
    a, prompt = w.agent, w.lengths.prompt_len
    for step in range(1, ctx.steps + 1):
        rec = StepRecord(step=step, start=env.now, end=0.0)
        prompts = [new_prompt(ctx) for _ in range(w.prompts_per_step)]
        if not ctx.spec.turn_barrier:
            procs = [env.process(run_episode(ctx, pid, ident, draw_turns(a, ctx.rng))) for pid, ident in prompts
                     for _ in range(w.group_size)]
            done = yield env.all_of(procs)
            rec.rollout_s = env.now - rec.start
            rec.prompt_ids = [pid for pid, _ in prompts]
            yield from train_phase(ctx, rec, [done[p][0] for p in procs], prompt, score=False)
            rec.end = env.now
            ctx.records.append(rec)
            continue
        eps = [{"ident": ident, "turns": draw_turns(a, ctx.rng), "context": prompt} for _, ident in prompts
               for _ in range(w.group_size)]
        turn = 0
        while True:
            live = [e for e in eps if e["turns"] > turn]
            if not live:
                break
            reqs = [Request(env, e["context"], draw_responses(w.lengths, e["ident"], 1, ctx.rng)[0],
                            prefill_tokens=prompt if turn == 0 else a.obs_tokens) for e in live]
            ctx.pool.submit_batch(reqs)
            yield env.all_of([r.done for r in reqs])
            for e, r in zip(live, reqs):
                e["context"] += r.length
            stepping = [e for e in live if e["turns"] > turn + 1]
            if stepping:  # every environment steps in parallel; the batch waits for the slowest
                yield env.timeout(max(env_latency(a, ctx.rng) for _ in stepping))
                for e in stepping:
                    e["context"] += a.obs_tokens
            turn += 1
        rec.rollout_s = env.now - rec.start
        rec.prompt_ids = [pid for pid, _ in prompts]
        yield from train_phase(ctx, rec, [e["context"] - prompt for e in eps], prompt)
        rec.end = env.now
        ctx.records.append(rec)
