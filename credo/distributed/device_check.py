"""Device correctness without a GPU: a torch function mode that records every tensor credo creates without
naming its device.

credo's first GPU run (2026-12-04, an H200) stopped at its first update: the mismatch metrics made an all-true
mask with `torch.ones(...)` on the CPU next to log-probs on `cuda:0` (fixed in b38e148). On a CPU-only machine
every tensor is on the CPU, so that class of bug cannot show; what can be checked is the cause: a factory call
that leaves the device to the default. Inside the train step every factory call in credo names its device,
either `device="cpu"` (host bookkeeping: packed batches, metric sums, index lists, moved where they are used)
or the device of the tensor it works with (`device=x.device`). `*_like` factories and `Tensor.new_*` methods
take their device from a tensor and are not checked.

    with ExplicitDeviceMode() as mode:
        trainer.train_step(1)
    assert not mode.violations, mode.report()

Only calls made from credo's own code are recorded (the nearest caller outside torch is a file of the `credo`
package): transformers, peft and DeepSpeed are not credo's to change.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from torch.overrides import TorchFunctionMode

FACTORIES = frozenset({
    "zeros", "ones", "full", "empty", "empty_strided", "arange", "range", "linspace", "logspace", "eye",
    "tensor", "as_tensor", "scalar_tensor", "rand", "randn", "randint", "randperm", "tril_indices", "triu_indices",
})
"""torch functions that create a tensor on the default device unless told otherwise (`*_like` excepted)."""

CREDO_ROOT = str(Path(__file__).resolve().parents[1]) + "/"
_TORCH_ROOT = str(Path(sys.modules["torch"].__file__).resolve().parent) + "/"


@dataclass(frozen=True)
class Violation:
    """A factory call without `device=`: the function and the credo line that made it."""

    func: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"torch.{self.func}(...) without device= at {self.file}:{self.line}"


def _caller(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the nearest frame outside torch and this module; None if it is not credo's code."""
    frame = sys._getframe(depth)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_ROOT)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(CREDO_ROOT):
        return None
    return frame.f_code.co_filename[len(CREDO_ROOT):], frame.f_lineno


class ExplicitDeviceMode(TorchFunctionMode):
    """Records (and passes through) every factory call from credo's code that names no device.

    `violations` holds the distinct sites in the order first seen; `report()` says where they are.
    """

    def __init__(self):
        super().__init__()
        self.violations: list[Violation] = []
        self._seen: set[Violation] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in FACTORIES and kwargs.get("device") is None and not _is_method(func):
            where = _caller()
            if where is not None:
                v = Violation(name, "credo/" + where[0], where[1])
                if v not in self._seen:
                    self._seen.add(v)
                    self.violations.append(v)
        return func(*args, **kwargs)

    def report(self) -> str:
        if not self.violations:
            return "every tensor credo created names its device"
        return ("tensors created without an explicit device (on a GPU they land on the CPU next to CUDA tensors; "
                "name it: device=x.device, or device='cpu' for host bookkeeping):\n  "
                + "\n  ".join(map(str, self.violations)))


def _is_method(func) -> bool:
    """`Tensor.new_zeros` & co. reach the mode too, as methods of a tensor whose device they take."""
    return getattr(func, "__objclass__", None) is not None or "Tensor." in getattr(func, "__qualname__", "")
