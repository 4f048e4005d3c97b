"""Loading torch files without running code: weights-only unpickling, with an allow-list of what credo's files hold.

`torch.load(weights_only=False)` runs whatever callable a pickle names, so a checkpoint or model folder from
elsewhere could run code on `credo export`, `credo eval` or a resume. Every torch file credo reads goes through
`load` (or, inside DeepSpeed and its zero_to_fp32, through `weights_only_torch_load`): tensors, containers and
the few classes on `allowed_globals()` load; anything else is refused with an `UnsafeFileError` naming the file
and the global, and nothing of it runs. credo writes its own state so that it loads this way (the RNG states as
lists of ints: credo.checkpoint.rng_state); a checkpoint an older credo wrote holds numpy arrays there and is
refused too, with the way to convert it if it is your own (`python -m credo.safe_load upgrade CKPT`).

Model folders: credo writes safetensors (credo.export); transformers and vLLM load a `pytorch_model.bin`
weights-only, and `check_model_folder` names a pickled weight file that holds anything else before either opens it.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import sys
from pathlib import Path

import torch

from credo.errors import UnsafeFileError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Weight files a model folder may hold as pickles (transformers' pytorch_model*.bin, others' .pt)."""


def allowed_globals() -> list:
    """The classes credo's own checkpoints hold besides tensors and containers: DeepSpeed's ZeRO optimizer state
    records its loss scaler, its ZeRO stage (an enum) and, under ZeRO-1/2, each parameter's fragment address (a
    dataclass); a fixed-lag run's pending batches (credo.train.fixed_lag) hold credo's `Sample` and `Problem`
    dataclasses. Each is rebuilt from plain fields (no `__setstate__`, no `__reduce__` of its own), so allowing it
    lets a pickle make one of these objects, never call a function."""
    from credo.distributed.rollout import Sample
    from credo.tasks.problem import Problem

    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # no DeepSpeed: no DeepSpeed checkpoint to read either
        return [Sample, Problem]
    return [Sample, Problem, LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _refusal(path, err: Exception) -> UnsafeFileError:
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
    what = (f"its pickle names '{found.group(1)}', which is not on credo's allow-list of checkpoint contents"
            if found else f"its pickle is not plain data that loads weights-only ({_first_line(err)})")
    old = (" An older credo (before safe loading) wrote RNG states as numpy arrays: if the checkpoint is your own, "
           f"convert it once with `python -m credo.safe_load upgrade {Path(path).parent}`."
           if found and found.group(1).startswith("numpy") and Path(path).name.startswith("rng_rank") else "")
    return UnsafeFileError(f"refusing to load {path}: {what}, so loading it could run code (torch.load with "
                           f"weights_only=True refused it; nothing of it ran).{old}")


def _first_line(err: Exception) -> str:
    """What torch's weights-only unpickler objected to (e.g. 'Unsupported operand 149'), else the first line."""
    found = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", str(err))
    return (found.group(1) if found else (str(err).splitlines() or [""])[0]).strip()[:200]


_torch_load = torch.load  # the real one, also while weights_only_torch_load has replaced torch.load


def load(path, map_location="cpu", **kwargs):
    """`torch.load(path, weights_only=True)` with credo's allow-list; `UnsafeFileError` naming `path` otherwise."""
    kwargs.pop("weights_only", None)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return _torch_load(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        raise _refusal(path, e) from None


def _forced_load(f, map_location=None, pickle_module=None, *, weights_only=None, **kwargs):
    return load(f, map_location=map_location, **kwargs)


@contextlib.contextmanager
def weights_only_torch_load():
    """Within it, every `torch.load` (DeepSpeed's engine.load_checkpoint and zero_to_fp32 call it with
    weights_only=False) loads weights-only with credo's allow-list."""
    before = torch.load
    torch.load = _forced_load
    try:
        yield
    finally:
        torch.load = before


def check_model_folder(path) -> None:
    """Refuse a local model folder whose pickled weight files (pytorch_model.bin, ...) name a global outside the
    allow-list, naming the file, before transformers or vLLM open it. A folder with safetensors only passes as is."""
    folder = Path(path)
    if not folder.is_dir():
        return
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix in PICKLE_SUFFIXES and not f.name.startswith("training_args"):
            _check_pickle(f)


def _check_pickle(f: Path) -> None:
    try:  # a zip-format torch file: read its pickle's globals without loading a tensor
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(f))
    except (RuntimeError, ValueError, OSError):  # not a zip: a legacy pickle, loaded weights-only to check it
        load(f, map_location="meta")
        return
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in allowed_globals()}
    bad = [n for n in names if n not in allowed]
    if bad:
        raise _refusal(f, pickle.UnpicklingError(f"Unsupported global: GLOBAL {bad[0]}"))


def upgrade_checkpoint(ckpt: Path) -> list[Path]:
    """Rewrite the RNG files of a checkpoint an older credo wrote (numpy arrays) in the weights-only form, and its
    manifest. It unpickles them fully: run it only on a checkpoint you wrote yourself. Returns the files rewritten."""
    import json

    from credo.checkpoint import _sha256, rng_state_to_plain

    ckpt = Path(ckpt)
    meta_path = ckpt / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{ckpt} has no meta.json: expected a credo checkpoint folder (checkpoints/step_N)")
    meta = json.loads(meta_path.read_text())
    done = []
    for f in sorted(ckpt.glob("rng_rank*.pt")):
        try:
            load(f)
            continue  # already in the new form
        except UnsafeFileError:
            pass
        state = _torch_load(f, map_location="cpu", weights_only=False)  # the user vouched for this file
        torch.save(rng_state_to_plain(state), f)
        meta["manifest"][f.name] = {"size": f.stat().st_size, "sha256": _sha256(f)}
        done.append(f)
    meta_path.write_text(json.dumps(meta, indent=1))
    return done


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "upgrade":
        print("usage: python -m credo.safe_load upgrade CHECKPOINT_DIR   (a checkpoint you wrote yourself)",
              file=sys.stderr)
        return 2
    done = upgrade_checkpoint(Path(argv[1]))
    print(f"credo: rewrote {len(done)} RNG file(s) of {argv[1]} in the weights-only form")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
