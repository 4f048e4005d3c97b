"""Every registry entry, and every public function of FUNCTION_MODULES, must have a naive
reference in some tests/**/naive_*.py file."""

from __future__ import annotations

import importlib

from credo.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from tests.reference_registry import FUNCTION_MODULES, REFERENCES, load_registries, naive_module_paths


def test_naive_modules_are_found():
    names = {p.name for p in naive_module_paths()}
    assert {"naive_losses.py", "naive_advantages.py", "naive_kl.py", "naive_asyppo.py"} <= names


def test_every_registry_entry_has_a_naive_reference():
    load_registries()
    missing = [
        (kind, name)
        for kind, registry in (("policy_loss", POLICY_LOSSES), ("advantage", ADVANTAGE_ESTIMATORS), ("kl", KL_ESTIMATORS))
        for name in sorted(registry)
        if (kind, name) not in REFERENCES
    ]
    assert not missing, f"registry entries without a naive reference in tests/**/naive_*.py: {missing}"


def test_every_listed_public_function_has_a_naive_reference():
    load_registries()
    missing = [
        f"{module}.{name}"
        for module in FUNCTION_MODULES
        for name in importlib.import_module(module).__all__
        if ("function", name) not in REFERENCES
    ]
    assert not missing, f"public functions without a naive reference in tests/**/naive_*.py: {missing}"
