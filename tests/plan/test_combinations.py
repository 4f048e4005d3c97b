"""Every combination of features either trains or is refused by `credo check` (issue 51). The matrix is generated
from the tables (benchmarks/combinations.py): family recipes (and the teacher's placements) x schedules x {hf, vllm,
vllm async} x {local, Ray} x packing x training engine x truncation x pi_old.
Here: of the three combinations that used to pass `credo check` and crash at step 1, one is refused by it naming
both keys and two are accepted (the Ray pool gained what they need);
a pairwise cover of the matrix goes through the plan's checks (the whole matrix is a heavy test); four accepted cells train
(heavy)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("combinations", REPO / "benchmarks" / "combinations.py")
comb = importlib.util.module_from_spec(_spec)
sys.modules["combinations"] = comb
_spec.loader.exec_module(comb)


@pytest.mark.parametrize("recipe,overrides,keys", [
    ("palette", ["rollout.tail_batching={}"], ("rollout.tail_batching", "stages.rollout' = 'palette")),
    ("palette", ["stages.schedule=tail_batching"], ("stages.schedule", "stages.rollout' = 'palette")),
])
def test_a_combination_that_crashed_at_step_1_is_refused_by_check(recipe, overrides, keys, capsys, tmp_path):
    """It passed `credo check` before and failed after its warm-up (palette's took 13 minutes); now `credo check`
    exits 2 with one line naming both keys (the palette source draws its own latents, so it cannot hand a schedule
    the prompts to race)."""
    from credo.cli import main

    rc = main(["check", f"recipes/{recipe}.yaml", *overrides, f"run.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = [x for x in err.splitlines() if x.startswith("credo: config error:")]
    assert len(line) == 1 and "config keys" in line[0] and all(k in line[0] for k in keys), err


@pytest.mark.parametrize("cell", [comb.Cell("palette", "sync", "hf", "ray", False),
                                  comb.Cell("quickstart", "tail_batching", "hf", "ray", False),
                                  comb.Cell("quickstart", "tail_batching", "vllm", "ray", True)],
                         ids=lambda c: "-".join(map(str, comb.astuple(c))))
def test_the_other_two_are_accepted_now_that_the_ray_pool_races_and_carries_soft_prompts(cell):
    """palette on Ray and tail batching on Ray crashed at step 1; the Ray pool now provides `prompt_embeds` and
    `race` (tests/ray/test_ray_rollout.py checks both against the in-process backend; the cells train in the matrix
    and in the heavy test below)."""
    assert comb.plan_cell(cell) == ("accepted", "")


@pytest.mark.parametrize("cell", comb.covering(comb.cells()), ids=comb.name)
def test_each_cell_of_a_pairwise_cover_is_accepted_or_refused_naming_both_keys(cell):
    """Every pair of values of two factors (recipe x schedule, backend x training engine, ...) is in one cell here;
    the whole matrix (8,064 cells) is the heavy test below."""
    status, message = comb.plan_cell(cell)
    assert status == "accepted" or comb.names_both_keys(message), message


@pytest.mark.heavy
def test_the_whole_matrix_is_accepted_or_refused_naming_both_keys():
    bad = [(c, m) for c in comb.cells() for s, m in [comb.plan_cell(c)] if s != "accepted" and not comb.names_both_keys(m)]
    assert not bad, bad[:5]


def test_the_covering_set_covers_every_pair_of_the_accepted_cells():
    cells = [c for c in comb.cells() if c.recipe in ("quickstart", "palette")]
    accepted = [c for c in cells if not (c.recipe == "palette" and c.schedule != "sync")]
    chosen = comb.covering(accepted)
    pairs = lambda c: {(a, b) for a, b in __import__("itertools").combinations(enumerate(comb.astuple(c)), 2)}  # noqa: E731
    assert set().union(*map(pairs, accepted)) == set().union(*map(pairs, chosen))
    assert len(chosen) < len(accepted)


@pytest.mark.heavy  # 90 s a cell in CI; the covering set trains in benchmarks/combinations.py train
@pytest.mark.parametrize("cell", [comb.Cell("quickstart", "tail_batching", "hf", "local", True),
                                  comb.Cell("quickstart", "fixed_lag", "hf", "local", False),
                                  comb.Cell("quickstart", "tail_batching", "hf", "ray", False),
                                  comb.Cell("palette", "sync", "hf", "ray", False)],
                         ids=lambda c: "-".join(map(str, comb.astuple(c))))
def test_accepted_cells_train_two_steps(cell, tmp_path):
    assert comb.plan_cell(cell) == ("accepted", "")
    rc, _, tail = comb.train_cell(cell, tmp_path / "run", timeout_s=600)
    assert rc == 0, tail


def test_cells_trained_before_leave_only_the_pairs_they_miss():
    """`train --carry`: the covering set beside cells trained earlier covers exactly the pairs they leave."""
    pairs = lambda c: {(a, b) for a, b in __import__("itertools").combinations(enumerate(comb.astuple(c)), 2)}  # noqa: E731
    cells = [c for c in comb.cells() if c.recipe in ("quickstart", "distill@ray")]
    done = comb.covering(cells)[:4]
    rest = comb.covering(cells, done=done)
    assert set().union(*map(pairs, done + rest)) == set().union(*map(pairs, cells))
    assert not set(rest) & set(done) and len(rest) < len(comb.covering(cells))


def test_the_new_axes_are_overrides_of_the_recipes():
    c = comb.Cell("distill@worker", "sync", "vllm_async", "local", False)
    assert c.path().endswith("recipes/distill.yaml") and c.overrides() == [
        "distill.placement=worker", "rollout.backend=vllm", "rollout.vllm_engine=async"]
    assert comb.plan_cell(c) == ("accepted", "")
    status, message = comb.plan_cell(comb.Cell("distill@ray", "sync", "hf", "local", False))
    assert status == "refused" and "'distill.placement' and 'cluster.engine'" in message
