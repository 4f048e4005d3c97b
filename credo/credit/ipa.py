"""IPA chunk-level policy loss (arXiv 2512.24873), kept importable from :mod:`credo.credit`.

The loss is defined in :mod:`credo.algos.ipa` so that importing :mod:`credo.algos` registers
``"ipa"`` in :data:`credo.algos.POLICY_LOSSES` without importing :mod:`credo.credit`. This module
re-exports it; ``credo.credit.ipa.ipa_loss is credo.algos.ipa_loss``.
"""

from __future__ import annotations

from credo.algos.ipa import ipa_loss

__all__ = ["ipa_loss"]
