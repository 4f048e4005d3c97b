"""Test-suite wide settings.

HEAVY_FILES: end-to-end files of round 3 (full runs with SIGKILL resumes, Ray and vLLM start-ups, multi-process
runs) that together would take `make test` past CI's 15 minutes on 2 cores. They are marked `heavy` here, so
`make test` skips them and `make test-heavy` runs them; the fast tests of the same features stay in `make test`.
The Ray tests in `make test`: the cluster section, the shop env on env actors, the weight deltas, the collective
weight pushes (a Gloo group; a pool through a kill, a join and a leave), the 3-node placement, the rollout pool
(1, 2 and 4 workers and an elastic pool draw the same tokens, delta == full push, a worker killed mid-call), and in
tests/ray/test_ray_engine.py and test_ray_workers.py the tests not marked heavy there: the quickstart on Ray ==
local (2 steps), the multi-turn recipe with env actors and Gloo pushes == local, a role no node offers, the reward
pool against the local worker, a reward worker killed mid-call, a judge pool with a killed worker, env actors with
a killed worker, a replacement that dies while starting. Heavy: the vLLM worker on Ray, the judges family's
recipe on a Ray judge pool, and 1 against 2 workers end to end.
"""

from __future__ import annotations

import pytest

HEAVY_FILES = (
    "tests/ablate/test_warmup_determinism.py",
    "tests/asynchronous/test_runs.py",
    "tests/complementary/test_train_and_resume.py",
    "tests/e2e/test_data_parallel_tail_batching.py",
    "tests/lora/test_lora_resume.py",
    "tests/lora/test_lora_vllm.py",
    "tests/palette/test_palette_runs.py",
    "tests/palette/test_vllm_prefix.py",
    "tests/polymath/test_resume.py",
    "tests/reliability/test_resume_tail_batching.py",
    "tests/spine/test_eval_saved_model.py",
    "tests/asynchronous/test_overlap.py",
    "tests/asynchronous/test_trajectories.py",
    "tests/invariants/test_packing_update.py",
    "tests/lora/test_lora_train.py",
    "tests/multiturn/shop/test_source.py",
    "tests/ray/test_ray_judges.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(HEAVY_FILES):
            item.add_marker(pytest.mark.heavy)
