"""`credo run RECIPE.yaml key=value ...`, `credo check RECIPE.yaml ...` (validate only), `credo ablate SWEEP.yaml`,
`credo list` (the names a recipe can use), `credo export CHECKPOINT_DIR OUT_DIR` (a checkpoint as a Hugging Face
model folder, or its LoRA adapter with --adapter), `credo eval MODEL RECIPE_OR_TASK` (a recipe's evaluation of a saved
model), the built-in families' own verbs (`Family.commands`: `credo --help` lists them) and `credo --version`."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

from credo import __version__
from credo.cli_support import run_settings_help, unexpected


OTHER_RANK_GRACE_S = 5.0
"""How long a rank other than 0 waits before printing a config error (torchrun stops it first when rank 0 fails)."""


def _quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # read when transformers is imported (importing it here would cost `credo check` ~2 s); its progress
    # bars follow HF_HUB_DISABLE_PROGRESS_BARS
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:  # already imported (a caller of main() in-process): set it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    for name in ("DeepSpeed", "deepspeed", "torch.distributed", "vllm"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from credo.tracking import CPU_ACCELERATOR_NOTE

    logging.getLogger("DeepSpeed").addFilter(CPU_ACCELERATOR_NOTE)  # deepspeed.utils.logger is this logger


def _library_verbosity(verbose: bool) -> None:
    """run.verbose: let DeepSpeed's and vLLM's INFO lines through; otherwise warnings only, in the vLLM
    engine's child processes too (they read VLLM_LOGGING_LEVEL; an exported value wins)."""
    level = logging.INFO if verbose else logging.WARNING
    for name in ("DeepSpeed", "deepspeed", "vllm"):
        logging.getLogger(name).setLevel(level)
    if verbose:
        from credo.tracking import CPU_ACCELERATOR_NOTE

        logging.getLogger("DeepSpeed").removeFilter(CPU_ACCELERATOR_NOTE)
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def _error(message: str) -> None:
    """One line on stderr, from rank 0 only: for failures every rank meets the same way (a config error, an
    interrupt every rank stops at), which torchrun would otherwise print once per process."""
    if _rank() == 0:
        print(message, file=sys.stderr)


def resume_command(recipe: str, overrides: list[str], run_dir) -> str:
    """The `credo run` line that continues an interrupted run in `run_dir`."""
    keep = [o for o in overrides if o.split("=", 1)[0].strip() not in ("run.output_dir", "run.resume")]
    args = ["credo", "run", recipe, *keep, f"run.output_dir={run_dir}", "run.resume=auto"]
    return " ".join(shlex.quote(a) for a in args)


def interrupted_line(e, recipe: str, overrides: list[str]) -> str:
    """The one line a run stopped by Ctrl-C (`RunInterrupted` e) ends with: where it stopped, how to go on."""
    if e.checkpoint is None:
        again = " ".join(shlex.quote(a) for a in ["credo", "run", recipe, *overrides])
        return f"credo: interrupted at step {e.step} before any checkpoint; start again with: {again}"
    older = "" if e.checkpoint == e.step else f", newest checkpoint at step {e.checkpoint}"
    return f"credo: interrupted at step {e.step}{older}; resume with: {resume_command(recipe, overrides, e.run_dir)}"


def _names(title: str, names, indent: str = "  ") -> str:
    return f"{title}:\n" + textwrap.fill(", ".join(names), width=100, initial_indent=indent, subsequent_indent=indent)


def list_names() -> str:
    """The registered names a recipe can select, and the credit strategies of credo.credit, as text."""
    from credo import algos
    from credo.algos.advantages import GROUP_ESTIMATORS
    from credo.credit.attention import RHYTHM_STRATEGIES
    from credo.tasks import task_names

    runnable = sorted(n for n, kind in algos.ADVANTAGE_INPUTS.items() if kind == "outcome")
    library = sorted(set(algos.ADVANTAGE_ESTIMATORS) - set(runnable) - {"gae"})
    try:
        from reasoning_gym.factory import DATASETS

        rg = _names(f"  rg:<name>, {len(DATASETS)} reasoning-gym datasets", sorted(DATASETS), indent="    ")
    except ImportError:
        rg = "  rg:<name>: reasoning-gym datasets (pip install 'credo[envs]' to list them)"
    from credo.config import AGG_MODES
    from credo.family import builtin_families, family_listings, stage_names
    from credo.train.registry import KINDS, STAGES

    fams = builtin_families()
    stages = "\n".join(_names(f"  {kind} (stages.{kind if kind != 'probe' else 'probes'})",
                               ["default"] * (kind != "probe") + sorted(set(stage_names(fams, kind)) | set(STAGES[kind])),
                               indent="    ") for kind in KINDS)
    sections = [
        _names("policy losses (algo.policy_loss)", sorted(algos.POLICY_LOSSES)),
        _names("loss aggregation (algo.agg_mode)", list(AGG_MODES)),
        _names("advantage estimators (algo.advantage; * needs rollout.group_size >= 2)",
               [n + ("*" if n in GROUP_ESTIMATORS else "") for n in runnable]),
        _names("advantage estimators with value models (algo.advantage + critic.num_critics >= 1; docs/critics.md)",
               ["gae"]),
        _names("advantage estimators in credo.algos only (per-token rewards, values or turns)", library),
        _names("KL estimators (algo.kl_estimator)", sorted(algos.KL_ESTIMATORS)),
        _names("tasks (task.name)", task_names()) + "\n"
        "  file: your JSONL / JSON / Parquet / CSV (task.kwargs: train, eval, prompt_field, answer_field)\n"
        "  hf:<name-or-folder>: a Hugging Face data set (save_to_disk folder or load_dataset name)\n" + rg,
        "stages (or 'package.module:factory'):\n" + stages,
        _names("families (credo/families/; a recipe adds its own with families: ['pkg.mod:attr'])",
               [f"{f.name}" + (f" (section {f.section}:)" if f.section else "") for f in fams]),
        *[listing(_names) for listing in family_listings(fams)],
        _recipes(),
        "credit strategies (credo.credit, see docs/credit.md):\n"
        "  ipa: chunk-level policy loss (algo.policy_loss=ipa; arXiv 2512.24873)\n"
        f"  rhythm_gamma / attention_rhythm_gamma strategy: {', '.join(RHYTHM_STRATEGIES)} (arXiv 2510.13554)\n"
        "  flow_gamma: FlowTracer answer-conditioned flow (arXiv 2606.10646)",
    ]
    return "\n\n".join(sections)


def _recipes() -> str:
    """The recipes shipped beside the package (a source checkout), as `credo run` takes them."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "recipes"
    found = sorted(str(p.relative_to(root.parent)) for p in root.glob("*.yaml")) if root.is_dir() else []
    gpu = sorted(str(p.relative_to(root.parent)) for p in root.glob("gpu/*.yaml")) if root.is_dir() else []
    if not found:
        return "recipes: none found beside the package (they ship with the source checkout, recipes/)"
    return _names("recipes (credo run RECIPE)", found) + "\n" + _names("  paper-scale GPU configs", gpu, indent="    ")


def _list(args) -> int:
    print(list_names())
    return 0


def _export(args) -> int:
    from credo.export import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, base_model=args.base_model, adapter=args.adapter)
    except (FileNotFoundError, ValueError) as e:
        print(f"credo: error: {e}", file=sys.stderr)
        return 1
    print(f"credo: exported {args.checkpoint} to {out}")
    return 0


def _eval(args) -> int:
    """`credo eval`: the recipe's evaluator on a saved model; the metrics on stdout (and as JSON with --out)."""
    import json

    from credo.evaluation import eval_recipe, evaluate_model

    recipe = eval_recipe(args.recipe, args.overrides)
    _library_verbosity(recipe.run.verbose)
    try:
        result = evaluate_model(args.model, recipe, samples=args.samples, temperature=args.temperature)
    except (FileNotFoundError, ValueError) as e:  # a checkpoint that cannot be read (credo.export)
        print(f"credo: error: {e}", file=sys.stderr)
        return 1
    how = (f"{result['eval_samples']} sample(s) per problem at temperature {result['eval_temperature']}"
           if result["eval_temperature"] > 0 else "greedy")
    print(f"credo eval: {args.model} on {args.recipe} ({how})")  # the header, then its result
    for name, value in result["metrics"].items():
        print(f"{name} = {value:.6g}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"credo: wrote {args.out}")
    return 0


def _ablate(args) -> int:
    from credo.ablate import run_sweep

    return run_sweep(args.sweep, jobs=args.jobs, dry_run=args.dry_run, exploratory=args.exploratory)


def _check(args) -> int:
    """`credo check`: load the recipe and run every check `credo run` makes before its first step; one OK line
    (the resolved config too with --show)."""
    from credo.config import load_recipe, recipe_to_yaml
    from credo.train.build import check_run

    recipe = load_recipe(args.recipe, args.overrides)
    _library_verbosity(recipe.run.verbose)
    if recipe.cluster.engine == "ray":
        from credo.distributed.ray.config import address_probe_as_note

        with address_probe_as_note():  # this machine may not be the cluster's: no Ray there is a warning here
            plan = check_run(recipe)
    else:
        plan = check_run(recipe)
    notes = list(plan.notes) + _warmup_notes(plan)
    if args.show:
        print(recipe_to_yaml(recipe), end="")
    for note in notes:  # a note that starts 'warning:' is printed as one
        print(f"credo: {note}" if note.startswith("warning:") else f"credo: note: {note}")
    print(f"credo check: OK ({args.recipe}{', ' + str(len(args.overrides)) + ' overrides' if args.overrides else ''})")
    return 0


def _warmup_notes(plan) -> list[str]:
    """Each warm-up's state for `credo check`: cached, or about how long it will take here (credo.warmup_estimate)."""
    from credo.train.build import run_task
    from credo.warmup_estimate import warmup_notes

    return warmup_notes(plan.recipe, run_task(plan), plan.active)


def _run(args) -> int:
    from credo.config import load_recipe
    from credo.distributed.engine import teardown_distributed
    from credo.errors import RewardFunctionError, TrainingError, UnsafeFileError
    from credo.train.interrupt import RunInterrupted
    from credo.trainer import train

    recipe = load_recipe(args.recipe, args.overrides)
    _library_verbosity(recipe.run.verbose)
    try:
        run_dir = train(recipe)  # checks what the recipe names (credo.preflight) before any warm-up
    except (TrainingError, RewardFunctionError, UnsafeFileError) as e:  # the message says what to fix (a traceback
        # would bury it); UnsafeFileError: a resume from a checkpoint whose file could run code
        print(f"credo: error: {e}", file=sys.stderr)  # every rank: it may have happened on one only
        return 1
    except RunInterrupted as e:
        _error(interrupted_line(e, args.recipe, args.overrides))
        return 130
    if _rank() == 0:
        print(f"credo: run finished: {run_dir}")
    teardown_distributed()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="credo", description="RL losses and credit assignment for LLM post-training")
    parser.add_argument("--version", action="version", version=f"credo {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="train from a recipe", epilog=run_settings_help(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p_run.add_argument("recipe", help="path to a YAML recipe")
    p_run.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.steps=10 algo.policy_loss=cispo")
    p_run.set_defaults(handler=_run, needs_logging=True)
    p_check = sub.add_parser("check", help="load and validate a recipe without running it")
    p_check.add_argument("recipe", help="path to a YAML recipe")
    p_check.add_argument("overrides", nargs="*", help="key=value overrides, as for `credo run`")
    p_check.add_argument("--show", action="store_true", help="also print the resolved config (every key's value)")
    p_check.set_defaults(handler=_check, needs_logging=True)
    p_ablate = sub.add_parser("ablate", help="run a sweep of recipe variants over seeds and tabulate")
    p_ablate.add_argument("sweep", help="path to a sweep YAML file (format in docs/reproductions.md)")
    p_ablate.add_argument("--jobs", type=int, default=0, help="runs at once (default 0: one per GPU, or one per CPU core)")
    p_ablate.add_argument("--dry-run", action="store_true", help="list the runs and what would happen to each; "
                          "start nothing, write nothing")
    p_ablate.add_argument("--exploratory", action="store_true", help="run a sweep file that is not committed in git "
                          "(refused otherwise: its named comparisons must be on record before the runs); every results "
                          "line and table of these runs is marked exploratory")
    p_ablate.set_defaults(handler=_ablate, needs_logging=True)
    from credo.ablate.report_cli import add_report_arguments, report_main

    p_report = sub.add_parser("report", help="remake a sweep's table (markdown) and curves from its results file")
    add_report_arguments(p_report)
    p_report.set_defaults(handler=report_main, needs_logging=False)
    _add_eval(sub)
    p_list = sub.add_parser("list", help="print the policy losses, advantage and KL estimators, tasks and credit strategies")
    p_list.set_defaults(handler=_list, needs_logging=False)
    _add_export(sub)
    _add_family_verbs(sub)
    # `credo simulate` has its own parser (credo.simulate.cli); listed here so `credo --help` shows it
    sub.add_parser("simulate", help="cluster simulator of rollout/training schedules (`credo simulate --help`)")
    return parser


def _add_eval(sub) -> None:
    """`credo eval MODEL RECIPE_OR_TASK`."""
    p_eval = sub.add_parser("eval", help="run a recipe's held-out evaluation on a saved model (a run's final/, a "
                            "checkpoint folder or any Hugging Face model folder) and print the metrics")
    p_eval.add_argument("model", help="a Hugging Face model folder (e.g. runs/NAME/.../final), a run folder holding "
                        "final/, or a checkpoint folder (runs/NAME/.../checkpoints/step_N)")
    p_eval.add_argument("recipe", help="a YAML recipe (its task, evaluator, rollout backend and seeds are used) or a "
                        "task name run with the default recipe (e.g. arithmetic, rg:leg_counting)")
    p_eval.add_argument("overrides", nargs="*",
                        help="key=value overrides, as for `credo run` (e.g. task.eval_size=500)")
    p_eval.add_argument("--samples", type=int, default=None,
                        help="samples per held-out problem (overrides run.eval_samples; needs a temperature > 0)")
    p_eval.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature, 0 = greedy decoding (overrides run.eval_temperature)")
    p_eval.add_argument("--out", default=None, help="also write the metrics, settings and the first 16 samples "
                        "as JSON to this file")
    p_eval.set_defaults(handler=_eval, needs_logging=True)


def _add_export(sub) -> None:
    """`credo export CHECKPOINT OUT_DIR [--adapter]`."""
    p_export = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model folder")
    p_export.add_argument("checkpoint", help="a checkpoint folder, e.g. runs/NAME/checkpoints/step_00000010")
    p_export.add_argument("out_dir", help="the model folder to write (config, safetensors weights, tokenizer)")
    p_export.add_argument("--base-model", default=None,
                          help="the model folder the run started from (default: the checkpoint's policy_path)")
    p_export.add_argument("--adapter", action="store_true",
                          help="a run with model.lora: write its LoRA adapter alone (adapter_config.json, "
                          "adapter_model.safetensors; peft.PeftModel.from_pretrained(base, OUT_DIR) loads it) "
                          "instead of the merged model")
    p_export.set_defaults(handler=_export, needs_logging=False)


def _add_family_verbs(sub) -> None:
    """Each built-in family's verbs (`Family.commands`); a recipe's own families are not known when arguments are
    parsed, so only the built-in ones add verbs."""
    from credo.family import builtin_families, family_commands

    for _, add_parser in family_commands(builtin_families(), set(sub.choices) | {"simulate"}):
        add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the deepspeed launcher appends --local_rank=N; LOCAL_RANK in the environment carries the same
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if argv[:1] == ["simulate"]:  # its own parser, --help included (credo.simulate.cli)
        from credo.simulate.cli import main as simulate_main

        return simulate_main(argv[1:])
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        from credo.cli_support import unknown_option_line

        line = unknown_option_line(args.cmd, unknown)
        if line is None:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        print(line, file=sys.stderr)
        return 2
    if args.needs_logging:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            datefmt="%H:%M:%S")
    _quiet_libraries()
    from credo.errors import ConfigError, UserError

    try:
        return args.handler(args)
    except ConfigError as e:
        if _rank() != 0:
            # every rank meets the same config error; once rank 0 has printed it and exited, the launcher stops
            # this process. Another rank prints only if still running after the wait: its error was its own.
            time.sleep(OTHER_RANK_GRACE_S)
            print(f"credo: config error (rank {_rank()}): {e}", file=sys.stderr)
        else:
            _error(f"credo: config error: {e}")
        return 2
    except UserError as e:  # any other error the user can cause (credo.errors.UserError): one line, every rank
        print(f"credo: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the user's own code, or a bug in credo (then its traceback)
        code = unexpected(e)
        if code is None:
            raise
        return code
    except KeyboardInterrupt as e:  # outside the training loop (model load, warm-up), or during the shutdown
        stopped = e.__context__  # a Ctrl-C while an interrupted run shut down: still say how to resume it
        from credo.train.interrupt import RunInterrupted

        if isinstance(stopped, RunInterrupted):
            _error(interrupted_line(stopped, args.recipe, args.overrides))
        else:
            _error("credo: interrupted; no new checkpoint written")
        return 130


if __name__ == "__main__":
    sys.exit(main())
