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
    task = _task(train=str(train), eval=str(train), prompt_field="question")  # no answer_field, no answer column
    assert task.train(1).answer == ""


def test_an_answer_field_naming_a_missing_column_is_an_error_naming_key_and_file(tmp_path):
    train = _write(tmp_path / "t.jsonl", [{"question": f"x{i}", "solution": i} for i in range(5)])
    with pytest.raises(ConfigError, match=r"task '.*t\.jsonl' train row 0 has no field 'nope' \(task.kwargs.answer_field; "
                                          r"the row has \['question', 'solution'\]\)"):
        _task(train=str(train), eval=str(train), prompt_field="question", answer_field="nope")
    ev = _write(tmp_path / "e.jsonl", [{"question": "y", "answer": 1}])
    with pytest.raises(ConfigError, match=r"eval row 0 of '.*e\.jsonl' has no field 'solution'"):
        _task(train=str(train), eval=str(ev), prompt_field="question", answer_field="solution")


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


def _rows(tag: str, n: int) -> list[dict]:
    return [{"prompt": f"{tag}{i}", "answer": str(i)} for i in range(n)]


def test_a_list_of_files_is_read_in_order_and_held_out_across_files(tmp_path):
    a, b = _write(tmp_path / "a.jsonl", _rows("a", 5)), _write(tmp_path / "b.csv", _rows("b", 3))
    ev = _write(tmp_path / "e.jsonl", _rows("e", 2))
    task = _task(train=[str(a), str(b)], eval=[str(ev), str(a)])
    assert [task.train(i).prompt for i in range(len(task))] == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2"]
    assert [p.prompt for p in task.eval_problems()] == ["e0", "e1", "a0", "a1", "a2", "a3", "a4"]
    task = _task(train=[str(a), str(b)], eval_size=3)
    held = {p.prompt for p in task.eval_problems()}
    trained = [task.train(i).prompt for i in range(len(task))]
    assert len(held) == 3 and len(trained) == 5 and not held & set(trained)
    assert held | set(trained) == {f"a{i}" for i in range(5)} | {f"b{i}" for i in range(3)}


def test_weighted_files_mix_by_weight_deterministically_by_seed(tmp_path):
    a, b = _write(tmp_path / "a.jsonl", _rows("a", 200)), _write(tmp_path / "b.jsonl", _rows("b", 100))
    spec = [{"path": str(a), "weight": 0.7}, {"path": str(b), "weight": 0.3}]
    ev = str(_write(tmp_path / "e.jsonl", _rows("e", 2)))

    def drawn(seed, **kw):
        task = make_task(TaskConfig(name="file", seed=seed, kwargs={"train": spec, "eval": ev}, **kw))
        return [task.train(i).prompt for i in range(len(task))]

    mixed = drawn(0)
    from_a = [p for p in mixed if p.startswith("a")]
    # every row of both files is drawn at least once, b (the one that runs out last) exactly once, in file order
    assert set(from_a) == {f"a{i}" for i in range(200)} and [p for p in mixed if p.startswith("b")] == [f"b{i}" for i in range(100)]
    assert from_a[:200] == [f"a{i}" for i in range(200)]  # a runs through in order, then starts over
    assert abs(len(from_a) / len(mixed) - 0.7) < 0.05, len(from_a) / len(mixed)
    assert drawn(0) == mixed and drawn(1) != mixed  # task.seed decides the order
    assert len(drawn(0, train_size=50)) == 50 and drawn(0, train_size=50) == mixed[:50]


@pytest.mark.parametrize("train, match", [
    ([5], r"task.kwargs.train\[0\]' is a int; expected a file or \{path, weight\}"),
    ([{"file": "{A}"}], r"task.kwargs.train\[0\]' = .*expected \{path: FILE, weight: NUMBER\} \(unknown key 'file'\)"),
    ([{"path": "{A}", "weight": -1}], r"task.kwargs.train\[0\].weight' = -1: expected a positive number"),
    ([{"path": "{A}", "weight": 1}, "{A}"], r"task.kwargs.train\[1\]' has no weight while others have one"),
    (["{A}", "nope.jsonl"], r"task.kwargs.train\[1\]' = 'nope.jsonl': file not found"),
    ({"path": "{A}"}, r"task.kwargs.train' is a dict; expected a file, a list of files"),
])
def test_file_list_errors_name_the_entry(tmp_path, train, match):
    a = str(_write(tmp_path / "a.jsonl", _rows("a", 5)))

    def fill(x):
        if isinstance(x, str):
            return x.replace("{A}", a)
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        return [fill(v) for v in x] if isinstance(x, list) else x

    with pytest.raises(ConfigError, match=match):
        _task(train=fill(train), eval=a)


def test_file_lists_from_a_yaml_recipe(tmp_path):
    """The recipe path: OmegaConf hands the list over as a ListConfig of DictConfigs."""
    from credo.config import load_recipe

    a, b = _write(tmp_path / "a.jsonl", _rows("a", 4)), _write(tmp_path / "b.jsonl", _rows("b", 4))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"run: {{name: x}}\ntask:\n  name: file\n  kwargs:\n    train: [{{path: {a}, weight: 1}}, "
                      f"{{path: {b}, weight: 3}}]\n    eval: {a}\n")
    task = make_task(load_recipe(str(recipe), []).task)
    prompts = [task.train(i).prompt for i in range(len(task))]
    assert {p[0] for p in prompts} == {"a", "b"} and sum(p.startswith("b") for p in prompts) > len(prompts) / 2
