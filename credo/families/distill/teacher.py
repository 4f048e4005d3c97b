"""The teacher: where its folder is (a path, or credo's cached SFT warm-up), the tokenizer check, and scoring.

    teacher_folder(r, task, log)   the teacher's model folder; with distill.teacher: warmup, trains it first (cached)
    check_teacher(r) -> notes      `credo check`: the folder and its tokenizer, the same vocabulary as the student's
    TeacherScorer                  the teacher's log-prob of each sampled token, no grad, on the trainer's device
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from credo.errors import ConfigError
from credo.families.distill.config import WARMUP_TEACHER, teacher_sft_config


def teacher_folder(r, task, *, log=print) -> tuple[str, str | None]:
    """(the teacher's model folder, its warm-up key or None). distill.teacher: warmup runs (or reuses) credo's SFT
    warm-up of model.path under the teacher's sft settings; a path is returned as it is resolved."""
    from credo.models import resolve_model_path

    d = r.distill
    if d.teacher != WARMUP_TEACHER:
        try:
            return resolve_model_path(d.teacher, r.model.tiny), None
        except ConfigError as e:
            raise ConfigError(str(e).replace("model.path", "distill.teacher")) from None
    from credo.sft import run_sft

    base = resolve_model_path(r.model.path, r.model.tiny)
    return run_sft(teacher_recipe(r), base, task, log=lambda m: log(f"teacher {m}"))


def teacher_recipe(r):
    """A shallow copy of the recipe whose sft section is the teacher's (`dataclasses.replace` would run the recipe's
    __post_init__ again, which re-reads deprecated keys and warns)."""
    t = copy.copy(r)
    object.__setattr__(t, "sft", teacher_sft_config(r))
    return t


def _tokenizer_file(folder: str) -> str:
    for name in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json"):
        if (Path(folder) / name).is_file():
            return str(Path(folder) / name)
    return folder


def check_teacher(r) -> list[str]:
    """The teacher's folder loads a tokenizer (no code shipped in it) and that tokenizer's vocabulary is the
    student's, token for token; otherwise a ConfigError naming distill.teacher and the teacher's tokenizer file. A
    warm-up teacher shares the student's tokenizer by construction; a hub id not cached here is a note."""
    d = r.distill
    if not d.enabled or d.teacher == WARMUP_TEACHER:
        return []
    from credo.models import load_tokenizer, resolve_model_path
    from credo.preflight import check_model

    notes = check_model(d.teacher, key="distill.teacher")
    if notes:
        return notes
    try:
        student_path = resolve_model_path(r.model.path, r.model.tiny)
    except ConfigError:
        return []  # model.path's own check reports it
    if not Path(student_path).is_dir():
        return [f"distill.teacher '{d.teacher}': its tokenizer not compared with model.path '{r.model.path}' "
                "(not downloaded here)"]
    teacher_path = resolve_model_path(d.teacher, r.model.tiny)
    student, teacher = load_tokenizer(student_path).get_vocab(), load_tokenizer(teacher_path).get_vocab()
    if student != teacher:
        only_t = sorted(set(teacher) - set(student))[:3]
        moved = sorted(k for k in set(student) & set(teacher) if student[k] != teacher[k])[:3]
        raise ConfigError(
            f"config key 'distill.teacher' = '{d.teacher}': its tokenizer ({_tokenizer_file(teacher_path)}) is not "
            f"the student's (model.path '{r.model.path}'): {len(teacher)} tokens against {len(student)}"
            f"{', e.g. ' + repr(only_t) + ' only in the teacher' if only_t else ''}"
            f"{', ids differ for ' + repr(moved) if moved else ''}. On-policy distillation scores the student's "
            "token ids with the teacher, so both must share one vocabulary (distill.token_mapping is not "
            "implemented; docs/distill.md)")
    return []


class TeacherScorer:
    """A frozen causal LM's log-prob of each sampled token ([B, T], label-aligned, 0 off the mask), at temperature 1,
    in row chunks of `rows` (one forward per chunk), on `device`."""

    def __init__(self, model: torch.nn.Module, *, rows: int, chunk_size: int, device):
        self.model, self.rows, self.chunk_size, self.device = model, max(1, rows), chunk_size, device

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [B, L]; mask: [B, L-1] bool, the tokens to score. Returns [B, L-1] float32 on the
        device of `mask`."""
        from credo.train.scoring import policy_forward

        out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        for rows in torch.arange(mask.shape[0]).split(self.rows):
            m = mask[rows]
            if not m.any():
                continue
            lp, _ = policy_forward(self.model, input_ids[rows].to(self.device), attention_mask[rows].to(self.device),
                                   m.to(self.device), temperature=1.0, chunk_size=self.chunk_size,
                                   with_entropy=False)
            out[rows] = lp.to(out)
        return out
