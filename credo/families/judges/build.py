"""Build-time parts of the judges family (`credo.family`): the judge model's folder and tokenizer, at preflight."""

from __future__ import annotations

from credo.family import FamilyParts


def preflight(r) -> list[str]:
    """judge.path exists and its tokenizer loads (a hub id not cached here is a note, not an error); with
    cluster.engine: ray and judge workers, the judge role can be placed (judge actors)."""
    from credo.preflight import check_cluster_placement, check_model

    notes = check_model(r.judge.path, key="judge.path") if r.judge.path else []
    if r.cluster.engine == "ray" and r.cluster.judge.workers:
        notes += check_cluster_placement(r, ("judge",))
    return notes


PARTS = FamilyParts(preflight=preflight)
