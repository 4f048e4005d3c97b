"""Pin behaviour across a refactor: each family's recipe, run with this checkout and with another revision,
and every `metrics.jsonl` key but `perf/*` (and `cluster/*`, `async/*` when asked) compared bit for bit. Each side
runs its own revision's recipe file (a refactor may move a key).

    python benchmarks/metrics_vs_rev.py --rev bce0466                     # every recipe below, old then new
    python benchmarks/metrics_vs_rev.py --rev bce0466 --only quickstart mipu
    python benchmarks/metrics_vs_rev.py --rev bce0466 --old-runs /work/pins   # reuse old runs made earlier

The other revision is checked out into a temporary git worktree; each side gets its own warm-up cache
(CREDO_CACHE), so the warm-ups are compared too, not shared. Prints one line per recipe: identical or not,
the keys the new code adds or drops, and the median step times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RECIPES: dict[str, list[str]] = {
    "quickstart": [],
    "ppo": ["run.steps=20"],
    "asyppo": ["run.steps=20"],
    "multiturn": [],
    "mipu": ["run.steps=20"],
    "attention_credit": ["run.steps=20"],
    "judge_reward": ["run.steps=10", "judge.warmup_steps=60"],
    "rm_nlhf": ["run.steps=20"],
    "ce_rm": ["run.steps=20"],
    "pgenrm": [],
    "complementary": ["run.steps=10", "complementary.extractor_sft_steps=20"],
    "async": ["run.steps=20"],
    "async_multiturn": ["run.steps=10"],
    "polymath": ["run.steps=10", "sft.steps=300"],
    "shop": ["run.steps=10"],
    "palette": ["run.steps=6", "sft.steps=100", "palette.vae_steps=40", "palette.sft_steps=20"],
    "longtail": ["run.steps=10"],
}
"""Recipe -> overrides (shortened where the full run adds minutes and no new code path: fewer steps, and the
longest warm-ups cut, the same on both sides, so the warm-up code is still compared)."""


def run(code_dir: Path, recipe: str, out: Path, overrides: list[str], cache: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(code_dir), "CREDO_CACHE": str(cache)}
    env.pop("RANK", None)
    if not (out / "metrics.jsonl").exists():
        cmd = [sys.executable, "-m", "credo.cli", "run", str(code_dir / "recipes" / f"{recipe}.yaml"),
               f"run.output_dir={out}", "run.progress=false", "run.plot=false", *overrides]
        done = subprocess.run(cmd, cwd=code_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            raise SystemExit(f"{recipe} failed in {code_dir}:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def compare(old: list[dict], new: list[dict], ignore: tuple[str, ...]) -> tuple[bool, list[str], list[str]]:
    """Whether every old key outside `ignore` has the bit-identical value in the new rows (same steps), and
    the keys only the new (old) rows have."""
    if [r.get("step") for r in old] != [r.get("step") for r in new]:
        return False, [], []
    keep = lambda k: not k.startswith(ignore)
    same = all(json.dumps(n.get(k)) == json.dumps(v) for o, n in zip(old, new) for k, v in o.items() if keep(k))
    keys = lambda rows: {k for r in rows for k in r if keep(k)}
    return same, sorted(keys(new) - keys(old)), sorted(keys(old) - keys(new))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="the other revision (e.g. bce0466)")
    p.add_argument("--only", nargs="*", default=None, help="recipe names (default: all)")
    p.add_argument("--old-runs", default=None, help="a folder of old runs to reuse (old-<recipe>/), made if missing")
    p.add_argument("--new-runs", default=None, help="a folder for the new runs (default: a temporary one)")
    p.add_argument("--ignore", nargs="*", default=["perf/"], help="metric prefixes left out of the comparison")
    p.add_argument("extra", nargs="*", help="overrides added to every run of both sides")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="credo-pin-"))
    old_root = Path(args.old_runs) if args.old_runs else tmp
    new_root = Path(args.new_runs) if args.new_runs else tmp
    old_code = tmp / "old-code"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old_code), args.rev], cwd=REPO, check=True)
    ok = True
    try:
        for name in args.only or list(RECIPES):
            over = [*RECIPES[name], *args.extra]
            old = run(old_code, name, old_root / f"old-{name}", over, old_root / "cache-old")
            new = run(REPO, name, new_root / f"new-{name}", over, new_root / "cache-new")
            same, added, dropped = compare(old, new, tuple(args.ignore))
            ok &= same
            med = lambda rows: statistics.median(r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r)
            print(f"{name:18s} steps {len(new) - 1:3d}  identical but {'/'.join(args.ignore)}: {same}  "
                  f"added: {added or '-'}  dropped: {dropped or '-'}  step s old {med(old):.3f} new {med(new):.3f}",
                  flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old_code)], cwd=REPO, check=False)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
