"""The `cluster:` section without Ray: field ranges and combinations refused naming the key, YAML through OmegaConf like
the recipe schema, the docs' examples valid, and `check_placement` against node lists shaped like `ray.nodes()`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from credo.config import ConfigError
from credo.distributed.ray.config import ClusterConfig, check_cluster, check_placement, resources_of, role_request

ROOT = Path(__file__).resolve().parents[2]


def load(text: str) -> ClusterConfig:
    """A `cluster:` mapping merged over the schema, as the recipe loader merges a section."""
    import yaml

    data = yaml.safe_load(text)["cluster"]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConfig), data))


def test_the_defaults_are_the_local_engine_and_valid():
    cfg = ClusterConfig()
    assert cfg.engine == "local" and cfg.rollout.workers == 1 and cfg.reward.workers == 4
    assert resources_of(cfg.rollout) == {"CPU": 1}
    # a recipe's mapping replaces the (empty) default instead of merging into it
    assert resources_of(load("cluster: {rollout: {resources: {decode_gpu: 1}}}").rollout) == {"decode_gpu": 1}
    check_cluster(cfg)
    check_cluster(ClusterConfig(engine="ray"))


@pytest.mark.parametrize("text,key", [
    ("cluster: {engine: spark}", "cluster.engine"),
    ("cluster: {address: 'http://x'}", "cluster.address"),
    ("cluster: {sync: sparse}", "cluster.sync"),
    ("cluster: {rollout: {workers: -1}}", "cluster.rollout.workers"),
    ("cluster: {reward: {resources: {CPU: -1}}}", "cluster.reward.resources"),
    ("cluster: {judge: {resources: {GPU: 0}}}", "cluster.judge.resources"),
    ("cluster: {env: {resources: {CPU: true}}}", "cluster.env.resources"),
    ("cluster: {env: {max_concurrency: 0}}", "cluster.env.max_concurrency"),
    ("cluster: {startup_timeout_s: 0}", "cluster.startup_timeout_s"),
])
def test_out_of_range_fields_name_their_key(text, key):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        check_cluster(load(text))


@pytest.mark.parametrize("text,key,words", [
    ("cluster: {engine: ray, rollout: {workers: 0}}", "cluster.rollout.workers", "expected >= 1"),
    ("cluster: {engine: ray, rollout: {workers: 2, elastic: {min: 3, max: 4}}}", "cluster.rollout.elastic",
     "1 <= min <= workers <= max"),
    ("cluster: {engine: ray, rollout: {workers: 5, elastic: {min: 1, max: 4}}}", "cluster.rollout.elastic", "max"),
    ("cluster: {engine: ray, rollout: {elastic: {min: 1}}}", "cluster.rollout.elastic.min", "without elastic.max"),
    ("cluster: {engine: ray, rollout: {workers: 2, per_sample_seeds: false}}", "cluster.rollout.per_sample_seeds",
     "rollout.workers: 1"),
    ("cluster: {engine: ray, rollout: {elastic: {min: 1, max: 2}, per_sample_seeds: false}}",
     "cluster.rollout.per_sample_seeds", "no elastic pool"),
    ("cluster: {engine: ray, rollout: {resources: {gpu: 1}}}", "cluster.rollout.resources", "expected 'GPU'"),
    ("cluster: {engine: ray, sync: delta, sync_transport: nccl, rollout: {resources: {GPU: 1}}}", "cluster.sync",
     "a nccl broadcast sends dense tensors"),
    ("cluster: {engine: ray, sync: delta, sync_transport: gloo}", "cluster.sync", "a gloo broadcast sends dense"),
    ("cluster: {engine: ray, sync_transport: nccl}", "cluster.sync_transport", "needs GPU rollout workers"),
    ("cluster: {engine: ray, sync_transport: mpi}", "cluster.sync_transport", "gloo"),
])
def test_settings_that_cannot_work_together_are_refused(text, key, words):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'") + ".*" + re.escape(words)):
        check_cluster(load(text))


def test_a_local_engine_ignores_the_ray_only_combinations():
    check_cluster(load("cluster: {rollout: {workers: 2, per_sample_seeds: false}}"))


def test_the_docs_cluster_examples_are_valid():
    blocks = re.findall(r"```yaml\n(cluster:.*?)```", (ROOT / "docs" / "cluster.md").read_text(), flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        cfg = load(block)
        check_cluster(cfg)
        assert cfg.engine == "ray"


NODES = [
    {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 8.0, "train": 1.0, "node:10.0.0.1": 1.0}},
    {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 8.0, "decode_gpu": 8.0}},
    {"Alive": False, "Resources": {"CPU": 64.0, "reward_node": 4.0}},
    {"Alive": True, "Resources": {"CPU": 32.0}},
]


def test_placement_names_the_role_no_alive_node_can_host():
    cfg = load("cluster: {engine: ray, rollout: {workers: 4, resources: {decode_gpu: 1, GPU: 1}}, "
               "reward: {resources: {CPU: 2}}, judge: {resources: {GPU: 1, train: 1}}, env: {resources: {CPU: 4}}}")
    check_placement(cfg, NODES)
    cfg.reward.resources = {"reward_node": 1}  # only the dead node offers it
    with pytest.raises(ConfigError, match=r"'cluster.reward.resources'.*role 'reward' cannot be placed"):
        check_placement(cfg, NODES)
    check_placement(cfg, NODES, roles=("rollout", "judge", "env"))  # a run without the reward role
    cfg.reward.resources = {"CPU": 1}
    cfg.judge.resources = {"GPU": 1, "decode_gpu": 1, "train": 1}  # each offered, never on one node
    with pytest.raises(ConfigError, match="role 'judge'"):
        check_placement(cfg, NODES)
    cfg.judge.workers = 0  # a role kept in the trainer is not placed
    check_placement(cfg, NODES)
    with pytest.raises(ConfigError, match="no alive node"):
        check_placement(cfg, [NODES[2]])


def test_role_requests_become_ray_options():
    assert role_request({"CPU": 1}) == {"num_cpus": 1, "num_gpus": 0}
    assert role_request({"GPU": 1, "decode_gpu": 2}) == {"num_cpus": 0, "num_gpus": 1, "resources": {"decode_gpu": 2}}


def test_the_cluster_config_and_the_package_do_not_import_ray():
    code = ("import sys, credo, credo.algos, credo.config, credo.distributed.ray, credo.distributed.ray.config\n"
            "assert 'ray' not in sys.modules, 'ray imported'\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("name", ["ppo_qwen3_4b_ray", "multiturn_qwen3_4b_ray"])
def test_the_paper_scale_ray_recipes_pass_credo_check(name):
    """The GPU recipes on Ray load strictly and pass `credo check` here (placement is noted: it needs the cluster)."""
    import os

    if name.startswith("multiturn"):
        pytest.importorskip("gem")
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", f"recipes/gpu/{name}.yaml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    assert "cluster placement" in p.stdout + p.stderr and "checked against the live cluster" in p.stdout + p.stderr
    if name.startswith("ppo"):  # its weights go by NCCL: a trainer without a GPU is noted, not refused
        import torch

        assert ("sees no CUDA device" in p.stdout + p.stderr) != torch.cuda.is_available()


def test_the_judges_family_checks_its_judge_roles_placement_before_the_run(tmp_path):
    """With cluster.engine: ray the judges family's preflight (run by `credo check` and at the start of `credo run`)
    checks the judge role (its actors), as the core checks rollout and reward: a label no node offers names the role."""
    from credo.config import load_recipe
    from credo.families.judges.build import preflight

    ray_judge = ["cluster.engine=ray", f"run.output_dir={tmp_path}", "cluster.judge.workers=1"]
    with pytest.raises(ConfigError, match=r"'cluster.judge.resources'.*prefill_gpu.*role 'judge' cannot be placed"):
        preflight(load_recipe("recipes/judge_reward.yaml", [*ray_judge, "cluster.judge.resources={prefill_gpu: 1}"]))
    preflight(load_recipe("recipes/judge_reward.yaml", [*ray_judge, "cluster.judge.resources={CPU: 1}"]))
    preflight(load_recipe("recipes/judge_reward.yaml", [*ray_judge[:2], "cluster.judge.workers=0",
                                                        "cluster.judge.resources={prefill_gpu: 1}"]))  # no actors
