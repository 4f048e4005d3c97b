"""The one-model mode (`complementary.extractor: self`) with a scripted actor on the vault game: the lesson samples in
the actor's batch, their rewards, group ids and advantages, and what the bank keeps, each against a reference
computed here from the env's codes (not from the source's bookkeeping)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch

from credo.distributed.rollout import Sample
from credo.families.complementary.config import ComplementaryConfig
from credo.families.complementary.hook import BankHook
from credo.families.complementary.source import ComplementaryRollout
from credo.families.multiturn.config import EnvConfig
from credo.families.multiturn.envs.vault import VaultEnv
from credo.families.multiturn.source import EnvReward
from credo.families.multiturn.turn_credit import TurnCredit
from credo.models import build_char_tokenizer
from credo.train.batch import pack_batch

P, G, T, C, M = 4, 4, 2, 3, 2
KW = {"n_tasks": 8, "low": 1, "high": 9, "max_turns": 1}


class SeededActor:
    """The actor: a note's code when it is shown one, else 5; asked for a lesson ('...lesson:'), 'code <c>' with c
    drawn by its seed from the range the episode's feedback left (so the candidates of an episode differ)."""

    def __init__(self, tok):
        self.tok, self.lesson_prompts = tok, 0

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        out = []
        for p, seed in zip(prompts, seeds):
            text = self.tok.decode(p, skip_special_tokens=True)
            if text.endswith("lesson:"):
                self.lesson_prompts += 1
                lo, hi = (6, 9) if "higher" in text else (1, 4) if "lower" in text else (5, 5)
                action = f"code {lo + seed % (hi - lo + 1)}"
            else:
                noted = re.search(r"note: code (\d)", text)
                action = noted.group(1) if noted else "5"
            ids = (self.tok(action, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])[:max_new_tokens]
            out.append(Sample(list(p), ids, [1] * len(ids), [-0.5] * len(ids), ids[-1] == self.tok.eos_token_id, 0))
        return out

    def sync_weights(self, model, version):
        pass

    def close(self):
        pass


def make_source():
    tok = build_char_tokenizer()
    cfg = EnvConfig(id="credo:Vault-v0", kwargs=KW, max_turns=1, max_total_tokens=64, max_new_tokens_per_turn=8,
                    step_timeout_s=5.0)
    section = ComplementaryConfig(extractor="self", extract_per_step=T, candidates=C, paired_episodes=M,
                                  lesson_tokens=8, experience_frac=0.5)
    backend = SeededActor(tok)
    src = ComplementaryRollout(cfg, section, tok, backend, seed=3, prompts_per_step=P, group_size=G,
                               temperature=1.0, top_p=1.0)
    return src, section, tok, backend


def expected_return(note_code: int | None, task: int) -> float:
    """The scripted actor's return on one vault of `task` (one guess): 1 when its guess is the code."""
    guess = note_code if note_code is not None else 5
    return float(guess == VaultEnv(**KW).code_of(task))


def lesson_code(text: str) -> int | None:
    found = re.findall(r"\d+", text)
    return int(found[-1]) if found and 1 <= int(found[-1]) <= 9 else None


def check_step(src, tok, step, bank_before):
    batch = src.rollout(step)
    EnvReward()(batch)
    pack_batch(batch, tok.pad_token_id, overlong_filter=False)
    TurnCredit("grpo", 1.0, 1e-9)(batch)
    episodes = [i for i, s in enumerate(batch.samples) if "lesson" not in s.meta]
    lessons = [i for i, s in enumerate(batch.samples) if "lesson" in s.meta]
    assert len(episodes) == P * G and len(lessons) == T * C and lessons == list(range(P * G, P * G + T * C))
    episode_groups = {int(batch.group_ids[i]) for i in episodes}
    by_episode: dict[int, list[int]] = {}
    tasks = []
    for k, i in enumerate(lessons):
        s = batch.samples[i]
        text = tok.decode(s.response_ids, skip_special_tokens=True).strip()
        prompt = tok.decode(s.prompt_ids, skip_special_tokens=True)
        task = int(re.match(r"vault (\d+)", prompt).group(1))
        tasks.append(task)  # the extractor's prompt starts with the first observation
        entry = bank_before.get(f"vault {task}")
        base = None if entry is None else lesson_code(entry)
        gain = expected_return(lesson_code(text), task) - expected_return(base, task)
        # the lesson's reward is its paired gain, and it trains (valid, a response of its own)
        assert float(batch.rewards[i]) == gain and bool(batch.valid[i]) and s.meta["lesson"]["text"] == text
        assert batch.loss_mask[i].sum() == len(s.response_ids)
        by_episode.setdefault(k // C, []).append(i)  # the C candidates of a chosen episode follow each other
    assert len(by_episode) == T
    for rows in by_episode.values():
        assert len({tuple(batch.samples[i].prompt_ids) for i in rows}) == 1  # one episode's prompt
        ids = {int(batch.group_ids[i]) for i in rows}
        assert len(ids) == 1 and not ids & episode_groups  # one group per chosen episode, no actor episode in it
        r = batch.rewards[rows].double()
        ref = (r - r.mean()) / (r.std() + 1e-6) if r.std() > 0 else torch.zeros_like(r)
        for i, a in zip(rows, ref):
            m = batch.loss_mask[i]
            assert torch.allclose(batch.advantages[i][m].double(), a.expand(int(m.sum())), atol=1e-6)
    other = {int(batch.group_ids[i]) for rows in by_episode.values() for i in rows}
    assert len(other) == T
    return batch, by_episode, sum(f"vault {k}" in bank_before for k in tasks)


def test_lesson_samples_join_the_actors_batch_with_their_paired_gains_and_own_groups():
    src, section, tok, backend = make_source()
    hook = BankHook(src, section)
    batch, by_episode, _ = check_step(src, tok, 1, {})
    assert backend.lesson_prompts == T * C
    hook.after_sync(1, batch)
    # what the bank keeps: per chosen episode, the first lesson of the highest gain, if it helped (> add_min = 0)
    kept = {}
    for rows in by_episode.values():
        gains = [float(batch.rewards[i]) for i in rows]
        best = rows[gains.index(max(gains))]
        if max(gains) > 0:
            kept[batch.samples[best].meta["task_key"]] = batch.samples[best].meta["lesson"]["text"]
    assert {e.key: e.text for e in src.bank.entries.values()} == kept
    # later steps: the paired baseline is the bank's entry where there is one
    against_entries = 0
    for step in range(2, 7):
        bank = {e.key: e.text for e in src.bank.entries.values()}
        batch, _, n = check_step(src, tok, step, bank)
        against_entries += n
        hook.after_sync(step, batch)
    assert len(src.bank) >= 1 and against_entries >= 1
