"""Supervised warm-up that produces the base policy, cached by the hash of everything that shapes it.

`sft.noisy_frac` makes a share of the demonstrations end the answer with a stray '.', a format
defect the verifier rejects: a controlled stand-in for imperfect SFT data that RL has to correct.

Repeated recipes and ablation runs with the same model, data and `sft` settings reuse the cached
checkpoint instead of retraining. The cache key hashes the model's contents (config.json, weight and
tokenizer files), not its path: a model rebuilt in place gets a new warm-up. The cache entry is written
to a temporary folder and renamed, so a killed warm-up never leaves a half-written policy behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from credo.config import ConfigError, Recipe
from credo.family import warmup_digest
from credo.tasks.render import prompt_renderer
from credo.models import cache_root, check_vocab, load_causal_lm, load_tokenizer, resolve_model_path


def sft_seed(r: Recipe) -> int:
    return r.run.seed if r.sft.seed is None else r.sft.seed


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                   "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json")
_FILE_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime, inode) -> sha256: a multi-GB weight file is read once per process


def file_digest(path: Path) -> str:
    """sha256 of a file's contents, remembered while the file's size, mtime and inode stay the same."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if stamp not in _FILE_DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _FILE_DIGESTS[stamp] = h.hexdigest()
    return _FILE_DIGESTS[stamp]


def model_digest(folder: Path) -> dict[str, str]:
    """Digests of what makes a Hugging Face model folder's model: config.json, weights (and their index), tokenizer."""
    def shapes_model(p: Path) -> bool:
        return (p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json")
                or p.name in TOKENIZER_FILES)

    return {p.name: file_digest(p) for p in sorted(folder.iterdir()) if p.is_file() and shapes_model(p)}


def _model_folder(r: Recipe, base_path: str) -> Path | None:
    """The local folder of the base model, or None for a hub id that is not downloaded."""
    if base_path == "tiny":  # the recipe's own path (credo ablate groups runs before any is started)
        return Path(resolve_model_path("tiny", r.model.tiny))
    if Path(base_path).is_dir():
        return Path(base_path)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(base_path, local_files_only=True))
    except (OSError, ValueError):  # not in the local hub cache (or not a hub id): its name is all there is to key by
        return None


def data_digest(r: Recipe) -> dict:
    """What the warm-up's demonstrations depend on: the task config, and the contents of a file task's files.

    The prompt-rendering keys enter only when set away from their defaults, so the keys of warm-ups
    cached before they existed still match.
    """
    d = asdict(r.task)
    for k, default in (("system_prompt", None), ("chat_template", "auto")):
        if d.get(k) == default:
            d.pop(k)
    d.update(warmup_digest(r))  # what an active family's demonstrations depend on (the env's expert episodes)
    if r.task.name == "file":
        d["files"] = {k: file_digest(Path(v)) for k, v in sorted(r.task.kwargs.items())
                      if k in ("train", "eval") and v and Path(v).is_file()}
    elif r.task.name.startswith("hf:") and Path(r.task.name[3:]).is_dir():  # a local data set folder
        root = Path(r.task.name[3:])
        d["files"] = {str(p.relative_to(root)): file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()}
    return d


def cpu_identity(cpuinfo: str | Path = "/proc/cpuinfo") -> dict:
    """The CPU's vendor and its widest vector instruction set, as the hardware reports them (not as torch is told
    to dispatch): MKL picks its GEMM code path from these whatever ATEN_CPU_CAPABILITY says, so an Intel host
    running torch's AVX2 kernels and an AMD AVX2 host train different warm-ups (measured, docs/reproductions.md
    "Warm-up determinism"). Where /proc/cpuinfo is absent, platform.processor() stands for the vendor."""
    vendor, flags = None, set()
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name == "vendor_id" and vendor is None:
                vendor = value.strip()
            elif name in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        import platform

        vendor = platform.processor() or None
    isa = next((i for i, f in (("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"), ("sse4_2", "sse4_2"))
                if f in flags), None)
    return {"vendor": vendor, "isa": isa}


# environment variables that steer MKL's and oneDNN's code paths; MKL_ENABLE_INSTRUCTIONS=AVX2 on an AVX-512 host
# gives other warm-up weights (measured), so a variable of this list set on a run is part of the warm-up's key
KERNEL_ENV = ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def kernel_fingerprint() -> dict:
    """What of the host changes a warm-up's bits: the instruction set torch's CPU kernels dispatch to (AVX-512,
    AVX2, ...; ATEN_CPU_CAPABILITY pins it), MKL's GEMM code path when pinned (MKL_CBWR, and the variables of
    KERNEL_ENV), and the CPU's vendor and widest instruction set (:func:`cpu_identity`), from which MKL picks
    that path otherwise. Measured in docs/reproductions.md ("Warm-up determinism"): the thread count and the
    data order change nothing."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR"),
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}, "cpu": cpu_identity()}


def sft_digest(r: Recipe) -> dict:
    """The `sft` settings as the warm-up's key hashes them: micro_batch_tokens and mask_observations only when on, so
    the keys of warm-ups cached before they existed still match (micro-batches sum the gradient in another order:
    other bits)."""
    d = asdict(r.sft)
    for k in ("micro_batch_tokens", "mask_observations"):  # off: out of the key, as before they existed
        if not d[k]:
            d.pop(k)
    return d


def sft_cache_key(r: Recipe, base_path: str) -> str:
    """Key of the warm-up of the model at `base_path` (a folder, a hub id, or 'tiny') under recipe `r`.

    It hashes the model's contents (:func:`model_digest`), the data (:func:`data_digest`), the `sft`
    settings, the warm-up seed and the CPU kernels (:func:`kernel_fingerprint`: a cache shared by hosts
    with other instruction sets keeps one warm-up per kernel set, each bitwise what that host trains);
    the path itself is not part of it. A hub id not yet downloaded is keyed by its name.
    """
    folder = _model_folder(r, base_path)
    model = model_digest(folder) if folder is not None else {"hub_id": base_path}
    # version 3: warm-ups cached before the char tokenizer was loaded as itself had trained without spaces and
    # newlines (AutoTokenizer rebuilt it as a byte-level BPE), and kept that tokenizer; they must not be reused
    payload = {"model": model, "data": data_digest(r), "sft": sft_digest(r), "seed": sft_seed(r), "version": 3,
               "kernels": kernel_fingerprint()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tiny_model_stand_in_key(r: Recipe) -> str:
    """The warm-up key of a recipe on the built-in tiny model, without building it (a dry run writes nothing).

    Once the model is built this is the trainer's key; before, the tiny config stands in for the model's
    contents, which groups runs the same way (one config, one model) but is not the trainer's key.
    """
    from credo.models import tiny_model_dir

    if (tiny_model_dir(r.model.tiny) / "COMPLETE").exists():
        return sft_cache_key(r, r.model.path)
    payload = {"model": {"tiny": asdict(r.model.tiny)}, "data": data_digest(r), "sft": sft_digest(r), "seed": sft_seed(r),
               "kernels": kernel_fingerprint()}
    return "tiny-unbuilt-" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def encode_pair(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + EOS, and the loss mask (answer and EOS only)."""
    return encode_parts(tokenizer, prompt, [(answer, True)])


def encode_parts(tokenizer, prompt: str, parts: list[tuple[str, bool]], suffix: str = "") -> tuple[list[int], list[int]]:
    """:func:`encode_pair` with the answer in pieces, each (text, trained): a piece is tokenized on its own, as the
    multi-turn source tokenizes each turn and observation, and gets loss mask 1 if trained, else 0; EOS (mask 1) and
    `suffix` (appended to the last piece) as there."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    for k, (text, trained) in enumerate(parts):
        piece = tokenizer(text + (suffix if k == len(parts) - 1 else ""), add_special_tokens=False)["input_ids"]
        ids, mask = ids + piece, mask + [int(trained)] * len(piece)
    return ids + [tokenizer.eos_token_id], mask + [1]


def demonstration_ids(r: Recipe, tokenizer, prompt: str, problem, noisy: bool) -> tuple[list[int], list[int]]:
    """One warm-up demonstration's token ids and loss mask: the whole answer (encode_pair), or with
    `sft.mask_observations` only the pieces of `problem.meta['answer_parts']` that are the model's own."""
    suffix = "." if noisy else ""  # noisy demonstrations stand in for imperfect SFT data: right answer, wrong format
    if not r.sft.mask_observations:
        return encode_pair(tokenizer, prompt, problem.answer + suffix)
    parts = problem.meta.get("answer_parts")
    if parts is None:
        raise ConfigError(f"config key 'sft.mask_observations' is on, but the task '{r.task.name}' gives its "
                          "demonstrations as one answer, with no observations to mask (only a multi-turn env's "
                          "expert episodes have them): expected sft.mask_observations: false")
    return encode_parts(tokenizer, prompt, parts, suffix)


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices of a warm-up batch in the passes that train it. max_tokens 0: one pass, in batch order. Else
    the rows longest first, cut whenever the next row would take the pass past max_tokens padded tokens (rows x
    the pass's longest row; a row longer than max_tokens goes alone), so a short row is padded only to rows of
    about its own length."""
    if max_tokens <= 0:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def padded_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """input_ids [B, L] right-padded with pad_id, loss mask [B, L] (float), attention mask [B, L], L the longest."""
    width = max(len(ids) for ids, _ in pairs)
    ids = torch.full((len(pairs), width), pad_id)
    mask = torch.zeros(len(pairs), width)
    attn = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (x, m) in enumerate(pairs):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
        attn[i, : len(x)] = 1
    return ids, mask, attn


def backward_batch(model, pairs: list[tuple[list[int], list[int]]], max_tokens: int, pad_id: int):
    """Accumulate into model's .grad the gradient of the batch's loss: the NLL of its answer tokens, averaged over
    them. Run in the passes of :func:`micro_batches`; returns (the loss, detached; each pass's (rows, width))."""
    groups = micro_batches([len(ids) for ids, _ in pairs], max_tokens)
    # each pass's token sum over the batch's count of answer tokens; one pass divides by its own mask sum, the
    # expression the warm-ups cached before micro-batches existed were trained with (the same bits)
    total = float(sum(sum(m[1:]) for _, m in pairs))
    loss, passes = 0.0, []
    for rows in groups:
        ids, mask, attn = padded_batch([pairs[i] for i in rows], pad_id)
        passes.append(tuple(ids.shape))
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        part = (nll * mask[:, 1:]).sum() / (mask[:, 1:].sum() if len(groups) == 1 else total)
        part.backward()
        loss = loss + part.detach()
    return loss, passes


def run_sft(r: Recipe, base_path: str, task, *, log=print) -> tuple[str, str]:
    """Warm up (or reuse the cache); return (policy directory, cache key)."""
    key = sft_cache_key(r, base_path)
    out = cache_root() / "sft" / key
    if (out / "COMPLETE").exists():
        log(f"sft: reusing cached warm-up {out}")
        return str(out), key
    tok = load_tokenizer(base_path)
    model = load_causal_lm(base_path)
    check_vocab(model, tok, base_path)
    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)  # as the rollout renders prompts
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=r.sft.lr, weight_decay=0.0)
    steps = r.sft.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(steps, 1))))
    gen = torch.Generator().manual_seed(sft_seed(r) + 17)
    from credo.warmup_estimate import flops_per_step, model_shape  # `credo check`'s estimate learns from this run

    shape, flops = model_shape(r, base_path), 0.0
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(0, len(task), (r.sft.batch_size,), generator=gen).tolist()
        noisy = (torch.rand(len(idx), generator=gen) < r.sft.noisy_frac).tolist()
        problems = [task.train(r.sft.data_offset + i) for i in idx]
        pairs = [demonstration_ids(r, tok, render(p), p, bad) for p, bad in zip(problems, noisy)]
        opt.zero_grad(set_to_none=True)
        loss, passes = backward_batch(model, pairs, r.sft.micro_batch_tokens, tok.pad_token_id)
        flops += sum(flops_per_step(shape, *p) for p in passes)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"sft: step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - t0:.1f}s)")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    # what made these exact bits: the same recipe warms up bitwise alike only under the same CPU kernels
    # (docs/reproductions.md, "Warm-up determinism"); the results of a sweep carry the weights' digest
    made_by = {**kernel_fingerprint(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    (tmp / "sft.json").write_text(json.dumps({"key": key, "steps": steps, "final_loss": loss.item() if steps else None,
                                              "made_by": made_by, "seconds": time.time() - t0, "flops": flops}))
    (tmp / "COMPLETE").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out), key
