"""LoRA on the policy (`model.lora`, PEFT): the engine trains the adapter only, everything else sees merged weights.

With `model.lora.r > 0` the builder wraps the loaded policy with `peft.get_peft_model` and hands DeepSpeed the
wrapped transformers module (`PeftModel.get_base_model()`: the same causal LM with each targeted linear layer
replaced by a PEFT `lora.Linear`), so the scorer, the HF sampler, checkpoints and probes see the model they always
saw; only the adapter's parameters require grad, and only they reach the optimizer. Then:

    the KL reference     the policy's own module with the adapter switched off (`BaseReference`, PEFT's
                         `disable_adapter`): the base weights are held once
    the vLLM engine      merged weights, W + (alpha / r) B A under the base model's names (`policy_state_dict`),
                         pushed by credo.distributed.weight_sync after every update
    final/, export       the merged model (a plain Hugging Face folder), or the adapter alone (`save_adapter`)

The output head and the embeddings are never wrapped: the scorer computes log-probs from the last hidden state
and the head's weight (`credo.algos.logprobs_from_hidden`), which would skip an adapter on the head. peft is
imported only when a recipe turns LoRA on.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from credo.errors import ConfigError

if TYPE_CHECKING:
    from credo.config import LoraConfig

ADAPTER = "default"
"""The adapter's name inside PEFT (one adapter per policy)."""


def add_lora(model: torch.nn.Module, cfg: LoraConfig, *, seed: int = 0):
    """Wrap `model` (a transformers causal LM) with a LoRA adapter in place; returns the `peft.PeftModel`.

    `model` itself keeps being the module to train (its targeted linear layers now hold the adapter) and only
    the adapter's parameters require grad. The adapter takes the base weights' dtype. Its initialisation (PEFT's:
    A random, B = 0) draws from a generator seeded with `seed`, not from the global RNG, whose state at this point
    depends on whether the warm-up ran or came from its cache.

    Raises:
        ConfigError: target_modules matches no module, or wraps a layer other than a linear one below the head.
    """
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    targets = list(cfg.target_modules)
    config = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                            target_modules="all-linear" if targets == ["all-linear"] else targets)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    except ValueError as e:
        raise ConfigError(f"config key 'model.lora.target_modules' = {targets}: {str(e).splitlines()[0]}") from None
    _check_wrapped(model, targets)
    return peft_model


def _check_wrapped(model: torch.nn.Module, targets: list[str]) -> None:
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    for name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if module is head or module is emb or not isinstance(module, LoraLinear):
            what = "the output head" if module is head else "the input embedding" if module is emb else \
                type(module.get_base_layer()).__name__
            raise ConfigError(f"config key 'model.lora.target_modules' = {targets} wraps '{name}' ({what}): expected "
                              "linear layers below the output head (the scorer reads the head's weight directly)")


def lora_layers(module: torch.nn.Module) -> dict[str, Any]:
    """The PEFT LoRA layers inside `module`, by module name (empty when peft was never imported)."""
    if "peft" not in sys.modules:  # nothing can hold an adapter
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


def has_lora(module: torch.nn.Module) -> bool:
    return bool(lora_layers(module))


@torch.no_grad()
def policy_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's names: with a LoRA adapter, each wrapped layer's weight is
    merged, W + (alpha / r) B A (PEFT's `get_delta_weight`, as `merge_and_unload` computes it) and the adapter's
    own tensors are left out; without one, `module.state_dict()` detached (views of the live tensors)."""
    layers = lora_layers(module)
    if not layers:
        return {k: v.detach() for k, v in module.state_dict().items()}
    out = {}
    for key, value in module.state_dict().items():
        owner = _owner(key, layers)
        if owner is None:
            out[key] = value.detach()
        elif key.startswith(owner + ".base_layer."):  # the wrapped layer's own weight and bias, renamed back
            leaf = key[len(owner) + len(".base_layer."):]
            if leaf == "weight":
                value = value + layers[owner].get_delta_weight(ADAPTER)
            out[f"{owner}.{leaf}"] = value.detach()
        # else: the adapter's own tensors (lora_A, lora_B), folded into the weight above
    return out


def _owner(key: str, layers: dict) -> str | None:
    """The LoRA layer a state-dict key sits under, or None."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:i])
        if name in layers:
            return name
    return None


@dataclass
class BaseReference:
    """The KL reference of a LoRA run: the policy's own module scored with its adapter switched off (PEFT's
    `disable_adapter`), which is the starting policy, without a second copy of its weights."""

    peft_model: Any
    """The `peft.PeftModel` around the policy."""

    @property
    def module(self) -> torch.nn.Module:
        return self.peft_model.get_base_model()

    def adapter_off(self):
        """A context in which the policy's module computes the base model."""
        return self.peft_model.disable_adapter()


def save_adapter(peft_model, tokenizer, out_dir: Path) -> None:
    """The adapter alone (adapter_config.json, adapter_model.safetensors) and the tokenizer, into `out_dir`:
    `peft.PeftModel.from_pretrained(base, out_dir)` loads it onto the base model it names."""
    peft_model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def check_model_options(r, base_path: str) -> None:
    """model.lora and model.gradient_checkpointing against the model's own classes, on an empty (meta-device)
    model built from its config.json: seconds, before any warm-up. Skipped for a model not on this machine."""
    if not (r.model.lora.r or r.model.gradient_checkpointing) or not (Path(base_path) / "config.json").is_file():
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_path))
    if r.model.gradient_checkpointing and not model.supports_gradient_checkpointing:
        raise ConfigError(f"config key 'model.gradient_checkpointing' = true: {type(model).__name__} at "
                          f"'{base_path}' does not support gradient checkpointing")
    if r.model.lora.r:
        add_lora(model, r.model.lora)
