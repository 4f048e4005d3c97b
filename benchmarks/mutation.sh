#!/usr/bin/env bash
# Mutation testing with mutmut 3 (`pip install -e '.[mutation]'`; config: [tool.mutmut] in pyproject.toml).
# Not part of CI: a full run of every package takes hours on 2 CPU cores.
#
#   benchmarks/mutation.sh [MUTANT_GLOB ...]
#
# MUTANT_GLOB selects mutants by module, e.g. 'credo.algos.aggregation.*' or 'credo.train.*'; default:
# the packages of docs/reliability.md ('credo.algos.*' 'credo.credit.*' 'credo.train.*' 'credo.trainer.*'
# 'credo.checkpoint.*' 'credo.distributed.engine.*'). Mutants run against the fast tests plus the
# train-step invariant tests (`-m "not vllm and (not slow or invariants)"`).
#
# It works on a scratch copy of the tracked and untracked (not ignored) files, so the repository gets
# no `mutants/` folder: MUTATION_DIR (default /tmp/credo-mutation; kept between runs, so results and
# mutmut's test-coverage map are reused; delete it after changing tests). MUTATION_JOBS: parallel
# mutants (default 1). MUTATION_RESUME=1 runs only the mutants without a result in MUTATION_DIR (an
# interrupted run goes on where it stopped). MUTATION_SAMPLE=N runs a seeded (MUTATION_SEED, default 0)
# uniform sample of N of the globs' mutants without a result: the whole set is hours, a sample of a few
# hundred estimates the kill rate to a few points. At the end it prints killed/total per module and per
# package, with a 95% Wilson interval of the rate, and writes them to $MUTATION_DIR/summary.tsv.
#
# A fast loop for one module, while writing its tests: MUTATION_ONLY (space-separated paths, e.g.
# "credo/train/build.py") limits the mutated files and MUTATION_TESTS (pytest arguments, e.g.
# "tests/spine/test_build_parts.py") the tests, in the scratch copy's pyproject only. Use a MUTATION_DIR of
# its own: the result is a lower bound of the module's rate (other tests may kill more), in minutes not hours.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-/tmp/credo-mutation}
jobs=${MUTATION_JOBS:-1}
py=${PYTHON:-python}
if [ $# -eq 0 ]; then
    set -- 'credo.algos.*' 'credo.credit.*' 'credo.train.*' 'credo.trainer.*' 'credo.checkpoint.*' 'credo.distributed.engine.*'
fi
mkdir -p "$work"
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work"
cd "$work"
if [ -n "${MUTATION_ONLY:-}${MUTATION_TESTS:-}" ]; then
    "$py" - <<'PY'
import json, os, re
text = open("pyproject.toml").read()
if os.environ.get("MUTATION_ONLY"):
    files = json.dumps(os.environ["MUTATION_ONLY"].split())
    text = re.sub(r"^only_mutate = \[.*?\]", "only_mutate = " + files, text, count=1, flags=re.M | re.S)
if os.environ.get("MUTATION_TESTS"):
    tests = json.dumps(os.environ["MUTATION_TESTS"].split() + ["-m", "not vllm and (not slow or invariants)"])
    text = re.sub(r"^pytest_add_cli_args_test_selection = \[.*?\]", "pytest_add_cli_args_test_selection = " + tests,
                  text, count=1, flags=re.M | re.S)
open("pyproject.toml", "w").write(text)
PY
fi
unset PYTHONPATH  # mutmut puts mutants/ first on the path; the original credo must not be importable
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$repo/.cache/torch_extensions} CREDO_CACHE=${CREDO_CACHE:-$repo/.cache/credo}
list_unchecked() {  # the mutants of the globs "$@" without a result, one name a line
    "$py" -m mutmut results --all true 2>/dev/null | "$py" -c '
import fnmatch, sys
globs = sys.argv[1:]
for line in sys.stdin:
    if line.strip().endswith(": not checked"):
        name = line.strip().rsplit(":", 1)[0]
        if any(fnmatch.fnmatch(name, g) for g in globs):
            print(name)' "$@"
}
if [ -n "${MUTATION_SAMPLE:-}" ]; then
    # a seeded uniform sample of MUTATION_SAMPLE mutants from those of the globs: the first call
    # generates every mutant and maps tests to them (a glob that names no mutant runs none)
    [ -d mutants ] || "$py" -m mutmut run --max-children "$jobs" 'credo.no_such_module.*' || true
    mapfile -t todo < <(list_unchecked "$@" | "$py" -c '
import random, sys
names = sorted(line.strip() for line in sys.stdin if line.strip())
k = min(int(sys.argv[1]), len(names))
print(f"sampling {k} of {len(names)} unchecked mutants (seed {sys.argv[2]})", file=sys.stderr)
print("\n".join(sorted(random.Random(int(sys.argv[2])).sample(names, k))))' "$MUTATION_SAMPLE" "${MUTATION_SEED:-0}" | grep .)
    printf '%s\n' "${todo[@]}" > sample.txt
    [ ${#todo[@]} -eq 0 ] || "$py" -m mutmut run --max-children "$jobs" "${todo[@]}" || true
elif [ "${MUTATION_RESUME:-0}" = 1 ] && [ -d mutants ]; then
    # run only the mutants of these globs that have no result yet (mutmut reruns every named mutant)
    mapfile -t todo < <(list_unchecked "$@")
    echo "resuming: ${#todo[@]} mutants without a result"
    [ ${#todo[@]} -eq 0 ] || "$py" -m mutmut run --max-children "$jobs" "${todo[@]}" || true
else
    "$py" -m mutmut run --max-children "$jobs" "$@" || true
fi
"$py" -m mutmut results --all true > results.txt || true
"$py" - "$@" <<'PY'
import fnmatch, re, sys
from collections import Counter, defaultdict
counts = defaultdict(Counter)
for line in open("results.txt"):
    if "__mutmut_" not in line or ":" not in line:
        continue
    name, status = (x.strip() for x in line.rsplit(":", 1))
    if status == "not checked" or not any(fnmatch.fnmatch(name, g) for g in sys.argv[1:]):
        continue
    module = re.sub(r"\.x[ǁ_][^.]*$", "", name.split("__mutmut_")[0])
    counts[module][status] += 1
def wilson(k, n, z=1.959964):
    # 95% Wilson score interval of a kill rate k/n: a sampled run estimates the rate of all mutants
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    mid, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)

def row(m, c):
    killed = c["killed"] + c["timeout"] + c["segfault"] + c["caught by type check"]
    total = sum(c.values())
    other = total - killed - c["survived"] - c["no tests"]
    lo, hi = wilson(killed, total)
    if total == 0:
        return f"{m}\t0\t0\t0\t0\t0\t-\t-"
    return f"{m}\t{killed}\t{c['survived']}\t{c['no tests']}\t{other}\t{total}\t{killed / total:.1%}\t[{lo:.1%}, {hi:.1%}]"

packages = defaultdict(Counter)  # credo.algos, credo.credit, credo.train, credo.trainer, ...
for m, c in counts.items():
    packages[".".join(m.split(".")[:2])].update(c)
with open("summary.tsv", "w") as f:
    header = "module\tkilled\tsurvived\tno_tests\tother\tchecked\tkill_rate\twilson_95ci"
    for line in [header] + [row(m, counts[m]) for m in sorted(counts)] + [""] + [
            row(p + " (package)", packages[p]) for p in sorted(packages)] + [row("all", sum(counts.values(), Counter()))]:
        print(line)
        print(line, file=f)
PY
