"""`stages.schedule: sync` (the default): every sample of step k comes from the weights after step k-1, the source
as it is. Takes no settings and needs nothing of the source, the backend or the engine."""

from __future__ import annotations

from dataclasses import dataclass

from credo.schedules import Schedule


@dataclass
class SyncSettings:
    """No settings: stages.schedule_kwargs must be empty."""


def wrap(source, runtime, settings: SyncSettings):
    return source


SCHEDULE = Schedule(name="sync", doc="synchronous: rollout, then update, every step", settings=SyncSettings, wrap=wrap)
