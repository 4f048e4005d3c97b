"""task.name 'file' (JSONL, JSON, Parquet, CSV) and 'hf:<dir>': prompts, answers, the other columns, splits, errors."""

import csv
import json

import pytest

from credo.config import ConfigError, TaskConfig
from credo.tasks import make_task

ROWS = [{"prompt": f"q{i}", "answer": str(i * 2), "level": i % 3, "source": f"s{i}"} for i in range(12)]


def _write(path, rows):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif suffix == ".parquet":
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _task(**kwargs):
    return make_task(TaskConfig(name="file", eval_size=kwargs.pop("eval_size", 200), kwargs=kwargs))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_each_format_loads_prompts_answers_and_other_columns(tmp_path, suffix):
    train = _write(tmp_path / f"train{suffix}", ROWS[:8])
    ev = _write(tmp_path / f"eval{suffix}", ROWS[8:])
    task = _task(train=str(train), eval=str(ev))
    assert len(task) == 8
    p = task.train(3)
    assert p.prompt == "q3" and p.answer == "6"
    cols = p.meta["columns"]
    assert str(cols["level"]) == "0" and cols["source"] == "s3" and str(cols["answer"]) == "6"
    assert "prompt" not in cols
    assert [e.prompt for e in task.eval_problems()] == ["q8", "q9", "q10", "q11"]
    assert task.score is None  # no verifier: the reward comes from reward.functions


def test_custom_field_names_and_missing_answer(tmp_path):
    rows = [{"question": f"x{i}", "solution": i} for i in range(5)]
    train = _write(tmp_path / "t.jsonl", rows)
    task = _task(train=str(train), eval=str(train), prompt_field="question", answer_field="solution")
    assert task.train(1).prompt == "x1" and task.train(1).answer == "1"
    task = _task(train=str(train), eval=str(train), prompt_field="question", answer_field="nope")
    assert task.train(1).answer == ""


def test_without_eval_file_holds_out_eval_size_rows_disjoint_from_train(tmp_path):
    train = _write(tmp_path / "t.jsonl", ROWS)
    task = _task(train=str(train), eval_size=4)
    held = {p.prompt for p in task.eval_problems()}
    trained = {task.train(i).prompt for i in range(len(task))}
    assert len(held) == 4 and len(trained) == 8 and not held & trained
    with pytest.raises(ConfigError, match="task.eval_size = 12 leaves no training rows"):
        _task(train=str(train), eval_size=12)


def test_chat_message_prompts_are_kept_as_messages(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": f"u{i}"}], "answer": "a"}
            for i in range(3)]
    train = _write(tmp_path / "t.jsonl", rows)
    task = _task(train=str(train), eval=str(train))
    assert task.train(2).prompt == [{"role": "system", "content": "s"}, {"role": "user", "content": "u2"}]


def test_hf_saved_dataset_dict_and_single_dataset(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:8]),
                          "test": datasets.Dataset.from_list(ROWS[8:])}).save_to_disk(tmp_path / "dd")
    task = make_task(TaskConfig(name=f"hf:{tmp_path / 'dd'}", kwargs={"train": "train", "eval": "test"}))
    assert len(task) == 8 and len(task.eval_problems()) == 4 and task.train(0).meta["columns"]["source"] == "s0"
    with pytest.raises(ConfigError, match="task.kwargs.eval.*no such split"):
        make_task(TaskConfig(name=f"hf:{tmp_path / 'dd'}", kwargs={"eval": "validation"}))
    datasets.Dataset.from_list(ROWS).save_to_disk(tmp_path / "one")
    task = make_task(TaskConfig(name=f"hf:{tmp_path / 'one'}", eval_size=2))
    assert len(task) == 10 and len(task.eval_problems()) == 2


def test_hf_load_dataset_on_a_folder_of_files(tmp_path):
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data" / "train.jsonl", ROWS[:6])
    _write(tmp_path / "data" / "test.jsonl", ROWS[6:])
    task = make_task(TaskConfig(name=f"hf:{tmp_path / 'data'}", kwargs={"train": "train", "eval": "test"}))
    assert [task.train(i).prompt for i in range(len(task))] == [f"q{i}" for i in range(6)]


@pytest.mark.parametrize("kwargs, match", [
    ({}, "task.kwargs.train' is required"),
    ({"train": "nope.jsonl"}, "task.kwargs.train' = 'nope.jsonl': file not found"),
    ({"train": "x.txt"}, "unknown file type '.txt'"),
    ({"train": "{T}", "promt_field": "p"}, "unknown config key 'task.kwargs.promt_field'"),
    ({"train": "{T}", "prompt_field": "question"}, "train row 0 has no field 'question'"),
])
def test_errors_name_the_key(tmp_path, kwargs, match):
    t = str(_write(tmp_path / "t.jsonl", ROWS))
    kwargs = {k: v.replace("{T}", t) for k, v in kwargs.items()}
    with pytest.raises(ConfigError, match=match):
        _task(**kwargs)


def test_a_prompt_that_is_neither_text_nor_messages_is_rejected(tmp_path):
    t = _write(tmp_path / "t.jsonl", [{"prompt": 5, "answer": "1"}])
    with pytest.raises(ConfigError, match="field 'prompt' is a int, expected a string or a list of chat messages"):
        _task(train=str(t), eval=str(t))
