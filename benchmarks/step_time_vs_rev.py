"""Side-by-side step time of this checkout against another revision, on the same recipe and machine.

    python benchmarks/step_time_vs_rev.py --rev a3216c6 --rounds 2 [recipe overrides...]

Checks the other revision out into a temporary git worktree, then runs the recipe alternately with the
old and the new code (`rounds` times each, old first), with their warm-ups cached beforehand so only RL
steps are timed. Prints each run's median `perf/step_time_s` and the new/old ratio of the medians over
all runs, and whether every `metrics.jsonl` key but `perf/*` is bit-identical between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(code_dir: Path, recipe: str, out: Path, overrides: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    env.pop("RANK", None)
    # each side runs its own revision's recipe file (a refactor may move a key), as metrics_vs_rev does
    cmd = [sys.executable, "-m", "credo.cli", "run", str(code_dir / recipe), f"run.output_dir={out}",
           "run.progress=false", *overrides]
    done = subprocess.run(cmd, cwd=code_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{recipe} failed in {code_dir}:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def same_but_perf(a: list[dict], b: list[dict]) -> bool:
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]
    return json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)


def compare_old_keys(old: list[dict], new: list[dict]) -> tuple[bool, list[str], list[str]]:
    """Whether every non-perf key of the old rows has the bit-identical value in the new rows (same steps),
    and the keys only the new (old) rows have: metrics a revision added are listed, not hidden."""
    if [r.get("step") for r in old] != [r.get("step") for r in new]:
        return False, [], []
    same = all(json.dumps(n.get(k)) == json.dumps(v) for o, n in zip(old, new)
               for k, v in o.items() if not k.startswith("perf/"))
    keys = lambda rows: {k for r in rows for k in r if not k.startswith("perf/")}
    return same, sorted(keys(new) - keys(old)), sorted(keys(old) - keys(new))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="the other revision (e.g. a3216c6)")
    p.add_argument("--recipe", default="recipes/quickstart.yaml")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-steptime-"))
    old = tmp / "old"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old), args.rev], cwd=REPO, check=True)
    try:
        times: dict[str, list[float]] = {"old": [], "new": []}
        rows: dict[str, list[dict]] = {}
        for code, name in ((old, "old"), (REPO, "new")):  # warm the SFT caches: not timed
            run(code, args.recipe, tmp / f"warm-{name}", ["run.steps=1", "run.eval_every=0", *args.overrides])
        for i in range(args.rounds):
            for code, name in ((old, "old"), (REPO, "new")):
                rows[name] = run(code, args.recipe, tmp / f"{name}-{i}", args.overrides)
                med = statistics.median(r["perf/step_time_s"] for r in rows[name] if "perf/step_time_s" in r)
                times[name].append(med)
                print(f"round {i} {name}: median step {med:.4f} s", flush=True)
        ratio = statistics.median(times["new"]) / statistics.median(times["old"])
        print(f"new / old median step time: {ratio:.3f}  (old {statistics.median(times['old']):.4f} s, "
              f"new {statistics.median(times['new']):.4f} s, {args.rounds} runs each)")
        print(f"metrics.jsonl identical but perf/*: {same_but_perf(rows['old'], rows['new'])}")
        same, added, dropped = compare_old_keys(rows["old"], rows["new"])
        print(f"every old non-perf key bit-identical: {same}; keys added: {added or 'none'}; "
              f"keys dropped: {dropped or 'none'}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
