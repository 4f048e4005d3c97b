"""Build-time parts of the critic family (`credo.family`): what `credo check` and `credo run` check before any
warm-up, so that a critic folder that cannot load fails in seconds, naming `critic.path`."""

from __future__ import annotations

from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """critic.path, when it names a folder or hub id: it exists, has config.json and its tokenizer loads (None is
    the actor's own weights and 'tiny' is built here, both checked with model.path)."""
    path = r.critic.path
    if path is None or path == "tiny":
        return []
    from credo.preflight import check_model

    return check_model(path, key="critic.path")


PARTS = FamilyParts(preflight=preflight)
