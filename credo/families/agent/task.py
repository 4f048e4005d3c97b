"""The agent family's task: the rows its episodes are given, and the warm-up's demonstrations.

A row is the dict an agent receives as `task`: `agent.tasks` ('pkg.module:task_row', called as
task_row(index, split) with split 'train' or 'eval') when set, else the recipe task's problem as
{'prompt', 'answer', **meta}. The warm-up (credo's SFT, which calls `train(i)`) trains on `agent.demos`'
conversations when set: demonstration(i) -> {'messages': [...], 'tools': [...]}, rendered by the gateway's own chat
template, so the policy is warmed up on exactly the text it will be asked to continue through the gateway. The
prompt is the conversation up to its first assistant turn (with the generation prompt), the answer everything
after (tool outputs included, as the multi-turn family's warm-up; the warm-up appends the final EOS), unless
`sft.mask_observations`: then only the agent's own turns are trained (`meta['answer_parts']`, agent_turn_parts).
"""

from __future__ import annotations

from typing import Any, Callable

from credo.errors import ConfigError
from credo.tasks import Problem


def demonstration_problem(tokenizer, demo: Any, where: str, template: str | None = None,
                          turn_parts: bool = False) -> Problem:
    """One demonstration conversation as (prompt, answer) text in the gateway's rendering (`template`: the run's
    agent.chat_template text, None for the tokenizer's). `turn_parts` (sft.mask_observations): also mark the agent's
    own turns in meta['answer_parts'] (agent_turn_parts; it renders the conversation again per turn, so only then)."""
    from credo.gateway.chat import RequestError, check_messages, render

    if not isinstance(demo, dict) or not isinstance(demo.get("messages"), list):
        raise ConfigError(f"{where} returned {type(demo).__name__}; expected {{'messages': [...], 'tools': [...]}}")
    try:
        messages = check_messages(demo["messages"])
        tools = demo.get("tools") or None
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if first is None or first == 0 or messages[-1]["role"] != "assistant":
            raise ConfigError(f"{where}: a demonstration starts with the task's messages and ends with an assistant "
                              "turn; expected at least one assistant message after the first message, and one last")
        prompt = render(tokenizer, messages[:first], tools, template=template)
        full = render(tokenizer, messages, tools, generation_prompt=False, template=template)
    except RequestError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not full.startswith(prompt):
        raise ConfigError(f"{where}: the chat template renders the conversation's start differently from its first "
                          "prompt; this template cannot be warmed up on conversations")
    answer = full[len(prompt):].rstrip()
    eos = tokenizer.eos_token or ""
    if eos and answer.endswith(eos):
        answer = answer[:-len(eos)]  # the warm-up appends the EOS token itself
    meta: dict = {"demonstration": True}
    if turn_parts:
        meta["answer_parts"] = agent_turn_parts(tokenizer, messages, tools, template, full, len(prompt), len(answer),
                                                where)
    return Problem(prompt=prompt, answer=answer, meta=meta)


def agent_turn_parts(tokenizer, messages: list[dict], tools, template, full: str, start: int, length: int,
                     where: str) -> list[tuple[str, bool]]:
    """The answer full[start:start + length] in pieces (text, the agent's own): each assistant turn from after its
    generation prompt through its closing EOS is what the policy samples through the gateway (mask 1 there); the
    generation prompts, the tool outputs and the template's other text are not (mask 0), as the gateway's capture
    masks them (`sft.mask_observations` trains on the agent's pieces only)."""
    from credo.gateway.chat import render

    eos = tokenizer.eos_token or ""
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:k], tools, template=template)  # the call that sampled this turn
        upto = render(tokenizer, messages[:k + 1], tools, generation_prompt=False, template=template)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ConfigError(f"{where}: the chat template renders a conversation's start differently from the "
                              f"call that samples its assistant turn {k}; its turns cannot be told from the template's "
                              "text (sft.mask_observations needs them)")
        close = upto.rfind(eos) if eos else -1
        spans.append((len(before), close + len(eos) if close >= len(before) else len(upto)))
    parts, pos, end = [], start, start + length
    for a, b in spans:
        a, b = max(a, start), min(b, end)
        if a > pos:
            parts.append((full[pos:a], False))
        if b > a:
            parts.append((full[a:b], True))
            pos = b
    if pos < end:
        parts.append((full[pos:end], False))
    return parts


class AgentTask:
    """The run's task under `rollout.agent` (see the module docstring)."""

    def __init__(self, cfg, tokenizer, *, rows: Callable | None, base: Any, demos: Callable | None, train_size: int,
                 template: str | None = None, turn_parts: bool = False):
        self.cfg, self.tokenizer, self.rows, self.base, self.demos = cfg, tokenizer, rows, base, demos
        self.turn_parts = turn_parts  # sft.mask_observations: mark the agent's turns in each demonstration
        self.template = template  # agent.chat_template's text (None: the tokenizer's), as the gateway renders
        self.train_size = train_size if rows is not None else len(base)

    def __len__(self) -> int:
        return self.train_size

    def row(self, index: int, split: str = "train") -> dict:
        """The `task` dict of episode `index` of `split` ('train' or 'eval')."""
        if self.rows is not None:
            out = self.rows(index, split)
            if not isinstance(out, dict):
                raise ConfigError(f"config key 'agent.tasks' = '{self.cfg.tasks}' returned a {type(out).__name__} for "
                                  f"{split} row {index}; expected a dict")
            return out
        problems = self.base.eval_problems() if split == "eval" else None
        p = problems[index % len(problems)] if problems else self.base.train(index)
        return {"prompt": p.prompt, "answer": p.answer, **dict(p.meta or {})}

    def train(self, i: int) -> Problem:
        if self.demos is None:
            return self.base.train(i)
        return demonstration_problem(self.tokenizer, self.demos(i), f"config key 'agent.demos' = '{self.cfg.demos}'",
                                     template=self.template, turn_parts=self.turn_parts)

    def eval_problems(self) -> list[Problem]:
        return []  # the agent's held-out episodes are the evaluator's (credo.families.agent.source.AgentEvaluator)
