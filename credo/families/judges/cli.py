"""`credo bon RECIPE.yaml --n 1 4 16 --out FILE.json`: best-of-N accuracy with the recipe's CE-RM judge (the judges
family's verb, `Family.commands`; imports nothing heavy until it runs)."""

from __future__ import annotations

import logging


def add_parser(sub) -> None:
    """`credo bon RECIPE [overrides] --n ... --out ...`."""
    p_bon = sub.add_parser("bon", help="best-of-N accuracy of the policy's samples picked by the recipe's judge "
                           "(CE-RM pointwise, credo.families.judges.best_of_n) vs a random and the verifier's pick")
    p_bon.add_argument("recipe", help="path to a YAML recipe with a CE-RM judge (recipes/ce_rm_bon.yaml)")
    p_bon.add_argument("overrides", nargs="*", help="key=value overrides, as for `credo run`")
    p_bon.add_argument("--n", type=int, nargs="+", default=[1, 4, 16], help="the N, prefixes of max(N) samples")
    p_bon.add_argument("--out", default=None, help="write the result (table, scores, verdicts) as JSON here")
    p_bon.set_defaults(handler=bon, needs_logging=True)


def bon(args) -> int:
    """`credo bon`: the checks first (a ConfigError before any model loads), then the table on stdout."""
    import json

    from credo.cli import _library_verbosity
    from credo.config import load_recipe
    from credo.families.judges.best_of_n import check_bon, run_best_of_n

    recipe = load_recipe(args.recipe, args.overrides)
    _library_verbosity(recipe.run.verbose)
    check_bon(recipe, args.n)
    res = run_best_of_n(recipe, args.n, log=lambda m: logging.getLogger("credo").info(m))
    print("N\tjudge\trandom\toracle")
    for n, row in res["table"].items():
        print(f"{n}\t{row['judge']:.3f}\t{row['random']:.3f}\t{row['oracle']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f)
        print(f"credo: wrote {args.out}")
    return 0
