"""Hugging Face model folders out of a run: `final/` at the end of `fit`, and `credo export CKPT OUT` for any checkpoint.

The folder holds config.json, safetensors weights, the generation config and the policy's tokenizer
(its chat template included), so `AutoModelForCausalLM.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)` load it, and so do vLLM and TRL. It is written to a temporary
folder and renamed, so a reader never sees half a model.

A checkpoint (`checkpoints/step_N/`, see credo.checkpoint) holds DeepSpeed's state: under ZeRO 0-2 the
module's weights sit whole in `state/mp_rank_00_model_states.pt`; under ZeRO-3 they are partitioned and
are merged (in fp32) with DeepSpeed's zero_to_fp32. Its meta.json names `policy_path`, the base model
folder whose config and tokenizer the weights belong to.

A policy trained with a LoRA adapter (`model.lora`, credo.lora) is written merged, W + (alpha / r) B A under the
base model's names, so the folder is a plain model; `credo export --adapter` writes the adapter alone instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import torch

from credo.checkpoint import TAG
from credo.lora import add_lora, policy_state_dict, save_adapter
from credo.safe_load import load as safe_load
from credo.safe_load import weights_only_torch_load


def _write_folder(out_dir: Path, write) -> Path:
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


def export_model(module: torch.nn.Module, tokenizer, out_dir: str | Path, *, zero_stage: int = 0, rank: int = 0) -> Path | None:
    """Write `module` (a transformers causal LM, e.g. a DeepSpeed engine's `.module`) and `tokenizer` to `out_dir`.

    Collective under ZeRO-3 (every rank calls it: the partitioned weights are gathered); rank 0 writes.
    Returns the folder on rank 0, None elsewhere.
    """
    gather = contextlib.nullcontext()
    if zero_stage == 3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    with gather:
        if rank != 0:
            return None

        state = {k: v.detach().cpu().clone() for k, v in policy_state_dict(module).items()}  # LoRA: merged
        return write_hf_folder(module, tokenizer, Path(out_dir), state)


def write_hf_folder(module: torch.nn.Module, tokenizer, out_dir: Path, state: dict[str, torch.Tensor]) -> Path:
    """`module`'s config with the weights `state` (full tensors on the CPU) and `tokenizer`, as a Hugging Face
    folder written atomically to `out_dir`."""

    def write(tmp: Path) -> None:
        module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return _write_folder(out_dir, write)


def checkpoint_state_dict(ckpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """The policy's weights in a credo checkpoint folder (ZeRO 0-2 as saved, ZeRO-3 merged to fp32, an FSDP2 DCP
    folder merged from its shards)."""
    ckpt = Path(ckpt_dir)
    if (ckpt / "dcp").is_dir():
        return dcp_model_state_dict(ckpt / "dcp")
    whole = ckpt / TAG / "mp_rank_00_model_states.pt"
    if whole.is_file():
        return safe_load(whole)["module"]
    if any((ckpt / TAG).glob("zero_pp_rank_*_mp_rank_00_model_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with weights_only_torch_load():  # zero_to_fp32 unpickles with weights_only=False
            return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=TAG)
    raise FileNotFoundError(f"{ckpt} holds no DeepSpeed model states under '{TAG}/' (expected a credo checkpoint "
                            "folder such as runs/NAME/checkpoints/step_00000010)")


def dcp_model_state_dict(dcp_dir: Path) -> dict[str, torch.Tensor]:
    """The full model weights of an FSDP2 checkpoint's DCP folder, read in this process without a process group."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(dcp_dir), f"{tmp}/state.pt")
        return torch.load(f"{tmp}/state.pt", map_location="cpu", weights_only=False)["model"]


def export_checkpoint(ckpt_dir: str | Path, out_dir: str | Path, *, base_model: str | None = None,
                      adapter: bool = False) -> Path:
    """Write the Hugging Face folder of a checkpoint's policy to `out_dir`.

    `base_model` overrides the checkpoint's `policy_path` (the folder its config and tokenizer come from),
    for a checkpoint moved to another machine. A run with `model.lora` is written merged (a plain model folder),
    or with `adapter` as its LoRA adapter alone (`peft.PeftModel.from_pretrained(base, out_dir)` loads it).

    Raises:
        FileNotFoundError: not a credo checkpoint, or its base model folder is gone.
        ValueError: `adapter` for a run without model.lora, or weights that do not fit the base model.
    """
    from credo.models import load_tokenizer

    ckpt = Path(ckpt_dir)
    model, peft_model, base = checkpoint_model(ckpt, base_model)
    if adapter and peft_model is None:
        raise ValueError(f"--adapter: checkpoint {ckpt} was trained without model.lora, so it has no adapter; "
                         "export the whole model (without --adapter)")
    if adapter:
        return _write_folder(Path(out_dir), lambda tmp: save_adapter(peft_model, load_tokenizer(base), tmp))
    return export_model(model, load_tokenizer(base), out_dir)


def checkpoint_model(ckpt: Path, base_model: str | None = None) -> tuple[torch.nn.Module, object, str]:
    """The policy of a credo checkpoint as a transformers model, the `peft.PeftModel` around it when the run
    trained a LoRA adapter (else None), and the base model folder it was built on."""
    from credo.config import LoraConfig
    from credo.models import load_causal_lm

    meta_path = ckpt / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{ckpt} has no meta.json: expected a credo checkpoint folder (checkpoints/step_N)")
    meta = json.loads(meta_path.read_text())
    base = base_model or meta.get("policy_path")
    if not base or not Path(base).is_dir():
        raise FileNotFoundError(f"the base model folder of {ckpt} ('{base}', meta.json policy_path) is missing: "
                                "pass --base-model with the model folder the run started from")
    state = checkpoint_state_dict(ckpt)  # first: a file that fails the weights-only load stops before any model load
    model_cfg = (meta.get("config") or {}).get("model", {})
    model = load_causal_lm(base, model_cfg.get("dtype", "float32"))  # the base's class, config and buffers
    lora = model_cfg.get("lora") or {}
    # the trained module held the adapter: the same names, then merged or saved alone
    peft_model = add_lora(model, LoraConfig(**lora)) if lora.get("r") else None
    own = model.state_dict()
    missing = [k for k in own if k not in state and not _tied(model, k)]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(f"checkpoint {ckpt} does not match the model at '{base}': missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v.to(own[k].dtype))
    return model, peft_model, base


def _tied(model, key: str) -> bool:
    """The output head shared with the input embedding (saved once)."""
    head = model.get_output_embeddings()
    return head is not None and head.weight is model.get_input_embeddings().weight and key.endswith("lm_head.weight")
