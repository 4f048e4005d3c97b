"""The attention-credit family: per-token loss weights from the policy's own attention, as a probe.

    config.py   the `attention_credit` probe's settings
    probe.py    AttentionCreditProbe: captures query/key states in the recompute forward and turns them into
                per-token multipliers (preplan-and-anchor arXiv 2510.13554, FlowTracer arXiv 2606.10646)

Named in a recipe as `stages.probes: [attention_credit]`. See docs/credit.md.
"""

from credo.families.attention.config import AttentionCreditSettings
from credo.family import Family, StageEntry

FAMILY = Family(
    name="attention",
    doc="attention-derived token credit: preplan-and-anchor (arXiv 2510.13554), FlowTracer (arXiv 2606.10646)",
    stages={"probe": {"attention_credit": StageEntry("credo.families.attention.probe:make_attention_credit_probe",
                                                     AttentionCreditSettings)}},
)
