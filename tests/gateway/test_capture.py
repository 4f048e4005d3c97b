"""The capture rules of credo.gateway.capture on a small BPE tokenizer, without HTTP or a model: the sampled ids are
chosen here (a non-canonical split, reasoning a template drops), and every trajectory is checked against the calls
recorded, token by token."""

from __future__ import annotations

import string

import pytest

from credo.gateway.capture import EpisodeStore
from credo.gateway.chat import DEFAULT_TEMPLATE, check_messages, cut_at_stop, parse_tool_calls, render

# a template that drops the reasoning of assistant turns in the history (as Qwen3's and DeepSeek-R1's do)
DROPS_REASONING = DEFAULT_TEMPLATE.replace(
    "{% if m.content %}{{ m.content }}{% endif %}",
    "{% if m.content %}{% if m.role == 'assistant' and '</think>' in m.content %}"
    "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}{% endif %}")


def bpe_tokenizer():
    """Characters plus one merge, 'a' 'b' -> 'ab': the split ['a', 'b'] is valid but not canonical."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - set("\r\x0b\x0c"))
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *chars, "ab"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture
def tok():
    return bpe_tokenizer()


def call(store, tok, episode, messages, answers, version=0, template=None):
    """One call as the server makes it: render, plan, 'sample' `answers` (lists of ids), record."""
    if template is not None:
        tok.chat_template = template
    text = render(tok, check_messages(messages), None)
    plan = store.plan(episode, text)
    choices = [{"response_ids": a, "log_probs": [-0.5 - i for i in range(len(a))], "finish_reason": "stop"}
               for a in answers]
    return store.record(episode, text, plan, choices, version)


def assert_only_sampled(store, episode):
    """Every segment's mask-1 tokens and log-probs are exactly those its calls sampled, in order; mask 0 has 0.0."""
    calls = store.episode_calls(episode)
    for i, traj in enumerate(store.trajectories(episode)):
        sampled, logps = [], []
        for c in traj.meta["calls"]:
            choice = calls[c].choices[calls[c].segments.index(i)] if i in calls[c].segments else calls[c].choices[0]
            sampled += choice["response_ids"]
            logps += choice["log_probs"]
        assert [t for t, m in zip(traj.response_ids, traj.response_mask) if m] == sampled
        assert [x for x, m in zip(traj.rollout_log_probs, traj.response_mask) if m] == logps
        assert all(x == 0.0 for x, m in zip(traj.rollout_log_probs, traj.response_mask) if not m)
        for (s, e) in traj.meta["turns"]:
            assert traj.response_mask[s:e] == [1] * (e - s)


def test_a_non_canonical_sample_is_kept_as_sampled_where_retokenizing_would_change_it(tok):
    store = EpisodeStore(tok)
    a, b, ab, eos = (tok.convert_tokens_to_ids(t) for t in ("a", "b", "ab", "<eos>"))
    assert tok("ab", add_special_tokens=False)["input_ids"] == [ab]
    hist = [{"role": "user", "content": "hi"}]
    first = call(store, tok, "e", hist, [[a, b, eos]])
    hist += [{"role": "assistant", "content": "ab"}, {"role": "user", "content": "more"}]
    second = call(store, tok, "e", hist, [[b, eos]])
    assert second.kind == "continuation" and store.counters["gateway/retokenization_drift"] == 0
    # the model was given its own tokens back; a server that re-tokenizes the history would have sent [ab]
    naive = tok(render(tok, check_messages(hist), None), add_special_tokens=False)["input_ids"]
    assert second.prompt_ids[:len(first.prompt_ids) + 3] == first.prompt_ids + [a, b, eos]
    assert naive != second.prompt_ids and naive[len(first.prompt_ids)] == ab
    assert tok.decode(second.prompt_ids) == tok.decode(naive)  # same text, different tokens
    [traj] = store.trajectories("e")
    assert traj.prompt_ids + traj.response_ids == second.prompt_ids + [b, eos]
    assert traj.meta["turns"] == [(0, 3), (len(second.prompt_ids) - len(first.prompt_ids), len(traj.response_ids))]
    assert_only_sampled(store, "e")


def test_a_template_that_drops_earlier_reasoning_is_drift_and_splits(tok):
    store = EpisodeStore(tok)
    answer = "<think>a b</think>c"
    ids = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    hist = [{"role": "user", "content": "q"}]
    call(store, tok, "r", hist, [ids], template=DROPS_REASONING)
    hist += [{"role": "assistant", "content": answer}, {"role": "user", "content": "q2"}]
    second = call(store, tok, "r", hist, [[tok.eos_token_id]], version=1, template=DROPS_REASONING)
    assert second.kind == "drift" and store.counters["gateway/retokenization_drift"] == 1
    first, split = store.trajectories("r")
    assert [t for t, m in zip(first.response_ids, first.response_mask) if m] == ids
    text = render(tok, check_messages(hist), None)
    assert split.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]  # what the model was given
    assert split.response_ids == [tok.eos_token_id] and split.policy_version == 1
    assert split.meta["opened_by"] == "drift" and text[split.meta["drift_at"]:].startswith("c<eos>")
    assert_only_sampled(store, "r")


def test_a_whitespace_changing_client_is_drift(tok):
    store = EpisodeStore(tok)
    ids = tok("x y", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    call(store, tok, "w", [{"role": "user", "content": "q"}], [ids])
    second = call(store, tok, "w", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x  y"},
                                    {"role": "user", "content": "z"}], [[tok.eos_token_id]])
    assert second.kind == "drift" and store.counters["gateway/retokenization_drift"] == 1
    assert_only_sampled(store, "w")


def test_a_retried_call_forks_and_a_new_conversation_is_not_drift(tok):
    store = EpisodeStore(tok)
    eos = tok.eos_token_id
    hist = [{"role": "user", "content": "q"}]
    first = call(store, tok, "f", hist, [[tok.convert_tokens_to_ids("a"), eos]])
    retry = call(store, tok, "f", hist, [[tok.convert_tokens_to_ids("b"), eos]])
    other = call(store, tok, "f", [{"role": "user", "content": "a sub-agent"}], [[eos]])
    assert (retry.kind, other.kind) == ("fork", "new")
    assert retry.prompt_ids == first.prompt_ids
    assert store.counters == {**store.counters, "gateway/retokenization_drift": 0, "gateway/forks": 1}
    assert len(store.trajectories("f")) == 3
    assert_only_sampled(store, "f")


def test_episodes_are_separate(tok):
    store = EpisodeStore(tok)
    call(store, tok, "p", [{"role": "user", "content": "q"}], [[tok.eos_token_id]])
    second = call(store, tok, "q", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "zz"},
                                    {"role": "user", "content": "q"}], [[tok.eos_token_id]])
    assert second.kind == "new" and store.counters["gateway/retokenization_drift"] == 0


def test_stop_strings_cut_at_a_token_boundary_and_tool_calls_parse(tok):
    ids = tok("ab STOP cd", add_special_tokens=False)["input_ids"]
    decode = tok.decode
    kept, logps, text = cut_at_stop(ids, [float(i) for i in range(len(ids))], ["STOP", "zz"], decode)
    assert text == "ab " and decode(kept) == "ab " and logps == [float(i) for i in range(len(kept))]
    assert cut_at_stop(ids, [0.0] * len(ids), ["nope"], decode) == (ids, [0.0] * len(ids), None)
    content, calls = parse_tool_calls('hm<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
                                      '<tool_call>not json</tool_call>', "c")
    assert content == "hm" and [c["function"] for c in calls] == [{"name": "f", "arguments": '{"x": 1}'}]
    assert parse_tool_calls("<tool_call>{\"name\": 3}</tool_call>", "c") == ("<tool_call>{\"name\": 3}</tool_call>", [])


def test_a_different_tool_output_after_a_sampled_turn_is_a_fork_not_drift(tok):
    store = EpisodeStore(tok)
    eos = tok.eos_token_id
    hist = [{"role": "user", "content": "q"}]
    call(store, tok, "b", hist, [[tok.convert_tokens_to_ids("a"), eos]])
    one = hist + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "r1"}]
    call(store, tok, "b", one, [[eos]])
    two = hist + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "r2"}]
    branch = call(store, tok, "b", two, [[eos]])
    assert branch.kind == "fork" and store.counters["gateway/retokenization_drift"] == 0
    main, forked = store.trajectories("b")
    # the fork shares the first turn (as sampled) and then follows the other history
    assert forked.response_ids[:2] == main.response_ids[:2] and forked.meta["calls"] == [0, 2]
    assert tok.decode(forked.prompt_ids + forked.response_ids).endswith("r2<eos>\n<|im_start|>assistant\n<eos>")
    assert_only_sampled(store, "b")


def test_take_returns_the_trajectories_and_forgets_the_episode(tok):
    store = EpisodeStore(tok)
    call(store, tok, "t", [{"role": "user", "content": "q"}], [[tok.eos_token_id]])
    before = store.trajectories("t")
    assert [s.response_ids for s in store.take("t")] == [s.response_ids for s in before] == [[tok.eos_token_id]]
    assert store.trajectories("t") == [] and store.episode_calls("t") == []
