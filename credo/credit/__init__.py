"""Token- and chunk-level credit assignment as pure torch functions.

- :mod:`credo.credit.chunks`: IPA chunk returns (arXiv 2512.24873), plus the chunk ids, chunk
  ratios and mismatch masks of :mod:`credo.algos.chunks`; :mod:`credo.credit.ipa` re-exports the
  chunk-level policy loss ``"ipa"`` of :mod:`credo.algos.ipa`.
- :mod:`credo.credit.attention`: preplan-and-anchor head span, WAAD, FAI, rhythm credit
  (arXiv 2510.13554).
- :mod:`credo.credit.flow`: FlowTracer answer-conditioned flow throughput (arXiv 2606.10646).
- :mod:`credo.credit.streaming`: the attention quantities from query/key states without
  materialising attention maps.
- :mod:`credo.credit.capture`: those query/key states captured from a Llama/Qwen decoder's own
  forward pass (hooks, no ``output_attentions``): ``model_rhythm_gamma``, ``model_flow_gamma``.

Layering: :mod:`credo.algos` imports nothing from here; this package uses only public names of
:mod:`credo.algos` (tests/test_import_light.py checks both directions).
"""

from credo.credit.attention import (
    attention_rhythm_gamma,
    fai,
    group_heads,
    head_span,
    rhythm_gamma,
    waad,
)
from credo.credit.capture import (
    capture_qk,
    default_layers,
    flow_gamma_from_qk,
    model_flow_gamma,
    model_rhythm_gamma,
    rhythm_gamma_from_qk,
)
from credo.credit.chunks import (
    chunk_ids,
    chunk_mean,
    chunk_mismatch_mask,
    chunk_ratio,
    chunk_returns,
    chunk_returns_from_rewards,
    num_chunks,
)
from credo.credit.flow import (
    answer_potential,
    doob_transform,
    flow_capacity,
    flow_gamma,
    flow_throughput,
    forward_flow,
)
from credo.credit.ipa import ipa_loss
from credo.credit.streaming import (
    attention_from_qk,
    streaming_flow_throughput,
    streaming_head_stats,
)

__all__ = [
    "answer_potential",
    "attention_from_qk",
    "attention_rhythm_gamma",
    "capture_qk",
    "chunk_ids",
    "chunk_mean",
    "chunk_mismatch_mask",
    "chunk_ratio",
    "chunk_returns",
    "chunk_returns_from_rewards",
    "default_layers",
    "doob_transform",
    "fai",
    "flow_capacity",
    "flow_gamma",
    "flow_gamma_from_qk",
    "flow_throughput",
    "forward_flow",
    "group_heads",
    "head_span",
    "model_flow_gamma",
    "model_rhythm_gamma",
    "ipa_loss",
    "num_chunks",
    "rhythm_gamma",
    "rhythm_gamma_from_qk",
    "streaming_flow_throughput",
    "streaming_head_stats",
    "waad",
]
