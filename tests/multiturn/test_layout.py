"""The token layout of a multi-turn episode, one generate call per turn, and the credit stages on it."""

import torch

from credo.credit import chunk_ids, chunk_returns_from_rewards
from credo.train.batch import pack_batch
from credo.families.multiturn.source import EnvReward, observation_renderer
from credo.families.multiturn.turn_credit import turn_credit
from tests.multiturn.common import ctx, env_cfg, source

SCRIPT = ["4", "6", "x"]  # target 5: higher, lower, then no number: GEM's format penalty -0.1 and termination


def by_turn(context: str) -> str:
    return SCRIPT[context.count("<eos>")]


def test_three_turn_episode_matches_a_hand_built_layout():
    src, backend, tok = source(env_cfg(), by_turn, P=1, G=1)
    batch = src.rollout(step=1)
    s = batch.samples[0]
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    # plain (no chat template): the first observation is rendered as every other observation block
    assert s.prompt_ids == ids("\nguess 1-7\n")
    expected = ids("4") + [eos] + ids("\nhigher\n") + ids("6") + [eos] + ids("\nlower\n") + ids("x") + [eos]
    assert s.response_ids == expected
    # "\nhigher\n" is 8 characters, "\nlower\n" 7: one token each with the char tokenizer
    assert s.response_mask == [1, 1] + [0] * 8 + [1, 1] + [0] * 7 + [1, 1]
    assert s.meta["chunk_ids"] == [0, 0] + [-1] * 8 + [1, 1] + [-1] * 7 + [2, 2]
    assert s.meta["turn_spans"] == [[0, 2], [10, 12], [19, 21]]
    assert s.meta["turn_rewards"] == [0.0, 0.0, -0.1]
    assert s.meta["terminated"] and not s.meta["truncated"] and s.meta["end"] == "terminated"
    assert s.meta["actions"] == ["4", "6", "x"] and s.meta["observations"] == ["higher", "lower", "invalid"]
    assert s.rollout_log_probs == [-0.5, -0.5] + [0.0] * 8 + [-0.5, -0.5] + [0.0] * 7 + [-0.5, -0.5]
    assert backend.calls == [1, 1, 1]  # one generate call per turn

    # per-turn returns with gamma 0.5, by hand: G2 = -0.1, G1 = 0 + 0.5 G2, G0 = 0 + 0.5 G1
    EnvReward()(batch)
    pack_batch(batch, tok.pad_token_id, overlong_filter=False)
    assert abs(float(batch.rewards[0]) + 0.1) < 1e-7 and bool(batch.valid[0])
    turn_credit(ctx(group_size=1), credit="mc", gamma=0.5)(batch)
    p = len(s.prompt_ids)
    adv = batch.advantages[0, p - 1:p - 1 + len(expected)].tolist()
    want = [-0.025] * 2 + [0.0] * 8 + [-0.05] * 2 + [0.0] * 7 + [-0.1] * 2
    assert torch.allclose(torch.tensor(adv), torch.tensor(want))


def test_one_generate_call_per_turn_across_all_live_episodes():
    # episode e guesses the target at turn e (turns 0, 1, 2) or never (e = 3): live episodes shrink 4, 3, 2
    def policy(context):
        turn = context.count("<eos>")
        e = int(context[1]) if context[1].isdigit() else 0
        return "5" if turn == e else "1"

    seen = iter(range(4))

    class Factory:
        def __call__(self):
            from tests.multiturn.common import FixedTarget

            i = next(seen)

            class Env(FixedTarget):  # the first observation names the episode so the policy can tell them apart
                def reset(self, seed=None):
                    super().reset(seed)
                    return f"{i}", {}
            return Env(5, low=1, high=7, max_turns=9)  # the source's env.max_turns (3) ends episode 3

    src, backend, _ = source(env_cfg(), policy, envs=Factory(), P=2, G=2)
    batch = src.rollout(step=3)
    assert backend.calls == [4, 3, 2]
    assert [len(s.meta["turn_rewards"]) for s in batch.samples] == [1, 2, 3, 3]
    assert [s.meta["end"] for s in batch.samples] == ["terminated"] * 3 + ["max_turns"]
    assert batch.metrics["env/terminated_frac"] == 0.75
    seeds = [s.meta["env_seed"] for s in batch.samples]  # the G episodes of a game share its env seed
    assert seeds[0] == seeds[1] != seeds[2] == seeds[3] and batch.group_ids.tolist() == [0, 0, 1, 1]


def test_ipa_chunks_are_the_turns():
    src, _, tok = source(env_cfg(), by_turn, P=2, G=2)
    batch = src.rollout(step=1)
    EnvReward()(batch)
    pack_batch(batch, tok.pad_token_id, overlong_filter=False)
    ids = chunk_ids(batch.response_mask)
    for b, s in enumerate(batch.samples):
        p, n = len(s.prompt_ids), len(s.response_ids)
        assert ids[b, p - 1:p - 1 + n].tolist() == s.meta["chunk_ids"]
        assert int(ids[b].max()) + 1 == len(s.meta["turn_rewards"])
    turn_credit(ctx(group_size=2), credit="ipa", gamma=0.9)(batch)
    rewards = torch.tensor([s.meta["turn_rewards"] for s in batch.samples])
    assert torch.allclose(batch.advantages, chunk_returns_from_rewards(rewards, ids, 0.9) * batch.loss_mask)
    # the ipa loss reads the same chunks from the loss mask
    from credo.algos import POLICY_LOSSES

    lp = torch.full(batch.loss_mask.shape, -0.5, requires_grad=True)
    loss, metrics = POLICY_LOSSES["ipa"](lp, lp.detach(), batch.advantages, batch.loss_mask,
                                          rollout_log_probs=batch.rollout_log_probs)
    loss.backward()
    assert torch.isfinite(loss) and float(metrics["chunk_dropped_frac"]) == 0.0
    assert bool((lp.grad[~batch.loss_mask] == 0).all()) and bool((lp.grad[batch.loss_mask] != 0).all())


def test_grpo_credit_normalises_the_episode_return_within_its_group():
    # both episodes of the group solve at turn 0; the second is then marked as a format failure (-0.1)
    src, backend, tok = source(env_cfg(), lambda c: "5", P=1, G=2)
    batch = src.rollout(step=1)
    batch.samples[1].meta["turn_rewards"] = [-0.1]  # as if the second episode had failed the format
    EnvReward()(batch)
    pack_batch(batch, tok.pad_token_id, overlong_filter=False)
    turn_credit(ctx(group_size=2), credit="grpo")(batch)
    a = [batch.advantages[b][batch.loss_mask[b]] for b in range(2)]
    assert torch.allclose(a[0], torch.full_like(a[0], a[0][0])) and float(a[0][0]) > 0 > float(a[1][0])
    assert abs(float(a[0][0]) + float(a[1][0])) < 1e-5


def test_observation_template_from_a_chat_template():
    from tests.byo.common import build_bpe_tokenizer

    tok = build_bpe_tokenizer(pad=True)
    render = observation_renderer(tok, "auto")
    assert render("higher") == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    assert observation_renderer(tok, "[{observation}]")("x") == "[x]"


def test_turn_format_with_and_without_a_chat_template():
    from credo.tasks.render import plain_prompt, prompt_renderer
    from credo.families.multiturn.source import turn_format
    from tests.byo.common import build_bpe_tokenizer
    from tests.multiturn.common import build_char_tokenizer

    # no chat template: the first observation is rendered as every later one
    prompt, obs = turn_format(build_char_tokenizer(), plain_prompt)
    assert prompt("start") == "\nstart\n" and obs("higher") == "\nhigher\n"
    # a chat template: the first observation is the user message, later ones the template's user turn
    tok = build_bpe_tokenizer(pad=True)
    prompt, obs = turn_format(tok, prompt_renderer(tok))
    assert prompt("start") == "start"
    assert obs("higher") == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"


def test_auto_observation_template_needs_eos_ending_assistant_turns():
    import pytest

    from credo.config import ConfigError
    from tests.byo.common import build_bpe_tokenizer

    tok = build_bpe_tokenizer(pad=True)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    with pytest.raises(ConfigError, match=r"^config key 'env.observation_template' = 'auto': the chat template does "
                                          r"not end an assistant turn with the EOS token"):
        observation_renderer(tok, "auto")
