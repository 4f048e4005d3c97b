"""A stand-in for `python -m credo.cli run` in the scheduler tests: starts in milliseconds, no model.

Called as `fake_train.py run BASE key=value ...`. It logs, for steps 0..run.steps, eval/accuracy =
1000 * optim.lr + run.seed / 10 + step / 100 and (from step 1) train/reward_mean = the same minus 0.5,
so a test can recompute every table cell. Like the trainer it refuses a folder that holds a run unless
run.resume is set, and on resume continues after the last logged step.

Environment: FAKE_TRAIN_FAIL=<text> fails (exit 1, after step 1) every run whose output_dir contains
<text>; FAKE_TRAIN_WARMUP_S and FAKE_TRAIN_STEP_S sleep before step 0 and after each step.
"""

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    assert sys.argv[1] == "run"
    o = dict(a.split("=", 1) for a in sys.argv[3:])
    out = Path(o["run.output_dir"])
    metrics = out / "metrics.jsonl"
    with open(out / "invocations.txt", "a") as f:
        f.write(json.dumps({"start": time.time(), "resume": o.get("run.resume"), "threads": o.get("run.threads"),
                            "omp": os.environ.get("OMP_NUM_THREADS")}) + "\n")
    if metrics.exists() and not o.get("run.resume"):
        print(f"credo: config error: config key 'run.output_dir' = '{out}' already holds a run", file=sys.stderr)
        return 2
    rows = [json.loads(l) for l in metrics.read_text().splitlines()] if metrics.exists() else []
    start = rows[-1]["step"] + 1 if rows else 0
    lr, seed, steps = float(o.get("optim.lr", 1e-4)), int(o["run.seed"]), int(o.get("run.steps", 60))
    time.sleep(float(os.environ.get("FAKE_TRAIN_WARMUP_S", 0)))
    fail = os.environ.get("FAKE_TRAIN_FAIL")
    for step in range(start, steps + 1):
        acc = 1000 * lr + seed / 10 + step / 100
        row = {"step": step, "eval/accuracy": acc}
        if step:
            row["train/reward_mean"] = acc - 0.5
        with open(metrics, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"step {step}", flush=True)
        if fail and fail in str(out) and step == 1:
            print("Traceback (most recent call last):\nRuntimeError: injected failure at step 1", file=sys.stderr)
            return 1
        time.sleep(float(os.environ.get("FAKE_TRAIN_STEP_S", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
