"""Trainer state: every stateful component behind `state_dict` / `load_state_dict` (torch's `Stateful`).

    TrainState.state_dict()  ->  {"engine": weights + optimizer + LR schedule + DeepSpeed counters,
                                  "rng": python/numpy/torch RNG, "counters": skip and failure counts,
                                  "<component>": source, advantage stage, critics, ...}

One dict serves three uses:
- **rollback** of a step in memory (`snapshot()` before, `restore(snap)` after): bit-exact;
- **checkpoints**: DeepSpeed writes the engine in its own (sharded) format, each rank its RNG, and
  `meta.json` the counters and the components' states (`credo.checkpoint`); a component with tensors
  (the critics) writes its own files into `<checkpoint>/<component>/` through `save_files` / `load_files`;
- **resume**: the newest good checkpoint is loaded and the run's recipe is compared with the one the
  checkpoint was written with.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from credo.errors import ConfigError, TrainingError
from credo.checkpoint import (find_resume_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state,
                              verify_checkpoint)
from credo.distributed.engine import rank_and_world
from credo.distributed.engines import as_train_engine
from credo.tracking import truncate_metrics
from credo.safe_load import load as safe_load
from credo.safe_load import weights_only_torch_load

log = logging.getLogger("credo")

# keys that may differ between the segments of a resumed run without run.allow_config_change: the run's length and
# place, and what is only logged (eval_every only spaces evaluations, which draw no RNG training uses: the hf sampler
# forks the RNG, vLLM and the env seed each request; eval_temperature/eval_samples change the metric, so they stay)
RESUME_FREE_KEYS = ("run.steps", "run.resume", "run.output_dir", "run.allow_config_change", "run.verbose", "run.progress",
                    "run.plot", "run.wandb", "run.wandb_mode", "run.wandb_project", "run.tensorboard",
                    "run.dump_rollouts_every", "run.eval_every")
# keys a resume cannot honour even with run.allow_config_change: the checkpoint's weights and optimizer partitions
# are shaped by them (a family adds its own, `Family.fixed_on_resume`)
RESUME_FIXED_KEYS = ("model.path", "model.tiny", "model.dtype", "optim.zero_stage", "model.lora.r",
                     "model.lora.target_modules", "engine.backend", "engine.zero_stage")


RENAMED_KEYS = {"engine.zero_stage": "optim.zero_stage"}
"""New key -> its former name, which checkpoints written before the rename hold instead."""


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class Counters:
    """Run-level counts that survive resume."""

    consecutive_skips: int = 0
    skipped_total: int = 0
    reward_failures_total: int = 0
    consecutive_empty: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class TrainState:
    """The engine, RNG, counters and the stages' own states, saved, restored and rolled back as one."""

    def __init__(self, engine, components: dict[str, Stateful], *, config: dict, sft_key: str | None,
                 policy_path: str, max_consecutive_skips: int, defaults: dict | None = None,
                 fixed_keys: tuple[str, ...] = RESUME_FIXED_KEYS):
        self.engine = as_train_engine(engine)
        self.counters = Counters()
        self.components = {"counters": self.counters, **components}
        self.config, self.sft_key, self.policy_path = config, sft_key, policy_path
        self.max_consecutive_skips = max_consecutive_skips
        self.config_changed: dict = {}  # keys a resume accepted with run.allow_config_change
        self.defaults = defaults  # the recipe type's defaults: a key a checkpoint lacks is no change at its default
        self.fixed_keys = fixed_keys  # refused on resume even with run.allow_config_change

    # ---- one dict
    def state_dict(self) -> dict:
        """A detached copy of the whole trainer state (in memory)."""
        return {"engine": self.engine.state_dict(), "rng": copy.deepcopy(rng_state()),
                **{k: copy.deepcopy(c.state_dict()) for k, c in self.components.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state["engine"])
        set_rng_state(state["rng"])
        for k, c in self.components.items():
            c.load_state_dict(copy.deepcopy(state[k]))

    snapshot, restore = state_dict, load_state_dict  # the names a rollback reads best with

    def _file_components(self) -> dict:
        """Components saved as files in the checkpoint folder instead of as JSON in meta.json: those with their own
        `save_files` / `load_files` (the critics' DeepSpeed engines), and any whose state holds tensors (a reward
        stage's model and optimizer, e.g. RM-NLHF's MetaRM), which `torch.save` writes, one file per rank."""
        return {k: c if hasattr(c, "save_files") else _TorchFiles(c) for k, c in self.components.items()
                if hasattr(c, "save_files") or _holds_tensors(c.state_dict())}

    # ---- per step
    def record_step(self, skipped: int, reward_failures: int, step: int, empty: str | None = None) -> None:
        """Count the step's skips; stop the run after run.max_consecutive_skips steps in a row that were skipped for
        non-finite values, or that had nothing to train on (`empty` says why)."""
        c = self.counters
        c.consecutive_skips = c.consecutive_skips + 1 if skipped else 0
        c.skipped_total += skipped
        c.reward_failures_total += reward_failures
        c.consecutive_empty = c.consecutive_empty + 1 if empty else 0
        if empty:
            log.error("step %d trained nothing: %s", step, empty)
        if c.consecutive_empty >= self.max_consecutive_skips:
            raise TrainingError(f"{c.consecutive_empty} consecutive steps had nothing to train on "
                                f"(run.max_consecutive_skips={self.max_consecutive_skips}); stopping at step {step}. "
                                f"Step {step}: {empty}")
        if c.consecutive_skips >= self.max_consecutive_skips:
            raise TrainingError(f"{c.consecutive_skips} consecutive optimizer steps skipped for non-finite values "
                                f"(run.max_consecutive_skips={self.max_consecutive_skips}); stopping at step {step}")

    # ---- disk
    def save(self, ckpt_root: Path, step: int, *, keep_last: int, param_digests: list[str]) -> None:
        if len(set(param_digests)) > 1:
            raise TrainingError(f"data-parallel ranks hold different parameters at step {step}: {param_digests}")
        files = self._file_components()
        meta = {"data_position": step, "sft_key": self.sft_key, "policy_path": self.policy_path,
                "param_digests": param_digests, "config": self.config,
                "components": {k: c.state_dict() for k, c in self.components.items()
                               if k != "counters" and k not in files},
                "counters": self.counters.state_dict()}

        def save_files(tmp: Path) -> dict:  # components with tensors (critics) write folders of their own
            return {"component_files": {k: c.save_files(tmp / k) for k, c in files.items()}} if files else {}

        saved = save_checkpoint(self.engine, ckpt_root, step, meta=meta, keep_last=keep_last, extra_save=save_files)
        if saved is None:  # the model holds NaN/Inf: training on is pointless, the last checkpoint is still good
            raise TrainingError(f"the model holds non-finite parameters at step {step}; no checkpoint written. "
                                "Resume from the last checkpoint (run.resume=auto) with a lower optim.lr")

    def resume(self, spec: str | None, run_dir: Path, *, rank: int, world: int, allow_config_change: bool) -> int:
        """Load the checkpoint `spec` names ('auto': the newest good one); return its step (0: fresh start)."""
        if not spec:
            return 0
        ckpt_root = run_dir / "checkpoints"
        if spec == "auto":
            # rank 0 verifies (and sets corrupt folders aside) once; every rank loads the folder it chose
            found = [find_resume_checkpoint(ckpt_root, tidy=True) if rank == 0 else None]
            if world > 1:
                dist.broadcast_object_list(found, src=0)
            path = found[0]
        else:
            path = Path(spec)
            problem = "the folder does not exist" if not path.is_dir() else verify_checkpoint(path)
            if problem is not None:
                raise ConfigError(f"config key 'run.resume' = '{spec}': not a usable checkpoint ({problem}); "
                                  "expected 'auto' or a checkpoints/step_<N> folder")
        if path is None:
            metrics = run_dir / "metrics.jsonl"
            if rank == 0 and metrics.exists():  # a fresh start must not write over the record of what ran
                aside = _free_name(metrics.with_name("metrics.before-restart.jsonl"))
                os.replace(metrics, aside)
                log.warning("run.resume=auto: no usable checkpoint in %s; starting from step 0 "
                            "(the previous metrics.jsonl was moved to %s)", ckpt_root, aside.name)
            else:
                log.warning("run.resume=auto: no usable checkpoint in %s; starting from step 0", ckpt_root)
            return 0
        self._check_settings(path, allow_config_change)
        with weights_only_torch_load():  # the components' DeepSpeed engines (critics) load through torch.load too
            meta = load_checkpoint(self.engine, path, verify=False)
            self._load_components(path, meta)
        if rank == 0:
            truncate_metrics(run_dir / "metrics.jsonl", meta["step"])
        log.info("resumed from %s (step %d)", path, meta["step"])
        return meta["step"]

    def _check_settings(self, path: Path, allow_config_change: bool) -> None:
        """Refuse a resume whose settings the checkpoint cannot honour: a fixed key changed, another warm-up, or any
        change without run.allow_config_change. Sets `config_changed`."""
        # the settings are compared before anything loads: a checkpoint of another shape would fail inside DeepSpeed
        meta = json.loads((path / "meta.json").read_text())
        self.config_changed = changed = config_changes(meta.get("config"), self.config, self.defaults)
        fixed = {k: v for k, v in changed.items() if any(k == f or k.startswith(f + ".") for f in self.fixed_keys)}
        if fixed:
            lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in fixed.items())
            raise ConfigError(f"resuming {path} with settings the checkpoint's weights and optimizer are shaped by:\n"
                              f"{lines}\nthey cannot change on resume (not even with run.allow_config_change); "
                              "start a new run instead")
        if meta.get("sft_key") != self.sft_key:
            raise ConfigError(f"checkpoint {path} was trained from a different warm-up (sft_key {meta.get('sft_key')} "
                              f"!= {self.sft_key}); resume with the recipe it was made with")
        if changed and not allow_config_change:
            lines = "\n".join(f"  {k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ConfigError(f"resuming {path} with settings that differ from the checkpoint's:\n{lines}\n"
                              "resume with the recipe it was made with, or set run.allow_config_change=true")

    def _load_components(self, path: Path, meta: dict) -> None:
        """The counters and every stateful component from checkpoint `path` (its `meta`)."""
        self.counters.load_state_dict(meta.get("counters", {}))
        for k, state in meta.get("components", {}).items():
            if k in self.components:
                self.components[k].load_state_dict(state)
        saved_files = meta.get("component_files", {})
        files = self._file_components()
        for k in saved_files:  # saved as files, whatever its state holds now (a fresh fixed-lag source: no batches)
            if k in self.components and k not in files:
                files[k] = _TorchFiles(self.components[k])
        for k, c in files.items():
            if k in saved_files:
                c.load_files(path / k)
            else:  # a checkpoint written before this component kept state (an older credo)
                log.warning("checkpoint %s holds no state for '%s'; it starts from its initial state", path, k)


def _holds_tensors(state) -> bool:
    if isinstance(state, torch.Tensor):
        return True
    if isinstance(state, dict):
        return any(_holds_tensors(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_holds_tensors(v) for v in state)
    return False


class _TorchFiles:
    """`save_files` / `load_files` of a component whose `state_dict` holds tensors: one torch file per rank (each
    rank's stage may hold its own state, e.g. a model trained on that rank's samples)."""

    def __init__(self, component):
        self.component = component

    def save_files(self, folder: Path) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.component.state_dict(), folder / f"rank{rank_and_world()[0]}.pt")
        return {"format": "torch"}

    def load_files(self, folder: Path) -> None:
        self.component.load_state_dict(safe_load(folder / f"rank{rank_and_world()[0]}.pt"))


def _flatten(d: dict, prefix: str = "") -> dict:
    """Nested recipe dict -> dotted keys; dict-valued keys (`*kwargs`) are leaves."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and not k.endswith("kwargs"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: dict | None, new: dict, defaults: dict | None = None) -> dict[str, tuple]:
    """Recipe keys whose value differs between a checkpoint's config and this run's, `key -> (old, new)`.

    Sections are compared key by key (dict-valued keys such as `algo.loss_kwargs` as a whole); the keys in
    `RESUME_FREE_KEYS` may change freely. A key only this run's config has (added to credo since) counts
    only when it is not at its default; a key only the checkpoint's has (removed since) counts as a change,
    since its setting can no longer be honoured. A checkpoint without a config (written before configs were
    kept) is not compared. `defaults` is the run's recipe type's defaults (default: the built-in families').
    """
    if old is None:
        return {}
    if defaults is None:
        from credo.config import recipe_class

        defaults = asdict(recipe_class()())
    a, b = _flatten(old), _flatten(new)
    # a key the checkpoint's config lacks (a section added to credo since) is no change while at its default, or
    # while it holds what the checkpoint wrote under the key's former name
    defaults = _flatten(defaults)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in RESUME_FREE_KEYS and a.get(k) != b.get(k) and not (k not in a and b.get(k) == defaults.get(k))
            and not (k not in a and k in RENAMED_KEYS and b.get(k) == a.get(RENAMED_KEYS[k]))}


def _free_name(path: Path) -> Path:
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return candidate
