"""The judges family: generative reward models, as the reward and as the policy being trained.

    config.py               the `judge:` section, its checks, the RM-NLHF and CE-RM stage settings
    prompts.py, parse.py    judge prompt templates; score and verdict parsing
    reward.py               the `judge` reward stage: a frozen LLM judge scores the policy (pointwise / pairwise)
    rm_nlhf.py              the `rm_nlhf` reward stage: outcome + critique similarity + online MetaRM (arXiv 2601.07349)
    ce_rm.py                CE-RM's two-stage rollout and discrimination reward (arXiv 2601.20327)
    critique_similarity.py  embedding / ROUGE-L similarity of critiques
    tasks.py                the synthetic judging tasks (judge_arithmetic, ce_rm_arithmetic, verdict_arithmetic)
    untrusted.py            policy text in a judge prompt: delimiters, defusing, the verdict format
    pgenrm/                 P-GenRM's synthetic users, evaluation chains and test-time scaling (arXiv 2602.12116)
    best_of_n.py            best-of-N with a CE-RM judge
    cli.py                  `credo bon` (its verb)
    build.py                build-time parts: the judge model's preflight check

See docs/judges.md.
"""

from credo.families.judges.config import CERMRolloutSettings, JudgeConfig, JudgeRoleConfig, RMNLHFSettings, check_judge
from credo.capabilities import BATCH_STATE
from credo.family import Family, StageEntry


def _active(r) -> bool:
    return r.stages.reward == "judge"  # the judge: section is in use


FAMILY = Family(
    name="judges",
    doc="generative reward models: judge as reward, RM-NLHF, CE-RM, P-GenRM (arXiv 2601.07349, 2601.20327, "
        "2602.12116)",
    section="judge",
    config=JudgeConfig,
    check=check_judge,
    stages={
        "reward": {"judge": StageEntry("credo.families.judges.reward:judge_stage"),
                   "rm_nlhf": StageEntry("credo.families.judges.rm_nlhf:rm_nlhf_stage", RMNLHFSettings),
                   "ce_rm": StageEntry("credo.families.judges.ce_rm:ce_rm_reward")},
        "rollout": {"ce_rm_two_stage": StageEntry("credo.families.judges.ce_rm:two_stage_source",
                                                  CERMRolloutSettings, provides=frozenset({BATCH_STATE}))},
    },
    tasks={"judge_arithmetic": "credo.families.judges.tasks:ArithmeticJudgeTask",
           "ce_rm_arithmetic": "credo.families.judges.tasks:CriteriaJudgeTask",
           "pgenrm_users": "credo.families.judges.pgenrm.task:PersonalJudgeTask",
           "verdict_arithmetic": "credo.families.judges.tasks:VerdictArithmeticTask"},
    active=_active,
    build="credo.families.judges.build",
    commands={"bon": "credo.families.judges.cli:add_parser"},
    roles={"judge": JudgeRoleConfig},
)
