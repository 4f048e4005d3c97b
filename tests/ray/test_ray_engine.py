"""The quickstart end to end with `cluster.engine: ray`, on a local Ray with explicit num_cpus and no dashboard
(which the run joins, as `cluster.address: ''` does when Ray is up): rollout on a Ray worker and the verifier on
Ray reward tasks give the local engine's metrics.jsonl, bit for bit, on every key but perf/* and cluster/*; with
per-sample seeds, 1 and 2 rollout workers (full and delta weight pushes) give the same metrics; the multi-turn
recipe with its envs on Ray actors gives the local metrics; cluster/* keys are logged; the workers stop with the
run; a role no node offers is refused before anything starts."""

from __future__ import annotations

import pytest

from credo.config import ConfigError, load_recipe
from tests.e2e.common import read_rows, tiny_overrides
from tests.ray.common import start_local_ray

pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray = start_local_ray(num_cpus=4)
    yield ray
    ray.shutdown()


RAY = {"cluster.engine": "ray", "cluster.rollout.threads": 1, "cluster.reward.workers": 2,
       "cluster.reward.resources": "{CPU: 0.5}", "cluster.rollout.resources": "{CPU: 0.5}",
       "cluster.env.workers": 0, "cluster.judge.workers": 0,
       "cluster.startup_timeout_s": 1800}  # a worker's imports take minutes on a loaded shared 2-core machine


def run(out, **extra) -> list[dict]:
    """A 2-step quickstart with its held-out evaluation at step 2 (the task's own verifier as the reward), its
    metrics.jsonl rows."""
    from credo.trainer import Trainer

    overrides = tiny_overrides(out, **{"reward.function": "null", "run.plot": False, "run.steps": 2,
                                       "run.eval_every": 2, **extra})
    trainer = Trainer(load_recipe("recipes/quickstart.yaml", overrides))
    trainer.fit()
    assert trainer.c.cluster is None or trainer.c.cluster.parts == []  # the Ray workers stopped with the run
    return read_rows(out)


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "cluster/"))} for row in rows]


def test_the_quickstart_on_ray_gives_the_local_metrics_bit_for_bit(tmp_path):
    local = run(tmp_path / "local")
    on_ray = run(tmp_path / "ray", **RAY, **{"cluster.rollout.per_sample_seeds": "false"})
    assert strip(on_ray) == strip(local)
    steps = [row for row in on_ray if "train/loss" in row]
    assert len(steps) == 2 and steps[0]["cluster/connect_s"] > 0
    assert any("eval/accuracy" in row for row in on_ray)  # the held-out evaluation is among the compared keys
    for row in steps:
        assert row["cluster/rollout_workers"] == 1 and row["cluster/worker_restarts"] == 0
        assert row["cluster/rollout_sync_bytes"] == row["cluster/rollout_sync_full_bytes"] > 0
        assert row["cluster/reward_workers"] >= 1  # the verifier ran on Ray tasks
    assert not any(k.startswith("cluster/") for row in local for k in row)


@pytest.mark.heavy  # 33 s at load 5 (2026-12-04): outside CI's budget; `make test-heavy` runs it
def test_one_and_two_rollout_workers_give_the_same_metrics(tmp_path):
    one = run(tmp_path / "one", **RAY, **{"cluster.rollout.workers": 1})
    two = run(tmp_path / "two", **RAY, **{"cluster.rollout.workers": 2, "cluster.sync": "delta"})
    assert strip(two) == strip(one)
    steps = [row for row in two if "train/loss" in row]
    assert all(row["cluster/rollout_workers"] == 2 for row in steps)
    assert all(row["cluster/rollout_sync_bytes"] <= row["cluster/rollout_sync_full_bytes"] for row in steps)


def test_a_role_no_node_offers_is_refused_at_start_up_naming_it(tmp_path):
    """Before the warm-up or any model load: the local Ray the run would start offers no such label."""
    from credo.train.build import check_run

    r = load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path, **{**RAY, "cluster.reward.resources": "{reward_node: 1}"}))
    with pytest.raises(ConfigError, match=r"'cluster.reward.resources'.*role 'reward' cannot be placed"):
        check_run(r)


def test_the_multiturn_recipe_with_its_envs_on_ray_actors_gives_the_local_metrics(tmp_path):
    """The multi-turn family builds its env actors from the recipe (cluster.env), and rollout runs on a Ray worker
    whose weights come by a Gloo broadcast (cluster.sync_transport: gloo): every metric but perf/* and cluster/*
    equals the local run's."""
    from credo.trainer import Trainer

    def go(out, **extra):
        o = {"run.output_dir": out, "run.steps": 2, "run.eval_every": 0, "run.progress": False, "run.plot": False,
             "run.threads": 1, "sft.steps": 5, "rollout.prompts_per_step": 4, "rollout.group_size": 2,
             "env.step_timeout_s": 600, **extra}
        Trainer(load_recipe("recipes/multiturn.yaml", [f"{k}={v}" for k, v in o.items()])).fit()
        return read_rows(out)

    local = go(tmp_path / "local")
    on_ray = go(tmp_path / "ray", **{**RAY, "cluster.env.workers": 2, "cluster.env.resources": "{CPU: 0.25}",
                                     "cluster.rollout.per_sample_seeds": "false", "cluster.sync_transport": "gloo"})
    assert strip(on_ray) == strip(local)
    steps = [row for row in on_ray if "train/loss" in row]
    assert all(row["cluster/env_workers"] == 2 and row["cluster/env_busy_frac"] > 0 for row in steps)
    assert any(row["env/turns_mean"] > 1 for row in steps)  # episodes went on past a first env step on the actors
    assert "cluster/reward_workers" not in steps[0]  # the env's return is the reward: no reward pool was built
    assert sum(row["cluster/rollout_groups_formed"] for row in steps) == 1  # the pushes went by one Gloo group
