"""Issue 57 A.7: `sft.mask_observations` trains a multi-turn warm-up on the model's own turns only, as the RL loss
does. The loss-masked tokens must be exactly the env's observations, the trained ones exactly each action and its EOS,
the ids the same as the whole-answer encoding (so only the mask changes), and the option refused where there is
nothing to mask."""

from __future__ import annotations

import pytest

from credo.config import ConfigError, load_recipe
from credo.families.multiturn.source import turn_format
from credo.families.multiturn.task import EnvTask
from credo.models import build_char_tokenizer
from credo.sft import demonstration_ids, encode_pair, sft_digest
from credo.tasks import Problem
from credo.tasks.render import plain_prompt
from tests.e2e.common import REPO


def _shop_task():
    r = load_recipe(REPO / "recipes" / "shop.yaml", ["sft.mask_observations=true"])
    tok = build_char_tokenizer()
    return r, tok, EnvTask(r.env, tok, *turn_format(tok, plain_prompt))


def _runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """The (mask value, ids) runs of a masked sequence, in order."""
    out: list[tuple[int, list[int]]] = []
    for t, m in zip(ids, mask):
        if out and out[-1][0] == m:
            out[-1][1].append(t)
        else:
            out.append((m, [t]))
    return out


def test_trained_tokens_are_the_actions_and_their_eos_the_rest_the_observations():
    r, tok, task = _shop_task()
    for i in range(12):
        p = task.train(i)
        parts = p.meta["answer_parts"]
        assert "".join(t for t, _ in parts) == p.answer  # the same episode, in pieces
        ids, mask = demonstration_ids(r, tok, p.prompt, p, noisy=False)
        whole, _ = encode_pair(tok, p.prompt, p.answer)
        assert ids == whole  # only the mask differs from the whole-answer warm-up
        runs = _runs(ids, mask)
        assert runs[0][0] == 0 and tok.decode(runs[0][1]) == p.prompt  # the prompt is never trained
        trained = [tok.decode(t, skip_special_tokens=False) for m, t in runs if m == 1]
        masked = [tok.decode(t, skip_special_tokens=False) for m, t in runs[1:] if m == 0]
        actions = [t for t, own in parts if own]
        assert trained[:-1] == actions[:-1] and trained[-1] == actions[-1] + tok.eos_token
        assert masked == [t for t, own in parts if not own] and masked  # shop episodes have observations
        assert all(a.endswith(tok.eos_token) for a in actions[:-1])  # each turn ends with EOS, trained


def test_off_the_demonstration_and_the_warm_up_key_are_as_before():
    r, tok, task = _shop_task()
    p = task.train(3)
    r.sft.mask_observations = False
    assert demonstration_ids(r, tok, p.prompt, p, noisy=True) == encode_pair(tok, p.prompt, p.answer + ".")
    assert "mask_observations" not in sft_digest(r)  # warm-ups cached before the option keep their key
    r.sft.mask_observations = True
    assert sft_digest(r)["mask_observations"] is True


def test_refused_where_there_is_nothing_to_mask():
    with pytest.raises(ConfigError, match=r"'sft.mask_observations' = True .*stages.rollout is 'default'"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["sft.mask_observations=true"])
    # with no warm-up it has nothing to act on, as every sft.* key: accepted, as the agent tests' recipes need
    assert load_recipe(REPO / "recipes" / "quickstart.yaml", ["sft.mask_observations=true", "sft.enabled=false"])
    r, tok, _ = _shop_task()
    r.task.name = "arith"
    with pytest.raises(ConfigError, match=r"'sft.mask_observations' is on, but the task 'arith'"):
        demonstration_ids(r, tok, "1+1=", Problem(prompt="1+1=", answer="2"), noisy=False)
