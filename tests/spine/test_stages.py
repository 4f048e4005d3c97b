"""The stage layout, tested through recipes: plug-in stages defined here, rollback, dumps, golden values.

The plug-in stages below live in this test file only: a rollout source, an advantage stage and a probe
that produces per-token weights. A recipe names them by import spec and trains with them; no credo
file knows about them.
"""

from __future__ import annotations

from credo.plan import resolve_plan
import contextlib
import json

import pytest
import torch

from credo.config import load_recipe
from credo.train.batch import Batch
from tests.e2e.common import read_rows, tiny_overrides

pytestmark = pytest.mark.slow
HERE = "tests.spine.test_stages"
CALLS: dict[str, list] = {"rollout": [], "advantage": [], "probe_forwards": []}


# ------------------------------------------------------------------------------------ plug-in stages
class FirstProblemsSource:
    """A rollout source that always asks the first `n_prompts` training problems, G samples each."""

    def __init__(self, ctx, n_prompts: int):
        self.ctx, self.n = ctx, n_prompts

    def rollout(self, step: int) -> Batch:
        CALLS["rollout"].append(step)
        ctx, G = self.ctx, self.ctx.rollout["group_size"]
        problems = [ctx.task.train(i) for i in range(self.n)]
        ids = ctx.tokenizer([p.prompt for p in problems], add_special_tokens=False)["input_ids"]
        samples = ctx.backend.generate([x for x in ids for _ in range(G)], max_new_tokens=ctx.rollout["max_new_tokens"],
                                       temperature=ctx.rollout["temperature"], top_p=1.0,
                                       seeds=[1000 * step + i for i in range(self.n * G)])
        return Batch(samples=samples, problems=[p for p in problems for _ in range(G)],
                     group_ids=torch.arange(self.n).repeat_interleave(G), step=step)

    def generate(self, prompts, *, temperature, seeds):
        return self.ctx.backend.generate(prompts, max_new_tokens=self.ctx.rollout["max_new_tokens"],
                                         temperature=temperature, top_p=1.0, seeds=seeds)

    def sync(self, model, step):
        self.ctx.backend.sync_weights(model, step)

    def close(self):
        self.ctx.backend.close()


def make_source(ctx, n_prompts: int = 2):
    return FirstProblemsSource(ctx, n_prompts)


class CenteredRewardAdvantage:
    """Advantage = (reward - batch mean reward) * scale on every loss token: not any credo estimator."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, batch: Batch) -> None:
        CALLS["advantage"].append(batch.step)
        centred = (batch.rewards - batch.rewards.mean()) * self.scale + 0.5  # +0.5: nonzero even if all rewards tie
        batch.advantages = centred[:, None] * batch.loss_mask


def make_advantage(ctx, scale: float = 1.0):
    return CenteredRewardAdvantage(scale)


class ConstantWeightProbe:
    """Counts the forwards it rode and returns a constant per-token weight."""

    name = "constant"

    def __init__(self, weight: float):
        self.weight = weight

    def capture(self, model):
        # the embedding runs once per forward, whichever path (hidden states or logits) the scorer takes
        handle = model.get_input_embeddings().register_forward_hook(lambda *_: CALLS["probe_forwards"].append(1))
        return contextlib.closing(type("H", (), {"close": lambda _self: handle.remove()})())

    def result(self, batch, log_probs, entropy):
        return {"weights": torch.full_like(log_probs, self.weight), "entropy_seen": entropy}


def make_probe(ctx, weight: float = 1.0):
    return ConstantWeightProbe(weight)


def plugin_overrides(out, weight: float, **extra):
    return tiny_overrides(out, **{
        "run.steps": 2, "run.eval_every": 0, "run.dump_rollouts_every": 1,
        "stages.rollout": f"{HERE}:make_source", "stages.rollout_kwargs": "{n_prompts: 2}",
        "stages.advantage": f"{HERE}:make_advantage", "stages.advantage_kwargs": "{scale: 2.0}",
        "stages.probes": f"['{HERE}:make_probe']", "stages.probe_kwargs": f"{{'{HERE}:make_probe': {{weight: {weight}}}}}",
        "algo.micro_batch_size": 4, **extra})


def train_params(overrides):
    from credo.trainer import Trainer

    trainer = Trainer(load_recipe("recipes/quickstart.yaml", overrides))
    before = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
    try:
        run_dir = trainer.fit()
    finally:
        trainer.close()
    after = {k: v.detach().clone() for k, v in trainer.engine.module.named_parameters()}
    return run_dir, before, after


def test_plugin_source_advantage_and_weight_probe_train_through_the_recipe(tmp_path):
    for v in CALLS.values():
        v.clear()
    run_dir, before, after = train_params(plugin_overrides(tmp_path / "w1", 1.0))
    assert CALLS["rollout"] == [1, 2] and CALLS["advantage"] == [1, 2]
    assert len(CALLS["probe_forwards"]) == 2, "the probe rides one recompute forward per step"
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # the source's samples and the advantage stage's values are what the step trained on
    for step in (1, 2):
        dumped = [json.loads(x) for x in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(dumped) == 2 * 4 and {d["group_id"] for d in dumped} == {0, 1}
        rewards = torch.tensor([d["reward"] for d in dumped])
        for d, r in zip(dumped, rewards):
            expected = float((r - rewards.mean()) * 2.0 + 0.5)
            got = [a for a, m in zip(d["advantages"], d["response_mask"]) if m]
            assert got == pytest.approx([expected] * len(got), abs=1e-5)

    # the probe's weights reach the loss: all-zero weights zero the policy gradient, so nothing moves
    _, before0, after0 = train_params(plugin_overrides(tmp_path / "w0", 0.0))
    assert all(torch.equal(before0[k], after0[k]) for k in before0), "weights=0 must leave the policy unchanged"


def test_unknown_plugin_fails_at_check_naming_the_key():
    from credo.config import ConfigError

    with pytest.raises(ConfigError, match=r"stages.advantage.*has no callable 'nope'"):
        resolve_plan(load_recipe("recipes/quickstart.yaml", [f"stages.advantage={HERE}:nope"]))
    with pytest.raises(ConfigError, match=r"stages.rollout.*not a known rollout stage"):
        resolve_plan(load_recipe("recipes/quickstart.yaml", ["stages.rollout=gem"]))


# ------------------------------------------------------------------------------------------ rollback
def _flat(x, prefix=""):
    """Every tensor and scalar in a nested state, by path (for bitwise comparison)."""
    if isinstance(x, torch.Tensor):
        return {prefix: x.detach().clone()}
    if type(x).__module__ == "numpy" and hasattr(x, "shape"):
        return {prefix: torch.from_numpy(x.copy())}
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _flat(val, f"{prefix}/{key}").items()}
    if isinstance(x, (list, tuple)):
        return {k: v for i, val in enumerate(x) for k, v in _flat(val, f"{prefix}/{i}").items()}
    return {prefix: x}


def _same(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    bad = []
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                bad.append(k)
        elif x != y and not (isinstance(x, float) and x != x and y != y):
            bad.append(k)
    return bad


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_rollback_of_one_step_is_bit_exact(tmp_path, zero_stage):
    import random

    import numpy as np

    from credo.checkpoint import rng_state
    from credo.trainer import Trainer

    trainer = Trainer(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path / "run", **{"run.eval_every": 0, "optim.zero_stage": zero_stage, "optim.warmup_steps": 5})))
    try:
        trainer.train_step(1)
        engine = trainer.engine
        base = getattr(engine.optimizer, "optimizer", engine.optimizer)
        live = lambda: _flat({"params": dict(engine.module.named_parameters()), "moments": base.state_dict()["state"],
                              "lr": engine.lr_scheduler.state_dict(), "rng": rng_state(), "steps": engine.global_steps,
                              "fp32": getattr(engine.optimizer, "single_partition_of_fp32_groups", [])})
        before = live()
        snap = trainer.state.snapshot()
        row2 = trainer.train_step(2)
        np.random.rand(3), torch.rand(3), random.random()  # draws after the step are rolled back too
        moved = _same(before, live())
        assert any(k.startswith("/params") for k in moved) and any(k.startswith("/moments") for k in moved)
        assert any(k.startswith("/lr") for k in moved) and any(k.startswith("/steps") for k in moved)
        assert {k.split("/")[2] for k in moved if k.startswith("/rng")} == {"python", "numpy", "torch"}
        trainer.state.restore(snap)
        assert _same(before, live()) == []
        # and the restored state trains step 2 again exactly as the first time
        again = trainer.train_step(2)
        assert {k: v for k, v in again.items() if not k.startswith("perf/")} == \
            {k: v for k, v in row2.items() if not k.startswith("perf/")}
    finally:
        trainer.close()


# ------------------------------------------------------------------------------------------ golden run
# Pinned from a run of this recipe at the commit that introduced the stages (entropy bonus and
# temperature 0.8 on, so a dropped sign or temperature moves them) (tiny 1-layer model, 5 SFT
# steps, 3 RL steps, seed 0). A change to any of these numbers is a change of behaviour: it must be
# intended and said in the commit.
GOLDEN = {
    "train/reward_mean": [0.3125, 0.1875, 0.0],
    "train/loss": [-0.055610550253519374, -0.04766549970282835, -0.047672946453094486],
    "train/grad_norm": [1.2885165214538574, 1.3740512132644653, 0.006962338928133249],
    "train/entropy": [4.767404079437256, 4.766547918319702, 4.767294645309448],
}


def test_golden_per_step_values(tmp_path):
    from credo.trainer import train

    rows = read_rows(train(load_recipe("recipes/quickstart.yaml", tiny_overrides(
        tmp_path / "run", **{"run.eval_every": 0, "algo.entropy_coef": 0.01, "rollout.temperature": 0.8}))))
    for key, pinned in GOLDEN.items():
        assert [r[key] for r in rows] == pytest.approx(pinned, rel=1e-5, abs=1e-7), key
