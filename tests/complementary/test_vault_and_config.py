"""The vault game (lessons transfer across episodes of a task), its scripted lessons, and the `complementary:`
section's errors at load and at `credo check`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from credo.config import ConfigError, load_recipe
from credo.families.complementary.extractor import demo_pairs
from credo.families.complementary.source import NotedEnv, strip_note, with_note
from credo.families.multiturn.envs import make_env
from credo.families.multiturn.envs.vault import scripted_lesson

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "complementary.yaml"


def test_a_task_hides_the_same_code_in_every_episode():
    env = make_env("credo:Vault-v0", n_tasks=4, low=1, high=9, max_turns=2)
    codes = {}
    for seed in range(40):
        env.reset(seed=seed)
        codes.setdefault(seed % 4, set()).add(env.code)
    assert all(len(c) == 1 for c in codes.values())
    assert len({next(iter(c)) for c in codes.values()}) > 1  # different tasks, different codes


def test_the_lesson_of_one_episode_opens_a_later_vault_of_the_task_at_once():
    env = make_env("credo:Vault-v0", n_tasks=8, max_turns=2)
    rng = random.Random(0)
    obs, _ = env.reset(seed=3)
    actions, observations = [], []
    for _ in range(2):
        a = env.expert_action(rng, 0.0)
        o, r, term, trunc, _ = env.step(a)
        actions.append(a)
        observations.append(o)
        if term or trunc:
            break
    lesson = env.lesson_demo(actions, observations)
    env.pin_note(lesson)
    obs, _ = env.reset(seed=3 + 8 * 5)  # another episode of task 3
    assert obs.startswith(f"note: {lesson}\n") and strip_note(obs) == "vault 3 code 1-9"
    expert = env.expert_action(rng, 0.0)
    if observations[-1] == "open":
        assert env.step(expert)[:3] == ("open", 1.0, True)  # the expert trusts the note: first try
    else:  # an unopened episode's lesson is the middle of what its feedback left
        assert lesson == f"code {int(expert)}"


def test_scripted_lesson_reference():
    assert scripted_lesson(["5", "7"], ["higher", "open"], 1, 9) == "code 7"
    assert scripted_lesson(["5", "7"], ["higher", "lower"], 1, 9) == "code 6"
    assert scripted_lesson(["x"], ["invalid"], 1, 9) == "code 5"


def test_warm_up_notes_only_where_not_pinned():
    env = make_env("credo:Vault-v0", note_frac=1.0)
    assert env.reset(seed=1)[0].startswith("note: code ")
    env.pin_note("")
    assert not env.reset(seed=1)[0].startswith("note:")


def test_noted_env_wraps_an_env_without_pin_note():
    env = with_note(make_env("credo:GuessNumber-v0"), "try 4")
    assert isinstance(env, NotedEnv) and env.reset(seed=0)[0] == "note: try 4\nguess 1-7"
    assert env.step("4")[0] in ("higher", "lower", "correct")


def test_demo_pairs_are_noisy_scripted_lessons():
    factory = lambda: make_env("credo:Vault-v0")  # noqa: E731
    clean = demo_pairs(factory, 64, max_turns=2, expert_noise=0.0, demo_noise=0.0, seed=0)
    noisy = demo_pairs(factory, 64, max_turns=2, expert_noise=0.0, demo_noise=1.0, seed=0)
    assert all(p.endswith("lesson:") and lesson.startswith("code ") for p, lesson in clean)
    opened = [(p, lesson) for p, lesson in clean if " open\n" in p]
    assert opened and all(p.split(" open\n")[0].split("\n")[-1] == lesson[5:] for p, lesson in opened)
    assert sum(a != b for (_, a), (_, b) in zip(clean, noisy)) > 16


@pytest.mark.parametrize("override, key", [
    ("complementary.candidates=1", "complementary.candidates"),
    ("complementary.extractor=second", "complementary.extractor"),
    ("complementary.experience_frac=0", "complementary.experience_frac"),
    ("complementary.retrieval=embedding", "complementary.retrieval"),
    ("complementary.lesson_tokens=64", "complementary.lesson_tokens"),
    ("stages.advantage_kwargs={credit: mc_rebn}", "complementary.conditional_groups"),
    ("env.init_resample_frac=0.5", "env.init_resample_frac"),
    ("complementary.extractr=model", "complementary.extractr"),
])
def test_bad_section_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_recipe(RECIPE, [override])


def test_notes_without_the_complementary_source_are_refused():
    with pytest.raises(ConfigError, match=r"env\.kwargs\.note_frac"):
        load_recipe(RECIPE, ["stages.rollout=multiturn"])
    r = load_recipe(RECIPE, ["complementary.extractor=none"])
    assert r.stages.rollout == "complementary"


def check(recipe, *overrides):
    """What `credo check` runs (credo.cli._check), in this process."""
    from credo.train.build import check_run

    return list(check_run(load_recipe(recipe, list(overrides))).notes)


def test_credo_check_passes_the_recipes():
    assert check(RECIPE) == []
    notes = check(REPO / "recipes" / "gpu" / "complementary_qwen3_4b.yaml")  # notes only: the models are not here
    assert any("complementary.extractor_path" in n for n in notes)


def test_credo_check_names_a_bad_extractor():
    with pytest.raises(ConfigError, match=r"complementary\.extractor_path"):
        check(RECIPE, "complementary.extractor_path=/no/such/model")
    with pytest.raises(ConfigError, match=r"complementary\.extractor_sft_steps"):  # no scripted lessons for it
        check(RECIPE, "env.id=credo:GuessNumber-v0", "env.kwargs={}")


def test_credo_check_accepts_the_one_model_mode_and_names_a_bad_combination():
    assert check(RECIPE, "complementary.extractor=self") == []
    with pytest.raises(ConfigError, match=r"complementary\.extractor' = 'self'"):  # lesson samples need their groups
        check(RECIPE, "complementary.extractor=self", "complementary.conditional_groups=false",
              "stages.advantage_kwargs={credit: mc_rebn}")
    with pytest.raises(ConfigError, match=r"complementary\.extractor_path"):  # no second model to load
        check(RECIPE, "complementary.extractor=self", "complementary.extractor_path=tiny")
    with pytest.raises(ConfigError, match=r"complementary\.extractor_sft_steps"):  # the actor's lesson warm-up
        check(RECIPE, "complementary.extractor=self", "env.id=credo:GuessNumber-v0", "env.kwargs={}")
