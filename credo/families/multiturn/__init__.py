"""The multi-turn family: agents in text environments with GEM's protocol (arXiv 2510.01051), with turn credit.

    config.py       the `env:` section, its checks, the `turn_credit` stage's settings
    envs/           the env registry (`credo:*` built-ins, GEM ids) and the built-in games
    source.py       MultiTurnRollout (the `multiturn` rollout source), EnvReward (the `env` reward stage)
    episodes.py     one step's episodes: reset, model turns, env steps, episode statistics
    env_metrics.py  the envs' own episode metrics (the shop's failure types), averaged as eval/<name>
    turn_credit.py  the `turn_credit` advantage stage: GEM's ReBN, trajectory GRPO, IPA chunk returns
    resample.py     IPA's chunk-level initialised resampling (arXiv 2512.24873)
    task.py         the env's expert episodes as warm-up demonstrations
    build.py        build-time parts: the env id check, the warm-up task, the held-out episode evaluator
    cli.py          its part of `credo list` (the env ids)

Active when `env.id` is set (with `stages.rollout: multiturn`). See docs/multiturn.md.
"""

from dataclasses import asdict

from credo.families.multiturn.config import LATENCY_KEYS, EnvConfig, EnvRoleConfig, TurnCreditSettings, check_env
from credo.capabilities import BATCH_STATE, ENV_EPISODES
from credo.family import Family, StageEntry


def _active(r) -> bool:
    e = getattr(r, "env", None)
    return e is not None and bool(e.id)


def _warmup_digest(r) -> dict:
    # the warm-up trains on the env's expert episodes; how episodes are scheduled and the simulated step latency
    # (which the demonstrations skip) do not change them
    env = asdict(r.env)
    env.pop("trajectory_async")
    env["kwargs"] = {k: v for k, v in env["kwargs"].items() if k not in LATENCY_KEYS}
    return {"env": env}


FAMILY = Family(
    name="multiturn",
    doc="multi-turn agents in GEM-protocol environments with turn credit (arXiv 2510.01051, 2512.24873)",
    section="env",
    config=EnvConfig,
    check=check_env,
    stages={
        "rollout": {"multiturn": StageEntry("credo.families.multiturn.source:multiturn_source",
                                            provides=frozenset({BATCH_STATE, ENV_EPISODES}))},
        "reward": {"env": StageEntry("credo.families.multiturn.source:env_reward")},
        "advantage": {"turn_credit": StageEntry("credo.families.multiturn.turn_credit:turn_credit",
                                                TurnCreditSettings)},
    },
    active=_active,
    warmup_digest=_warmup_digest,
    build="credo.families.multiturn.build",
    listing="credo.families.multiturn.cli:listing",
    roles={"env": EnvRoleConfig},
)
