"""One train step per agg_mode on the fixed global batch, as a world of 1 (in-process) or under torchrun.

    python -m torch.distributed.run --nproc_per_node=2 -m tests.invariants.dp_worker OUT_DIR [BACKEND]

Each rank takes its contiguous share of the same `B_GLOBAL` samples (all G samples of a prompt on one
rank), with the same rewards, a failed reward call, old/ref log-probs and per-token weights. The stages
are built from the recipe for each agg_mode and run reward-free: pack -> advantage (gathered over ranks)
-> recompute -> update. Rank 0 writes `OUT_DIR/world<N>.pt`: per agg_mode the update's metrics, the
parameters after the step, and every rank's parameter digest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from credo.algos import AGG_MODES
from tests.invariants.common import B_GLOBAL, components, fixed_batch, global_rows, off_policy_fields, params_of

RECIPE = {"model.ref_model": True, "algo.entropy_coef": 0.05, "algo.kl_coef": 0.2, "rollout.temperature": 0.7,
          "algo.loss_kwargs": "{clip_low: 0.1, clip_high: 0.3, dual_clip: 2.0}", "optim.lr": 1e-2,
          "optim.grad_clip": 1.0, "algo.micro_batch_size": 4}


def run(out_dir: Path, backend: str = "deepspeed", agg_modes=AGG_MODES) -> dict:
    """`backend`: the recipe's engine.backend (deepspeed or fsdp2)."""
    results = {}
    for agg in agg_modes:
        with components(out_dir / agg, **RECIPE, **{"algo.agg_mode": agg, "engine.backend": backend}) as c:
            share = B_GLOBAL // c.world
            rows = slice(c.rank * share, (c.rank + 1) * share)
            batch = fixed_batch(c, rows=rows, invalid=(5,))
            c.scorer.recompute(c.engine.module, batch)
            off_policy_fields(c, batch, rows=global_rows(rows))
            metrics, skipped = c.updater.update(batch)
            results[agg] = {"metrics": metrics, "skipped": skipped, "params": params_of(c.engine.module),
                            "digests": c.engine.param_digests(), "world": c.world}
    return results


if __name__ == "__main__":
    out = Path(sys.argv[1])
    res = run(out, *sys.argv[2:3], **({"agg_modes": sys.argv[3].split(",")} if len(sys.argv) > 3 else {}))
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(res, out / f"world{next(iter(res.values()))['world']}.pt")
    from credo.distributed.engine import teardown_distributed

    teardown_distributed()


def assert_two_ranks_match_one(one: dict, two: dict) -> None:
    """`run`'s results of a world of 1 and of 2 (every agg mode) agree: same metrics (the clip active), the ranks'
    parameters identical to each other and to the single process's. Shared by the DeepSpeed and FSDP2 tests."""
    import pytest

    from credo.algos import AGG_MODES

    for agg in AGG_MODES:
        a, b = one[agg], two[agg]
        assert a["world"] == 1 and b["world"] == 2 and a["skipped"] == b["skipped"] == 0
        assert len(set(b["digests"])) == 1, f"{agg}: ranks disagree"
        assert a["metrics"]["train/grad_norm"] > 1.0, "the clip (1.0) must be active for the scale to show"
        for key in ("train/grad_norm", "train/loss", "train/pg_loss", "train/entropy", "train/kl",
                    "loss/mismatch_kl_k3", "loss/clipfrac_low", "loss/clipfrac_high"):
            assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=1e-5, abs=1e-7), f"{agg}: {key}"
        for k in a["params"]:
            torch.testing.assert_close(b["params"][k], a["params"][k], rtol=0, atol=1e-6, msg=lambda m: f"{agg} {k}: {m}")
