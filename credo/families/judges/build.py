"""Build-time parts of the judges family (`credo.family`): the judge model's folder and tokenizer, at preflight."""

from __future__ import annotations


def preflight(r) -> list[str]:
    """judge.path exists and its tokenizer loads (a hub id not cached here is a note, not an error)."""
    from credo.preflight import check_model

    return check_model(r.judge.path, key="judge.path") if r.judge.path else []
