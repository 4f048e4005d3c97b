"""The README's python snippets run verbatim."""

import re

import torch

from tests.e2e.common import REPO


def python_blocks(path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_loss_snippet_runs_verbatim():
    blocks = python_blocks(REPO / "README.md")
    assert blocks, "README.md has no python block"
    for code in blocks:
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert torch.isfinite(scope["loss"]) and scope["loss"].ndim == 0
    assert scope["log_probs"].grad is not None and scope["log_probs"].grad.abs().sum() > 0
    assert scope["adv"].shape == scope["mask"].shape
