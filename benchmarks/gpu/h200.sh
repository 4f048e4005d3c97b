#!/usr/bin/env bash
# credo's first run on a GPU: one script for one lent H200, about 7 minutes (each stage under its own timeout,
# results written to $OUT as they come, so a later stage's failure loses nothing).
#   1. quickstart (recipes/quickstart.yaml: SFT warm-up + 100 GRPO steps, hf backend, DeepSpeed over NCCL)
#   2. a Qwen3-4B-shaped model (random init, bf16) through credo's trainer: update-phase MFU and peak memory
#      (falls back to the Qwen3-0.6B shape if the 4B run fails early)
#   3. log-prob memory on CUDA (benchmarks/logprob_memory.py, V = 151,936, bf16)
#   4. $OUT/summary.json
# Device:   bash benchmarks/gpu/h200.sh            (wheels for the packages missing there in .whl/, see below)
# CPU test: CREDO_GPU_TINY=1 OUT=/tmp/gpu1/out PYTHON=.venv/bin/python bash benchmarks/gpu/h200.sh  (tiny sizes, no install)
# .whl/ (git-ignored via .git/info/exclude, ~5.3 MiB; carry it): the device image (python 3.12, torch 2.11) lacks
#   deepspeed 0.19.8 (sdist only on PyPI: DS_BUILD_OPS=0 .venv/bin/python -m pip wheel --no-deps --no-build-isolation
#   deepspeed==0.19.8 -w .whl, a py3-none-any wheel with no compiled op), omegaconf 2.4.0, antlr4-python3-runtime 4.13.2,
#   pydantic 2.14.4, pydantic_core 2.50.5, annotated-types 0.8.0, typing-inspection 0.4.5, hjson 3.1.0 and
#   typing_extensions 4.16.0 (pydantic needs >= 4.16): python3 -m pip download --no-deps --only-binary=:all:
#   --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 -d .whl NAME==VERSION
# Outputs in $OUT: log.txt, summary.json (every figure), quickstart_metrics.jsonl, qwen3_4b.metrics.jsonl (or
#   qwen3_0.6b.*), logprob_memory.md.
set -u
OUT=${OUT:?set OUT to the folder for results}
TINY=${CREDO_GPU_TINY:-0}
BUDGET_S=${CREDO_GPU_BUDGET_S:-420}     # the whole script; stages are skipped when too little is left
mkdir -p "$OUT"
LOG="$OUT/log.txt"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_NO_ADVISORY_WARNINGS=1
export CREDO_CACHE=${CREDO_CACHE:-/tmp/credo_gpu/cache}
PY=${PYTHON:-python3}
WORK=/tmp/credo_gpu
RES=$WORK/res   # intermediate files; $OUT gets at most 7 (the device returns 8 files at most)
rm -rf "$RES"; mkdir -p "$RES"
SECONDS=0
stage() { echo "$1 rc=$2 t=${SECONDS}s" | tee -a "$RES/stages.txt"; }
left() { echo $((BUDGET_S - SECONDS)); }
summarize() { $PY benchmarks/gpu/summarize.py "$RES" "$OUT/summary.json" || echo "summarize failed"; }

echo "=== credo GPU run $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') tiny=$TINY"
nvidia-smi || echo "no nvidia-smi"

# --- 0. wheels for what the device image lacks (deepspeed, omegaconf, pydantic, hjson, ...) ---
if [ "$TINY" != 1 ] && [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl
  stage install $?
  export PYTHONPATH="$WORK/site:$PWD"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
RES="$RES" timeout 90 $PY - <<'EOF'
import json, os, sys, torch, transformers, deepspeed, omegaconf, pydantic, credo
from credo.distributed.engine import device
d = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available(), "transformers": transformers.__version__,
     "deepspeed": deepspeed.__version__, "omegaconf": omegaconf.__version__, "pydantic": pydantic.__version__,
     "credo": credo.__file__, "credo_device": str(device()),
     "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
     "gpu_mem_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None}
open(os.path.join(os.environ["RES"], "env.json"), "w").write(json.dumps(d, indent=2) + "\n")  # stdout has DeepSpeed's lines
EOF
rc=$?; cat "$RES/env.json"; stage import $rc
if [ $rc != 0 ]; then summarize; echo "import check failed: stopping"; exit 1; fi

# --- 1. quickstart on CUDA ---
QS_DIR=$WORK/quickstart
rm -rf "$QS_DIR"
if [ "$TINY" = 1 ]; then
  QS_ARGS="run.steps=2 run.eval_every=2 run.save_every=0 sft.steps=20 task.eval_size=16 rollout.prompts_per_step=8"
  QS_T=600
else
  QS_ARGS=""
  QS_T=150
fi
t0=$SECONDS
timeout $QS_T $PY -m credo.cli run recipes/quickstart.yaml run.output_dir="$QS_DIR" run.progress=false $QS_ARGS
rc=$?
echo "$((SECONDS - t0)) s (SFT warm-up, 100 GRPO steps, evals, checkpoints)" > "$RES/quickstart_wall_s.txt"
cp "$QS_DIR/metrics.jsonl" "$RES/quickstart_metrics.jsonl" 2>/dev/null && cp "$RES/quickstart_metrics.jsonl" "$OUT/"
stage quickstart $rc; summarize

# --- 2. Qwen3-4B shape (random init, bf16) through credo's trainer ---
if [ "$TINY" = 1 ]; then
  timeout 900 $PY benchmarks/gpu/qwen3_mfu.py --shape tiny --steps 2 --max-new-tokens 16 --dtype float32 \
    --workdir "$WORK" --out "$RES/qwen3_tiny.json"
  stage qwen3_tiny $?
else
  T=$(( $(left) - 60 )); [ $T -gt 240 ] && T=240
  timeout $T $PY benchmarks/gpu/qwen3_mfu.py --shape 4b --steps 4 --micro-batch 16 --workdir "$WORK" \
    --out "$RES/qwen3_4b.json"
  rc=$?; stage qwen3_4b $rc
  rm -rf "$WORK/qwen3_4b"   # 8 GB of weights on /tmp
  if [ $rc != 0 ] && [ $(left) -gt 110 ]; then
    timeout 90 $PY benchmarks/gpu/qwen3_mfu.py --shape 0.6b --steps 4 --micro-batch 16 --workdir "$WORK" \
      --out "$RES/qwen3_0.6b.json"
    stage qwen3_0.6b $?
  fi
fi
summarize

# --- 3. log-prob memory on CUDA (naive log_softmax+gather vs credo's chunked and fused paths) ---
if [ "$TINY" = 1 ]; then
  LP_ARGS="--device cpu --dtype float32 --vocabs 32000 --ns 256 --rounds 1"
else
  LP_ARGS="--device cuda --dtype bfloat16 --vocabs 151936 --ns 4096 16384 --rounds 5"
fi
T=$(( $(left) - 10 ))
if [ $T -gt 20 ]; then
  [ $T -gt 90 ] && T=90
  timeout $T $PY benchmarks/logprob_memory.py $LP_ARGS --variants logp --methods chunked fused \
    --chunk-sizes 1024 | tee "$RES/logprob_memory.md"
  stage logprob_memory ${PIPESTATUS[0]}
else
  stage logprob_memory skipped
fi

# --- 4. summary ---
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv 2>/dev/null
summarize
echo "=== done in ${SECONDS}s"
cp "$RES"/*.metrics.jsonl "$RES/logprob_memory.md" "$OUT/" 2>/dev/null
cat "$OUT/summary.json"
sleep 1   # let tee write the last lines to log.txt
