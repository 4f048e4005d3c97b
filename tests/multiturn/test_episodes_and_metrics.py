"""The multi-turn source's contract, by hand: what it passes to the backend and the env, each episode's record and
error, the stats and metrics of a step, the context-length boundaries, the observation templates, evaluation and
the stage factories."""

import re
import threading
import time
from types import SimpleNamespace

import pytest
from tokenizers import processors

from credo.config import ConfigError
from credo.distributed.rollout import Sample
from credo.models import build_char_tokenizer
from credo.tasks.render import plain_prompt
from credo.families.multiturn.source import (EVAL_SEED_BASE, EnvEvaluator, EnvFailureError, EnvReward, Episode, MultiTurnRollout,
                                   call_with_deadline, env_reward, multiturn_source, observation_renderer, turn_format)
from credo.train.rollout import step_problem_indices, step_seed
from tests.multiturn.common import FixedTarget, ScriptedBackend, env_cfg

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
PROMPT = "\nguess 1-7\n"  # the first observation as an observation block (no chat template): 11 tokens


def ids(text):
    return TOK(text, add_special_tokens=False)["input_ids"]


def by_turn(*actions):
    """The policy that plays actions[k] on turn k (the k-th EOS of the context)."""
    return lambda context: actions[min(context.count("<eos>"), len(actions) - 1)]


def kinds(*factories):
    """An env factory that makes factories[0](), factories[1](), ... (and again from the start)."""
    n = iter(range(10**6))
    return lambda: factories[next(n) % len(factories)]()


def target(t, max_turns=9):
    return lambda: FixedTarget(t, low=1, high=7, max_turns=max_turns)


class Recording(ScriptedBackend):
    """The scripted backend, recording every generate call's keyword arguments and close()."""

    def __init__(self, tok, policy, *, version=0, delay=0.0, log_probs=True):
        super().__init__(tok, policy)
        self.version, self.delay, self.log_probs = version, delay, log_probs
        self.kwargs, self.contexts, self.closed, self.synced = [], [], False, []

    def generate(self, prompts, **kw):
        self.kwargs.append(kw)
        self.contexts.append([list(p) for p in prompts])
        time.sleep(self.delay)
        out = super().generate(prompts, **kw)
        if not self.log_probs:
            for s in out:
                s.rollout_log_probs = []
        return out

    def sync_weights(self, model, version):
        self.synced.append((model, version))

    def close(self):
        self.closed = True


def make(cfg, policy=None, *, envs=target(5), P=1, G=1, tok=TOK, backend=None, **kw):
    backend = backend or Recording(tok, policy)
    src = MultiTurnRollout(cfg, tok, backend, seed=kw.pop("seed", 0), prompts_per_step=P, group_size=G,
                           temperature=kw.pop("temperature", 1.0), top_p=kw.pop("top_p", 1.0), render=plain_prompt,
                           env_factory=envs, **kw)
    return src, backend


# ------------------------------------------------------------------------------------ backend and seeds
def test_each_turn_samples_all_live_contexts_with_the_turn_cap_sampling_settings_and_seeds():
    backend = Recording(TOK, by_turn("4", "6", "5"), version=5)
    src = MultiTurnRollout(env_cfg(max_new_tokens_per_turn=4), TOK, backend, seed=11, prompts_per_step=2,
                           group_size=2, temperature=0.7, top_p=0.9, env_factory=target(5))
    batch = src.rollout(step=3)
    sample_seeds = [step_seed(11, 3, k) for k in (1, 2, 3, 4)]  # 1 + game * G + episode
    assert backend.kwargs == [{"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9,
                               "seeds": [step_seed(s, turn, 0) for s in sample_seeds]} for turn in range(3)]
    assert src.generate_calls == 3
    # turn 1's contexts: the prompt, turn 0 (4 + EOS) and the observation after it
    assert backend.contexts[1] == [ids(PROMPT) + ids("4") + [EOS] + ids("\nhigher\n")] * 4
    games = step_problem_indices(11, 3, 2**31 - 1, 2)  # drawn like PromptRollout's problems, 31-bit
    assert [s.meta["env_seed"] for s in batch.samples] == [games[0], games[0], games[1], games[1]]
    assert [s.policy_version for s in batch.samples] == [5] * 4 and all(s.finished for s in batch.samples)
    assert batch.step == 3 and batch.group_ids.tolist() == [0, 0, 1, 1]
    assert [(p.prompt, p.answer, p.meta) for p in batch.problems] == [
        ("guess 1-7", "", {"env_seed": games[j]}) for j in (0, 0, 1, 1)]


def test_a_ranks_share_plays_its_games_with_their_seeds():
    backend = Recording(TOK, by_turn("5"))
    src = MultiTurnRollout(env_cfg(), TOK, backend, seed=2, prompts_per_step=4, group_size=2, temperature=1.0,
                           top_p=1.0, rank=1, world=2, env_factory=target(5))
    batch = src.rollout(step=6)
    games = step_problem_indices(2, 6, 2**31 - 1, 4)
    assert [s.meta["env_seed"] for s in batch.samples] == [games[2], games[2], games[3], games[3]]
    assert batch.group_ids.tolist() == [2, 2, 3, 3]
    assert backend.kwargs[0]["seeds"] == [step_seed(step_seed(2, 6, 1 + j * 2 + g), 0, 0) for j in (2, 3)
                                          for g in (0, 1)]


def test_the_default_env_factory_makes_the_env_of_the_id_with_its_kwargs():
    cfg = env_cfg(kwargs={"low": 2, "high": 9, "max_turns": 1}, max_turns=1)
    src = MultiTurnRollout(cfg, TOK, Recording(TOK, by_turn("x")), seed=0, prompts_per_step=1, group_size=1,
                           temperature=1.0, top_p=1.0)
    s = src.rollout(step=0).samples[0]
    assert s.prompt_ids == ids("\nguess 2-9\n") and s.meta["observations"] == ["invalid"]


def test_the_envs_are_reset_with_their_seeds_and_stepped_with_the_decoded_actions():
    seen = []

    class Recorder(FixedTarget):
        def reset(self, seed=None):
            seen.append(("reset", seed))
            return super().reset(seed)

        def step(self, action):
            seen.append(("step", action))
            return super().step(action)

    src, _ = make(env_cfg(), by_turn("4", "5"), envs=lambda: Recorder(5, low=1, high=7, max_turns=3))
    src.run_episodes([123], temperature=1.0, top_p=1.0, sample_seeds=None)
    assert seen == [("reset", 123), ("step", "4"), ("step", "5")]


# ------------------------------------------------------------------------------------ records and stats
class PaysThenRaises(FixedTarget):
    def step(self, action):
        if self.turn:
            raise RuntimeError("boom")
        self.turn += 1
        return "more", 0.5, False, False, {}


class Verbose(FixedTarget):
    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs * 40, r, term, trunc, info


def test_stats_and_metrics_of_a_step_by_hand():
    envs = kinds(target(5), lambda: PaysThenRaises(5), target(7), lambda: Verbose(5))
    cfg = env_cfg(max_failure_frac=0.25)  # 1 failure of 4 is not more than 0.25 x 4
    src, _ = make(cfg, by_turn("4", "6", "5"), envs=envs, P=2, G=2)
    eps, stats = src.run_episodes([1, 2, 3, 4], temperature=1.0, top_p=1.0, sample_seeds=None)
    # 5: 4 6 5 solves it; 0.5 then a crash (its 0.5 is not in the return); 7: never found in the 3 turns; the
    # verbose env's first observation does not fit: one turn
    assert [e.end for e in eps] == ["terminated", "failed", "max_turns", "max_total_tokens"]
    assert [e.turn_rewards for e in eps] == [[0.0, 0.0, 1.0], [0.5, 0.0], [0.0, 0.0, 0.0], [0.0]]
    assert [e.error for e in eps] == [None, "step 1: error RuntimeError('boom')", None, None]
    assert stats == {"env/episodes": 4.0, "env/failures": 1.0, "env/timeouts": 0.0, "env/return_sum": 1.0,
                     "env/turns_sum": 9.0, "env/terminated": 1.0, "env/overflow": 1.0}

    batch = src.rollout(step=1)
    assert [s.meta["end"] for s in batch.samples] == ["terminated", "failed", "max_turns", "max_total_tokens"]
    assert batch.metrics == {"env/failures": 1, "env/timeouts": 0, "env/return_mean": pytest.approx(1 / 3),
                             "env/turns_mean": 9 / 4, "env/terminated_frac": 0.25, "env/overflow_frac": 0.25,
                             "perf/episodes_per_s": batch.metrics["perf/episodes_per_s"]}
    assert type(batch.metrics["env/failures"]) is int and type(batch.metrics["env/timeouts"]) is int


def test_the_mean_return_of_a_step_whose_episodes_all_failed_is_nan():
    src, _ = make(env_cfg(max_failure_frac=1.0), by_turn("4"), envs=lambda: PaysThenRaises(5), P=1, G=2)
    m = src.rollout(step=0).metrics
    assert m["env/failures"] == 2 and m["env/return_mean"] != m["env/return_mean"]


def test_returns_are_reduced_in_double_precision():
    # one episode whose return, -0.1 (a format error), has no exact float32 value: its mean is -0.1 itself
    src, _ = make(env_cfg(), by_turn("x"))
    assert src.rollout(step=0).metrics["env/return_mean"] == -0.1
    assert src.evaluate(1, temperature=0, seed=0) == -0.1


def test_too_many_failures_name_the_env_the_step_and_the_first_error():
    envs = kinds(target(5), lambda: PaysThenRaises(5))
    src, _ = make(env_cfg(max_failure_frac=0.4), by_turn("4", "6", "5"), envs=envs, P=1, G=2)
    with pytest.raises(EnvFailureError, match="^" + re.escape(
            "env 'credo:GuessNumber-v0': 1 of 2 episodes failed at step 4 (more than env.max_failure_frac = 0.4); "
            "first error: step 1: error RuntimeError('boom')") + "$"):
        src.rollout(step=4)


def test_timeouts_and_errors_of_resets_prefixes_and_steps_are_counted_and_named():
    release = threading.Event()

    class HangReset(FixedTarget):
        def reset(self, seed=None):
            release.wait(30)
            return super().reset(seed)

    class RaiseReset(FixedTarget):
        def reset(self, seed=None):
            raise ValueError("no board")

    class HangStep(FixedTarget):
        def step(self, action):
            release.wait(30)
            return super().step(action)

    envs = kinds(lambda: HangReset(5), lambda: RaiseReset(5), lambda: HangStep(5), lambda: HangStep(5), target(5))
    src, backend = make(env_cfg(step_timeout_s=0.2), by_turn("4", "6", "5"), envs=envs, P=1, G=5)
    try:
        eps, stats = src.run_episodes([0] * 5, temperature=1.0, top_p=1.0, sample_seeds=None,
                                      prefixes=[[], [], [], ["4"], ["4"]])
    finally:
        release.set()
    assert [e.error for e in eps] == ["reset: timeout None", "reset: error ValueError('no board')",
                                      "step 0: timeout None", "prefix step 0: timeout None", None]
    assert [e.end for e in eps] == ["failed"] * 4 + ["terminated"]
    # the last episode's reset still runs after a failed prefix: it replays 4, then plays 6 and 5
    assert eps[4].prompt_ids == ids(PROMPT) + ids("4") + [EOS] + ids("\nhigher\n")
    assert eps[4].turn_rewards == [0.0, 1.0] and eps[4].actions == ["6", "5"]
    assert [e.prompt_ids for e in eps[:2]] == [[], []] and eps[2].turn_rewards == [0.0]
    assert stats == {"env/episodes": 5.0, "env/failures": 4.0, "env/timeouts": 3.0, "env/return_sum": 1.0,
                     "env/turns_sum": 3.0, "env/terminated": 1.0, "env/overflow": 0.0,
                     "env/resampled": 2.0, "env/prefix_turns_sum": 2.0}
    assert backend.kwargs[0]["seeds"] is None and [len(c) for c in backend.contexts] == [2, 1]


def test_a_failed_reset_keeps_the_fallback_prompt_and_the_sample_record():
    e = Episode(env=None, env_seed=9, end="failed", error="reset: error X", version=4)
    s = e.sample([EOS])
    assert (s.prompt_ids, s.response_ids, s.finished, s.policy_version) == ([EOS], [], False, 4)
    assert s.meta == {"turn_rewards": [], "turn_spans": [], "chunk_ids": [], "terminated": False, "truncated": False,
                      "end": "failed", "failed": True, "error": "reset: error X", "env_seed": 9, "actions": [],
                      "observations": [], "prefix_actions": [], "turns": [{"role": "env", "text": ""}]}
    done = Episode(env=None, env_seed=1, prompt_ids=[3], end="terminated", actions=["5"], observations=["correct"],
                   prefix_actions=["4"]).sample([EOS])
    assert done.prompt_ids == [3] and done.finished and done.meta["actions"] == ["5"]
    assert done.meta["observations"] == ["correct"] and done.meta["prefix_actions"] == ["4"]


def test_missing_log_probs_are_zeros_and_the_source_forwards_sync_and_close():
    backend = Recording(TOK, by_turn("4", "5"), log_probs=False)
    src, _ = make(env_cfg(), backend=backend)
    s = src.rollout(step=0).samples[0]
    assert s.response_mask == [1, 1] + [0] * 8 + [1, 1] and s.rollout_log_probs == [0.0] * 12
    src.sync("model", 7)
    assert backend.synced == [("model", 7)] and not backend.closed
    assert src.state_dict() == {} and src.load_state_dict({"x": 1}) is None
    src.close()
    assert backend.closed


def test_info_suffix_follows_the_observation():
    class Board(FixedTarget):
        def reset(self, seed=None):
            super().reset(seed)
            return "start", {"suffix": "board0"}

        def step(self, action):
            obs, r, term, trunc, _ = super().step(action)
            return obs, r, term, trunc, ({"suffix": "board1"} if not term else None)

    src, _ = make(env_cfg(), by_turn("4", "6", "5"), envs=lambda: Board(5))
    batch = src.rollout(step=0)
    s = batch.samples[0]
    assert batch.problems[0].prompt == "start\nboard0" and s.prompt_ids == ids("\nstart\nboard0\n")
    assert s.meta["observations"] == ["higher\nboard1", "lower\nboard1", "correct"]
    assert s.response_ids[2:2 + len(ids("\nhigher\nboard1\n"))] == ids("\nhigher\nboard1\n")
    # a replayed prefix's observations carry the suffix too
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None, prefixes=[["4"]])[0]
    assert e.prompt_ids == ids("\nstart\nboard0\n") + ids("4") + [EOS] + ids("\nhigher\nboard1\n")


# ------------------------------------------------------------------------------------ context boundaries
def test_a_prompt_that_leaves_no_room_ends_before_the_first_turn():
    src, backend = make(env_cfg(max_total_tokens=len(PROMPT)), by_turn("5"))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None)[0]
    assert e.end == "max_total_tokens" and e.turn_spans == [] and e.response_ids == [] and backend.kwargs == []


def test_a_turn_that_fills_the_context_exactly_is_stepped():
    src, _ = make(env_cfg(max_total_tokens=len(PROMPT) + 2), by_turn("5"))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None)[0]
    assert e.end == "terminated" and e.turn_rewards == [1.0] and e.response_ids == ids("5") + [EOS]


def test_an_observation_that_leaves_room_for_one_token_is_kept():
    n = len(PROMPT) + 2 + len("\nhigher\n")
    src, _ = make(env_cfg(max_total_tokens=n + 1), by_turn("4", "5"))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None)[0]
    # the next turn gets one token: "5" without its EOS, cut, not stepped
    assert e.response_ids == ids("4") + [EOS] + ids("\nhigher\n") + ids("5")
    assert e.response_mask == [1, 1] + [0] * 8 + [1] and e.log_probs == [-0.5, -0.5] + [0.0] * 8 + [-0.5]
    assert e.end == "max_total_tokens" and e.turn_rewards == [0.0, 0.0] and e.actions == ["4", "5"]
    assert e.turn_spans == [[0, 2], [10, 11]] and e.chunk_ids == [0, 0] + [-1] * 8 + [1]
    src, _ = make(env_cfg(max_total_tokens=n), by_turn("4", "5"))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None)[0]
    assert e.response_ids == ids("4") + [EOS] and e.end == "max_total_tokens" and e.turn_rewards == [0.0]


def test_an_overflowing_observation_does_not_stop_the_other_episodes():
    src, _ = make(env_cfg(), by_turn("4", "6", "5"), envs=kinds(lambda: Verbose(5), target(5)), P=1, G=2)
    first, second = src.rollout(step=0).samples
    assert first.meta["end"] == "max_total_tokens" and first.meta["turn_rewards"] == [0.0]
    assert second.meta["end"] == "terminated" and second.meta["turn_rewards"] == [0.0, 0.0, 1.0]
    assert second.meta["observations"] == ["higher", "lower", "correct"]


def test_replayed_turns_count_against_max_turns():
    # the source's max_turns (3) ends the episode, the env's (9) does not: one replayed turn leaves two
    src, _ = make(env_cfg(), by_turn("1"), envs=target(7))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None, prefixes=[["4"]])[0]
    assert e.end == "max_turns" and len(e.turn_spans) == 2 and e.actions == ["1", "1"]


def test_the_expert_prefix_is_cut_at_max_turns():
    # max_turns 2: the expert's episode is [4, 6], so every prefix is [4] (a prefix never takes the whole episode)
    src, _ = make(env_cfg(max_turns=2, init_resample_frac=1.0), by_turn("5"), P=2, G=2)
    lengths = {len(s.meta["prefix_actions"]) for step in range(4) for s in src.rollout(step=step).samples}
    assert lengths == {1}


def test_prefixes_and_observations_are_tokenised_without_special_tokens():
    tok = build_char_tokenizer()
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    assert tok("4")["input_ids"] == [bos] + ids("4")  # a tokenizer that adds BOS, as Llama's do
    src, _ = make(env_cfg(), by_turn("4", "6", "5"), tok=tok, envs=target(5))
    e, = src.run_episodes([0], temperature=1.0, top_p=1.0, sample_seeds=None, prefixes=[["4"]])[0]
    assert e.prompt_ids == ids(PROMPT) + ids("4") + [EOS] + ids("\nhigher\n")
    assert e.response_ids == ids("6") + [EOS] + ids("\nlower\n") + ids("5") + [EOS]


# ------------------------------------------------------------------------------------ templates
def test_the_envs_observation_template_renders_the_prompt_and_every_observation():
    src, _ = make(env_cfg(observation_template="[{observation}]"), by_turn("4", "5"))
    s = src.rollout(step=0).samples[0]
    assert s.prompt_ids == ids("[guess 1-7]") and s.response_ids == ids("4") + [EOS] + ids("[higher]") + ids("5") + [EOS]


def test_an_explicit_template_renders_every_observation_without_a_chat_template():
    prompt, obs = turn_format(TOK, plain_prompt, "[{observation}]")
    assert prompt("start") == "[start]" and obs("x") == "[x]"


def test_a_chat_render_plays_the_observations_as_the_templates_user_turns():
    from credo.tasks.render import prompt_renderer

    tok = chat_tokenizer(ROLE_TEMPLATE)
    backend = Recording(tok, lambda context: "5" if "higher" in context else "4")
    src = MultiTurnRollout(env_cfg(), tok, backend, seed=0, prompts_per_step=1, group_size=1, temperature=1.0,
                           top_p=1.0, render=prompt_renderer(tok), env_factory=target(5))
    s = src.rollout(step=0).samples[0]
    piece = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert s.prompt_ids == piece("{u}guess 1-7{/u}<a>")  # the first observation is the user message
    assert s.response_ids == piece("4") + [tok.eos_token_id] + piece("{u}higher{/u}<a>") + piece("5") + [tok.eos_token_id]


def test_a_plain_render_with_a_chat_tokenizer_renders_observations_as_plain_blocks():
    # the recipe turned the chat template off (the render does not apply it): observations follow suit
    prompt, obs = turn_format(chat_tokenizer(ROLE_TEMPLATE), plain_prompt)
    assert prompt("start") == "\nstart\n" and obs("x") == "\nx\n"


def test_the_default_observation_template_is_auto():
    tok = chat_tokenizer(ROLE_TEMPLATE)
    assert observation_renderer(tok)("x") == observation_renderer(tok, "auto")("x") == "{u}x{/u}<a>"
    assert observation_renderer(TOK)("x") == "\nx\n"


def test_a_template_that_renders_an_empty_block_is_an_error():
    with pytest.raises(ConfigError, match=r"^config key 'env.observation_template' renders an empty observation "
                                          r"block: expected at least one token between turns \(it separates the "
                                          r"turns' chunks\)$"):
        observation_renderer(TOK, "{observation}")


def chat_tokenizer(template):
    from tests.byo.common import build_bpe_tokenizer

    tok = build_bpe_tokenizer(pad=True)
    tok.chat_template = template
    return tok


# a template that ends only assistant turns with EOS and writes braces around user turns
ROLE_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
                 "{% elif m['role'] == 'user' %}{u}{{ m['content'] }}{/u}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<a>{% endif %}")


def test_the_auto_template_is_the_user_turn_and_the_assistant_header_after_an_assistant_turn():
    render = observation_renderer(chat_tokenizer(ROLE_TEMPLATE), "auto")
    assert render("x") == "{u}x{/u}<a>"
    # the assistant turn may start the text: a template that drops the first user message
    drops_first = ROLE_TEMPLATE.replace("{% elif m['role'] == 'user' %}", "{% elif not loop.first %}")
    assert observation_renderer(chat_tokenizer(drops_first), "auto")("y") == "{u}y{/u}<a>"


def test_the_auto_template_renders_a_user_assistant_user_conversation():
    # Llama-2 / Mistral style: a template that only accepts alternating user / assistant roles, user first
    strict = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
              "{% endif %}{% endfor %}" + ROLE_TEMPLATE)
    assert observation_renderer(chat_tokenizer(strict), "auto")("z") == "{u}z{/u}<a>"


def test_the_auto_template_needs_the_observation_after_the_assistant_turn():
    drops_users = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
                   "{% endif %}{% endfor %}<a>")
    with pytest.raises(ConfigError, match="^" + re.escape(
            "config key 'env.observation_template' = 'auto': the chat template does not end an assistant turn with "
            "the EOS token '<|im_end|>'; set a template with '{observation}'") + "$"):
        observation_renderer(chat_tokenizer(drops_users), "auto")


# ------------------------------------------------------------------------------------ deadlines
def test_calls_run_in_daemon_threads_under_one_shared_deadline():
    release = threading.Event()
    t0 = time.monotonic()
    try:
        out = call_with_deadline([lambda: threading.current_thread().daemon, lambda: time.sleep(0.05) or "slow",
                                  lambda: release.wait(30), lambda: release.wait(30)], 0.3)
    finally:
        release.set()
    # two hung calls cost one deadline, not two; a call that returns within it is ok
    assert time.monotonic() - t0 < 0.55
    assert out == [("ok", True), ("ok", "slow"), ("timeout", None), ("timeout", None)]


# ------------------------------------------------------------------------------------ evaluation and stages
class SeedReward:
    """One turn; the reward is the env seed mod 3 (10**10 = 1 mod 3: seeds EVAL_SEED_BASE + 0..3 pay 1, 2, 0, 1)."""

    def reset(self, seed=None):
        self.seed = seed
        return "go", {}

    def step(self, action):
        return "done", float(self.seed % 3), True, False, {}


def test_evaluation_averages_the_ranks_share_of_the_held_out_episodes():
    assert EVAL_SEED_BASE == 10**10
    for rank, world, want in ((0, 1, 1.0), (0, 2, 0.5), (1, 2, 1.5)):
        src, _ = make(env_cfg(), by_turn("a"), envs=SeedReward, rank=rank, world=world)
        assert src.evaluate(4, temperature=0, seed=0) == want, (rank, world)


def test_the_env_evaluator_asks_its_source():
    calls = []

    class Source:
        def evaluate(self, n, *, temperature, seed):
            calls.append((n, temperature, seed))
            return 0.25

    ev = EnvEvaluator(Source(), 6, temperature=0.3, seed=8)
    assert ev() == 0.25 and calls == [(6, 0.3, 8)] and ev.metric == "eval/return"


def test_the_rollout_rate_is_episodes_over_the_rollouts_time():
    src, backend = make(env_cfg(), by_turn("4", "6", "5"), P=2, G=2,
                        backend=Recording(TOK, by_turn("4", "6", "5"), delay=0.02))
    t0 = time.perf_counter()
    rate = src.rollout(step=0).metrics["perf/episodes_per_s"]
    wall = time.perf_counter() - t0
    assert 4 / wall <= rate <= 4 / 0.06  # three generate calls of at least 0.02 s each


def test_the_env_reward_is_the_episode_return_and_failed_episodes_are_invalid():
    samples = [Sample([1], [2], [1], [0.0], True, 0, {"turn_rewards": [0.0, 0.25, 1.0], "failed": False}),
               Sample([1], [2], [1], [0.0], False, 0, {"turn_rewards": [0.5, 0.0], "failed": True})]
    batch = SimpleNamespace(samples=samples, metrics={})
    stage = env_reward(None)
    stage(batch)
    assert batch.rewards.tolist() == [1.25, 0.5] and batch.valid.tolist() == [True, False]
    assert batch.metrics == {"reward/failures": 0, "reward/timeouts": 0}
    assert isinstance(stage, EnvReward) and stage.close() is None
    with pytest.raises(ConfigError, match=r"^config key 'stages.reward_kwargs': the env reward takes none, "
                                          r"got \['a', 'b'\]$"):
        env_reward(None, b=1, a=2)


def test_the_multiturn_source_needs_an_env_id_and_takes_no_kwargs():
    def ctx(env):
        return SimpleNamespace(section=env, tokenizer=TOK, backend=None, seed=0, rank=0, world=1, render=plain_prompt,
                               rollout=dict(prompts_per_step=1, group_size=1, temperature=1.0, top_p=1.0))

    def quoted(problem):
        return f"Q: {problem.prompt}"

    c = ctx(env_cfg())
    c.seed, c.render, c.backend = 5, quoted, Recording(TOK, by_turn("5"))
    c.rollout["env_factory"] = target(5)
    batch = multiturn_source(c).rollout(step=2)
    assert batch.samples[0].prompt_ids == ids("Q: guess 1-7")
    assert batch.samples[0].meta["env_seed"] == step_problem_indices(5, 2, 2**31 - 1, 1)[0]
    for env in (None, env_cfg(id="")):
        with pytest.raises(ConfigError, match=r"^config key 'stages.rollout' = 'multiturn' needs env.id$"):
            multiturn_source(ctx(env))
    with pytest.raises(ConfigError, match=r"^config key 'stages.rollout_kwargs': the multiturn source takes its "
                                          r"settings from the env: section, got \['a', 'b'\]$"):
        multiturn_source(ctx(env_cfg()), b=1, a=2)
