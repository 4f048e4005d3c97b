"""credo: reinforcement-learning losses and credit assignment for LLM post-training.

`credo.algos` and `credo.credit` are pure torch; importing `credo` itself pulls in nothing heavy.

The Python API (credo.api): `credo.train(recipe, overrides=None, **sections) -> Path` (the run folder),
`credo.check(...)` and `credo.evaluate(model, recipe, ...)`; each imports the trainer only when called.
"""

__version__ = "0.1.0"

from credo import _moved

_moved.install()  # old import paths (credo.envs, credo.train.critic, ...) keep working for one release


def __getattr__(name: str):
    """`credo.train`, imported on first use: the package credo/train, callable as credo.train(recipe, ...)
    (credo.api.train). Imported lazily so `import credo.config` loads no other credo package."""
    if name == "train":
        import importlib

        return importlib.import_module("credo.train")
    raise AttributeError(f"module 'credo' has no attribute {name!r}")


def check(recipe, overrides=None, **sections) -> list:
    """Every check `credo run` makes before its first step, running nothing; returns notes. See `credo.api.check`."""
    from credo.api import check as run_checks

    return run_checks(recipe, overrides, **sections)


def evaluate(model, recipe, overrides=None, *, samples=None, temperature=None, **sections) -> dict:
    """The recipe's held-out evaluation of a saved model (`credo eval`). See `credo.api.evaluate`."""
    from credo.api import evaluate as run_eval

    return run_eval(model, recipe, overrides, samples=samples, temperature=temperature, **sections)
