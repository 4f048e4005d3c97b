"""Argument checks shared by the loss library.

Every check raises ``ValueError`` naming the argument at fault and saying what was expected.
Checks are cheap: shape/dtype checks read metadata only, and each finiteness check is one
``torch.isfinite`` over the masked tensor.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to [-20, 20] before ``exp`` so inputs as extreme as e^±30 stay finite.

Inside the clamp the gradient is exact; outside it is zero (the token is treated as saturated).
"""


def shape_str(x: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in x.shape) + "]"


def check_tensor(name: str, x, *, ndim: int | None = None, floating: bool = False) -> None:
    """Checks that ``x`` is a tensor with ``ndim`` dimensions and (optionally) a floating dtype."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {ndim} dimensions")
    if floating and not x.is_floating_point():
        raise ValueError(f"{name} has dtype {x.dtype}, expected a floating dtype")


def check_like(name: str, x, ref_name: str, ref: torch.Tensor, *, floating: bool = True) -> None:
    """Checks that ``x`` is a tensor with the same shape as ``ref``."""
    check_tensor(name, x, floating=floating)
    if x.shape != ref.shape:
        raise ValueError(f"{name} has shape {shape_str(x)}, expected {shape_str(ref)} like {ref_name}")


def as_bool_mask(mask, ref_name: str, ref: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Returns ``mask`` as a bool tensor shaped like ``ref``.

    Accepted: ``torch.bool``, or a floating tensor whose entries are all 0 or 1. Integer masks are
    rejected (an int mask is usually token ids or counts passed by mistake); fractional floating
    masks are rejected too (per-token weights go in ``weights=``).
    """
    check_tensor(name, mask)
    if mask.shape != ref.shape:
        raise ValueError(f"{name} has shape {shape_str(mask)}, expected {shape_str(ref)} like {ref_name}")
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"{name} has dtype {mask.dtype}, expected bool or floating (0/1 values)")
    binary = (mask == 0) | (mask == 1)
    if not bool(binary.all()):
        raise ValueError(f"{name} has values other than 0 and 1; pass fractional per-token weights as weights=")
    return mask != 0


def check_finite(name: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Raises if ``x`` has NaN/Inf where ``mask`` is True (everywhere when ``mask`` is None)."""
    with torch.no_grad():
        inside = x if mask is None else torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
        if not bool(torch.isfinite(inside).all()):
            where = "" if mask is None else " in masked-in positions"
            raise ValueError(f"{name} has non-finite values (NaN or Inf){where}")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} is {value!r}, expected one of {list(choices)}")


def check_positive(name: str, value, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, torch.Tensor):
        return  # a device tensor (e.g. an all-reduced count): checking it would force a sync
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} is {value!r}, expected a positive number")


def masked_fill_zero(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` where ``mask`` else 0, via ``torch.where`` so NaN/Inf outside the mask cannot leak into
    values or gradients (a multiplication by 0 would give NaN)."""
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def register(registry: dict, kind: str, name: str, fn):
    """Record ``fn`` under ``name`` in ``registry`` and return it.

    Registering a *different* function under a taken name raises ValueError naming both;
    re-registering the same function (a module reload) is allowed.

    credo's own functions register by a call after the ``def`` (``ppo = register_policy_loss("ppo")(
    per_token_policy_loss(ppo))``), not as decorators: mutmut 3 does not mutate decorated functions,
    and the mutation tests (docs/reliability.md) must reach the losses. User code may use either form.
    """
    old = registry.get(name)
    if old is not None and _qualified(old) != _qualified(fn):
        raise ValueError(f"{kind} {name!r} is already registered by {_qualified(old)}")
    registry[name] = fn
    return fn


def _qualified(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
