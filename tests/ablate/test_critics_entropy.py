"""benchmarks/critics_entropy.py: the policy's entropy taken from whichever key logged it, tested like credo report."""

import importlib.util
import json
from pathlib import Path

from credo.ablate.stats import holm, paired_diff

SPEC = importlib.util.spec_from_file_location("critics_entropy", Path(__file__).parents[2] / "benchmarks" / "critics_entropy.py")
critics_entropy = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(critics_entropy)


def _row(variant, seed, entropy, unfiltered=None, sha="w"):
    values = {"train/entropy last-10 mean": entropy, "train/entropy_unfiltered last-10 mean": unfiltered}
    return {"variant": variant, "seed": seed, "values": values, "warmup_key": f"{sha}{seed}"}


def test_filtered_runs_use_the_unfiltered_key_and_tests_are_paired(tmp_path, capsys):
    base_bonus, base_policy = [0.01, 0.02, 0.03], [0.20, 0.25, 0.31]   # the bonus term must not be used
    other = [0.22, 0.24, 0.35]
    third = [0.10, 0.30, 0.20]
    rows = [_row("asyppo", s, base_bonus[s], base_policy[s]) for s in range(3)]
    rows += [_row("ppo_full", s, other[s]) for s in range(3)] + [_row("grpo", s, third[s]) for s in range(3)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    critics_entropy.main([str(path), "--baseline", "asyppo"])
    out = capsys.readouterr().out
    d_full, d_grpo = paired_diff(other, base_policy), paired_diff(third, base_policy)
    p_holm = holm([d_full.p, d_grpo.p])
    assert f"| ppo_full | {d_full.diff:+.4f} [{d_full.low:+.4f}, {d_full.high:+.4f}] | paired | {d_full.p:.3f} | {p_holm[0]:.3f}" in out
    assert f"| grpo | {d_grpo.diff:+.4f}" in out and f"| {p_holm[1]:.3f} |" in out
    assert f"{sum(base_policy) / 3:.4f}" in out.splitlines()[0]


def test_different_warmups_fall_back_to_welch(tmp_path, capsys):
    rows = [_row("asyppo", s, 0.0, 0.2 + s / 10) for s in range(3)] + [_row("grpo", s, 0.3 + s / 10, sha="x") for s in range(3)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    critics_entropy.main([str(path)])
    out = capsys.readouterr().out
    assert "| grpo | +0.1000 [" in out and "| Welch |" in out and "paired" not in out


def test_the_entropy_table_in_the_docs_is_what_the_script_prints_from_the_committed_results(capsys):
    """docs/reproductions.md prints this script's table outside a `credo report` block: remake it from
    docs/results/critics.jsonl and require it there verbatim, so an edit of either shows."""
    repo = Path(__file__).parents[2]
    critics_entropy.main([str(repo / "docs" / "results" / "critics.jsonl"), "--baseline", "asyppo"])
    made = capsys.readouterr().out.strip()
    assert made.count("\n") >= 3
    assert made in (repo / "docs" / "reproductions.md").read_text(), "the critics entropy table of docs/reproductions.md differs from `python benchmarks/critics_entropy.py docs/results/critics.jsonl --baseline asyppo`"
