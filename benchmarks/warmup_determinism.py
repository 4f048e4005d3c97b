"""Which host settings change the SFT warm-up bit for bit (issue 33, docs/reproductions.md "Warm-up determinism").

A second host cannot be reached from here, so what differs between hosts is varied on this one, each setting in a
fresh interpreter with its own cache (the tiny model is rebuilt too):

    python benchmarks/warmup_determinism.py matrix [--steps 20]   # digests of the initial and warmed-up weights
    python benchmarks/warmup_determinism.py ops                   # the first module output that differs, per setting
    python benchmarks/warmup_determinism.py matrix --steps 280 --pins   # the full warm-up under the pins tried
                                                                        # against another host's (2026-12-06)

`matrix` prints, per setting (thread count; ATEN_CPU_CAPABILITY, the instruction set torch's kernels use; MKL's
code path MKL_CBWR; oneDNN's ISA), the sha256 prefixes of the built tiny model and of the warm-up of
recipes/testbed/add_scratch2.yaml after --steps steps, and the final loss. `ops` runs one warm-up batch (forward,
loss, backward, clip, AdamW step) from one fixed initial model under each setting and names the first module
whose output differs from the default's, and whether the data order, loss, gradients and weights do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "testbed" / "add_scratch2.yaml"
SETTINGS = [  # (threads, environment)
    (1, {}), (1, {}), (2, {}), (4, {}), (8, {}), (16, {}),
    (1, {"ATEN_CPU_CAPABILITY": "avx2"}), (2, {"ATEN_CPU_CAPABILITY": "avx2"}), (1, {"ATEN_CPU_CAPABILITY": "default"}),
    (1, {"MKL_CBWR": "COMPATIBLE"}), (1, {"MKL_CBWR": "AVX"}), (1, {"MKL_CBWR": "AVX2"}), (1, {"MKL_CBWR": "AVX512"}),
    (1, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}), (1, {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}),
]
# the pins tried on an Intel AVX-512 host to reproduce an AMD AVX2 host's warm-up (docs/reproductions.md, "Two real hosts")
PIN_SETTINGS = [(1, {}), (1, {"ATEN_CPU_CAPABILITY": "avx2"}), (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_DEBUG_CPU_TYPE": "5"}),
                (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
                (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}),
                (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                     "ONEDNN_MAX_CPU_ISA": "AVX2"}),
                (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX"}), (1, {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"})]
OPS_SETTINGS = [{"ATEN_CPU_CAPABILITY": "avx2"}, {"MKL_CBWR": "COMPATIBLE"}, {"MKL_CBWR": "AVX512"}, {"OMP_NUM_THREADS": "8"}]


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def _child_warmup(threads: int, steps: int) -> None:
    import torch
    from safetensors.torch import load_file

    from credo.ablate.results import _warmup_sha256
    from credo.config import load_recipe
    from credo.models import resolve_model_path
    from credo.tasks import make_task
    from credo.sft import run_sft

    torch.set_num_threads(threads)
    r = load_recipe(RECIPE, [f"sft.steps={steps}"])
    base = resolve_model_path(r.model.path, r.model.tiny)
    out, _ = run_sft(r, base, make_task(r.task), log=lambda m: None)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                      "init": _digest(load_file(os.path.join(base, "model.safetensors"))),
                      "warmup": _digest(load_file(os.path.join(out, "model.safetensors"))),
                      "key": Path(out).name, "file": _warmup_sha256(Path(out).name)[:12],  # as a results line has them
                      "loss": json.loads(Path(out, "sft.json").read_text())["final_loss"]}))


def _child_ops(model_dir: str, out: str) -> None:
    """One warm-up batch from the model at model_dir; every module output, loss, grads and new weights to out."""
    import torch

    from credo.config import load_recipe
    from credo.models import load_causal_lm, load_tokenizer
    from credo.rewards.chat import prompt_renderer
    from credo.tasks import make_task
    from credo.sft import encode_pair

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    r = load_recipe(RECIPE)
    task = make_task(r.task)
    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    render = prompt_renderer(tok, r.task.system_prompt, r.task.chat_template)
    idx = torch.randint(0, len(task), (r.sft.batch_size,), generator=torch.Generator().manual_seed(17)).tolist()
    pairs = [encode_pair(tok, render(task.train(i)), task.train(i).answer) for i in idx]
    width = max(len(x) for x, _ in pairs)
    ids = torch.full((len(pairs), width), tok.pad_token_id)
    mask, attn = torch.zeros(len(pairs), width), torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (x, m) in enumerate(pairs):
        ids[i, :len(x)], mask[i, :len(m)], attn[i, :len(x)] = torch.tensor(x), torch.tensor(m, dtype=torch.float), 1
    acts = {}

    def keep(name):
        def hook(mod, args, output):
            output = output[0] if isinstance(output, tuple) else output
            if isinstance(output, torch.Tensor):
                acts[name] = output.detach().clone()
        return hook

    for name, mod in model.named_modules():
        if name:
            mod.register_forward_hook(keep(name))
    opt = torch.optim.AdamW(model.parameters(), lr=r.sft.lr, weight_decay=0.0)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    torch.save({"ids": ids, "acts": acts, "loss": loss.detach(), "grads": grads,
                "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}, out)


def _run_child(args: list[str], env: dict, cache: str) -> str:
    full = {**os.environ, **env, "CREDO_CACHE": cache, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, __file__, *args], env=full, capture_output=True, text=True, check=True)
    return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""


def matrix(steps: int, settings: list) -> None:
    print(f"| threads | environment | capability | initial model | warm-up ({steps} steps) | final loss "
          "| cache key | warmup_sha256 |")
    print("|---|---|---|---|---|---|---|---|")
    for threads, env in settings:
        with tempfile.TemporaryDirectory() as cache:
            row = json.loads(_run_child(["_warmup", str(threads), str(steps)], env, cache))
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "(host default)"
        print(f"| {threads} | {shown} | {row['capability']} | {row['init']} | {row['warmup']} | {row['loss']!r} "
              f"| {row['key']} | {row['file']} |", flush=True)


def ops() -> None:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _run_child(["_build"], {}, tmp)
        _run_child(["_ops", model_dir, f"{tmp}/ref.pt"], {}, tmp)
        ref = torch.load(f"{tmp}/ref.pt", weights_only=False)
        for env in OPS_SETTINGS:
            _run_child(["_ops", model_dir, f"{tmp}/x.pt"], env, tmp)
            o = torch.load(f"{tmp}/x.pt", weights_only=False)
            first = next((n for n in ref["acts"] if not torch.equal(o["acts"][n], ref["acts"][n])), None)
            gap = (o["acts"][first] - ref["acts"][first]).abs().max().item() if first else 0.0
            grads = sum(not torch.equal(o["grads"][n], ref["grads"][n]) for n in ref["grads"])
            weights = sum(not torch.equal(o["weights"][n], ref["weights"][n]) for n in ref["weights"])
            print(f"{env}: data {'same' if torch.equal(o['ids'], ref['ids']) else 'DIFFERS'}; first differing output: "
                  f"{first or 'none'} (max |diff| {gap:.2g}); loss {'same' if torch.equal(o['loss'], ref['loss']) else 'differs'}; "
                  f"{grads}/{len(ref['grads'])} gradients and {weights}/{len(ref['weights'])} updated weights differ")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):  # a child
        cmd, rest = sys.argv[1], sys.argv[2:]
        if cmd == "_warmup":
            _child_warmup(int(rest[0]), int(rest[1]))
        elif cmd == "_build":
            from credo.config import load_recipe
            from credo.models import resolve_model_path

            r = load_recipe(RECIPE)
            print(resolve_model_path(r.model.path, r.model.tiny))
        else:
            _child_ops(rest[0], rest[1])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["matrix", "ops"], help="matrix: digests per setting; ops: the first op that differs")
    p.add_argument("--steps", type=int, default=20, help="warm-up steps in matrix (default 20)")
    p.add_argument("--pins", action="store_true", help="matrix over the cross-host pins (PIN_SETTINGS) instead")
    args = p.parse_args()
    matrix(args.steps, PIN_SETTINGS if args.pins else SETTINGS) if args.what == "matrix" else ops()


if __name__ == "__main__":
    main()
