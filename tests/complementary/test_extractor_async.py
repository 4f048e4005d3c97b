"""`complementary.extractor_async` (beside.py): the extractor's step runs in a worker thread beside the actor's next
step. Its config errors; the worker's join, errors and state; and (slow) a run through the recipe against a
synchronous reference written here, which runs the extractor's step in the trainer's thread and shows the actor the
bank one step late: the same metrics (the extractor's one row later), the same banks, the same extractor."""

from __future__ import annotations

from credo.plan import resolve_plan
import copy
import json
import threading

import pytest
import torch

from credo.config import ConfigError, load_recipe
from credo.families.complementary.bank import ExperienceBank
from credo.families.complementary.beside import Beside
from tests.complementary.test_train_and_resume import LIMIT_S, extractor_params
from tests.complementary.test_vault_and_config import RECIPE, check
from tests.e2e.common import read_rows, run_cli
from tests.reliability.common import assert_same_run, has_checkpoint, run_and_kill, start, wait_ok

ON = "complementary.extractor_async=true"
STEPS = 4


def args(out, **extra) -> list[str]:
    """The recipe's own models and warm-ups (the actor's is cached in CREDO_CACHE after its first run; the tests'
    one-layer actor after 5 warm-up steps gains nothing from any lesson, so its bank would stay empty), 4 steps."""
    o = {"run.output_dir": out, "run.steps": STEPS, "run.eval_every": 2, "run.save_every": 2, "run.keep_last": 3,
         "run.plot": False, "run.progress": False, "run.threads": 1, "run.seed": 0, "env.eval_episodes": 16,
         "complementary.extractor_async": "true"}
    o.update(extra)
    return ["run", str(RECIPE), *(f"{k}={v}" for k, v in o.items())]


@pytest.mark.parametrize("override, match", [
    ("complementary.extractor=none", r"complementary\.extractor_async.*extractor: model or frozen"),
    ("complementary.extractor=self", r"complementary\.extractor_async.*got 'self'"),
    ("rollout.max_staleness=1", r"config keys 'complementary\.extractor_async' and 'stages\.schedule' cannot"),
    ("stages.schedule=fixed_lag", r"config keys 'complementary\.extractor_async' and 'stages\.schedule' cannot"),
])
def test_a_bad_combination_names_the_key(override, match):
    with pytest.raises(ConfigError, match=match):  # at load (its own section) or by the run plan (a refusal row)
        resolve_plan(load_recipe(RECIPE, [ON, override]))


def test_credo_check_passes_the_async_extractor():
    assert check(RECIPE, ON) == []
    assert check(RECIPE, ON, "complementary.extractor=frozen") == []
    assert load_recipe(RECIPE, []).complementary.extractor_async is False  # off by default


def bank_with(key: str, text: str) -> ExperienceBank:
    bank = ExperienceBank()
    bank.consolidate(key, text, 0.5, 1)
    return bank


def test_the_work_runs_beside_the_caller_and_its_error_is_raised_at_the_join():
    worker, started, release = Beside(), threading.Event(), threading.Event()

    def work():
        started.set()
        assert release.wait(30)  # blocks until the caller, which goes on meanwhile, releases it
        return {"extractor/x": 1.0, "thread": threading.current_thread().name}

    bank = bank_with("3", "code 7")
    worker.submit(4, bank, work)
    assert started.wait(30)  # running while submit has returned: another thread
    with pytest.raises(RuntimeError, match="before the previous one was installed"):
        worker.submit(5, ExperienceBank(), work)
    release.set()
    done = worker.take()
    assert done.step == 4 and done.bank is bank and done.metrics["thread"].startswith("credo-extractor")
    assert worker.take() is None

    def fails():
        raise ValueError("extractor broke")

    worker.submit(5, ExperienceBank(), fails)
    with pytest.raises(ValueError, match="extractor broke"):
        worker.join()
    worker.close()


def test_the_state_joins_the_work_in_flight_and_restores_it():
    worker, release = Beside(), threading.Event()
    bank = ExperienceBank()

    def work():
        assert release.wait(30)
        bank.consolidate("5", "code 2", 1.0, 6)  # changed by the worker after state_dict was asked for
        return {"bank/adds": 1}

    worker.submit(6, bank, work)
    threading.Timer(0.2, release.set).start()
    state = json.loads(json.dumps(worker.state_dict()))  # waits for the work; JSON as in meta.json
    assert state["step"] == 6 and state["metrics"] == {"bank/adds": 1}
    assert [e["text"] for e in state["bank"]["entries"]] == ["code 2"]
    other = Beside()
    other.load_state_dict(state, ExperienceBank)
    done = other.take()
    assert (done.step, done.metrics, done.bank.state_dict()) == (6, {"bank/adds": 1}, bank.state_dict())
    other.load_state_dict({}, ExperienceBank)
    assert other.take() is None
    worker.close()
    other.close()


HOOK_KEYS = ("extractor/", "bank/", "complementary/with_minus_without")


def reference_run(out, steps: int) -> tuple[list[dict], dict, dict, dict]:
    """The synchronous trainer with the extractor's step in the trainer's thread after the sync, sampling as the worker
    does (each row from its own seed), and the actor shown the bank as it was before the previous step's extractor work. Returns the
    metrics rows, the shown and the newest bank's states, and the extractor's parameters."""
    from credo.distributed.rollout import HFBackend
    from credo.trainer import Trainer

    r = load_recipe(RECIPE, args(out, **{"run.steps": steps, "run.save_every": 0,
                                         "complementary.extractor_async": "false"})[2:])
    trainer = Trainer(r)
    try:
        hook = next(h for h in trainer.c.hooks if h.name == "complementary")
        src, tok = trainer.source, hook.tokenizer
        hook.backend = HFBackend(hook.engine.module, tok, per_sample_seeds=True)
        paired = HFBackend(trainer.engine.module, tok, per_sample_seeds=True)  # the actor after the step's update
        newest = [src.bank]

        def lagged(step, batch):
            shown = copy.deepcopy(newest[0])  # the bank before this step's work: what step + 1 is shown
            view = copy.copy(src)
            view.bank, view.backend = newest[0], paired
            metrics = hook.work(step, batch, view)
            src.bank = shown
            return metrics

        hook.after_sync = lagged
        trainer.fit()
        rows = read_rows(out)
        extractor = {k: v.detach().clone() for k, v in hook.engine.module.state_dict().items()}
        return rows, src.bank.state_dict(), newest[0].state_dict(), extractor
    finally:
        trainer.close()


@pytest.mark.slow
def test_the_async_extractor_equals_a_synchronous_run_with_the_bank_one_step_late(tmp_path):
    steps = STEPS
    p = run_cli(args(tmp_path / "async"), timeout=LIMIT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_rows(tmp_path / "async")
    ref, shown, newest, extractor = reference_run(tmp_path / "ref", steps)
    assert [r["step"] for r in rows] == [r["step"] for r in ref] == list(range(steps + 1))
    # the lag: none at step 1 (nothing ran before it), exactly one step after
    assert [r["complementary/bank_lag"] for r in rows[1:]] == [0] + [1] * (steps - 1)
    assert not any(k.startswith(HOOK_KEYS) for k in rows[1])  # no extractor work had finished yet
    for k in range(1, steps + 1):
        a, b = rows[k], ref[k]
        actor = {key for key in b if not key.startswith(HOOK_KEYS + ("perf/",))}
        assert {key: a[key] for key in actor} == {key: b[key] for key in actor}, f"step {k}"
        if k > 1:  # the extractor's work on step k - 1, one row later
            hook = {key for key in ref[k - 1] if key.startswith(HOOK_KEYS)}
            assert hook and {key: a[key] for key in hook} == {key: ref[k - 1][key] for key in hook}, f"step {k}"
    assert any(r["bank/adds"] for r in ref[1:]) and any(r["complementary/injected_frac"] for r in rows[1:])
    # the checkpoint of the last step: the shown bank, the newest bank (the last step's work, joined) and the
    # extractor after that work
    ckpt = tmp_path / "async" / "checkpoints" / f"step_{steps:08d}"
    state = json.loads((ckpt / "meta.json").read_text())["components"]["source"]
    assert state["bank"] == shown and state["beside"]["bank"] == newest and state["beside"]["step"] == steps
    assert state["bank_step"] == steps - 1 and shown != newest
    saved = extractor_params(tmp_path / "async", steps)
    assert saved.keys() == extractor.keys() and all(torch.equal(saved[k], extractor[k]) for k in saved)


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_and_resume_is_exact(tmp_path):
    """Killed right after the step-2 checkpoint (the extractor's work on step 2 joined and saved, that of step 3
    possibly running) and resumed to step 4: metrics less perf/*, the actor, the banks and the extractor equal the
    uninterrupted run's, bit for bit."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    wait_ok(start(args(full), tmp_path / "full.log"), timeout=LIMIT_S)
    run_and_kill(args(killed), has_checkpoint(killed, 2), tmp_path / "killed.log", timeout=LIMIT_S)
    assert not (killed / "checkpoints" / f"step_{STEPS:08d}").exists()
    err = wait_ok(start(args(killed, **{"run.resume": "auto"}), tmp_path / "resumed.log"), timeout=LIMIT_S)
    assert "resumed from" in err
    assert_same_run(full, killed, STEPS)
    for step in (2, STEPS):
        states = [json.loads((d / "checkpoints" / f"step_{step:08d}" / "meta.json").read_text())["components"]
                  ["source"] for d in (full, killed)]
        for state in states:  # the worker's wall time is saved with its metrics
            state["beside"]["metrics"] = {k: v for k, v in state["beside"]["metrics"].items() if "perf/" not in k}
        assert states[0] == states[1] and states[0]["beside"]["step"] == step and states[0]["bank_step"] == step - 1
        a, b = extractor_params(full, step), extractor_params(killed, step)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert states[0]["beside"]["bank"]["entries"]
    assert [r["complementary/bank_lag"] for r in read_rows(killed)[1:]] == [0, 1, 1, 1]
