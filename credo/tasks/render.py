"""Prompt rendering shared by the warm-up, the rollout and evaluation: one function, bound once by the builder.

A problem's prompt is a string or a list of chat messages (`[{"role": "user", "content": ...}]`). When the
tokenizer has a chat template and `task.chat_template` is `auto` (or `true`), the prompt becomes the
messages (a string is one user message, after `task.system_prompt` as a system message) rendered with
`add_generation_prompt=True`; the model then continues with the assistant's turn. Without a template
(`auto` on a tokenizer that has none, or `false`), a string prompt is used as it is: the built-in tasks
and the tiny character tokenizer take this path, unchanged.

The rendered text is tokenized with `add_special_tokens=False` everywhere, since a template writes its own
special tokens.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from credo.errors import ConfigError


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer, prompt: str | list, *, system_prompt: str | None = None,
                  chat_template: bool | str = "auto") -> str:
    """The text the policy continues for `prompt` (a string or a list of chat messages).

    Raises:
        ConfigError: `chat_template` is true but the tokenizer has none, or a list of messages cannot be
            rendered (no template, or chat_template false).
    """
    use = has_chat_template(tokenizer) if chat_template == "auto" else bool(chat_template)
    if use and not has_chat_template(tokenizer):
        raise ConfigError("config key 'task.chat_template' = true but the tokenizer has no chat template: "
                          "expected a tokenizer with one (tokenizer.chat_template), or task.chat_template=auto")
    if not use:
        if isinstance(prompt, str):
            return prompt
        raise ConfigError("a prompt is a list of chat messages but it cannot be rendered: "
                          f"task.chat_template = {chat_template!r} and the tokenizer "
                          f"{'has' if has_chat_template(tokenizer) else 'has no'} chat template; expected a "
                          "tokenizer with a chat template and task.chat_template auto or true")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt is not None and not (messages and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_renderer(tokenizer, system_prompt: str | None = None, chat_template: bool | str = "auto") -> Callable:
    """`render(problem) -> str`, the recipe's rendering bound once (the builder passes it to every stage)."""
    render = partial(render_prompt, tokenizer, system_prompt=system_prompt, chat_template=chat_template)
    return lambda problem: render(problem.prompt)


def plain_prompt(problem) -> str:
    """The default renderer of stages built without one: the prompt string as it is."""
    return problem.prompt


def encode_prompts(tokenizer, render: Callable, problems: list) -> list[list[int]]:
    """Token ids of each problem's rendered prompt (no special tokens added: a template writes its own)."""
    return tokenizer([render(p) for p in problems], add_special_tokens=False)["input_ids"]
