#!/usr/bin/env bash
# The GPU check list, in one command on a lent GPU machine (the `device` tool; CI has no GPU):
#
#   bash scripts/gpu_check.sh --prepare          # here, once: wheels into .whl/, the model into .gpu/
#   bash scripts/gpu_check.sh [STEP ...]         # there (carry .whl and .gpu); default: every step
#   bash scripts/gpu_check.sh --dry-run [STEP ...]  # here: every step starts, at CPU sizes
#
# Steps, in order, each under its own time limit (STEP=SECONDS overrides one) and all of them under
# GPU_CHECK_BUDGET seconds (default 560, for one 10-minute device call): a step gets at most what is
# left, and one that would get under 20 s is recorded as skipped. Each writes to $OUT:
#   smoke      benchmarks/gpu_bench.py --smoke on the GPU: every GPU code path at tiny sizes (its
#              throughput section is left to the full one below)
#   kernels    the Triton kernel tests compiled (TRITON_INTERPRET=0) on CUDA tensors, their `cuda` tests too
#   engine     greedy tokens with CUDA graphs = eager = transformers (tests/model/test_cuda_engine.py, the
#              `cuda`-marked engine tests) and the Triton-backend engine test (test_triton_e2e.py)
#   decode, quant, kernel_bench, throughput   the benchmark sections of benchmarks/gpu_bench.py
# A step that fails or runs out of time is recorded and the next one runs. $OUT/steps.json holds
# each step's status, seconds and the tail of its output; $OUT/gpu_check.log the whole output.
#
# The device's Python has torch and Triton but not all of Tram's dependencies: the wheels in .whl/
# (cp312, manylinux) are installed into /tmp/site. The C++ CPU kernels are not built there
# (TRAM_CPU_KERNELS=0): nothing on the GPU path uses them, and the build would cost minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

WHEELS=(msgspec==0.22.0 pyzmq==27.3.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic_core==2.46.4
  annotated-types==0.7.0 typing-inspection==0.4.2 typing_extensions==4.16.0 uvicorn==0.54.0 httptools==0.9.0
  xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 llguidance==1.9.1 gguf==0.19.0 compressed-tensors==0.20.0
  loguru==0.7.3 opentelemetry-api==1.45.2)
# Seen on an H100 (docs/benchmarks.md, "GPU"): smoke ~60 s, kernels 115, engine ~60, decode 53, quant 35,
# kernel_bench 32, throughput 45 s before transformers' run (which --hf-timeout bounds: half the step).
declare -A LIMIT=([smoke]=100 [kernels]=150 [engine]=100 [decode]=100 [quant]=50 [kernel_bench]=60 [throughput]=200)
BUDGET=${GPU_CHECK_BUDGET:-560}
ALL_STEPS=(smoke kernels engine decode quant kernel_bench throughput)
# The kernel tests run 8 to a time (each compiles its own variants); the engine tests one at a time,
# since every engine takes its share of the GPU's memory. GPU_KERNEL_TESTS / GPU_ENGINE_TESTS replace
# either list (a rerun of what failed); GPU_BENCH_ARGS adds flags to every benchmark step.
read -r -a KERNEL_TESTS <<<"${GPU_KERNEL_TESTS:-tests/model/test_triton_kernels.py tests/model/test_triton_moe.py \
tests/quant/test_triton_quant_linear.py}"
read -r -a ENGINE_TESTS <<<"${GPU_ENGINE_TESTS:-tests/model/test_cuda_engine.py tests/model/test_triton_e2e.py}"

prepare() {
  mkdir -p .whl .gpu/models
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
  local platforms=() n
  for n in 28 27 26 24 17 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  cp -r ../shared/models/stories260K .gpu/models/
  du -sh .whl .gpu
}

setup_device() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
      echo "gpu_check: wheel install failed" >&2
    export PYTHONPATH=/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  fi
  # The tests and benchmarks find stories260K beside the checkout, as on the development machines.
  if [ ! -d ../shared/models/stories260K ] && [ -d .gpu/models/stories260K ]; then
    mkdir -p ../shared/models && cp -r .gpu/models/stories260K ../shared/models/
  fi
  export TRAM_CPU_KERNELS=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | head -3
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
}

step_command() {  # the command line of one step; $DEVICE is cuda, or cpu in a dry run
  local pytest=(python3 -m pytest -q -p no:cacheprovider -o addopts= -rfE)
  case $1 in
    smoke) echo python3 benchmarks/gpu_bench.py --smoke --device "$DEVICE" --out "$OUT/smoke.json" \
      --sections decode,kernels,quant ;;
    kernels)
      if [ "$DEVICE" = cuda ]; then
        echo env TRITON_INTERPRET=0 "${pytest[@]}" -n 8 "${KERNEL_TESTS[@]}"
      else
        echo "${pytest[@]}" --collect-only "${KERNEL_TESTS[@]}"
      fi ;;
    engine)
      if [ "$DEVICE" = cuda ]; then
        echo env TRITON_INTERPRET=0 "${pytest[@]}" "${ENGINE_TESTS[@]}"
      else
        echo "${pytest[@]}" --collect-only "${ENGINE_TESTS[@]}"
      fi ;;
    decode | quant | throughput | kernel_bench)
      local section=${1/kernel_bench/kernels} size=()
      [ "$DEVICE" = cuda ] || size=(--smoke --device cpu)
      [ "$1" = throughput ] && size+=(--hf-timeout $((${LIMIT[$1]} / 2)))
      echo python3 benchmarks/gpu_bench.py "${size[@]}" --sections "$section" --out "$OUT/bench_$section.json" \
        --section-timeouts "$section=$((${LIMIT[$1]} - 15))" ${GPU_BENCH_ARGS:-} ;;
    *) echo "unknown step $1" >&2; return 1 ;;
  esac
}

run_step() {  # runs one step under its limit; appends its record to $OUT/steps.jsonl
  local name=$1 left=$((BUDGET - SECONDS)) cmd start rc limit
  if [ "$left" -lt 20 ]; then
    echo "{\"step\": \"$name\", \"status\": \"skipped\", \"why\": \"budget of ${BUDGET}s spent\"}" >>"$OUT/steps.jsonl"
    echo "=== $name: skipped (budget spent)" | tee -a "$LOG"
    return
  fi
  [ "${LIMIT[$name]:-0}" -gt "$left" ] && LIMIT[$name]=$left
  limit=${LIMIT[$name]:-0}
  cmd=$(step_command "$name") || return
  echo "=== $name (limit ${limit}s): $cmd" | tee -a "$LOG"
  start=$(date +%s)
  timeout -k 5 "$limit" $cmd >"$OUT/.step.log" 2>&1
  rc=$?
  cat "$OUT/.step.log" >>"$LOG"
  tail -n 25 "$OUT/.step.log"
  python3 - "$name" "$rc" "$(($(date +%s) - start))" "$OUT/.step.log" >>"$OUT/steps.jsonl" <<'EOF'
import json, sys
name, rc, seconds, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "failed"
tail = open(log, errors="replace").read().splitlines()[-40:]
print(json.dumps({"step": name, "status": status, "rc": rc, "seconds": seconds, "tail": tail}))
EOF
  echo "=== $name: rc=$rc in $(($(date +%s) - start))s" | tee -a "$LOG"
}

main() {
  DEVICE=cuda
  case ${1:-} in
    --prepare) prepare; return ;;
    --dry-run) DEVICE=cpu; shift ;;
  esac
  OUT=${OUT:-$REPO/.gpu/out}
  mkdir -p "$OUT"
  LOG=$OUT/gpu_check.log
  : >"$LOG"
  : >"$OUT/steps.jsonl"
  local steps=("$@") s
  [ ${#steps[@]} -gt 0 ] || steps=("${ALL_STEPS[@]}")
  for s in "${steps[@]}"; do  # STEP=SECONDS sets that step's limit
    if [[ $s == *=* ]]; then LIMIT[${s%%=*}]=${s#*=}; fi
  done
  if [ "$DEVICE" = cuda ]; then setup_device > >(tee -a "$LOG") 2>&1; fi
  for s in "${steps[@]}"; do run_step "${s%%=*}"; done
  python3 -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))" \
    "$OUT/steps.jsonl" >"$OUT/steps.json"
  rm -f "$OUT/.step.log" "$OUT/steps.jsonl"
  grep '^=== .*rc=' "$LOG"
}

main "$@"
