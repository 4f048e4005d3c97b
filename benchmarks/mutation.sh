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
# interrupted run goes on where it stopped). At the end it prints killed/total per module and writes them to
# $MUTATION_DIR/summary.tsv.
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
unset PYTHONPATH  # mutmut puts mutants/ first on the path; the original credo must not be importable
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$repo/.cache/torch_extensions} CREDO_CACHE=${CREDO_CACHE:-$repo/.cache/credo}
if [ "${MUTATION_RESUME:-0}" = 1 ] && [ -d mutants ]; then
    # run only the mutants of these globs that have no result yet (mutmut reruns every named mutant)
    mapfile -t todo < <("$py" -m mutmut results --all true 2>/dev/null | "$py" -c '
import fnmatch, sys
globs = sys.argv[1:]
for line in sys.stdin:
    if line.strip().endswith(": not checked"):
        name = line.strip().rsplit(":", 1)[0]
        if any(fnmatch.fnmatch(name, g) for g in globs):
            print(name)' "$@")
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
with open("summary.tsv", "w") as f:
    header = "module\tkilled\tsurvived\tno_tests\tother\tchecked\tkill_rate"
    print(header)
    print(header, file=f)
    for m in sorted(counts):
        c = counts[m]
        killed = c["killed"] + c["timeout"] + c["segfault"] + c["caught by type check"]
        total = sum(c.values())
        other = total - killed - c["survived"] - c["no tests"]
        line = f"{m}\t{killed}\t{c['survived']}\t{c['no tests']}\t{other}\t{total}\t{killed / total:.1%}"
        print(line)
        print(line, file=f)
PY
