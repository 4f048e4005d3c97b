"""`credo simulate`: run a scenario, fit lengths from rollout dumps, calibrate costs, validate against a run.

    credo simulate run benchmarks/simulate/rollpacker.yaml --out runs/sim/rollpacker
    credo simulate fit runs/longtail                       # response-length quantiles and the fitted model
    credo simulate calibrate --recipe recipes/longtail.yaml --run runs/longtail-calib --out costs.yaml
    credo simulate validate --recipe recipes/longtail.yaml --run runs/longtail --costs costs.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="credo simulate", description="discrete-event simulator of RL post-training "
                                "schedules on a cluster of rollout and training devices (credo.simulate)")
    sub = p.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="simulate every mode of a scenario file; print and write the table and plot")
    run.add_argument("scenario", help="a scenario YAML file (see benchmarks/simulate/)")
    run.add_argument("--out", default=None, help="folder for table.md, plot.png and results.json (default: none)")
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    fit = sub.add_parser("fit", help="response-length quantiles of rollout dumps and the fitted length model")
    fit.add_argument("dumps", help="a run folder (its rollouts/step_*.jsonl) or a glob of dump files")
    cal = sub.add_parser("calibrate", help="fit this machine's costs for a recipe's model from a calibration run's "
                         "perf/* metrics and dumps (and optionally a timed generate grid)")
    cal.add_argument("--recipe", required=True, help="the recipe whose model and rollout settings to measure")
    cal.add_argument("--run", required=True, help="a calibration run folder (metrics.jsonl and rollouts/ dumps)")
    cal.add_argument("--out", required=True, help="write the fitted costs here (YAML)")
    cal.add_argument("--decode-from", choices=("run", "grid"), default="run",
                     help="fit decode costs from the calibration run's rollout steps (default) or a timed generate grid")
    cal.add_argument("--repeats", type=int, default=3, help="timed repeats per generate grid point (median kept)")
    cal.add_argument("overrides", nargs="*", help="recipe key=value overrides, as for `credo run` (e.g. run.threads=1)")
    val = sub.add_parser("validate", help="simulate a measured synchronous run and compare step times")
    val.add_argument("--recipe", required=True, help="the run's recipe")
    val.add_argument("--run", required=True, help="the measured run folder (metrics.jsonl and rollouts/ dumps)")
    val.add_argument("--costs", required=True, help="costs YAML from `calibrate` (measured separately)")
    val.add_argument("--lengths-from", default=None,
                     help="a different run whose dumps give the length distribution (default: replay only)")
    val.add_argument("--mode", default="sync", help="the mode the run used: sync, tail_batching or async (the "
                     "overlap schedule's hf worker; with --lengths-from)")
    val.add_argument("--out", default=None, help="write the comparison table (markdown) here")
    val.add_argument("overrides", nargs="*", help="recipe key=value overrides the run was started with")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "run":
            return _run(args)
        if args.action == "fit":
            return _fit(args)
        if args.action == "calibrate":
            from credo.simulate.calibrate import calibrate

            calibrate(args.recipe, args.run, args.out, repeats=args.repeats, overrides=args.overrides,
                      decode_from=args.decode_from)
            print(Path(args.out).read_text(), end="")
            return 0
        from credo.simulate.validate import validate

        table = validate(args.recipe, args.run, args.costs, lengths_from=args.lengths_from, mode=args.mode,
                         overrides=args.overrides)
        print(table, end="")
        if args.out:
            Path(args.out).write_text(table)
        return 0
    except (ValueError, FileNotFoundError) as e:
        print(f"credo simulate: error: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from credo.simulate.report import markdown_table, plot
    from credo.simulate.runner import simulate
    from credo.simulate.scenario import load_scenario

    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None}
    scn = load_scenario(args.scenario, overrides)
    results = simulate(scn)
    table = markdown_table(results, scn.baseline)
    print(f"# {scn.name}: {scn.steps} steps, seed {scn.seed}\n\n{table}", end="")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(table)
        plot(results, out / "plot.png", f"{scn.name}: seconds per step")
        rows = [{k: v for k, v in vars(r).items() if k != "records"} for r in results]
        (out / "results.json").write_text(json.dumps(rows, indent=1))
        print(f"\nwrote {out / 'table.md'}, {out / 'plot.png'}, {out / 'results.json'}")
    return 0


def _fit(args) -> int:
    from credo.simulate.lengths import dump_paths, fit_dumps, quantiles

    paths = dump_paths(args.dumps)
    if not paths:
        raise ValueError(f"{args.dumps}: no rollout dumps (expected rollouts/step_*.jsonl)")
    m = fit_dumps(paths)
    flat = [x for g in m.groups for x in g]
    q = quantiles(flat)
    print(f"{len(flat)} responses in {len(m.groups)} prompt groups from {len(paths)} dump files")
    print("| quantile | " + " | ".join(f"{k:g}" for k in q) + " |\n|---|" + "---|" * len(q))
    print("| tokens | " + " | ".join(f"{v:.0f}" for v in q.values()) + " |")
    print(f"mean {sum(flat) / len(flat):.1f}; lognormal summary: median {m.median:.1f}, sigma_prompt "
          f"{m.sigma_prompt:.3f}, sigma_response {m.sigma_response:.3f}; prompt_len {m.prompt_len}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
