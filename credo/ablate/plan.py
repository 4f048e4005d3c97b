"""A sweep's runs: every (variant, seed) with its overrides and loaded recipe, grouped by SFT warm-up.

Every run is `python -m credo.cli run BASE <runner defaults> <overrides> <variant overrides> [sft.seed=<w>]
run.seed=<s> run.output_dir=<output_dir>/runs/<variant>/seed<s>`, with w the sweep's warmup_seed: the run's
seed s by default (each seed trains its own warm-up, shared by the variants of that seed), a pinned integer,
or nothing (warmup_seed: recipe). Its recipe is loaded here with
`credo.config.load_recipe`, so an unknown key or a bad value stops the sweep, naming the variant and the
key, before any run starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from credo.ablate.spec import WARMUP_SEED_KEY, Sweep, _fail
from credo.config import ConfigError, Recipe, RunConfig, load_recipe, recipe_to_yaml

RESULT_NEUTRAL = ("output_dir", "threads", "progress", "plot", "resume")
"""`run.*` settings that do not change a run's results (where it writes, threads, display, resuming)."""


@dataclass
class Run:
    variant: str
    seed: int
    run_dir: Path
    overrides: list[str]
    """Everything passed after the base recipe, in order."""
    recipe: Recipe
    config_hash: str
    warmup_group: str | None
    """Runs with the same group share one cached SFT warm-up (None: no warm-up)."""
    action: str = "new"
    """new, resume, restart (config changed, unfinished), done or stale (config changed, finished)."""
    status: str = "pending"
    exit_code: int | None = None
    wall_s: float | None = None
    error_tail: str = ""
    stale_diff: list[str] = field(default_factory=list)


def config_hash(r: Recipe) -> str:
    """Hash of the resolved recipe without the settings in RESULT_NEUTRAL (reset to their defaults)."""
    defaults = RunConfig()
    run = dataclasses.replace(r.run, **{k: getattr(defaults, k) for k in RESULT_NEUTRAL})
    return hashlib.sha256(recipe_to_yaml(dataclasses.replace(r, run=run)).encode()).hexdigest()[:16]


def warmup_group(r: Recipe, *, build: bool = True) -> str | None:
    """The SFT warm-up a run needs, as the trainer's cache key (runs that share it share one warm-up).

    With build=False (a dry run, which writes nothing) a built-in tiny model that is not built yet is keyed
    by its config instead of its contents: the same grouping, not the trainer's key.
    """
    if not (r.sft.enabled and r.sft.steps > 0):
        return None
    from credo.sft import sft_cache_key

    if not build and r.model.path == "tiny":
        from credo.sft import tiny_model_stand_in_key

        return tiny_model_stand_in_key(r)
    return sft_cache_key(r, r.model.path)


def _warmup_override(sweep: Sweep, seed: int) -> list[str]:
    if sweep.warmup_seed == "recipe":
        return []
    return [f"{WARMUP_SEED_KEY}={seed if sweep.warmup_seed == 'run' else sweep.warmup_seed}"]


def plan_runs(sweep: Sweep, *, threads: int, build: bool = True) -> list[Run]:
    """Every (variant, seed) run with its overrides, validated by loading its recipe; nothing is started.

    Args:
        sweep: the loaded sweep file.
        threads: run.threads of each run (the runner divides the cores among the runs at once).
        build: whether the built-in tiny model may be built into the cache to key the warm-ups (False: a
            dry run, which writes nothing).

    Raises:
        ConfigError: a run's overrides do not load, naming the variant, the seed and the key.
    """
    runs = []
    defaults = ["run.progress=false", "run.plot=false", f"run.threads={threads}"]
    for variant, vo in sweep.variants.items():
        for seed in sweep.seeds:
            run_dir = sweep.output_dir / "runs" / variant / f"seed{seed}"
            overrides = (defaults + sweep.overrides + vo + _warmup_override(sweep, seed)
                         + [f"run.seed={seed}", f"run.output_dir={run_dir}"])
            try:
                recipe = load_recipe(sweep.base, overrides)
            except ConfigError as e:
                raise _fail(sweep.path, f"variant '{variant}' (seed {seed}): {e}") from None
            runs.append(Run(variant=variant, seed=seed, run_dir=run_dir, overrides=overrides, recipe=recipe,
                            config_hash=config_hash(recipe), warmup_group=warmup_group(recipe, build=build)))
    return runs
