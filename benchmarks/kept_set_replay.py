"""Kept-set replay measured on the quickstart (docs/truncated_sampling.md): per sampler setting and backend, the token
mean of pi_old / mu (`mismatch/ratio_mean`) and `mismatch/k3`, without and with `rollout.kept_set_replay`, averaged
over the steps of short runs.

    python benchmarks/kept_set_replay.py --out /tmp/kst [--steps 3] [--backends hf,vllm] [--sft-steps 600]

Each run is `credo run recipes/quickstart.yaml run.steps=<steps> ...` in its own process; the warm-up is cached, so
the first run pays for it. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {"top_p = 0.9": ["rollout.top_p=0.9"], "top_k = 5": ["rollout.top_k=5"]}


def run(out: Path, backend: str, setting: str, replay: bool, steps: int, sft_steps: int | None) -> dict:
    name = f"{backend}_{setting.replace(' ', '').replace('=', '')}_{'on' if replay else 'off'}"
    run_dir = out / name
    if not (run_dir / "metrics.jsonl").exists():
        cmd = [sys.executable, "-m", "credo.cli", "run", "recipes/quickstart.yaml", f"run.steps={steps}",
               "run.eval_every=0", "run.save_every=0", "run.plot=false", f"run.output_dir={run_dir}",
               f"rollout.backend={backend}", f"rollout.kept_set_replay={str(replay).lower()}", *SETTINGS[setting]]
        if sft_steps is not None:
            cmd.append(f"sft.steps={sft_steps}")
        print(" ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, env=os.environ)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "mismatch/k3" in r]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    return dict(ratio=mean("mismatch/ratio_mean"), k3=mean("mismatch/k3"), steps=len(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--backends", default="hf")
    ap.add_argument("--sft-steps", type=int, default=None, help="override sft.steps (default: the recipe's)")
    a = ap.parse_args()
    lines = ["| backend | sampler | replay | mean pi_old / mu | log of it | mismatch/k3 | steps |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    import math

    for backend in a.backends.split(","):
        for setting in SETTINGS:
            for replay in (False, True):
                m = run(a.out, backend, setting, replay, a.steps, a.sft_steps)
                lines.append(f"| {backend} | {setting} | {'on' if replay else 'off'} | {m['ratio']:.6f} | "
                             f"{math.log(m['ratio']):.2e} | {m['k3']:.2e} | {m['steps']} |")
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
