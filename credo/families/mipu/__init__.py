"""The MIPU family (arXiv 2606.29526): validate each update on held-out training prompts, roll back a bad one.

    config.py   the `mipu:` section and its checks
    gate.py     StepGate: the accept-or-roll-back step hook, and the random-rollback control

Step 1 (the `mipu` policy loss) is `credo.algos.mipu`; the mismatch metrics every run logs are core
(`credo.train.mismatch`). Active when `mipu.enabled` or `mipu.random_rollback > 0`: its step hook then snapshots
the trainer state before each step and, after the sync, accepts the update or restores the snapshot; with
`mipu.enabled` the last `mipu.val_prompts` training problems are held out of the rollouts. See docs/mipu.md.
"""

from credo.families.mipu.config import MipuConfig, check_mipu
from credo.family import Family


def _section(r):
    return getattr(r, "mipu", None)


def _active(r) -> bool:
    m = _section(r)
    return m is not None and (m.enabled or m.random_rollback > 0)


def _holdout(r) -> int:
    m = _section(r)
    return m.val_prompts if m is not None and m.enabled else 0


FAMILY = Family(
    name="mipu",
    doc="MIPU: sampler-referenced IS loss and accept-or-roll-back of each update (arXiv 2606.29526)",
    section="mipu",
    config=MipuConfig,
    check=check_mipu,
    active=_active,
    holdout=_holdout,
    build="credo.families.mipu.gate",
)
