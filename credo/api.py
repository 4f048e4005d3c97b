"""The Python API: `credo.train`, `credo.check` and `credo.evaluate`, the commands `credo run`, `credo check` and
`credo eval` as functions.

    import credo

    run_dir = credo.train("recipes/quickstart.yaml", ["run.steps=20"])           # -> Path of the run folder
    run_dir = credo.train({"run": {"name": "mine"}, "optim": {"lr": 1e-3}})      # a recipe as a dict
    run_dir = credo.train(cfg, {"optim.lr": 1e-3}, run={"steps": 20})            # an OmegaConf config, overrides
    notes = credo.check("recipes/quickstart.yaml", model={"lora": {"r": 8}})      # every check `credo run` makes
    result = credo.evaluate(run_dir / "final", "recipes/quickstart.yaml")        # {"metrics": {...}, ...}

A recipe is a YAML path, a dict, an OmegaConf config or a loaded `Recipe`. `overrides` is a list of `key=value`
strings (as on the command line) or a dict of dotted keys (`{"optim.lr": 1e-3}`); keyword arguments name whole
sections (`run={"steps": 20}`), whose keys are set one by one as `run.steps=20` (a `*kwargs` mapping is replaced
whole, as on the command line). Loading is as strict as the CLI's: a misspelled key is a `credo.errors.ConfigError`
naming it. Nothing heavy is imported until a function is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def load(recipe: Any, overrides: list[str] | Mapping[str, Any] | None = None, **sections: Any):
    """The `credo.config.Recipe` for `recipe` with `overrides` and `sections` applied (see the module docstring)."""
    from omegaconf import DictConfig

    from credo.config import Recipe, load_recipe, recipe_to_dict

    if isinstance(recipe, Recipe):
        if not overrides and not sections:
            return recipe
        recipe = recipe_to_dict(recipe)
    if not isinstance(recipe, (str, Path, Mapping, DictConfig)):
        raise TypeError(f"recipe is a {type(recipe).__name__}: expected a YAML path, a dict, an OmegaConf config "
                        "or a credo.config.Recipe")
    if isinstance(overrides, str):
        raise TypeError("overrides is a string: expected a list of 'key=value' strings or a dict of dotted keys")
    items: list = list(overrides.items()) if isinstance(overrides, Mapping) else list(overrides or [])
    for name, value in sections.items():
        items += _section_items(name, value)
    if isinstance(recipe, Path):
        recipe = str(recipe)
    elif isinstance(recipe, Mapping) and not isinstance(recipe, DictConfig):
        recipe = dict(recipe)
    return load_recipe(recipe, items)


def _section_items(key: str, value: Any) -> list[tuple[str, Any]]:
    """`run={"steps": 20}` as `[("run.steps", 20)]`: nested mappings key by key, a `*kwargs` mapping whole."""
    if isinstance(value, Mapping) and value and not key.endswith("kwargs"):
        return [item for k, v in value.items() for item in _section_items(f"{key}.{k}", v)]
    return [(key, value)]


def train(recipe: Any, overrides: list[str] | Mapping[str, Any] | None = None, **sections: Any) -> Path:
    """Train from a recipe, as `credo run` does; returns the run folder (metrics.jsonl, checkpoints/, final/).

    Raises:
        credo.errors.ConfigError: the recipe is invalid or points at something missing (before any warm-up).
        credo.errors.TrainingError: the run stopped (non-finite steps, reward failures, nothing to train on).
        credo.train.interrupt.RunInterrupted: Ctrl-C; the step in progress was checkpointed.
    """
    from credo.tracking import python_logging
    from credo.trainer import train as run_training

    python_logging()  # credo's INFO lines and no transformers progress bars, as `credo run` shows
    return Path(run_training(load(recipe, overrides, **sections)))


def check(recipe: Any, overrides: list[str] | Mapping[str, Any] | None = None, **sections: Any) -> list[str]:
    """Every check `credo run` makes before its first step, without running anything (`credo check`); returns
    notes on what could not be checked (e.g. a hub model on an offline machine).

    Raises:
        credo.errors.ConfigError: naming the key at fault.
    """
    from credo.train.build import check_run

    return list(check_run(load(recipe, overrides, **sections)).notes)


def evaluate(model: str | Path, recipe: Any, overrides: list[str] | Mapping[str, Any] | None = None, *,
             samples: int | None = None, temperature: float | None = None, **sections: Any) -> dict:
    """The recipe's held-out evaluation of a saved model (`credo eval`): a run's final/ or run folder, a
    checkpoint folder, or any Hugging Face model folder. `recipe` may also be a task name (`"arithmetic"`).
    `samples` and `temperature` override run.eval_samples and run.eval_temperature.

    Returns:
        {"metrics": {"eval/accuracy": ...}, "model", "eval_samples", "eval_temperature", "samples": [...]}.
    """
    from credo.evaluation import eval_recipe, evaluate_model

    if isinstance(recipe, str) and not Path(recipe).is_file() and not recipe.endswith((".yaml", ".yml")):
        recipe = eval_recipe(recipe)  # a task name
    return evaluate_model(model, load(recipe, overrides, **sections), samples=samples, temperature=temperature)
