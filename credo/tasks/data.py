"""Your own prompts: `task.name: file` (JSONL, JSON, Parquet, CSV) or `task.name: hf:<name-or-local-dir>`.

    task:
      name: file
      kwargs: {train: data/train.jsonl, eval: data/test.jsonl, prompt_field: prompt, answer_field: answer}

`train` (and `eval`) may list several files, read one after the other (`train: [a.jsonl, b.jsonl]`), or mix
them by weight (`train: [{path: a.jsonl, weight: 0.7}, {path: b.jsonl, weight: 0.3}]`): each training row is
drawn from file k with probability weight_k / sum(weights), seeded by `task.seed`, until every file has been
drawn through once (or `task.train_size` rows), as `datasets.interleave_datasets(probabilities=...,
stopping_strategy="all_exhausted")` mixes data sets; a file that runs out first starts over.

Files load through Hugging Face `datasets` (`pip install 'credo[data]'`), by extension. `hf:<x>` takes a
folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (read with `load_from_disk`), or
else a name or folder for `datasets.load_dataset`; `train` and `eval` then name splits (default 'train'
and none). Without an eval file or split, `task.eval_size` rows are held out of the train rows (shuffled
with `task.seed`).

The prompt field holds a string or a list of chat messages. The answer field is optional (it is what a
warm-up would teach): without `answer_field`, an `answer` column is used when there is one; a column named
by `answer_field` must exist. Every column but the prompt, the answer included, is kept in `Problem.meta
['columns']` and reaches TRL-style reward functions as a keyword argument. These tasks have no verifier:
the reward comes from `reward.functions` (or `reward.function`).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Mapping, Sequence
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


@contextlib.contextmanager
def _quiet(datasets):
    """While credo reads a data file: no 'Generating train split' progress bar and no log line of datasets' own.

    A malformed file made datasets log 'Failed to load JSON ...' at ERROR (twice, through its handler and the root's)
    and draw its bar, before credo's one config-error line that names the key, the file and the row (issue 57's
    round-4 trial). credo states what it read where it matters; anything datasets raises is still turned into that
    line below. Both settings are restored afterwards."""
    logger = logging.getLogger("datasets")
    level, bars = logger.level, not datasets.are_progress_bars_disabled()
    logger.setLevel(logging.CRITICAL + 1)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def load_rows_file(path: str, key: str) -> list[dict]:
    """The rows of a JSONL / JSON / Parquet / CSV file, as dicts."""
    p = Path(path)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ConfigError(f"config key '{key}' = '{path}': unknown file type '{p.suffix}' (expected one of "
                          f"{', '.join(FORMATS)})")
    if not p.is_file():
        raise ConfigError(f"config key '{key}' = '{path}': file not found")
    if p.stat().st_size == 0:  # datasets raises a bare StopIteration on an empty file
        raise ConfigError(f"config key '{key}' = '{path}': the file is empty (expected one row per problem)")
    datasets = _datasets()
    try:
        with _quiet(datasets):
            ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
    except (datasets.exceptions.DatasetGenerationError, ValueError, StopIteration) as e:  # a malformed row
        cause = e.__cause__ or e  # DatasetGenerationError says only 'an error occurred'; its cause names the row
        raise ConfigError(f"config key '{key}' = '{path}' cannot be read as {fmt.upper()}: "
                          f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else 'no rows'}") from None
    return [dict(row) for row in ds]


def parse_file_list(spec, key: str) -> list[tuple[str, float | None]]:
    """`task.kwargs.train` / `eval` as (path, weight) pairs: a path, a list of paths, or a list of {path, weight}.

    Weights are all given or none; each is a positive number.
    """
    if isinstance(spec, (str, Path)):
        return [(str(spec), None)]
    if not isinstance(spec, Sequence) or not spec:
        raise ConfigError(f"config key '{key}' is a {type(spec).__name__}; expected a file, a list of files or a list "
                          "of {path, weight}")
    out = []
    for i, entry in enumerate(spec):
        where = f"{key}[{i}]"
        if isinstance(entry, (str, Path)):
            out.append((str(entry), None))
            continue
        if not isinstance(entry, Mapping):
            raise ConfigError(f"config key '{where}' is a {type(entry).__name__}; expected a file or {{path, weight}}")
        unknown = sorted(set(entry) - {"path", "weight"})
        if unknown or "path" not in entry:
            raise ConfigError(f"config key '{where}' = {dict(entry)}: expected {{path: FILE, weight: NUMBER}}"
                              + (f" (unknown key '{unknown[0]}')" if unknown else ""))
        weight = entry.get("weight")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0):
            raise ConfigError(f"config key '{where}.weight' = {weight!r}: expected a positive number")
        out.append((str(entry["path"]), None if weight is None else float(weight)))
    weighted = [w is not None for _, w in out]
    if any(weighted) and not all(weighted):
        i = weighted.index(False)
        raise ConfigError(f"config key '{key}[{i}]' has no weight while others have one: give every file a weight")
    return out


def mix_by_weight(sources: list[list], weights: list[float], seed: int, limit: int) -> list:
    """Rows drawn from source k with probability weights[k] / sum(weights) (a `random.Random(seed)` stream), each
    source in its own order and starting over when it runs out, until every source has been drawn through once
    or `limit` rows are out."""
    rng, used, out = random.Random(seed), [0] * len(sources), []
    while len(out) < limit and any(u < len(src) for u, src in zip(used, sources)):
        k = rng.choices(range(len(sources)), weights=weights)[0]
        out.append(sources[k][used[k] % len(sources[k])])
        used[k] += 1
    return out


def load_rows_hf(name: str, split: str, key: str, **load_kwargs: Any) -> list[dict]:
    """The rows of split `split` of a saved folder (`load_from_disk`) or a `load_dataset` name or folder."""
    datasets = _datasets()
    p = Path(name)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
        with _quiet(datasets):
            ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(f"config key '{key}' = '{split}': no such split in '{name}' (it has {sorted(ds)})")
            ds = ds[split]
        elif split != "train":
            raise ConfigError(f"config key '{key}' = '{split}': '{name}' holds a single data set, read as split 'train'")
    else:
        try:
            with _quiet(datasets):
                ds = datasets.load_dataset(name, split=split, **load_kwargs)
        except (FileNotFoundError, ValueError, ConnectionError, datasets.exceptions.DatasetGenerationError,
                StopIteration) as e:  # DatasetGenerationError: a malformed file in the folder; its cause names it
            cause = e.__cause__ if isinstance(e, datasets.exceptions.DatasetGenerationError) and e.__cause__ else e
            raise ConfigError(f"task.name 'hf:{name}' split '{split}' (config key '{key}') cannot be loaded: "
                              f"{type(cause).__name__}: {(str(cause) or 'no rows').splitlines()[0]}") from None
    return [dict(row) for row in ds]


class FileTask:
    """Prompts (and optional answers and other columns) from your data; no verifier (`score` is None)."""

    score = None

    def __init__(self, train_sources: list[tuple[str, list[dict]]], eval_rows: list[dict] | None, *, train_size: int,
                 eval_size: int, seed: int, prompt_field: str = "prompt", answer_field: str | None = None,
                 weights: list[float] | None = None, source: str = "file", eval_source: str | None = None):
        """`train_sources`: (file name, rows) per training file; `weights`: one per file to mix them (else they
        are read one after the other). `answer_field` None takes an `answer` column when there is one."""
        self.prompt_field, self.source = prompt_field, source
        self.answer_field, self.answer_required = answer_field or "answer", answer_field is not None
        many = len(train_sources) > 1
        per_source = [[self._problem(r, f"{name} row {i}" if many else f"train row {i}") for i, r in enumerate(rows)]
                      for name, rows in train_sources]
        of = f" of '{eval_source}'" if eval_source else ""
        held = None if eval_rows is None else [self._problem(r, f"eval row {i}{of}") for i, r in enumerate(eval_rows)]
        if held is None:  # hold out eval_size rows of the train data, before any mixing repeats a row
            tagged = [(k, p) for k, problems in enumerate(per_source) for p in problems]
            random.Random(seed).shuffle(tagged)
            if eval_size >= len(tagged):
                raise ConfigError(f"task.eval_size = {eval_size} leaves no training rows ({source} has {len(tagged)}); "
                                  "give task.kwargs.eval or lower task.eval_size")
            held = [p for _, p in tagged[:eval_size]]
            per_source = [[p for j, p in tagged[eval_size:] if j == k] for k in range(len(per_source))]
        for (name, _), problems in zip(train_sources, per_source):
            if not problems:
                raise ConfigError(f"task '{source}' has no training rows in '{name}': expected at least one in "
                                  "task.kwargs.train")
        if weights:
            train = mix_by_weight(per_source, weights, seed, train_size)
        else:
            train = [p for problems in per_source for p in problems]
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
        if self.answer_required and self.answer_field not in row:
            raise ConfigError(f"task '{self.source}' {where} has no field '{self.answer_field}' "
                              f"(task.kwargs.answer_field; the row has {sorted(row)})")
        answer = row.get(self.answer_field)
        columns = {k: v for k, v in row.items() if k != self.prompt_field}
        return Problem(prompt=[dict(m) for m in prompt] if chat else prompt, answer="" if answer is None else str(answer),
                       meta={"columns": columns})

    def __len__(self) -> int:
        return len(self._train)

    def train(self, i: int) -> Problem:
        return self._train[i % len(self._train)]

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)


def _load_files(files: list[tuple[str, float | None]], key: str) -> list[tuple[str, list[dict]]]:
    """(path, rows) per file; errors name `key`, or `key[i]` in a list."""
    return [(path, load_rows_file(path, key if len(files) == 1 else f"{key}[{i}]")) for i, (path, _) in enumerate(files)]


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
            raise ConfigError("config key 'task.kwargs.train' is required for task 'file': a JSONL, JSON, Parquet or "
                              "CSV file, a list of them, or a list of {path, weight}")
        files = parse_file_list(train, "task.kwargs.train")
        sources = _load_files(files, "task.kwargs.train")
        eval_rows = None
        if ev:
            eval_files = parse_file_list(ev, "task.kwargs.eval")
            if any(w is not None for _, w in eval_files):
                raise ConfigError("config key 'task.kwargs.eval' takes files without weights (every eval row is used)")
            eval_rows = [row for _, rows in _load_files(eval_files, "task.kwargs.eval") for row in rows]
        weights = [w for _, w in files] if files[0][1] is not None else None
        return FileTask(sources, eval_rows, weights=weights, source=" + ".join(p for p, _ in files),
                        eval_source=" + ".join(p for p, _ in eval_files) if ev else None, **common)
    name = kind[3:]
    train, ev = kw.pop("train", "train"), kw.pop("eval", None)
    if not isinstance(train, str):
        raise ConfigError(f"config key 'task.kwargs.train' = {train!r}: task 'hf:{name}' takes one split name")
    return FileTask([(f"hf:{name}", load_rows_hf(name, train, "task.kwargs.train", **kw))],
                    load_rows_hf(name, ev, "task.kwargs.eval", **kw) if ev else None, source=f"hf:{name}", **common)
