"""The Complementary RL family (arXiv 2603.17621): an actor and an experience extractor that co-evolve.

    config.py     the `complementary:` section and its checks
    bank.py       the experience bank: lessons per task key, retrieval (task id or similarity), add/merge/delete
    credit.py     the extractor's paired-gain reward, conditional group ids, an entry's with-minus-without help
    source.py     the `complementary` rollout source: the multi-turn source with retrieved lessons in the prompt
    distil.py     both modes: choose episodes, sample lessons, measure them on paired rollouts, consolidate
    extractor.py  the second model: its warm-up on scripted lessons, its GRPO update
    hook.py       the step hooks: the second model's (distil, pair, train it, consolidate); the one-model mode's
    beside.py     complementary.extractor_async: the second model's step in a worker thread beside the next step
    build.py      build-time parts: the env checks, the one-model mode's lesson warm-up, the hooks

Active when `stages.rollout: complementary` (with an `env:` section). See docs/complementary.md.
"""

from credo.capabilities import BATCH_STATE, ENV_EPISODES
from credo.families.complementary.config import REFUSALS, ComplementaryConfig, check_complementary
from credo.family import Family, StageEntry


def _active(r) -> bool:
    return r.stages.rollout == "complementary"


FAMILY = Family(
    name="complementary",
    doc="Complementary RL: an actor and an experience extractor trained together (arXiv 2603.17621)",
    section="complementary",
    config=ComplementaryConfig,
    check=check_complementary,
    stages={"rollout": {"complementary": StageEntry("credo.families.complementary.source:complementary_source",
                                                    provides=frozenset({BATCH_STATE, ENV_EPISODES}))}},  # plays env:
    refusals=REFUSALS,
    active=_active,
    fixed_on_resume=("complementary.extractor", "complementary.extractor_path"),
    build="credo.families.complementary.build",
)
