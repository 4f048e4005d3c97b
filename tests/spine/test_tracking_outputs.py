"""The run folder's records beyond metrics.jsonl: curves.png's eval and reward panels draw what the run logs,
TensorBoard mirrors the metrics, and each evaluation's sample completions land in samples/step_<N>.jsonl."""

from __future__ import annotations

import json
import logging

import pytest

from credo.tracking import Tracker, curves_figure, write_samples


def _lines(fig) -> dict[str, dict[str, list]]:
    """Visible axes: title -> {line label: (x values, y values)}."""
    return {ax.get_title(): {ln.get_label(): ([float(x) for x in ln.get_xdata()], [float(y) for y in ln.get_ydata()])
                             for ln in ax.get_lines()}
            for ax in fig.axes if ax.get_visible()}


def _rows() -> list[dict]:
    rows = [{"step": 0, "eval/reward_mean": 0.2, "eval/return": -1.0}]
    for s in (1, 2, 3, 4):
        rows.append({"step": s, "train/reward_mean": 0.1 * s, "train/rewards/correct": 0.2 * s,
                     "train/rewards/format": 1.0 - 0.1 * s, "train/loss": 1.0 / s})
    rows.append({"step": 4, "eval/reward_mean": 0.6, "eval/return": 0.5})
    return rows


def test_eval_panel_draws_every_eval_metric_and_reward_panel_each_function():
    import matplotlib.pyplot as plt

    fig = curves_figure(_rows())
    panels = _lines(fig)
    plt.close(fig)
    assert panels["eval"] == {"reward_mean": ([0.0, 4.0], [0.2, 0.6]), "return": ([0.0, 4.0], [-1.0, 0.5])}
    reward = panels["reward"]
    assert set(reward) == {"reward_mean", "correct", "format"}
    assert reward["correct"][1] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert reward["format"][1] == pytest.approx([0.9, 0.8, 0.7, 0.6])


def test_eval_panel_with_accuracy_only_keeps_its_one_line():
    import matplotlib.pyplot as plt

    fig = curves_figure([{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "train/reward_mean": 0.3},
                         {"step": 2, "eval/accuracy": 0.4, "eval/note": "text is not drawn"}])
    panels = _lines(fig)
    plt.close(fig)
    assert panels["eval"] == {"accuracy": ([0.0, 2.0], [0.1, 0.4])}
    assert list(panels["reward"]) == ["reward_mean"]


def test_cluster_panels_draw_each_roles_busy_fraction_workers_and_queue_only_on_ray():
    import matplotlib.pyplot as plt

    rows = [{"step": s, "train/reward_mean": 0.1, "cluster/rollout_busy_frac": 0.2 * s, "cluster/reward_busy_frac": 0.1,
             "cluster/rollout_workers": 1 + s, "cluster/reward_workers": 4, "cluster/worker_restarts": s - 1,
             "cluster/rollout_queue_depth": s, "cluster/rollout_sync_bytes": 100, "cluster/connect_s": 2.0}
            for s in (1, 2, 3)]
    fig = curves_figure(rows)
    panels = _lines(fig)
    plt.close(fig)
    assert panels["cluster: busy fraction"]["rollout_busy_frac"][1] == pytest.approx([0.2, 0.4, 0.6])
    assert set(panels["cluster: busy fraction"]) == {"rollout_busy_frac", "reward_busy_frac"}
    assert set(panels["cluster: workers"]) == {"worker_restarts", "rollout_workers", "reward_workers"}
    assert panels["cluster: workers"]["worker_restarts"][1] == [0.0, 1.0, 2.0]
    assert panels["cluster: queue depth"] == {"rollout_queue_depth": ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])}
    local = curves_figure([{k: v for k, v in r.items() if not k.startswith("cluster/")} for r in rows])
    titles = set(_lines(local))
    plt.close(local)
    assert not any(t.startswith("cluster") for t in titles)  # a local run's figure is as before


def _tracker(run_dir, **kw) -> Tracker:
    return Tracker(run_dir, total_steps=4, start_step=kw.pop("start_step", 0), enabled=True, progress=False,
                   plot=False, wandb_cfg=None, config={}, **kw)


def test_tensorboard_holds_the_logged_scalars_and_the_samples(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = _tracker(tmp_path, tensorboard_dir=tmp_path / "tb")
    for row in _rows():
        tracker.log(row)
    tracker.log_samples(4, ["1+1=", "2+2="], ["2", "5"], [1.0, 0.0])
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars["eval/return"] == [(0, -1.0), (4, 0.5)]
    assert [(s, round(v, 6)) for s, v in scalars["train/rewards/format"]] == [(1, 0.9), (2, 0.8), (3, 0.7), (4, 0.6)]
    assert "step" not in scalars
    (text,) = acc.Tensors("eval/samples/text_summary")  # TensorBoard stores text as a string tensor
    assert text.step == 4 and "2+2=" in text.tensor_proto.string_val[0].decode() and "→ 5" in text.tensor_proto.string_val[0].decode()


def test_samples_are_written_and_shown_in_the_log(tmp_path, caplog):
    prompts = [[{"role": "user", "content": "What is 2+2?"}], "3+3=", "4+4="]
    with caplog.at_level(logging.INFO, logger="credo"):
        path = write_samples(tmp_path, 20, prompts, ["4", "7", "8"], [1.0, 0.0, None], show=2)
    assert path == tmp_path / "samples" / "step_20.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"step": 20, "prompt": prompts[0], "completion": "4", "reward": 1.0},
                    {"step": 20, "prompt": "3+3=", "completion": "7", "reward": 0.0},
                    {"step": 20, "prompt": "4+4=", "completion": "8", "reward": None}]
    shown = [r.getMessage() for r in caplog.records if "eval sample" in r.getMessage()]
    assert len(shown) == 2 and "What is 2+2?" in shown[0] and "-> 4" in shown[0] and "-> 7" in shown[1]
    with pytest.raises(ValueError, match="2 prompts, 1 completions and 2 rewards"):
        write_samples(tmp_path, 1, ["a", "b"], ["x"], [0.0, 1.0])


def test_disabled_tracker_writes_nothing(tmp_path):
    tracker = Tracker(tmp_path, total_steps=1, start_step=0, enabled=False, progress=False, plot=False,
                      wandb_cfg=None, config={}, tensorboard_dir=tmp_path / "tb")
    tracker.log({"step": 1, "train/loss": 1.0})
    tracker.log_samples(1, ["p"], ["c"], [1.0])
    tracker.close()
    assert not (tmp_path / "tb").exists() and not (tmp_path / "samples").exists()


@pytest.mark.slow
def test_a_run_writes_tensorboard_events_and_eval_samples(tmp_path):
    """run.tensorboard and the evaluator's samples, wired through the builder and the trainer."""
    from credo.config import load_recipe
    from credo.trainer import train
    from tests.e2e.common import tiny_overrides

    run_dir = train(load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **{
        "run.steps": 2, "run.eval_every": 2, "run.tensorboard": True})))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    for step in (0, 2):
        rows = [json.loads(x) for x in (run_dir / "samples" / f"step_{step}.jsonl").read_text().splitlines()]
        assert rows and all(r["step"] == step and r["reward"] in (0.0, 1.0) for r in rows)
