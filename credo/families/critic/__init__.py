"""The critic family: PPO with value models and GAE, and AsyPPO's mini-critics (arXiv 2510.01656).

    config.py       the `critic:` section and its checks
    stage.py        CriticAdvantage: the advantage stage that owns the critics' engines (GAE, value updates)
    value_model.py  a causal LM with a scalar value head

Active when `critic.num_critics >= 1` (with `algo.advantage: gae`): the critic stage then replaces the default
advantage stage. See docs/critics.md.
"""

from credo.families.critic.config import CriticConfig, check_critic
from credo.family import Family, StageEntry



def _active(r) -> bool:
    c = getattr(r, "critic", None)
    return c is not None and c.num_critics > 0


FAMILY = Family(
    name="critic",
    doc="PPO with value models (GAE) and AsyPPO mini-critics (arXiv 2510.01656)",
    section="critic",
    config=CriticConfig,
    check=check_critic,
    stages={"advantage": {"critic": StageEntry("credo.families.critic.stage:critic_stage")}},
    active=_active,
    stage_defaults=lambda r: {"advantage": "critic"},
    build="credo.families.critic.build",  # its preflight: critic.path loads before any warm-up
    fixed_on_resume=("critic.num_critics", "critic.path", "critic.tiny"),  # the value models in the checkpoint
)
