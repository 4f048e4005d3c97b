"""Naive reference implementations, keyed by (kind, name), for checking every registry entry.

Naive references live in files named ``tests/**/naive_*.py``, written independently of the
library with explicit Python loops over sequences and tokens, and register themselves with::

    from tests.reference_registry import reference

    @reference("policy_loss", "ipa", make_kwargs=lambda B, T, generator: {"chunk_ids": ...})
    def ipa(log_probs, old_log_probs, advantages, mask, **kwargs):
        ...

Kinds and the signature each reference must have (the same as the library entry it checks):

- ``"policy_loss"``: ``ref(log_probs, old_log_probs, advantages, mask, **kwargs) -> loss`` (0-d,
  differentiable w.r.t. ``log_probs``), accepting the common loss keywords (weights,
  rollout_log_probs, correction*, agg_mode, global_tokens, global_seqs, norm_len). The helper
  ``tests.algos.naive_common.naive_policy_loss`` does those common parts with loops, so a
  reference only writes the per-token term.
- ``"advantage"``: same signature as the estimator, returns its output.
- ``"kl"``: ``ref(log_probs, ref_log_probs) -> [B, T]``.
- ``"function"``: a public function outside the registries (e.g. ``credo.algos.critic_shards``),
  keyed by its name; same signature and outputs as the library function. The modules whose
  ``__all__`` must be covered this way are listed in ``FUNCTION_MODULES``.

``make_kwargs(B, T, generator) -> dict`` (optional) draws the extra keywords a loss needs or
varies (e.g. ``scores``, ``chunk_ids``, clip values) with the given ``torch.Generator``; the
generic tests pass the same dict to the library function and to the reference.

A coverage test (tests/algos/test_reference_coverage.py) imports every ``naive_*.py`` file and
fails if any registry name, or any public name of a module in ``FUNCTION_MODULES``, lacks a
reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

REFERENCES: dict[tuple[str, str], Callable] = {}
MAKE_KWARGS: dict[tuple[str, str], Callable] = {}
KINDS = ("policy_loss", "advantage", "kl", "function")
FUNCTION_MODULES = ("credo.algos.asyppo", "credo.algos.distill")
"""Modules every name of whose ``__all__`` needs a ``("function", name)`` reference."""
TESTS_DIR = Path(__file__).resolve().parent


def reference(kind: str, name: str, *, make_kwargs: Callable | None = None) -> Callable[[Callable], Callable]:
    """Records ``fn`` as the naive reference of registry entry ``name`` of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind is {kind!r}, expected one of {list(KINDS)}")

    def decorator(fn: Callable) -> Callable:
        old = REFERENCES.get((kind, name))
        if old is not None and old.__module__ != fn.__module__:
            raise ValueError(f"two references for ({kind!r}, {name!r}): {old.__module__} and {fn.__module__}")
        REFERENCES[(kind, name)] = fn
        if make_kwargs is not None:
            MAKE_KWARGS[(kind, name)] = make_kwargs
        return fn

    return decorator


def extra_kwargs(kind: str, name: str, B: int, T: int, generator) -> dict:
    """The extra keywords a reference declared (empty dict when none)."""
    make = MAKE_KWARGS.get((kind, name))
    return {} if make is None else dict(make(B, T, generator))


def load_registries() -> None:
    """Imports everything that registers entries or references: ``credo.algos`` (which registers
    every built-in entry, ``ipa`` included), every module of ``credo.credit`` (in case one registers
    an entry of its own) and every naive module."""
    import pkgutil

    import credo.algos  # noqa: F401
    import credo.credit

    for info in pkgutil.walk_packages(credo.credit.__path__, "credo.credit."):
        importlib.import_module(info.name)
    load_naive_modules()


def naive_module_paths() -> list[Path]:
    return sorted(TESTS_DIR.rglob("naive_*.py"))


def load_naive_modules() -> list:
    """Imports every ``tests/**/naive_*.py`` (as ``tests.<sub>.naive_x``) so their references register."""
    modules = []
    repo_root = TESTS_DIR.parent
    for path in naive_module_paths():
        dotted = ".".join(path.relative_to(repo_root).with_suffix("").parts)
        if dotted in sys.modules:
            modules.append(sys.modules[dotted])
            continue
        try:
            modules.append(importlib.import_module(dotted))
        except ModuleNotFoundError as err:
            if err.name is None or not dotted.startswith(err.name):
                raise
            # The folder is not a package (no __init__.py): load the file directly.
            spec = importlib.util.spec_from_file_location(dotted, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[dotted] = module
            spec.loader.exec_module(module)
            modules.append(module)
    return modules
