"""The experience extractor of Complementary RL (arXiv 2603.17621) as a second model: its own weights, DeepSpeed
engine and optimizer, a warm-up on scripted lessons, lesson sampling, and its policy-gradient update.

    extractor prompt   "<first observation>\\n<action> <observation>\\n...lesson:"   (the finished episode)
    lesson             what it samples after "lesson:", up to complementary.lesson_tokens tokens or EOS
    update             GRPO over the `candidates` lessons of one episode (one group), reward = the lesson's paired
                       gain (credit.paired_gain); on-policy REINFORCE with the group-normalised advantage on every
                       lesson token (token mean), one optimizer step per train step (inferred: the abstract gives
                       the reward, not the extractor's loss)

The warm-up (inferred) trains the extractor on (episode, scripted lesson) pairs: episodes of the env's noisy
scripted expert on seeds of their own, lessons from the env's `lesson_demo(actions, observations)`, replaced with
probability `extractor_demo_noise` by the lesson of another episode, so RL has room to improve it.
"""

from __future__ import annotations

import random

import torch

from credo import algos
from credo.distributed.engine import backward, optimizer_step
from credo.errors import ConfigError

EXTRACTOR_DEMO_SEED_BASE = 7 * 10**9
"""Seeds of the extractor's warm-up episodes (apart from training seeds < 2^31 and held-out seeds >= 10^10)."""


def trajectory_prompt(first_observation: str, actions: list[str], observations: list[str]) -> str:
    """The extractor's prompt for one finished episode."""
    turns = "".join(f"{a} {o}\n" for a, o in zip(actions, observations))
    return f"{first_observation}\n{turns}lesson:"


def clean_lesson(text: str) -> str:
    """A sampled lesson as it is stored and shown: its first line, stripped."""
    return text.strip().split("\n", 1)[0].strip()


def demo_pairs(env_factory, n: int, *, max_turns: int, expert_noise: float, demo_noise: float, seed: int
               ) -> list[tuple[str, str]]:
    """`n` (extractor prompt, scripted lesson) pairs from the env's noisy expert (see the module docstring)."""
    rng = random.Random(seed)
    episodes = []
    for i in range(n):
        env = env_factory()
        if hasattr(env, "pin_note"):
            env.pin_note("")
        obs, _ = env.reset(seed=EXTRACTOR_DEMO_SEED_BASE + seed * 100_003 + i)
        actions, observations = [], []
        for _ in range(max_turns):
            a = env.expert_action(rng, expert_noise)
            o, _, terminated, truncated, _ = env.step(a)
            actions.append(a)
            observations.append(str(o))
            if terminated or truncated:
                break
        episodes.append((trajectory_prompt(str(obs), actions, observations), env.lesson_demo(actions, observations)))
    lessons = [lesson for _, lesson in episodes]
    return [(p, rng.choice(lessons) if rng.random() < demo_noise else lesson) for p, lesson in episodes]


def encode(tokenizer, prompts: list[str], lessons: list[list[int]] | list[str]) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids [N, L], attention_mask [N, L], lesson_mask [N, L-1]) of prompt + lesson (+ EOS for a
    text lesson); lesson_mask column j marks token j+1 as a lesson token (label-aligned)."""
    rows, masks = [], []
    for p, lesson in zip(prompts, lessons):
        pid = tokenizer(p, add_special_tokens=False)["input_ids"]
        lid = (tokenizer(lesson, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               if isinstance(lesson, str) else list(lesson))
        rows.append(pid + lid)
        masks.append([0] * len(pid) + [1] * len(lid))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lesson = torch.tensor([m + [0] * (width - len(m)) for m in masks])[:, 1:].bool()
    return ids, attn, lesson


def token_log_probs(model, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """[N, L-1] log p(token j+1 | tokens <= j)."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]


def warm_up(model, tokenizer, pairs: list[tuple[str, str]], *, steps: int, batch: int, lr: float, seed: int
            ) -> list[float]:
    """Supervised warm-up of the extractor (before its engine is built): cross-entropy on the lesson tokens.
    Returns the loss of each step."""
    if not steps:
        return []
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    losses = []
    model.train()
    for _ in range(steps):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in range(batch)]
        ids, attn, mask = encode(tokenizer, [p for p, _ in chosen], [lesson for _, lesson in chosen])
        lp = token_log_probs(model, ids, attn)
        loss = -(lp * mask).sum() / mask.sum().clamp_min(1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.zero_grad(set_to_none=True)  # the last step's gradients would join the engine's first update
    return losses


def extractor_update(engine, tokenizer, prompts: list[str], lesson_ids: list[list[int]], rewards: torch.Tensor,
                     group_ids: torch.Tensor, *, zero_stage: int, world: int) -> dict[str, float]:
    """One GRPO step of the extractor (see the module docstring). prompts / lesson_ids: [N]; rewards, group_ids: [N].
    A lesson of no tokens trains nothing."""
    ids, attn, mask = encode(tokenizer, prompts, lesson_ids)
    adv = algos.grpo(rewards.float(), group_ids, mask.float())  # [N, L-1]
    lp = token_log_probs(engine.module, ids, attn)
    n = mask.sum().clamp_min(1)
    loss = -(adv * lp * mask).sum() / n
    backward(engine, loss, world)
    optimizer_step(engine, zero_stage)
    # no grad-norm metric: DeepSpeed's get_global_grad_norm() after a resume reported 1.64 where the
    # uninterrupted run reported 0.0 (a step whose advantages were all 0), so it is not a function of the state
    return {"extractor/loss": float(loss.detach()),
            "extractor/lesson_tokens_mean": float(mask.sum()) / max(1, len(prompts))}


def check_extractor_env(env, section) -> None:
    """An extractor warm-up needs the env's scripted expert and scripted lessons."""
    missing = [m for m in ("expert_action", "lesson_demo") if not hasattr(env, m)]
    if section.extractor != "none" and section.extractor_sft_steps > 0 and missing:
        raise ConfigError(f"config key 'complementary.extractor_sft_steps' = {section.extractor_sft_steps} needs an env "
                          f"with {' and '.join(missing)} (scripted lessons); expected "
                          "complementary.extractor_sft_steps: 0")
