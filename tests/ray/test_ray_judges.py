"""The judges family on Ray: with cluster.engine: ray and judge workers, the `judge` reward stage builds its judge as a
pool of Ray actors from the recipe's cluster.judge (through the run's Cluster, as the multi-turn family builds its env
actors), and scores a batch exactly as the in-process judge does: the same judge texts, rewards, valid mask and
reward metrics. The judge is a tiny model warmed up for a few steps on the judging task, so that it writes
parseable, varying verdicts (a random one writes none, which would make equal scores mean nothing)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from credo.config import JudgeConfig, TaskConfig, TinyModelConfig
from credo.distributed.ray.config import ClusterConfig, RoleConfig
from credo.distributed.rollout import HFBackend, Sample
from credo.families.judges.reward import judge_stage
from credo.models import load_tokenizer, resolve_model_path
from credo.tasks import make_task
from credo.train.batch import Batch
from credo.train.registry import StageContext
from tests.ray.common import start_local_ray
from tests.fakes import recipe_with

pytest.importorskip("ray")

TINY = TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       tie_word_embeddings=False, seed=1)
TASK = TaskConfig(name="arithmetic", train_size=200, eval_size=8, seed=0,
                  kwargs={"max_operand": 49, "ops": "+", "fixed_width": True})


@pytest.fixture(scope="module")
def ray_local():
    ray = start_local_ray(num_cpus=4)
    yield ray
    ray.shutdown()


def context(tmp_path, cluster=None) -> StageContext:
    judge = JudgeConfig(path="tiny", tiny=TINY, mode="pointwise", template="{question}{response}?", max_new_tokens=12,
                        temperature=0.0, warmup_steps=120, warmup_batch_size=64, warmup_lr=3e-3,
                        warmup_kwargs={"wrong_frac": 0.5})
    tok = load_tokenizer(str(resolve_model_path("tiny", TINY)))
    recipe = recipe_with(run={"seed": 3}, rollout={"group_size": 2, "max_new_tokens": 4},
                         reward={"timeout_s": 600.0, "workers": 1, "max_failure_frac": 1.0})
    recipe.task = TASK  # the judging task's config, as the builder's recipe holds it
    return StageContext(rank=0, world=1, recipe=recipe, tokenizer=tok, task=make_task(TASK), section=judge,
                        cluster=cluster)


def batch_of(ctx: StageContext, n: int = 32) -> Batch:
    """n problems of the task, each answered right by one sample of its group and wrong by the other (a wrong digit,
    or the right sum with a stray '.', the defects the judge is warmed up on)."""
    problems, responses = [], []
    for i in range(n // 2):
        p = ctx.task.train(i)
        problems += [p, p]
        responses += [p.answer, p.answer + "." if i % 2 else str(int(p.answer) + 1 + i % 9).zfill(len(p.answer))]
    ids = [ctx.tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    samples = [Sample([1], r, [1] * len(r), [0.0] * len(r), True) for r in ids]
    return Batch(samples=samples, problems=problems, group_ids=torch.arange(n) // 2, step=4)


def scored(stage, batch: Batch):
    stage(batch)
    return batch.rewards.tolist(), batch.valid.tolist(), {k: v for k, v in batch.metrics.items()
                                                          if not k.startswith("perf/")}


def test_the_judge_stage_on_a_ray_judge_pool_scores_like_the_local_judge(ray_local, tmp_path, monkeypatch):
    from credo.distributed.ray.rollout import RayRolloutBackend
    from credo.train.cluster import Cluster

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path / "cache"))  # the warm-up is cached there, shared by both stages
    local_ctx = context(tmp_path)
    local = judge_stage(local_ctx)
    assert isinstance(local.backend, HFBackend)
    cfg = ClusterConfig(engine="ray", judge=RoleConfig(workers=2, resources={"CPU": 0.5}, max_restarts=0),
                        startup_timeout_s=600)
    cluster = Cluster(cfg, connect_s=0.0, started_ray=False)
    on_ray = judge_stage(dataclasses.replace(local_ctx, cluster=cluster))
    try:
        assert isinstance(on_ray.backend, RayRolloutBackend) and on_ray.backend.role == "judge"
        assert cluster.parts == [on_ray.backend] and len(on_ray.backend.active) == 2

        batch = batch_of(local_ctx)
        want = scored(local, batch_of(local_ctx))
        got = scored(on_ray, batch)
        assert got == want
        rewards, valid, metrics = want
        assert sum(valid) >= len(valid) // 2 and len(set(r for r, v in zip(rewards, valid) if v)) > 1  # real verdicts
        assert metrics["reward/judge_calls"] == 32 and metrics["reward/failures"] == 0

        m = cluster.metrics()
        assert m["cluster/judge_workers"] == 2 and m["cluster/judge_busy_frac"] > 0
        assert m["cluster/worker_restarts"] == 0
    finally:
        local.close()
        cluster.close()
    assert on_ray.backend.active == [] and cluster.parts == []
