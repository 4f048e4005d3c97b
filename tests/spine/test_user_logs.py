"""Issue 57 A.6: what a new user reads in the log. Two eval-sample lines show two prompts; without a terminal the
progress bar is plain `step N/M` lines (no `\\r`); `credo.train` from Python shows credo's INFO lines and no
transformers progress bars, as the CLI does; `credo eval` prints its header before its result."""

from __future__ import annotations

import json
import logging

from credo import cli
from credo.tracking import PlainProgress, Tracker, write_samples



def test_the_two_eval_sample_lines_show_different_prompts(tmp_path, caplog):
    prompts = ["3+4=", "3+4=", "3+4=", "5+1=", "5+1="]  # samples of a prompt come together
    with caplog.at_level(logging.INFO, logger="credo"):
        write_samples(tmp_path, 0, prompts, ["7", "8", "7", "6", "6"], [1.0, 0.0, 1.0, 1.0, 1.0])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval sample")]
    assert len(lines) == 2 and "3+4= -> 7" in lines[0] and "5+1= -> 6" in lines[1]
    rows = [json.loads(l) for l in (tmp_path / "samples" / "step_0.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == prompts  # the file keeps every sample


def test_without_a_terminal_the_progress_is_plain_lines(tmp_path, caplog, capsys):
    tracker = Tracker(tmp_path, total_steps=20, start_step=0, enabled=True, progress=True, plot=False, wandb_cfg=None,
                      config={})
    assert isinstance(tracker.bar, PlainProgress)  # pytest's stderr is no terminal
    with caplog.at_level(logging.INFO, logger="credo"):
        for step in range(21):
            tracker.log({"step": step, "train/reward_mean": 0.5})
    tracker.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [l.split()[1] for l in lines] == [f"{n}/20" for n in range(2, 21, 2)]
    assert lines[-1].startswith("step 20/20 (100%), reward 0.500, ")
    assert "\r" not in capsys.readouterr().err


def test_credo_train_from_python_shows_credos_info_lines_and_no_progress_bars(tmp_path, monkeypatch, capsys):
    import credo
    import credo.trainer
    from transformers.utils import logging as hf_logging

    seen = {}

    def fake_training(recipe):
        logging.getLogger("credo.train").info("step 1 from credo")
        seen["bars"] = hf_logging.is_progress_bar_enabled()
        return tmp_path

    credo_log = logging.getLogger("credo")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # a script that configured no logging of its own
    monkeypatch.setattr(credo_log, "handlers", [])
    monkeypatch.setattr(credo_log, "level", logging.NOTSET)
    monkeypatch.setattr(credo.trainer, "train", fake_training)
    hf_logging.enable_progress_bar()
    try:
        assert credo.train("recipes/quickstart.yaml") == tmp_path
    finally:
        hf_logging.enable_progress_bar()
    assert "INFO credo.train: step 1 from credo" in capsys.readouterr().err
    assert seen["bars"] is False


def test_credo_eval_prints_its_header_before_its_result(monkeypatch, capsys):
    import credo.evaluation as ev

    class R:
        class run:
            verbose = False

    monkeypatch.setattr(ev, "eval_recipe", lambda recipe, overrides=(): R)
    monkeypatch.setattr(ev, "evaluate_model", lambda model, recipe, **kw: {
        "metrics": {"eval/accuracy": 0.25}, "eval_samples": 1, "eval_temperature": 0.0})
    assert cli.main(["eval", "runs/x/final", "recipes/quickstart.yaml"]) == 0
    assert capsys.readouterr().out.splitlines() == ["credo eval: runs/x/final on recipes/quickstart.yaml (greedy)",
                                                    "eval/accuracy = 0.25"]


def test_deepspeeds_cpu_accelerator_note_is_shown_only_with_verbose():
    """Round-4 trial: `credo check recipes/shop.yaml` (and multiturn, longtail) printed DeepSpeed's '[WARNING]
    [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. If you have GPU ...' among its notes:
    transformers imports DeepSpeed through accelerate, and DeepSpeed logs it on every import without CUDA. Checked
    on the logger DeepSpeed logs it through (`deepspeed.utils.logger` is logging.getLogger('DeepSpeed')), with a
    handler of our own; another DeepSpeed warning still shows."""
    ds = logging.getLogger("DeepSpeed")
    filters, seen = list(ds.filters), []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    ds.addHandler(keep)
    try:
        cli._quiet_libraries()
        ds.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        ds.warning("another DeepSpeed warning")
        assert seen == ["another DeepSpeed warning"]
        cli._library_verbosity(True)  # run.verbose: DeepSpeed's own lines, this one included
        ds.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        assert seen[-1].startswith("Setting accelerator to CPU")
    finally:
        ds.removeHandler(keep)
        ds.filters[:] = filters
        cli._library_verbosity(False)
