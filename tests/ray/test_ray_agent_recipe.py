"""The agent family end to end under cluster.engine: ray (heavy: three trainer runs and a Ray rollout worker): the
gateway fronting the Ray rollout pool with agents in threads, and with agents on Ray tasks (agent.placement: ray),
each gives the local engine's metrics.jsonl on every key but perf/* and cluster/* (as the quickstart on the Ray pool
does, docs/engines.md), with weights pushed to the worker after each update."""

from __future__ import annotations

import pytest

from credo.config import load_recipe
from tests.e2e.common import read_rows
from tests.ray.common import start_local_ray

pytest.importorskip("ray")
pytest.importorskip("openai")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray = start_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


FAST = {"run.steps": 2, "run.eval_every": 2, "run.progress": False, "run.plot": False, "run.threads": 1,
        "sft.enabled": False, "agent.demos": "null", "agent.tasks": "tests.ray.agent_fns:task_row",
        "rollout.agent": "tests.ray.agent_fns:sampled_reward", "rollout.prompts_per_step": 2,
        "rollout.group_size": 2, "agent.eval_episodes": 2, "agent.max_concurrent": 2, "agent.timeout_s": 300,
        "model.tiny.num_layers": 1, "model.tiny.num_heads": 1, "model.tiny.hidden_size": 32, "model.tiny.intermediate_size": 64,
        "optim.lr": 1e-2, "stages.advantage": "default", "stages.advantage_kwargs": "{}", "algo.advantage": "grpo"}
RAY = {"cluster.engine": "ray", "cluster.rollout.threads": 1, "cluster.rollout.per_sample_seeds": "false",
       "cluster.rollout.resources": "{CPU: 0.5}", "cluster.env.workers": 0, "cluster.judge.workers": 0,
       "cluster.startup_timeout_s": 1800}


def run(out, **extra) -> list[dict]:
    from credo.trainer import Trainer

    o = {"run.output_dir": out, **FAST, **extra}
    trainer = Trainer(load_recipe("recipes/gateway_gem.yaml", [f"{k}={v}" for k, v in o.items()]))
    trainer.fit()
    assert trainer.c.cluster is None or trainer.c.cluster.parts == []  # the Ray parts stopped with the run
    return read_rows(out)


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "cluster/"))} for row in rows]


@pytest.mark.heavy  # three trainer runs and a rollout worker's start: a minute or more on the shared 2-core machine
def test_the_agent_family_on_the_ray_pool_with_agents_in_threads_and_on_ray_gives_the_local_metrics(tmp_path):
    local = run(tmp_path / "local")
    threads = run(tmp_path / "ray_threads", **RAY)
    on_ray = run(tmp_path / "ray_agents", **RAY, **{"agent.placement": "ray"})
    steps = [row for row in local if "train/loss" in row]
    assert len(steps) == 2 and all(row["agent/episodes"] == 4 and row["agent/failures"] == 0 for row in steps)
    assert any(row["gateway/requests"] == 12 for row in steps) and "eval/agent_reward" in local[-1]
    assert len({row["train/reward_mean"] for row in steps}) > 1 or steps[0]["train/reward_std"] > 0  # not flat
    assert strip(threads) == strip(local)
    assert strip(on_ray) == strip(local)
    ray_steps = [row for row in on_ray if "train/loss" in row]
    assert all(row["cluster/rollout_workers"] == 1 and row["cluster/rollout_sync_bytes"] > 0 for row in ray_steps)
    assert all(1 <= row["cluster/agent_workers"] <= 2 for row in ray_steps)  # the episodes ran as Ray tasks
    assert not any(k.startswith("cluster/agent") for row in threads for k in row)
