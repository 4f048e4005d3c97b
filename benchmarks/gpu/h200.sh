#!/usr/bin/env bash
# credo on a GPU: one script for one lent H100/H200, at most 8 minutes (each stage under its own timeout,
# results written to $OUT as they come, so a later stage's failure loses nothing).
#   1. quickstart (recipes/quickstart.yaml: SFT warm-up + GRPO steps, hf backend) under engine.backend deepspeed,
#      then fsdp2 (the warm-up is cached by then): $OUT/quickstart_<engine>/
#   2. the update phase of the Qwen3-0.6B and Qwen3-4B shapes (random init, bf16, 16k packed tokens per micro-batch)
#      under both engines: tokens/s, MFU, peak memory (benchmarks/gpu/update_mfu.py)
#   3. log-prob memory on CUDA (benchmarks/logprob_memory.py, V = 151,936, bf16)
#   4. $OUT/summary.json, copied to docs/results/gpu_<date>.json ($CREDO_GPU_RESULTS) to commit
# Not measured yet (issue 53, item 4): the NCCL weight push to a rollout worker process, HF rollout tokens/s apart
#   from the quickstart's perf/tokens_per_s.
# Device:   bash benchmarks/gpu/h200.sh            (wheels for the packages missing there in .whl/, see below)
# CPU test: CREDO_GPU_TINY=1 OUT=/tmp/gpu1/out PYTHON=.venv/bin/python bash benchmarks/gpu/h200.sh  (tiny sizes, no install;
#   tests/engines/test_gpu_script.py runs it in CI so it is not stale when a GPU comes)
# .whl/ (git-ignored via .git/info/exclude, ~5.3 MiB; carry it): the device image (python 3.12, torch 2.11) lacks
#   deepspeed 0.19.8 (sdist only on PyPI: DS_BUILD_OPS=0 .venv/bin/python -m pip wheel --no-deps --no-build-isolation
#   deepspeed==0.19.8 -w .whl, a py3-none-any wheel with no compiled op), omegaconf 2.4.0, antlr4-python3-runtime 4.13.2,
#   pydantic 2.14.4, pydantic_core 2.50.5, annotated-types 0.8.0, typing-inspection 0.4.5, hjson 3.1.0 and
#   typing_extensions 4.16.0 (pydantic needs >= 4.16): python3 -m pip download --no-deps --only-binary=:all:
#   --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 -d .whl NAME==VERSION
# Outputs in $OUT: log.txt, summary.json (every figure: quickstart_<engine>, update_<shape> per engine, log-prob
#   memory), gpu_<date>.json (the same, also written to $CREDO_GPU_RESULTS), logprob_memory.md.
set -u
OUT=${OUT:?set OUT to the folder for results}
TINY=${CREDO_GPU_TINY:-0}
DEFAULT_BUDGET=450; [ "$TINY" = 1 ] && DEFAULT_BUDGET=1500   # on a (shared) CPU the tiny stages take minutes
BUDGET_S=${CREDO_GPU_BUDGET_S:-$DEFAULT_BUDGET}     # the whole script; stages are skipped when too little is left
RESULTS=${CREDO_GPU_RESULTS:-docs/results}  # where gpu_<date>.json goes (the summary, to commit)
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

# --- 1. quickstart on CUDA, under each engine (the SFT warm-up is cached by the first) ---
if [ "$TINY" = 1 ]; then
  QS_ARGS="run.steps=2 run.eval_every=2 run.save_every=0 sft.steps=20 task.eval_size=16 rollout.prompts_per_step=8"
  QS_T=600
else
  QS_ARGS="run.steps=40 run.eval_every=20"
  QS_T=120
fi
for ENG in deepspeed fsdp2; do
  QS_DIR=$WORK/quickstart_$ENG
  rm -rf "$QS_DIR"; mkdir -p "$RES/quickstart_$ENG"
  t0=$SECONDS
  timeout $QS_T $PY -m credo.cli run recipes/quickstart.yaml run.output_dir="$QS_DIR" run.progress=false \
    engine.backend=$ENG $QS_ARGS
  rc=$?
  echo "$((SECONDS - t0)) s (SFT warm-up if not cached, GRPO steps, evals, checkpoints)" > "$RES/quickstart_$ENG/quickstart_wall_s.txt"
  cp "$QS_DIR/metrics.jsonl" "$RES/quickstart_$ENG/quickstart_metrics.jsonl" 2>/dev/null
  stage "quickstart_$ENG" $rc; summarize
done

# --- 2. update phase of the Qwen3 shapes (random init, bf16, 16k packed tokens), both engines ---
if [ "$TINY" = 1 ]; then
  timeout 600 $PY benchmarks/gpu/update_mfu.py --out "$RES/update_tiny.json"
  stage update_tiny $?
else
  for SHAPE in 0.6b 4b; do
    T=$(( $(left) - 70 )); [ $T -gt 200 ] && T=200
    if [ $T -gt 40 ]; then
      timeout $T $PY benchmarks/gpu/update_mfu.py --shape $SHAPE --tokens 16384 --seq-len 1024 --steps 4 \
        --out "$RES/update_$SHAPE.json"
      stage "update_$SHAPE" $?
    else
      stage "update_$SHAPE" skipped
    fi
  done
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
mkdir -p "$RESULTS" && cp "$OUT/summary.json" "$RESULTS/gpu_$(date -u +%F).json" \
  && cp "$OUT/summary.json" "$OUT/gpu_$(date -u +%F).json" && echo "results: $RESULTS/gpu_$(date -u +%F).json"
echo "=== done in ${SECONDS}s"
cp "$RES"/*.metrics.jsonl "$RES/logprob_memory.md" "$OUT/" 2>/dev/null
cat "$OUT/summary.json"
sleep 1   # let tee write the last lines to log.txt
