"""End-to-end GRPO throughput: credo against TRL's `GRPOTrainer` on the same work, in one run.

Both frameworks train the quickstart recipe's GRPO phase for `--steps` optimizer steps, `--rounds` times
each, one run at a time and in alternating order (credo, TRL, TRL, credo, ...) so that a change in the
machine's load falls on both alike, with the same torch thread count:

- the same starting weights: the recipe's cached SFT warm-up directory (computed first if missing);
- the same prompts in the same order: credo's per-step prompt draw (`rollout.prompts_per_step` problems,
  each repeated `rollout.group_size` times) is exported to JSON and TRL walks it unshuffled;
- the same reward (`ArithmeticTask.score`, restated in the worker and checked against it), temperature,
  top-p, `max_new_tokens` (TRL: `max_completion_length`), learning rate and linear warm-up, AdamW betas,
  weight decay, gradient clip, PPO clip;
- one optimizer step per batch of prompts_per_step x group_size completions, split into the same number of
  micro-batches (TRL: `per_device_train_batch_size`, `gradient_accumulation_steps`, `steps_per_generation`);
- no reference model (`beta=0`), one pass over each batch (`num_iterations=1`), fp32, no vLLM, CPU;
- token-level loss normalisation: credo's `token-mean` (divide by the batch's response tokens) is TRL's
  `loss_type="dapo"` (active tokens in the global accumulated batch; with one process this equals "bnpo").

TRL lives in its own virtual environment (`--trl-venv`, created on first use with the project's CPU
constraints and the project's own transformers version), so it never becomes a credo dependency.
`benchmarks/trl_grpo_worker.py` is the TRL side.

Measured per step: wall time of the step (credo: `perf/step_time_s`, rollout to weight sync; TRL:
`on_step_begin` to `on_step_end`, generation to optimizer step; neither includes logging or
checkpointing) and tokens = prompt + response tokens, response up to and including EOS, no padding
(credo's `perf/tokens_per_s`, verl's definition; TRL's `num_tokens` count). The first `--warmup`
steps of each run are dropped (one-time start-up costs) and reported apart. tokens/s is the sum of tokens
over the sum of step times of all measured steps; "at median" divides the mean tokens per step by the
median step time, and "best run" is the fastest run's tokens/s (timeit's rule): both are moved less by a
burst of other load on a shared machine (`--wait-load` also helps there). The step-time breakdowns
(means over the measured steps) are printed for both.

Usage (from the repository root, with the project venv):
    .venv/bin/python benchmarks/e2e_throughput.py [--steps 20] [--rounds 2] [--warmup 2] [--threads 2] [key=value ...]
Trailing key=value pairs are recipe overrides applied to both frameworks (e.g. rollout.group_size=4).

Tasks: the arithmetic task (exact-match reward) and the long-tail workload `longtail_add` (the integer after the
last '>'), e.g. `--recipe recipes/longtail.yaml`. `--variant NAME:key=value,...` adds a credo run with more
overrides that TRL does not get (what credo does differently: `algo.packing`, `rollout.tail_batching`); each
variant runs every round and is compared with TRL and with plain credo:

    .venv/bin/python benchmarks/e2e_throughput.py --recipe recipes/longtail.yaml \
        --variant "packed:algo.packing=true,algo.micro_batch_tokens=4096" \
        --variant "tail:rollout.tail_batching={}" --variant "both:rollout.tail_batching={},algo.packing=true"
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

CREDO_BREAKDOWN = ["perf/rollout_s", "perf/reward_s", "perf/logprob_s", "perf/update_s", "perf/sync_s"]
TRL_BREAKDOWN = ["rollout_s", "reward_s", "prepare_other_s", "loss_fwd_s", "backward_opt_s"]
TRL_SPEC = "trl==1.16.0"  # the release this benchmark was written and measured against
AGG_TO_TRL_LOSS = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def machine_info() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "torch": version("torch"), "transformers": version("transformers")}


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


# ------------------------------------------------------------------------------------------- TRL venv


def ensure_trl_venv(venv: Path, trl_spec: str) -> Path:
    """Create the TRL venv if it cannot import trl; pin torch (CPU) and transformers to the project's."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import trl"], capture_output=True).returncode == 0:
        return py
    print(f"creating the TRL virtual environment in {venv} ({trl_spec}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # constraints-cpu.txt pins torch so pip takes the CPU build; transformers follows the project venv so the
    # two frameworks run the same model and generate() code
    subprocess.run([py, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints-cpu.txt"), trl_spec,
                    f"transformers=={version('transformers')}"], check=True)
    return py


def venv_versions(py: Path) -> dict:
    code = ("import json; from importlib.metadata import version as v; "
            "print(json.dumps({k: v(k) for k in ('trl', 'torch', 'transformers', 'accelerate')}))")
    return json.loads(subprocess.run([py, "-c", code], check=True, capture_output=True, text=True).stdout)


# ------------------------------------------------------------------------------------------------ job


def build_job(r, steps: int, threads: int, out_dir: Path) -> dict:
    """The TRL worker's job: SFT model directory, credo's prompts in step order, mapped hyperparameters."""
    import torch

    from credo import algos
    from credo.models import resolve_model_path
    from credo.tasks import ArithmeticTask, make_task
    from credo.sft import run_sft
    from credo.train.rollout import step_problem_indices
    from credo.train.update import grad_accum_steps

    a, ro, o = r.algo, r.rollout, r.optim
    task = make_task(r.task)
    reward = "exact" if isinstance(task, ArithmeticTask) else "final_int" if r.task.name == "longtail_add" else None
    if reward is None:
        raise SystemExit(f"task.name = {r.task.name!r}: the TRL side reproduces the arithmetic task's exact-match "
                         "reward and longtail_add's final-integer reward only")
    if a.policy_loss != "ppo" or a.advantage != "grpo":
        raise SystemExit(f"algo.policy_loss/advantage = {a.policy_loss}/{a.advantage}: expected ppo/grpo, the pair both "
                         "frameworks implement alike")
    if a.agg_mode not in AGG_TO_TRL_LOSS:
        raise SystemExit(f"algo.agg_mode = {a.agg_mode!r}: expected one of {sorted(AGG_TO_TRL_LOSS)}")
    if a.ppo_epochs * a.mini_batches != 1:
        raise SystemExit("algo.ppo_epochs and algo.mini_batches must be 1 (one optimizer step per rollout batch)")
    if r.reward.function or r.model.dtype != "float32" or ro.backend != "hf":
        raise SystemExit("expected the built-in reward, model.dtype=float32 and rollout.backend=hf")
    clip = {k: p.default for k, p in inspect.signature(algos.POLICY_LOSSES["ppo"]).parameters.items()
            if p.kind is p.KEYWORD_ONLY} | a.loss_kwargs
    if clip.get("dual_clip") is not None:
        raise SystemExit("algo.loss_kwargs.dual_clip has no TRL counterpart")

    torch.set_num_threads(threads)
    base = resolve_model_path(r.model.path, r.model.tiny)
    model_dir = base
    if r.sft.enabled and r.sft.steps > 0:
        model_dir, _ = run_sft(r, base, task, log=lambda m: print(m, flush=True))

    P, G = ro.prompts_per_step, ro.group_size
    rows = []
    for step in range(1, steps + 1):  # credo's Trainer.rollout draw, world size 1
        for i in step_problem_indices(r.run.seed, step, len(task), P):
            p = task.train(i)
            rows.append({"prompt": p.prompt, "answer": p.answer})
    grad_accum = grad_accum_steps(P * G, 1, a.micro_batch_size)  # as Trainer.__init__ (mini_batches is 1 here)
    if (P * G) % grad_accum:
        raise SystemExit(f"{P * G} completions do not split into {grad_accum} equal TRL micro-batches; "
                         "pick algo.micro_batch_size dividing prompts_per_step * group_size")
    std = a.advantage_kwargs.get("norm_std", True)
    config = {
        "per_device_train_batch_size": P * G // grad_accum, "gradient_accumulation_steps": grad_accum,
        "num_generations": G, "max_completion_length": ro.max_new_tokens, "temperature": ro.temperature,
        "top_p": ro.top_p, "learning_rate": o.lr, "weight_decay": o.weight_decay, "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1], "max_grad_norm": o.grad_clip, "beta": a.kl_coef if r.model.ref_model else 0.0,
        "epsilon": clip["clip_low"], "epsilon_high": clip["clip_high"], "loss_type": AGG_TO_TRL_LOSS[a.agg_mode],
        "scale_rewards": "group" if std else "none", "entropy_coef": a.entropy_coef,
        "mask_truncated_completions": a.overlong_filter, "warmup_steps": o.warmup_steps,
    }
    check_verifier(task, reward)
    return {"model": model_dir, "rows": rows, "steps": steps, "seed": r.run.seed, "threads": threads,
            "output_dir": str(out_dir / "trl"), "config": config, "reward": reward}


def check_verifier(task, reward: str = "exact") -> None:
    """The TRL worker restates the task's verifier (it runs without credo): make sure the two agree."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from trl_grpo_worker import SCORES

    score = SCORES[reward]
    problems = [task.train(i) for i in range(50)]
    for p in problems:
        a = p.answer
        tail = a.rpartition(">")[2]
        for response in (a, f" {a}\n", a.lstrip("0") or "0", "0" + a, a + ".", a[:-1], "-" + a, "", "x", "1e2", " ",
                         "--1", a + " " + a, f">{tail}", f"1+1=02>{tail}", a + ">", a.replace(">", ""),
                         *([f"{int(a) + 1}"] if a.isdigit() else [])):
            want, got = task.score(response, p), score(response, a)
            if want != got:
                raise SystemExit(f"trl_grpo_worker.{score.__name__}({response!r}, {a!r}) = {got}, but the task's "
                                 f"verifier gives {want}: update it to match {type(task).__name__}.score")


# ------------------------------------------------------------------------------------------------ runs


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
               WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    return env


def run_logged(cmd: list, log_path: Path, env: dict) -> float:
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = "".join(open(log_path).readlines()[-30:])
        raise SystemExit(f"{cmd[:4]} exited with {rc}; last lines of {log_path}:\n{tail}")
    return time.perf_counter() - t0


def run_credo(recipe: str, overrides: list[str], steps: int, threads: int, out_dir: Path,
              tag: str) -> tuple[list[dict], float]:
    from credo.models import cache_root

    run_dir = out_dir / tag
    cmd = [sys.executable, "-m", "credo.cli", "run", recipe, *overrides, f"run.output_dir={run_dir}",
           f"run.steps={steps}", "run.eval_every=0", "run.save_every=0", "run.progress=false", "run.plot=false",
           f"run.threads={threads}"]
    env = child_env(threads)
    env["CREDO_CACHE"] = str(cache_root())  # the warm-up the job was built from
    wall = run_logged(cmd, out_dir / f"{tag}.log", env)
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    rows = [row for row in rows if "perf/step_time_s" in row]
    for row in rows:
        row["step_s"] = row["perf/step_time_s"]
        row["tokens"] = row["perf/tokens_per_s"] * row["perf/step_time_s"]  # one process: per device = total
    return rows, wall


def run_trl(py: Path, job: dict, out_dir: Path, tag: str) -> tuple[list[dict], float]:
    job_path, out_path = out_dir / "trl_job.json", out_dir / f"{tag}_steps.jsonl"
    job_path.write_text(json.dumps(job))
    cmd = [str(py), str(ROOT / "benchmarks" / "trl_grpo_worker.py"), str(job_path), str(out_path)]
    wall = run_logged(cmd, out_dir / f"{tag}.log", child_env(job["threads"]))
    return [json.loads(line) for line in open(out_path)], wall


# ------------------------------------------------------------------------------------------- reporting


def summarise(runs: list[list[dict]], warmup: int, response_len: str, reward: str) -> dict:
    """Pool the measured steps (all but the first `warmup` of each run) of one framework's runs."""
    measured = [row for rows in runs for row in rows[warmup:]]
    times = [row["step_s"] for row in measured]
    tokens_per_step = statistics.mean(row["tokens"] for row in measured)
    per_run = [sum(row["tokens"] for row in rows[warmup:]) / sum(row["step_s"] for row in rows[warmup:]) for rows in runs]
    return {"steps": len(measured), "s_per_step": statistics.mean(times),
            "s_per_step_std": statistics.stdev(times) if len(times) > 1 else 0.0,
            "s_per_step_median": statistics.median(times), "tokens_per_step": tokens_per_step,
            "tokens_per_s": sum(row["tokens"] for row in measured) / sum(times),
            "tokens_per_s_median": tokens_per_step / statistics.median(times), "tokens_per_s_best_run": max(per_run),
            "run_tokens_per_s": [round(x) for x in per_run],
            "run_medians": [round(statistics.median(row["step_s"] for row in rows[warmup:]), 3) for rows in runs],
            "response_len": statistics.mean(row[response_len] for row in measured),
            "reward_mean": statistics.mean(row[reward] for row in measured),
            "warmup_s": [round(row["step_s"], 2) for rows in runs for row in rows[:warmup]]}


def breakdown(runs: list[list[dict]], keys: list[str], warmup: int) -> list[tuple[str, float, float]]:
    measured = [row for rows in runs for row in rows[warmup:]]
    total = statistics.mean(row["step_s"] for row in measured)
    return [(k, m, m / total) for k in keys for m in [statistics.mean(row[k] for row in measured)]]


def wait_for_load(limit: float, timeout_s: float = 300.0) -> None:
    """Sleep until the 1-minute load average is below `limit` (0: don't wait), at most `timeout_s`."""
    t0 = time.time()
    while limit and float(loadavg().split()[0]) >= limit and time.time() - t0 < timeout_s:
        time.sleep(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="recipe key=value overrides applied to both frameworks")
    p.add_argument("--recipe", default="recipes/quickstart.yaml")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the averages")
    p.add_argument("--rounds", type=int, default=2,
                   help="runs per framework; the order alternates (credo, TRL, TRL, credo, ...) so that a change in "
                        "the machine's load falls on both alike")
    p.add_argument("--threads", type=int, default=2, help="torch threads for both frameworks")
    p.add_argument("--wait-load", type=float, default=0.0,
                   help="before each run, wait (up to 5 min) until the 1-minute load average is below this; 0: don't")
    p.add_argument("--trl-venv", default=str(ROOT / ".cache" / "trl-venv"))
    p.add_argument("--trl-spec", default=TRL_SPEC, help="pip requirement for TRL when the venv is created")
    p.add_argument("--out", default=None, help="work folder (default .cache/e2e_throughput/<time>)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...",
                   help="a credo run with these extra overrides (credo only; repeatable), e.g. "
                        "'packed:algo.packing=true,algo.micro_batch_tokens=4096'")
    p.add_argument("--no-trl", action="store_true", help="run the credo variants only (no TRL venv or runs)")
    args = p.parse_args()
    variants = {"credo": []}
    for spec in args.variant:
        name, _, items = spec.partition(":")
        if not name or name in variants or name == "trl":
            raise SystemExit(f"--variant {spec!r}: expected NAME:key=value,... with a new name (not credo or trl)")
        variants[name] = split_overrides(items)
    if args.steps <= args.warmup + 1:
        raise SystemExit(f"--steps {args.steps}: expected more than --warmup + 1 = {args.warmup + 1}")

    from credo.config import load_recipe

    r = load_recipe(ROOT / args.recipe, args.overrides)
    out_dir = Path(args.out or ROOT / ".cache" / "e2e_throughput" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out_dir.mkdir(parents=True, exist_ok=False)
    info = machine_info()
    trl_py, trl_versions = None, {"trl": "-", "accelerate": "-"}
    if not args.no_trl:
        trl_py = ensure_trl_venv(Path(args.trl_venv), args.trl_spec)
        trl_versions = venv_versions(trl_py)
        if trl_versions["torch"] != info["torch"] or trl_versions["transformers"] != info["transformers"]:
            print(f"warning: TRL venv has torch {trl_versions['torch']} / transformers {trl_versions['transformers']}, "
                  f"credo has {info['torch']} / {info['transformers']}", flush=True)
    job = build_job(r, args.steps, args.threads, out_dir)

    names = [*variants, *([] if args.no_trl else ["trl"])]
    runs: dict[str, list] = {name: [] for name in names}
    wall = {name: 0.0 for name in names}
    load = [("start", loadavg())]
    for k in range(args.rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            wait_for_load(args.wait_load)
            print(f"round {k + 1}/{args.rounds}: {name} (load average {loadavg()}) ...", flush=True)
            load.append((f"before {name}{k + 1}", loadavg()))
            if name == "trl":
                rows, w = run_trl(trl_py, job, out_dir, f"trl{k + 1}")
            else:
                rows, w = run_credo(args.recipe, [*args.overrides, *variants[name]], args.steps, args.threads, out_dir,
                                    f"{name}{k + 1}")
            runs[name].append(rows)
            wall[name] += w
    load.append(("end", loadavg()))

    report(r, args, runs, wall, load, info, trl_versions, job, out_dir)
    return 0


def split_overrides(items: str) -> list[str]:
    """'a=1,b={x: 1, y: 2},c=3' -> ['a=1', 'b={x: 1, y: 2}', 'c=3'] (commas inside braces or brackets stay)."""
    out, depth, cur = [], 0, ""
    for ch in items:
        depth += ch in "{[" and 1 or ch in "}]" and -1 or 0
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [x.strip() for x in out + [cur] if x.strip()]


def report(r, args, runs: dict, wall: dict, load: list, info: dict, trl_versions: dict, job: dict, out_dir: Path) -> None:
    """Print the tables (each credo variant against TRL and against plain credo) and write summary.json."""
    ro = r.rollout
    res = {name: summarise(rows, args.warmup, *(("response_len", "reward_mean") if name == "trl" else
                                                  ("train/response_len", "train/reward_mean")))
           for name, rows in runs.items()}
    for name in res:
        res[name]["process_wall_s"] = wall[name]
    ratios = {}
    for name in res:
        for base in ("trl", "credo"):
            if name != base and base in res:
                ratios[f"{name}/{base}"] = {k: res[name][k] / res[base][k] for k in
                                            ("tokens_per_s", "tokens_per_s_median", "tokens_per_s_best_run")}
                ratios[f"{name}/{base}"]["s_per_step"] = res[base]["s_per_step"] / res[name]["s_per_step"]
    print(f"\n# e2e GRPO throughput, {args.recipe} {' '.join(args.overrides)}".rstrip())
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {info['nproc']} x {info['cpu']}, threads={args.threads}")
    print("# load average (1/5/15 min): " + "; ".join(f"{when} {avg}" for when, avg in load))
    print(f"# torch {info['torch']}, transformers {info['transformers']}, trl {trl_versions['trl']}, "
          f"accelerate {trl_versions['accelerate']}")
    print(f"# batch {ro.prompts_per_step} prompts x {ro.group_size} samples, max_new_tokens {ro.max_new_tokens}; "
          f"{args.rounds} runs x {args.steps} steps per framework, first {args.warmup} of each run dropped; "
          f"TRL loss_type={job['config']['loss_type']}, {job['config']['gradient_accumulation_steps']} micro-batch(es) "
          "per step")
    for spec in args.variant:
        print(f"# variant {spec}")
    print("\n| run | steps measured | s/step (mean ± std) | s/step median | tokens/step | tokens/s "
          "| tokens/s at median | tokens/s best run | response len | reward mean |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, s in res.items():
        label = f"TRL GRPOTrainer {trl_versions['trl']}" if name == "trl" else name
        print(f"| {label} | {s['steps']} | {s['s_per_step']:.3f} ± {s['s_per_step_std']:.3f} | {s['s_per_step_median']:.3f} "
              f"| {s['tokens_per_step']:.0f} | {s['tokens_per_s']:.0f} | {s['tokens_per_s_median']:.0f} "
              f"| {s['tokens_per_s_best_run']:.0f} "
              f"| {s['response_len']:.2f} | {s['reward_mean']:.3f} |")
    print()
    for pair, x in ratios.items():
        print(f"{pair} tokens/s: {x['tokens_per_s']:.2f}x over all measured steps, {x['tokens_per_s_median']:.2f}x at "
              f"the median step time, {x['tokens_per_s_best_run']:.2f}x best run against best run; "
              f"step time {x['s_per_step']:.2f}x shorter")
    for name, s in res.items():
        print(f"{name}: tokens/s of each run {s['run_tokens_per_s']}, median s/step {s['run_medians']}; dropped warm-up "
              f"steps (s) {s['warmup_s']}; process wall time {s['process_wall_s']:.0f} s in all")
    for name in res:
        keys = TRL_BREAKDOWN if name == "trl" else CREDO_BREAKDOWN
        print(f"\n{name} mean step-time breakdown (measured steps):")
        print("| part | s/step | share |\n|---|---|---|")
        for part, m, share in breakdown(runs[name], keys, args.warmup):
            print(f"| {part} | {m:.3f} | {share:.0%} |")
    summary = {"results": res, "ratios": ratios, "load": load, "machine": info, "trl_venv": trl_versions,
               "args": vars(args), "trl_config": job["config"]}
    if "credo/trl" in ratios:  # the keys earlier summaries had
        summary.update(ratio=ratios["credo/trl"]["tokens_per_s"], ratio_median=ratios["credo/trl"]["tokens_per_s_median"],
                       ratio_best_run=ratios["credo/trl"]["tokens_per_s_best_run"])
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nfiles: {out_dir}")


if __name__ == "__main__":
    sys.exit(main())
