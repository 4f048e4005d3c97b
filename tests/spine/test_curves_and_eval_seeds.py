"""curves.png's panels, and evaluation seeds that do not depend on the number of processes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from credo.tracking import curves_figure, plot_curves
from credo.train.evaluate import Evaluator
from credo.train.rollout import step_seed


def _rows(kl: bool) -> list[dict]:
    rows = [{"step": 0, "eval/accuracy": 0.1}]
    for s in (1, 2, 3):
        row = {"step": s, "train/reward_mean": 0.1 * s, "train/loss": 1.0 / s, "train/entropy": 2.0 - 0.1 * s,
               "train/grad_norm": 0.5 * s, "train/response_len": 4.0 + s}
        if kl:
            row["train/kl"] = 0.01 * s
        rows.append(row)
    return rows


def _panels(fig) -> dict[str, list]:
    """Visible axes: title -> the y values drawn."""
    return {ax.get_title(): [float(y) for line in ax.get_lines() for y in line.get_ydata()]
            for ax in fig.axes if ax.get_visible()}


@pytest.mark.parametrize("kl", [False, True])
def test_curves_show_kl_entropy_grad_norm_and_length(kl, tmp_path):
    import matplotlib.pyplot as plt

    fig = curves_figure(_rows(kl))
    panels = _panels(fig)
    plt.close(fig)
    expected = {"reward", "eval", "loss", "entropy", "grad norm", "response length"}
    assert set(panels) == expected | ({"KL to reference"} if kl else set())
    assert panels["entropy"] == pytest.approx([1.9, 1.8, 1.7])
    assert panels["grad norm"] == pytest.approx([0.5, 1.0, 1.5])
    assert panels["response length"] == [5.0, 6.0, 7.0]
    if kl:
        assert panels["KL to reference"] == pytest.approx([0.01, 0.02, 0.03])
    plot_curves(_rows(kl), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


class _Tok:
    """Token ids = the prompt's characters' codes."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) for c in t] for t in texts]}

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(i) for i in x) for x in ids]


class _Source:
    """Echoes each request's (prompt, seed) so the test sees exactly which draws each rank asked for."""

    def __init__(self):
        self.draws: list[tuple[str, int]] = []

    def generate(self, prompts, *, temperature, seeds):
        out = []
        for p, s in zip(prompts, seeds):
            self.draws.append(("".join(chr(i) for i in p), s))
            out.append(SimpleNamespace(response_ids=[ord(c) for c in str(s % 7)]))
        return out


def _eval_draws(world: int, n_problems: int, k: int) -> tuple[list[tuple[str, int]], float]:
    """Every rank's draws (run one after another in this process) and the accuracy over all ranks."""
    problems = [SimpleNamespace(prompt=f"p{j}") for j in range(n_problems)]
    task = SimpleNamespace(eval_problems=lambda: problems,
                           score=lambda text, problem: float(int(text) in (0, 3)))  # depends on the seed drawn
    draws, correct, total = [], 0.0, 0
    for rank in range(world):
        source = _Source()
        ev = Evaluator(task, _Tok(), source, seed=11, temperature=0.7, samples=k, rank=rank, world=world)
        acc = ev()  # a world of one in this process: all_reduce_sum is the identity, acc is this rank's
        draws += source.draws
        correct += acc * len(source.draws)
        total += len(source.draws)
    return sorted(draws), correct / total


@pytest.mark.parametrize("world", [2, 3, 4])
def test_eval_seeds_do_not_depend_on_the_number_of_processes(world):
    one, acc_one = _eval_draws(1, n_problems=10, k=3)
    many, acc_many = _eval_draws(world, n_problems=10, k=3)
    assert many == one
    assert acc_many == acc_one


def test_eval_seeds_of_one_process_are_unchanged():
    """With one process, sample s of problem j keeps seed step_seed(seed, -1, j * k + s), as before the change
    (the quickstart's eval/accuracy stays bit-identical)."""
    draws, _ = _eval_draws(1, n_problems=5, k=2)
    assert sorted(draws) == sorted((f"p{j}", step_seed(11, -1, j * 2 + s)) for j in range(5) for s in range(2))
