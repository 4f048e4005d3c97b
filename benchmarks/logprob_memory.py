"""Peak memory and forward+backward time of token log-probs (and entropy) from hidden states.

Compares the naive path, ``log_softmax(hidden @ weight.T / T).gather(labels)`` (entropy as verl's
``logsumexp(z) - sum(softmax(z) * z)``), with `credo.algos.logprobs.logprobs_from_hidden`
("chunked": forward keeps per-row statistics, backward recomputes the chunk logits) and
`fused_policy_loss_from_hidden` ("fused": gradient formed in the forward chunk pass), on fp32 CPU
tensors, hidden size 896 (Qwen2.5-0.5B), vocabularies 32,000 and 151,936. Every method computes
d_hidden and d_weight of L = sum(g1 * log_probs) (+ sum(g2 * entropy)) for fixed random g1, g2.

How memory is measured (CPU): every (method, chunk size, V, N) case runs in a fresh Python
subprocess so that one case's allocations cannot inflate another's. The subprocess allocates the
inputs (hidden, weight, labels, the upstream gradients) and runs the method once on tiny inputs
(imports, autograd engine and BLAS start-up), then resets the kernel's peak-RSS counter by writing
"5" to /proc/self/clear_refs (Linux >= 4.0; this sets VmHWM to the current RSS) and records the
current RSS as the baseline. After one forward+backward (which returns d_hidden and d_weight), the
peak is VmHWM from /proc/self/status and the reported number is VmHWM - baseline: the physical
memory the step needed on top of its inputs, gradients included, whatever allocator or library
made it. (Torch's CPU allocator keeps no peak statistics, and ru_maxrss cannot be reset, so a
high-water mark left by start-up could hide the step's own peak.) Torch's CPU allocator returns
large blocks to the OS on free, so RSS follows live tensors closely.

How time is measured: for each (V, N, outputs) one subprocess allocates the inputs once and runs
`--rounds` rounds; each round times one forward+backward of every method (naive included), in an
order rotated from round to round, and the minimum per method is kept. Interleaving matters on a
shared machine: load from other processes then falls on all methods alike, and the ratios (to the
naive path, measured in the same subprocess) are what to read. Wall-clock time is the target;
the process CPU time ratio is printed beside it as a check that is less sensitive to other load.

Usage:
    nice -n 10 .venv/bin/python benchmarks/logprob_memory.py [--chunk-sizes 512 1024] [--rounds 3]
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

HIDDEN = 896
TEMPERATURE = 0.9


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _step(method, hidden, weight, labels, grad_logp, grad_entropy, with_entropy, chunk_size):
    """One forward+backward of L = sum(grad_logp * log_probs) (+ sum(grad_entropy * entropy))."""
    import torch

    if method == "naive":
        z = hidden @ weight.t() / TEMPERATURE
        logp = torch.log_softmax(z, dim=-1).gather(-1, labels[:, None]).squeeze(-1)
        outputs, grads = [logp], [grad_logp]
        if with_entropy:
            p = torch.softmax(z, dim=-1)
            entropy = torch.logsumexp(z, dim=-1) - (p * z).sum(-1)
            outputs.append(entropy)
            grads.append(grad_entropy)
        return torch.autograd.grad(outputs, (hidden, weight), grads)
    from credo.algos.logprobs import fused_policy_loss_from_hidden, logprobs_from_hidden

    if method == "chunked":
        out = logprobs_from_hidden(
            hidden, weight, labels, temperature=TEMPERATURE, chunk_size=chunk_size, with_entropy=with_entropy
        )
        outputs, grads = (list(out), [grad_logp, grad_entropy]) if with_entropy else ([out], [grad_logp])
        return torch.autograd.grad(outputs, (hidden, weight), grads)

    def token_loss(log_probs, entropy, grad_logp, grad_entropy):
        return log_probs * grad_logp + (entropy * grad_entropy if entropy is not None else 0)

    loss, _, _ = fused_policy_loss_from_hidden(
        hidden, weight, labels, token_loss, token_inputs=(grad_logp, grad_entropy), temperature=TEMPERATURE,
        chunk_size=chunk_size, with_entropy=with_entropy,
    )  # fmt: skip
    return torch.autograd.grad(loss, (hidden, weight))


def _inputs(args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev, dtype = args.device, getattr(torch, args.dtype)
    hidden = torch.randn(args.n, HIDDEN, device=dev, dtype=dtype, requires_grad=True)
    weight = (torch.randn(args.vocab, HIDDEN, device=dev) * HIDDEN**-0.5).to(dtype).requires_grad_(True)
    labels = torch.randint(0, args.vocab, (args.n,), device=dev)
    grad_logp, grad_entropy = torch.randn(args.n, device=dev), torch.randn(args.n, device=dev)
    return hidden, weight, labels, grad_logp, grad_entropy


def _sync(args):
    if args.device == "cuda":
        import torch

        torch.cuda.synchronize()


def _warm_up(method, hidden, weight, labels, grad_logp, grad_entropy, with_entropy):
    """Imports, autograd-engine and BLAS start-up, on tiny inputs, outside anything measured."""
    tiny = (hidden[:4].detach().requires_grad_(), weight[:64].detach().requires_grad_(), labels[:4] % 64)
    _step(method, *tiny, grad_logp[:4], grad_entropy[:4], with_entropy, 2)


def _memory_worker(args):
    method, chunk_size = args.cases[0].split(":")
    inputs = _inputs(args)
    _warm_up(method, *inputs, args.entropy)
    if args.device == "cuda":  # peak allocated device memory above what the inputs hold
        import torch

        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        grads = _step(method, *inputs, args.entropy, int(chunk_size))
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - baseline) / 1024
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        baseline = _rss_kib("VmRSS")
        grads = _step(method, *inputs, args.entropy, int(chunk_size))
        peak = _rss_kib("VmHWM") - baseline
    del grads
    print(json.dumps({"peak_mib": peak / 1024}))


def _time_worker(args):
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases]
    inputs = _inputs(args)
    for method, _ in cases:
        _warm_up(method, *inputs, args.entropy)
    wall = {c: [] for c in cases}
    cpu = {c: [] for c in cases}
    for round_index in range(args.rounds):
        shift = round_index % len(cases)  # rotate the order so no case always follows the same one
        for case in cases[shift:] + cases[:shift]:
            _sync(args)
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            grads = _step(case[0], *inputs, args.entropy, case[1])
            _sync(args)
            wall[case].append(time.perf_counter() - wall_start)
            cpu[case].append(time.process_time() - cpu_start)
            del grads
    print(json.dumps({f"{m}:{c}": {"wall_s": min(wall[(m, c)]), "cpu_s": min(cpu[(m, c)])} for m, c in cases}))


def _run_worker(kind, cases, vocab, n, entropy, args):
    cmd = [
        sys.executable, __file__, "--worker", kind, "--cases", *cases, "--vocab", str(vocab), "--n", str(n),
        "--rounds", str(args.rounds), "--threads", str(args.threads), "--device", args.device, "--dtype", args.dtype,
    ]  # fmt: skip
    if entropy:
        cmd.append("--entropy")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["memory", "time"], help=argparse.SUPPRESS)
    parser.add_argument("--cases", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=32000, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--entropy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--ns", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--variants", nargs="+", default=["logp", "logp+entropy"], choices=["logp", "logp+entropy"])
    parser.add_argument("--methods", nargs="+", default=["chunked", "fused"], choices=["chunked", "fused"])
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[1024])
    parser.add_argument("--rounds", type=int, default=3, help="timed forward+backward steps per method")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: peak memory is torch.cuda.max_memory_allocated above the inputs")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="hidden and weight dtype")
    args = parser.parse_args()
    if args.worker == "memory":
        _memory_worker(args)
        return
    if args.worker == "time":
        _time_worker(args)
        return

    print(f"hidden={HIDDEN}, {args.dtype} {args.device}, torch threads={args.threads}, T={TEMPERATURE}; time = min over "
          f"{args.rounds} interleaved rounds (wall clock, and process CPU time)")  # fmt: skip
    header = (
        "| V | N | outputs | method | chunk | peak MiB | memory vs naive | fwd+bwd wall s | wall vs naive "
        "| CPU vs naive |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for vocab in args.vocabs:
        for n in args.ns:
            for variant in args.variants:
                entropy = variant == "logp+entropy"
                cases = ["naive:0"] + [f"{m}:{c}" for m in args.methods for c in args.chunk_sizes]
                memory = {case: _run_worker("memory", [case], vocab, n, entropy, args)["peak_mib"] for case in cases}
                times = _run_worker("time", cases, vocab, n, entropy, args)
                base_mem, base = memory["naive:0"], times["naive:0"]
                for case in cases:
                    method, chunk = case.split(":")
                    print(
                        f"| {vocab} | {n} | {variant} | {method} | {chunk if method != 'naive' else '-'} | "
                        f"{memory[case]:.0f} | {memory[case] / base_mem:.3f} | {times[case]['wall_s']:.2f} | "
                        f"{times[case]['wall_s'] / base['wall_s']:.3f} | {times[case]['cpu_s'] / base['cpu_s']:.3f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
