"""Peak memory and forward+backward time of token log-probs (and entropy) from hidden states.

Compares the naive path, ``log_softmax(hidden @ weight.T / T).gather(labels)`` (entropy as verl's
``logsumexp(z) - sum(softmax(z) * z)``), with `credo.algos.logprobs.logprobs_from_hidden`, on fp32
CPU tensors, hidden size 896 (Qwen2.5-0.5B), vocabularies 32,000 and 151,936.

How memory is measured (CPU): every (method, V, N) case runs in a fresh Python subprocess so that
one case's allocations cannot inflate another's. The subprocess allocates the inputs (hidden,
weight, labels, the upstream gradients), then resets the kernel's peak-RSS counter by writing "5"
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
    nice -n 10 .venv/bin/python benchmarks/logprob_memory.py [--chunk-size 256] [--repeats 2]
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
    else:
        from credo.algos.logprobs import logprobs_from_hidden

        out = logprobs_from_hidden(
            hidden, weight, labels, temperature=TEMPERATURE, chunk_size=chunk_size, with_entropy=with_entropy
        )
        outputs, grads = (list(out), [grad_logp, grad_entropy]) if with_entropy else ([out], [grad_logp])
    return torch.autograd.grad(outputs, (hidden, weight), grads)


def _worker(args):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hidden = torch.randn(args.n, HIDDEN, requires_grad=True)
    weight = (torch.randn(args.vocab, HIDDEN) * HIDDEN**-0.5).requires_grad_(True)
    labels = torch.randint(0, args.vocab, (args.n,))
    grad_logp, grad_entropy = torch.randn(args.n), torch.randn(args.n)
    step_args = (args.method, hidden, weight, labels, grad_logp, grad_entropy, args.entropy, args.chunk_size)

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


def _run_case(method, vocab, n, entropy, args):
    cmd = [
        sys.executable, __file__, "--worker", "--method", method, "--vocab", str(vocab), "--n", str(n),
        "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats), "--threads", str(args.threads),
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
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--ns", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--variants", nargs="+", default=["logp", "logp+entropy"], choices=["logp", "logp+entropy"])
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="timed steps after the warm-up step")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return

    print(f"hidden={HIDDEN} fp32 CPU, torch threads={args.threads}, chunk_size={args.chunk_size}, T={TEMPERATURE}")
    header = "| V | N | outputs | naive peak MiB | chunked peak MiB | memory ratio | naive s | chunked s | time ratio |"
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for vocab in args.vocabs:
        for n in args.ns:
            for variant in args.variants:
                entropy = variant == "logp+entropy"
                naive = _run_case("naive", vocab, n, entropy, args)
                chunked = _run_case("chunked", vocab, n, entropy, args)
                print(
                    f"| {vocab} | {n} | {variant} | {naive['peak_mib']:.0f} | {chunked['peak_mib']:.0f} | "
                    f"{chunked['peak_mib'] / naive['peak_mib']:.3f} | {naive['seconds']:.2f} | "
                    f"{chunked['seconds']:.2f} | {chunked['seconds'] / naive['seconds']:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
