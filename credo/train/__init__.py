"""The trainer's stages: a rollout source, a reward model, an advantage stage, a scorer with probes, an
objective, an updater and the trainer state, built from a recipe by `credo.train.build`.

See docs/architecture.md. This package's `__init__` imports nothing heavy, so `credo check` stays light.

`credo.train` is also the Python API's training function: `credo.train(recipe, overrides=None, **sections)`
(`credo.api.train`). The package and the function share the name, so the package's module is made callable.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, recipe, overrides=None, **sections):
        """Train from a recipe (a YAML path, a dict or an OmegaConf config) with overrides; returns the run folder.
        See `credo.api.train`."""
        from credo.api import train

        return train(recipe, overrides, **sections)


sys.modules[__name__].__class__ = _CallablePackage
