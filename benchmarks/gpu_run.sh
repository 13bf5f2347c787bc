#!/usr/bin/env bash
# One GPU run of rtserve, from a copy of the tree plus gpu-carry/ (benchmarks/gpu_carry.py), with the host's own
# Python and torch and no package index. It writes the host's report into $OUT/docs/bench-h200/ (one report per
# machine: it replaces docs/bench-h200/ when copied back).
#
#   benchmarks/gpu_run.sh [--device cuda|cpu] [--quick] [--carry DIR] [--workers N] [--sweep-max N] [--report NAME]
#                         [--budget SECONDS]
#   RTSERVE_GPU_RUN_COMPILE=1 also times torch.compile in step 2 (its compiles take minutes per graph).
#
# Steps, each timed and bounded by what is left of --budget seconds (default 570, for a host that stops a command at
# 600 s), each failure said and the run going on (README.md in the report lists them), the measurements first:
#   0. probe: Python, torch and CUDA, ONNX Runtime and its providers, the imports rtserve lacks;
#   1. environment: the carried wheels of the missing imports unpacked into a folder put first on PYTHONPATH
#      (benchmarks/gpu_env.py; no pip, no venv: the host's torch stays the one imported); MiniLM's weights (carried,
#      else random in its shapes: the RMT's timings and energy hold, its answers do not);
#   2. offline segments/s per batch, eager against captured CUDA graphs, written into each entry's step_modes.json
#      (the service then runs each graph in the mode measured fastest: benchmarks/step_modes.py);
#   3. the capacity sweep of RMT and RSA (rtserve bench --only e2e,sweep) with 1 front end, then N: pieces/s, p50/p99,
#      the engine's mean batch, the GPU's utilization, J/piece per count, the client's CPU; e2e/step at one session;
#   4. the CUDA tests (tests/test_cuda.py, tests/test_cuda_graphs.py);
#   5. ONNX Runtime's CUDA provider (tests/test_cuda.py -k onnx), when the host has it (else said and skipped);
#   6. the targets read off the reports (benchmarks/gpu_summary.py).
# --device cpu --quick is the rehearsal on a machine without a GPU (tests/test_gpu_run.py): the same steps, tiny.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE=cuda QUICK=0 WORKERS=4 SWEEP_MAX=512 REPORT_NAME=bench-h200 BUDGET=570
CARRY="${RTSERVE_GPU_CARRY:-$ROOT/gpu-carry}"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --carry) CARRY="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --sweep-max) SWEEP_MAX="$2"; shift 2 ;;
    --report) REPORT_NAME="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    *) echo "gpu_run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $QUICK = 1 ] && SWEEP_MAX=4
OUT="${OUT:-/tmp/rtserve-gpu-run}"
REPORT="$OUT/docs/$REPORT_NAME"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rtserve-gpu-run.XXXXXX")"
PY="${PYTHON:-python3}"
mkdir -p "$REPORT"
SUMMARY="$REPORT/README.md"
STARTED=$(date +%s)
cd "$ROOT"

FAILURES=0
note() { echo "$*" | tee -a "$SUMMARY"; }
step() {  # step NAME LOG COMMAND...: run within what is left of the budget, time, say how it ended
  local name="$1" log="$2"; shift 2
  local began=$(date +%s)
  local left=$(( STARTED + BUDGET - began - 15 ))  # 15 s kept for the summary
  if [ $left -lt 20 ]; then
    note "- $name: skipped (the budget of $BUDGET s is spent)"
    FAILURES=$((FAILURES + 1))
    return 1
  fi
  echo "== $name" >&2
  timeout --kill-after=10 "$left" "$@" > "$log" 2>&1
  local code=$?
  [ $code -eq 124 ] && echo "stopped after $left s: the budget of $BUDGET s" >> "$log"
  tail -n 40 "$log" >&2
  note "- $name: $([ $code -eq 0 ] && echo ok || echo "FAILED (exit $code, log: $(basename "$log"))"), $(( $(date +%s) - began )) s"
  [ $code -eq 0 ] || FAILURES=$((FAILURES + 1))
  return $code
}

{
  echo "# rtserve on $( [ "$DEVICE" = cpu ] && echo "the CPU (rehearsal)" || echo "the GPU host" ): benchmarks/gpu_run.sh"
  echo
  echo "Command: \`benchmarks/gpu_run.sh --device $DEVICE$([ $QUICK = 1 ] && echo " --quick") --workers $WORKERS --sweep-max $SWEEP_MAX\`, $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo
  echo '```'
} > "$SUMMARY"

# 0. probe
"$PY" --version >> "$SUMMARY" 2>&1 || { echo "no $PY on this host" >&2; exit 2; }
"$PY" benchmarks/gpu_env.py probe | tee -a "$SUMMARY"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$SUMMARY" 2>&1
echo '```' >> "$SUMMARY"
echo >> "$SUMMARY"
if ! "$PY" -c 'import torch' 2>/dev/null; then
  note "torch is not importable by $PY: nothing can run (set PYTHON=/path/to/the host's python with torch)."
  exit 2
fi
if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  note "torch sees no CUDA device: the GPU steps cannot run (use --device cpu for a rehearsal)."
  exit 2
fi

# 1. environment
SITE="$WORK/site"
mkdir -p "$SITE"
if [ -f "$CARRY/wheels/index.json" ]; then
  "$PY" benchmarks/gpu_env.py install "$CARRY/wheels" "$SITE" | tee -a "$SUMMARY"
fi
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" benchmarks/gpu_env.py minilm "$CARRY" "$SITE" | tee -a "$SUMMARY"
"$PY" benchmarks/gpu_env.py metadata "$ROOT" "$SITE" | tee -a "$SUMMARY"
MISSING=$("$PY" benchmarks/gpu_env.py probe | sed -n 's/^missing imports: //p')
[ "$MISSING" != none ] && note "Still missing after the carried wheels: $MISSING (the steps that need them fail below)."

REPOSITORY="$WORK/repository"
cp -r "$CARRY/repository" "$REPOSITORY"
DATA="$CARRY/data"
[ -d "$DATA" ] || DATA="$ROOT/../shared/data"
export RTSERVE_BACKEND=torch RTSERVE_LOG_LEVEL=warning RTSERVE_MODEL_REPOSITORY="$REPOSITORY"
if [ "$DEVICE" = cuda ]; then
  export RTSERVE_DEVICE=cuda CUDA_DEVICE_ORDER=PCI_BUS_ID
  BATCHES=1,8,32,128,256 SECONDS_PER_CELL=1 REPEATS=2
else
  export RTSERVE_DEVICE=cpu
  BATCHES=1,8,32 SECONDS_PER_CELL=0.3 REPEATS=1
fi
if [ $QUICK = 1 ]; then BATCHES=1,4 SECONDS_PER_CELL=0.05 REPEATS=1; fi
note ""
note "Steps:"

# 2. offline rates, eager against graphs; the fastest recorded in each entry
MODES=eager,graphs
[ -n "${RTSERVE_GPU_RUN_COMPILE:-}" ] && MODES=eager,graphs,compile
step "offline segments/s per batch, $MODES (benchmarks/step_modes.py)" "$REPORT/step-modes.log" \
  "$PY" benchmarks/step_modes.py --repository "$REPOSITORY" --device "$([ "$DEVICE" = cuda ] && echo cuda:0 || echo cpu)" \
  --modes "$MODES" --batches "$BATCHES" --seconds "$SECONDS_PER_CELL" --write --out-md "$REPORT/step-modes.md" \
  --out-json "$REPORT/step-modes.json"

# 3. the sweep with 1 front end, then N; e2e/step with the one
BENCH=("$PY" -m rtserve.cli bench --model-repository "$REPOSITORY" --data "$DATA" --repeats "$REPEATS"
       --sweep-max "$SWEEP_MAX")
[ $QUICK = 1 ] && BENCH+=(--quick)
for workers in 1 "$WORKERS"; do
  only=sweep
  [ "$workers" = 1 ] && only=e2e,sweep
  RTSERVE_WORKERS=$workers step "rtserve bench --only $only, RTSERVE_WORKERS=$workers" "$REPORT/workers-$workers.log" \
    "${BENCH[@]}" --only "$only" --out-json "$REPORT/workers-$workers.json" --out-md "$REPORT/workers-$workers.md"
  [ "$workers" = "$WORKERS" ] && break
done

# 4. the CUDA tests
if [ "$DEVICE" = cuda ]; then
  step "CUDA tests (tests/test_cuda.py, tests/test_cuda_graphs.py)" "$REPORT/cuda-tests.log" \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_cuda_graphs.py
else
  note "- CUDA tests: skipped (--device cpu)"
fi

# 5. ONNX Runtime's CUDA provider
if [ "$DEVICE" = cuda ] && "$PY" -c 'import onnxruntime as o, sys; sys.exit(0 if "CUDAExecutionProvider" in o.get_available_providers() else 1)' 2>/dev/null; then
  step "ONNX Runtime CUDA provider (tests/test_cuda.py -k onnx: IO binding, fp32 and fp16)" "$REPORT/onnx-cuda.log" \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -k onnx
else
  note "- ONNX Runtime's CUDA provider: skipped (no onnxruntime with CUDAExecutionProvider on this host); the GPU deployments keep the torch backend"
fi

# 6. the targets, read off the reports
note ""
note "Targets (benchmarks/gpu_summary.py):"
note ""
"$PY" benchmarks/gpu_summary.py "$REPORT" 1 "$WORKERS" >> "$SUMMARY" 2>&1 || note "(the summary failed: see the tables)"
note ""
note "Whole run: $(( $(date +%s) - STARTED )) s. Tables: step-modes.md (offline, eager against graphs), workers-1.md and workers-$WORKERS.md (sweep, capacity, J/piece, e2e/step)."
rm -rf "$WORK"
echo "report in $REPORT" >&2
[ $FAILURES -eq 0 ] || { echo "$FAILURES step(s) failed: see $SUMMARY" >&2; exit 1; }
