"""A family from outside credo, defined in this file only: its own recipe section, an advantage stage with typed
settings, and a step hook with state. A recipe names it (`families: [...]`) and trains 2 steps; no credo file
knows about it. A wrong key or value in its section fails at `credo check`.

The family `scaled`: the advantage stage `scaled_grpo` is GRPO times `scaled.factor` (a section key) plus
`stages.advantage_kwargs.shift` (a stage setting); the hook counts the steps it saw, logs `scaled/seen`, and keeps
its count in the trainer state (checkpointed with the run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from credo.config import load_recipe, out_of_range, ranged
from credo.errors import ConfigError
from credo.family import Family, FamilyParts, StageEntry
from credo.plan import resolve_plan
from tests.e2e.common import read_rows, run_cli, tiny_overrides

HERE = "tests.spine.test_family_plugin"
CALLS: list[tuple[str, int]] = []


@dataclass
class ScaledConfig:
    factor: float = ranged(1.0, gt=0)
    """Multiplies the GRPO advantages."""
    enabled: bool = False
    """Switches the family's step hook on."""


@dataclass
class ShiftSettings:
    shift: float = 0.0
    """Added to every loss token's advantage."""


def check_scaled(r) -> None:
    if r.scaled.enabled and r.stages.advantage != "scaled_grpo":
        raise out_of_range("scaled.enabled", True, "false unless stages.advantage is scaled_grpo")


class ScaledGRPO:
    def __init__(self, default, factor: float, shift: float):
        self.default, self.factor, self.shift = default, factor, shift

    def __call__(self, batch) -> None:
        self.default(batch)  # the outcome stage: GRPO on the recipe's algo.advantage
        batch.advantages = (batch.advantages * self.factor + self.shift) * batch.loss_mask


def make_scaled(ctx, s: ShiftSettings) -> ScaledGRPO:
    return ScaledGRPO(ctx.default, ctx.section.factor, s.shift)


class CountingHook:
    name = "scaled"

    def __init__(self):
        self.seen = 0

    def before_step(self, step: int) -> None:
        CALLS.append(("before", step))

    def after_sync(self, step: int, batch) -> dict:
        CALLS.append(("after", step))
        self.seen += 1
        return {"scaled/seen": float(self.seen)}

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def hooks(ctx, parts) -> list:
    return [CountingHook()]


PARTS = FamilyParts(hooks=hooks)  # the build-time parts, checked when the family loads (a misspelt part is an error)

FAMILY = Family(name="scaled", doc="a test family", section="scaled", config=ScaledConfig, check=check_scaled,
                stages={"advantage": {"scaled_grpo": StageEntry(f"{HERE}:make_scaled", ShiftSettings)}},
                active=lambda r: r.scaled.enabled, build=HERE)


def overrides(out, **extra) -> list[str]:
    return tiny_overrides(out, **{"families": f"['{HERE}:FAMILY']", "scaled.factor": 2.0, "scaled.enabled": True,
                                  "stages.advantage": "scaled_grpo", "stages.advantage_kwargs": "{shift: 0.25}",
                                  "run.steps": 2, "run.eval_every": 0, "run.save_every": 2,
                                  "run.dump_rollouts_every": 1, **extra})


@pytest.mark.slow
def test_a_family_of_its_own_trains_through_a_recipe(tmp_path):
    from credo.trainer import train

    CALLS.clear()
    run_dir = train(load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run")))
    assert CALLS == [("before", 1), ("after", 1), ("before", 2), ("after", 2)]
    rows = read_rows(run_dir)
    assert [r["scaled/seen"] for r in rows] == [1.0, 2.0]
    assert all("perf/scaled_s" in r for r in rows)
    for step in (1, 2):  # the stage's advantages: 2 x GRPO + 0.25 on every loss token, by hand from the dump
        dumped = [json.loads(x) for x in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        for g in {d["group_id"] for d in dumped}:
            group = [d for d in dumped if d["group_id"] == g]
            r = torch.tensor([d["reward"] for d in group], dtype=torch.float64)
            grpo = (r - r.mean()) / (r.std() + 1e-6)
            for d, a in zip(group, grpo):
                got = [x for x, m in zip(d["advantages"], d["response_mask"]) if m]
                assert got == pytest.approx([2.0 * float(a) + 0.25] * len(got), abs=1e-4)
    meta = json.loads((run_dir / "checkpoints" / "step_00000002" / "meta.json").read_text())
    assert meta["components"]["scaled"] == {"seen": 2}, "the hook's state is checkpointed with the run"
    assert meta["config"]["scaled"] == {"factor": 2.0, "enabled": True}


def test_the_family_section_is_loaded_strictly(tmp_path):
    r = load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run"))
    assert (r.scaled.factor, r.scaled.enabled) == (2.0, True)
    with pytest.raises(ConfigError, match=r"unknown config key 'scaled.facter'; did you mean 'scaled.factor'\?"):
        load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run", **{"scaled.facter": 3}))
    with pytest.raises(ConfigError, match=r"'scaled.factor' = -1.0 is out of range: expected > 0"):
        load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run", **{"scaled.factor": -1}))
    with pytest.raises(ConfigError, match=r"'scaled.enabled' = True is out of range: expected false unless"):
        load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run", **{"stages.advantage": "default",
                                                                               "stages.advantage_kwargs": "{}"}))
    with pytest.raises(ConfigError, match=r"unknown config key 'stages.advantage_kwargs.shfit'; did you mean "
                                          r"'stages.advantage_kwargs.shift'\?"):  # stage settings: by the run plan
        resolve_plan(load_recipe("recipes/quickstart.yaml", overrides(tmp_path / "run",
                                                                      **{"stages.advantage_kwargs": "{shfit: 1}"})))
    # without the family named, its section is an unknown key
    with pytest.raises(ConfigError, match=r"unknown config key 'scaled'"):
        load_recipe("recipes/quickstart.yaml", ["scaled.factor=2"])


def test_credo_check_fails_on_a_wrong_key_of_the_section(tmp_path):
    p = run_cli(["check", "recipes/quickstart.yaml", *overrides(tmp_path / "run", **{"scaled.facter": 3})], timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("credo: config error: unknown config key 'scaled.facter'")
