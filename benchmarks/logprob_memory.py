"""Peak memory and forward+backward time of token log-probs (and entropy) from hidden states.

Compares the naive path, ``log_softmax(hidden @ weight.T / T).gather(labels)`` (entropy as verl's
``logsumexp(z) - sum(softmax(z) * z)``), with `credo.algos.logprobs.logprobs_from_hidden`
("chunked": forward keeps per-row statistics, backward recomputes the chunk logits) and
`fused_policy_loss_from_hidden` ("fused": gradient formed in the forward chunk pass), on fp32 CPU
tensors, hidden size 896 (Qwen2.5-0.5B), vocabularies 32,000 and 151,936. Every method computes
d_hidden and d_weight of L = sum(g1 * log_probs) (+ sum(g2 * entropy)) for fixed random g1, g2.

How memory is measured (CPU): every (method, V, N) case runs in a fresh Python subprocess so that
one case's allocations cannot inflate another's. The subprocess allocates the inputs (hidden,
weight, labels, the upstream gradients) and runs the method once on tiny inputs (imports, autograd
engine and BLAS start-up), then resets the kernel's peak-RSS counter by writing "5"
to /proc/self/clear_refs (Linux >= 4.0; this sets VmHWM to the current RSS) and records the current
RSS as the baseline. After one forward+backward (which returns d_hidden and d_weight), the peak is
VmHWM from /proc/self/status and the reported number is VmHWM - baseline: the physical memory the
step needed on top of its inputs, gradients included, whatever allocator or library made it (torch's
CPU allocator has no peak statistics, and ru_maxrss cannot be reset, so a transient high-water mark
from start-up would hide the step's own peak). Torch's CPU allocator returns large blocks to the OS
on free, so RSS follows live tensors closely.

Time: after that first (warm-up) step, `--repeats` further forward+backward steps are timed with
time.perf_counter and the minimum is reported (the machine is shared; the minimum is the least
disturbed measurement). Ratios compare the two methods measured in the same run.

Usage:
    nice -n 10 .venv/bin/python benchmarks/logprob_memory.py [--chunk-sizes 256 1024] [--repeats 2]
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


def _worker(args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hidden = torch.randn(args.n, HIDDEN, requires_grad=True)
    weight = (torch.randn(args.vocab, HIDDEN) * HIDDEN**-0.5).requires_grad_(True)
    labels = torch.randint(0, args.vocab, (args.n,))
    grad_logp, grad_entropy = torch.randn(args.n), torch.randn(args.n)
    step_args = (args.method, hidden, weight, labels, grad_logp, grad_entropy, args.entropy, args.chunk_size)
    # Imports, autograd-engine and BLAS start-up happen here, outside the measured step.
    tiny = (hidden[:4].detach().requires_grad_(), weight[:64].detach().requires_grad_(), labels[:4] % 64)
    _step(args.method, *tiny, grad_logp[:4], grad_entropy[:4], args.entropy, 2)
    del tiny

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    baseline = _rss_kib("VmRSS")
    start = time.perf_counter()
    grads = _step(*step_args)
    first = time.perf_counter() - start
    del grads
    peak = _rss_kib("VmHWM") - baseline

    times = [first]
    for _ in range(args.repeats):
        start = time.perf_counter()
        grads = _step(*step_args)
        times.append(time.perf_counter() - start)
        del grads
    timed = times[1:] or times
    print(json.dumps({"peak_mib": peak / 1024, "seconds": min(timed), "first_seconds": first}))


def _run_case(method, vocab, n, entropy, chunk_size, args):
    cmd = [
        sys.executable, __file__, "--worker", "--method", method, "--vocab", str(vocab), "--n", str(n),
        "--chunk-size", str(chunk_size), "--repeats", str(args.repeats), "--threads", str(args.threads),
    ]  # fmt: skip
    if entropy:
        cmd.append("--entropy")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="naive", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=32000, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--entropy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk-size", type=int, default=1024, help=argparse.SUPPRESS)
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--ns", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--variants", nargs="+", default=["logp", "logp+entropy"], choices=["logp", "logp+entropy"])
    parser.add_argument("--methods", nargs="+", default=["chunked", "fused"], choices=["chunked", "fused"])
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeats", type=int, default=2, help="timed steps after the warm-up step")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return

    print(f"hidden={HIDDEN}, fp32 CPU, torch threads={args.threads}, T={TEMPERATURE}, "
          f"time = min over {args.repeats} timed steps after a warm-up step")  # fmt: skip
    header = "| V | N | outputs | method | chunk | peak MiB | memory vs naive | fwd+bwd s | time vs naive |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for vocab in args.vocabs:
        for n in args.ns:
            for variant in args.variants:
                entropy = variant == "logp+entropy"
                naive = _run_case("naive", vocab, n, entropy, 0, args)
                print(f"| {vocab} | {n} | {variant} | naive | - | {naive['peak_mib']:.0f} | 1 | "
                      f"{naive['seconds']:.2f} | 1 |", flush=True)  # fmt: skip
                for method in args.methods:
                    for chunk_size in args.chunk_sizes:
                        r = _run_case(method, vocab, n, entropy, chunk_size, args)
                        print(
                            f"| {vocab} | {n} | {variant} | {method} | {chunk_size} | {r['peak_mib']:.0f} | "
                            f"{r['peak_mib'] / naive['peak_mib']:.3f} | {r['seconds']:.2f} | "
                            f"{r['seconds'] / naive['seconds']:.3f} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
