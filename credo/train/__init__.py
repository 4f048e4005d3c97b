"""The trainer's stages: a rollout source, a reward model, an advantage stage, a scorer with probes, an
objective, an updater and the trainer state, built from a recipe by `credo.train.build`.

See docs/architecture.md. This package's `__init__` imports nothing, so `credo check` stays light.
"""
