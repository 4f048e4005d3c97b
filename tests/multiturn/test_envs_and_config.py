"""Env ids, the strict env: section, the recipes, GEM games through the source, and determinism."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from credo.config import ConfigError, load_recipe
from credo.families.multiturn.envs import check_env_id, make_env
from tests.multiturn.common import env_cfg, source

REPO = Path(__file__).resolve().parents[2]
STAGES = ["stages.rollout=multiturn", "stages.reward=env", "stages.advantage=turn_credit"]


def test_unknown_builtin_env_id_lists_close_ids():
    with pytest.raises(ConfigError, match=r"'env.id' = 'credo:GuessNumber-v1' is not a known environment; "
                                          r"close ids: credo:GuessNumber-v0"):
        check_env_id("credo:GuessNumber-v1")
    with pytest.raises(ConfigError, match=r"env.kwargs' for 'credo:GuessNumber-v0'.*unexpected keyword argument 'lo'"):
        make_env("credo:GuessNumber-v0", lo=2)


def test_env_section_is_strict_and_consistent():
    with pytest.raises(ConfigError, match=r"unknown config key 'env.max_turn'; did you mean 'env.max_turns'"):
        load_recipe(None, ["run.name=x", "env.max_turn=3"])
    with pytest.raises(ConfigError, match=r"'env.id' = 'credo:GuessNumber-v0' is set but stages.rollout is 'default'"):
        load_recipe(None, ["run.name=x", "env.id=credo:GuessNumber-v0"])
    with pytest.raises(ConfigError, match=r"'stages.rollout' = 'multiturn' needs an environment: set env.id"):
        load_recipe(None, ["run.name=x", "stages.rollout=multiturn"])
    with pytest.raises(ConfigError, match=r"needs stages.reward: env"):
        load_recipe(None, ["run.name=x", "env.id=credo:GuessNumber-v0", "stages.rollout=multiturn"])
    with pytest.raises(ConfigError, match=r"'env.max_new_tokens_per_turn' = 64 is out of range: expected < env.max_total_tokens \(64\)"):
        load_recipe(None, ["run.name=x", "env.id=credo:GuessNumber-v0", *STAGES, "env.max_total_tokens=64",
                           "env.max_new_tokens_per_turn=64"])
    with pytest.raises(ConfigError, match=r"'env.observation_template' = 'obs' is out of range: expected auto, or a string with '\{observation\}'"):
        load_recipe(None, ["run.name=x", "env.observation_template=obs"])
    with pytest.raises(ConfigError, match=r"'env.step_timeout_s' = 0.0 is out of range: expected > 0"):
        load_recipe(None, ["run.name=x", "env.step_timeout_s=0"])


def test_recipes_load_with_every_credit():
    r = load_recipe(REPO / "recipes" / "multiturn.yaml")
    assert r.env.id == "credo:GuessNumber-v0" and r.stages.advantage_kwargs["credit"] == "mc_rebn"
    sweep = (REPO / "recipes" / "ablations" / "multiturn.yaml").read_text()
    for credit in ("grpo", "mc_rebn", "ipa"):
        assert credit in sweep
    r = load_recipe(REPO / "recipes" / "multiturn.yaml", ["stages.advantage_kwargs={credit: ipa, gamma: 0.9}",
                                                           "algo.policy_loss=ipa"])
    assert r.algo.policy_loss == "ipa"




def test_gem_id_typo_lists_close_ids():
    pytest.importorskip("gem")
    with pytest.raises(ConfigError, match=r"close ids: game:GuessTheNumber-v0-easy"):
        check_env_id("game:GuessTheNumber-v0-eazy")


def test_gem_game_through_the_source():
    """GEM's own GuessTheNumber: \\boxed{} actions, its reward constants, its turn limit."""
    pytest.importorskip("gem")
    guesses = iter(range(1, 100))
    cfg = env_cfg(id="game:GuessTheNumber-v0-easy", kwargs={}, max_turns=6, max_total_tokens=2000,
                  max_new_tokens_per_turn=16)
    src, backend, _ = source(cfg, lambda c: "\\boxed{%d}" % next(guesses), envs=None, P=1, G=1)
    src.env_factory = lambda: make_env(cfg.id)
    batch = src.rollout(step=1)
    s = batch.samples[0]
    assert "Guess The Number" in src.tokenizer.decode(s.prompt_ids)
    assert s.meta["end"] in ("terminated", "env_truncated") and len(s.meta["turn_rewards"]) <= 4  # easy: 4 turns
    assert backend.calls == [1] * len(s.meta["turn_rewards"])
    assert all(r in (0.0, 1.0) or 0 <= r <= 1 for r in s.meta["turn_rewards"])


def test_same_step_same_episodes():
    """Env seeds and sampling seeds are functions of (seed, step): a resumed run replays the same episodes."""
    import torch

    from credo.distributed.rollout import HFBackend
    from credo.models import build_char_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1, pad_token_id=0,
                                         eos_token_id=tok.eos_token_id))
    from credo.families.multiturn.envs.guess import GuessNumberEnv

    def play(step):
        src, _, _ = source(env_cfg(), None, envs=lambda: GuessNumberEnv(max_turns=3), P=2, G=1,
                           tokenizer=tok, backend=HFBackend(model, tok))
        return [(s.response_ids, s.meta["env_seed"], s.meta["turn_rewards"]) for s in src.rollout(step).samples]

    first = play(4)
    assert play(4) == first and play(5) != first
    assert first[0][1] != first[1][1]  # two games, two env seeds


def test_gpu_recipe_passes_credo_check():
    pytest.importorskip("gem")
    p = subprocess.run([sys.executable, "-m", "credo.cli", "check", "recipes/gpu/multiturn_qwen3_4b.yaml"], cwd=REPO,
                       capture_output=True, text=True, timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    r = load_recipe(REPO / "recipes" / "gpu" / "multiturn_qwen3_4b.yaml")
    assert r.model.path.startswith("Qwen/Qwen3-4B") and r.env.id.startswith("game:")
    assert r.rollout.backend == "vllm" and r.stages.rollout == "multiturn"


def test_char_tokenizer_keeps_whitespace_after_save_and_load(tmp_path):
    from credo.models import build_char_tokenizer, load_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.decode(tok("guess 1-7\nhigher", add_special_tokens=False)["input_ids"]) == "guess 1-7\nhigher"


def _guess_recipe_on_a_64_token_model():
    from credo.config import recipe_class

    r = recipe_class()()
    r.model.path, r.model.tiny.max_position_embeddings = "tiny", 64
    r.model.tiny.num_layers, r.model.tiny.hidden_size, r.model.tiny.num_heads = 1, 32, 2
    r.model.tiny.num_kv_heads, r.model.tiny.intermediate_size = 1, 64
    return r


def test_env_max_total_tokens_is_checked_against_the_tiny_models_context():
    import pytest

    from credo.config import ConfigError
    from credo.families.multiturn.build import task as env_task

    r = _guess_recipe_on_a_64_token_model()
    r.env.id, r.env.max_total_tokens = "credo:GuessNumber-v0", 100
    with pytest.raises(ConfigError, match=r"'env.max_total_tokens' = 100 is more than the model's context of 64 tokens"):
        env_task(r)


def test_env_task_renders_the_first_observation_as_every_other_without_a_chat_template():
    from credo.families.multiturn.envs import make_env
    from credo.families.multiturn.task import DEMO_SEED_BASE
    from credo.families.multiturn.build import task as env_task

    r = _guess_recipe_on_a_64_token_model()
    r.env.id, r.env.max_total_tokens = "credo:GuessNumber-v0", 64
    task = env_task(r)
    first = make_env(r.env.id, **dict(r.env.kwargs)).reset(seed=DEMO_SEED_BASE)[0]
    problem = task.train(0)
    # the tiny model's tokenizer has no chat template: the first observation is an observation block
    assert problem.prompt == f"\n{first}\n" and problem.meta["env_seed"] == DEMO_SEED_BASE
    assert problem.answer  # the expert episode's actions
