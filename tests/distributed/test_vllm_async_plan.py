"""rollout.vllm_engine (the AsyncLLM backend, credo/distributed/vllm_async.py) without an engine: the default changes
nothing, `credo check` refuses what the async engine cannot run naming both keys, the trainer builds the async
backend with the offline one's settings, and vLLM's weight-version spans become per-token versions. The engine itself
is tested in test_vllm_async.py (heavy: two engine starts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from credo.config import load_recipe
from credo.plan import resolve_plan

QUICK = "recipes/quickstart.yaml"
ASYNC = ["rollout.backend=vllm", "rollout.vllm_engine=async"]


def test_the_default_is_the_offline_engine():
    r = load_recipe(QUICK, ["rollout.backend=vllm"])
    assert r.rollout.vllm_engine == "offline" and resolve_plan(r).backend == "vllm"
    assert resolve_plan(load_recipe(QUICK, ASYNC)).backend == "vllm_async"
    partial = resolve_plan(load_recipe(QUICK, [*ASYNC, "stages.schedule=overlap",
                                               "stages.schedule_kwargs={partial_rollout: true}"]))
    assert (partial.backend, partial.schedule.name) == ("vllm_async", "overlap")


@pytest.mark.parametrize("recipe,overrides,keys", [
    (QUICK, ["rollout.vllm_engine=async"], ("'rollout.vllm_engine'", "'rollout.backend'")),
    (QUICK, [*ASYNC, "cluster.engine=ray"], ("'rollout.vllm_engine'", "'cluster.engine'")),
    (QUICK, [*ASYNC, "stages.schedule=tail_batching"], ("stages.schedule", "'rollout.vllm_engine' = 'async'")),
    ("recipes/palette.yaml", ASYNC, ("stages.rollout", "'rollout.vllm_engine' = 'async'")),
    (QUICK, [*ASYNC, "stages.schedule=overlap"], ("'stages.schedule_kwargs.partial_rollout'", "'rollout.vllm_engine'")),
    (QUICK, [*ASYNC, "stages.schedule=overlap", "stages.schedule_kwargs={partial_rollout: true, workers: 2}"],
     ("'stages.schedule_kwargs.workers'", "'rollout.vllm_engine'")),
])
def test_credo_check_refuses_what_the_async_engine_cannot_run(recipe, overrides, keys, capsys, tmp_path):
    from credo.cli import main

    rc = main(["check", recipe, *overrides, f"run.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("credo: config error:")]
    assert all(k in line for k in keys), line


def test_the_trainer_builds_the_async_backend_with_the_offline_ones_settings(monkeypatch):
    """make_backend hands AsyncVLLMBackend what it hands VLLMBackend (bar the prompt embeddings it does not take)."""
    from credo.distributed import vllm_async, vllm_backend
    from credo.train import setup

    calls = {}

    def recorder(name):
        def build(path, **kw):
            calls[name] = (path, kw)
            return SimpleNamespace(name=name)
        return build

    monkeypatch.setattr(vllm_async, "AsyncVLLMBackend", recorder("async"))
    monkeypatch.setattr(vllm_backend, "VLLMBackend", recorder("offline"))
    engine = SimpleNamespace(module=SimpleNamespace(get_input_embeddings=lambda: None))
    for engine_key in ("offline", "async"):
        r = load_recipe(QUICK, ["rollout.backend=vllm", f"rollout.vllm_engine={engine_key}"])
        assert setup.make_backend(resolve_plan(r), engine, None, "/p").name == engine_key
    offline_kw = dict(calls["offline"][1])
    assert offline_kw.pop("input_embeddings") is None
    assert calls["async"] == ("/p", offline_kw)


def test_weight_version_spans_become_per_token_versions():
    from credo.distributed.vllm_async import span_versions

    Span = lambda v, s, e: SimpleNamespace(version=v, start=s, end=e)  # noqa: E731  vLLM's WeightVersionSpan
    spans = [Span("0", 0, 3), Span("2", 3, 4), Span("3", 4, 7)]
    want = []
    for s in spans:  # written out token by token
        for _ in range(s.start, s.end):
            want.append(int(s.version))
    assert span_versions(spans, 7, fallback=9) == want == [0, 0, 0, 2, 3, 3, 3]
    assert span_versions(None, 2, fallback=5) == [5, 5]  # no label reported: the backend's version
    assert span_versions([Span("0", 0, 1)], 3, fallback=4) == [0, 4, 4]
    with pytest.raises(RuntimeError, match="'default'"):
        span_versions([Span("default", 0, 1)], 1, fallback=0)
