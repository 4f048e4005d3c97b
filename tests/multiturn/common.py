"""Scripted backends and envs for the multi-turn tests (no model)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from credo.config import EnvConfig
from credo.distributed.rollout import Sample
from credo.families.multiturn.envs.guess import GuessNumberEnv
from credo.models import build_char_tokenizer
from credo.tasks.render import plain_prompt
from credo.families.multiturn.source import MultiTurnRollout


class ScriptedBackend:
    """`policy(context_text) -> action text`; each action is followed by EOS and cut at max_new_tokens.
    Records every generate call's batch size."""

    def __init__(self, tokenizer, policy, log_prob: float = -0.5):
        self.tok, self.policy, self.log_prob = tokenizer, policy, log_prob
        self.calls: list[int] = []
        self.version = 0

    def generate(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            text = self.policy(self.tok.decode(p, skip_special_tokens=False))
            ids = (self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])[:max_new_tokens]
            out.append(Sample(list(p), ids, [1] * len(ids), [self.log_prob] * len(ids),
                              ids[-1] == self.tok.eos_token_id, self.version))
        return out

    def sync_weights(self, model, version):
        self.version = version

    def close(self):
        pass


class FixedTarget(GuessNumberEnv):
    """The built-in game with a chosen target, whatever the seed."""

    def __init__(self, target: int, **kw):
        super().__init__(**kw)
        self.fixed = target

    def reset(self, seed=None):
        obs, info = super().reset(seed)
        self.target = self.fixed
        return obs, info


class RaisingEnv(FixedTarget):
    def step(self, action):
        raise RuntimeError("the env crashed")


class HangingEnv(FixedTarget):
    release = threading.Event()

    def step(self, action):
        self.release.wait(60)  # released at the end of the test; a daemon thread either way
        return super().step(action)


def env_cfg(**kw) -> EnvConfig:
    base = dict(id="credo:GuessNumber-v0", kwargs={"low": 1, "high": 7, "max_turns": 3}, max_turns=3,
                max_total_tokens=128, max_new_tokens_per_turn=4, step_timeout_s=5.0, max_failure_frac=0.5)
    base.update(kw)
    return EnvConfig(**base)


def source(cfg: EnvConfig, policy, *, envs=None, P=2, G=2, tokenizer=None, backend=None):
    """A MultiTurnRollout over a scripted backend; `envs()` makes each episode's env (default: target 5)."""
    tok = tokenizer or build_char_tokenizer()
    backend = backend or ScriptedBackend(tok, policy)
    factory = envs or (lambda: FixedTarget(5, low=1, high=7, max_turns=3))
    src = MultiTurnRollout(cfg, tok, backend, seed=0, prompts_per_step=P, group_size=G, temperature=1.0, top_p=1.0,
                           render=plain_prompt, env_factory=factory)
    return src, backend, tok


def ctx(**rollout):
    return SimpleNamespace(rollout=rollout)
