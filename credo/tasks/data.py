"""Your own prompts: `task.name: file` (JSONL, JSON, Parquet, CSV) or `task.name: hf:<name-or-local-dir>`.

    task:
      name: file
      kwargs: {train: data/train.jsonl, eval: data/test.jsonl, prompt_field: prompt, answer_field: answer}

Files load through Hugging Face `datasets` (`pip install 'credo[data]'`), by extension. `hf:<x>` takes a
folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (read with `load_from_disk`), or
else a name or folder for `datasets.load_dataset`; `train` and `eval` then name splits (default 'train'
and none). Without an eval file or split, `task.eval_size` rows are held out of the train rows (shuffled
with `task.seed`).

The prompt field holds a string or a list of chat messages. The answer field is optional (it is what a
warm-up would teach). Every column but the prompt, the answer included, is kept in `Problem.meta
['columns']` and reaches TRL-style reward functions as a keyword argument. These tasks have no verifier:
the reward comes from `reward.functions` (or `reward.function`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from credo.errors import ConfigError
from credo.tasks.problem import Problem

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError("task.name 'file' and 'hf:<name>' need Hugging Face datasets: pip install 'credo[data]'") from None
    return datasets


def load_rows_file(path: str, key: str) -> list[dict]:
    """The rows of a JSONL / JSON / Parquet / CSV file, as dicts."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ConfigError(f"config key '{key}' = '{path}': unknown file type '{p.suffix}' (expected one of "
                          f"{', '.join(FORMATS)})")
    if not p.is_file():
        raise ConfigError(f"config key '{key}' = '{path}': file not found")
    ds = _datasets().load_dataset(fmt, data_files=str(p), split="train")
    return [dict(row) for row in ds]


def load_rows_hf(name: str, split: str, key: str, **load_kwargs: Any) -> list[dict]:
    """The rows of split `split` of a saved folder (`load_from_disk`) or a `load_dataset` name or folder."""
    datasets = _datasets()
    p = Path(name)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(f"config key '{key}' = '{split}': no such split in '{name}' (it has {sorted(ds)})")
            ds = ds[split]
        elif split != "train":
            raise ConfigError(f"config key '{key}' = '{split}': '{name}' holds a single data set, read as split 'train'")
    else:
        try:
            ds = datasets.load_dataset(name, split=split, **load_kwargs)
        except (FileNotFoundError, ValueError, ConnectionError) as e:
            raise ConfigError(f"task.name 'hf:{name}' split '{split}' (config key '{key}') cannot be loaded: "
                              f"{str(e).splitlines()[0]}") from None
    return [dict(row) for row in ds]


class FileTask:
    """Prompts (and optional answers and other columns) from your data; no verifier (`score` is None)."""

    score = None

    def __init__(self, train_rows: list[dict], eval_rows: list[dict] | None, *, train_size: int, eval_size: int,
                 seed: int, prompt_field: str = "prompt", answer_field: str | None = "answer", source: str = "file"):
        self.prompt_field, self.answer_field, self.source = prompt_field, answer_field, source
        train = [self._problem(r, f"train row {i}") for i, r in enumerate(train_rows)]
        held = None if eval_rows is None else [self._problem(r, f"eval row {i}") for i, r in enumerate(eval_rows)]
        if held is None:  # hold out eval_size rows of the train data
            random.Random(seed).shuffle(train)
            if eval_size >= len(train):
                raise ConfigError(f"task.eval_size = {eval_size} leaves no training rows ({source} has {len(train)}); "
                                  "give task.kwargs.eval or lower task.eval_size")
            held, train = train[:eval_size], train[eval_size:]
        if not train:
            raise ConfigError(f"task '{source}' has no training rows: expected at least one in task.kwargs.train")
        self._train, self._eval = train[:train_size], held[:eval_size]

    def _problem(self, row: dict, where: str) -> Problem:
        if self.prompt_field not in row:
            raise ConfigError(f"task '{self.source}' {where} has no field '{self.prompt_field}' "
                              f"(task.kwargs.prompt_field; the row has {sorted(row)})")
        prompt = row[self.prompt_field]
        chat = isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
        if not isinstance(prompt, str) and not chat:
            raise ConfigError(f"task '{self.source}' {where}: field '{self.prompt_field}' is a {type(prompt).__name__}, "
                              "expected a string or a list of chat messages ({role, content})")
        answer = row.get(self.answer_field) if self.answer_field else None
        columns = {k: v for k, v in row.items() if k != self.prompt_field}
        return Problem(prompt=[dict(m) for m in prompt] if chat else prompt, answer="" if answer is None else str(answer),
                       meta={"columns": columns})

    def __len__(self) -> int:
        return len(self._train)

    def train(self, i: int) -> Problem:
        return self._train[i % len(self._train)]

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)


def make_file_task(kind: str, cfg) -> FileTask:
    """`task.name` 'file' or 'hf:<name>' with `task.kwargs` {train, eval, prompt_field, answer_field, ...}."""
    kw = dict(cfg.kwargs)
    fields = {k: kw.pop(k) for k in ("prompt_field", "answer_field") if k in kw}
    common = dict(train_size=cfg.train_size, eval_size=cfg.eval_size, seed=cfg.seed, **fields)
    if kind == "file":
        train, ev = kw.pop("train", None), kw.pop("eval", None)
        if kw:
            raise ConfigError(f"unknown config key 'task.kwargs.{sorted(kw)[0]}' for task 'file' (valid: train, eval, "
                              "prompt_field, answer_field)")
        if not train:
            raise ConfigError("config key 'task.kwargs.train' is required for task 'file': a JSONL, JSON, Parquet or CSV file")
        return FileTask(load_rows_file(train, "task.kwargs.train"),
                        load_rows_file(ev, "task.kwargs.eval") if ev else None, source=str(train), **common)
    name = kind[3:]
    train, ev = kw.pop("train", "train"), kw.pop("eval", None)
    return FileTask(load_rows_hf(name, train, "task.kwargs.train", **kw),
                    load_rows_hf(name, ev, "task.kwargs.eval", **kw) if ev else None, source=f"hf:{name}", **common)
