#!/usr/bin/env bash
# The checks that need a GPU, run against an existing build (./scripts/build.sh): the steps named
# as arguments, in order, each writing its full log to $OUT (default /tmp/mxmoe-out), then a short
# summary. Exits nonzero if any step failed.
# Usage: scripts/device-check.sh [--build-dir DIR] STEP [ARGS] ...
#   --build-dir DIR  the build to check (default: build/ of the checkout that holds this script)
#   tests       all GPU tests (the gpu-labelled ctest suite, run as one process so that the large
#               synthetic layers are built once); GTEST_FILTER picks some (gtest reads it)
#   sanitizer   compute-sanitizer memcheck over a fast subset of the GPU tests
#   racecheck   compute-sanitizer racecheck and synccheck over every tactic on a shape whose rings
#               wrap (the layer test's ring_E5_k3_H512_I512 case)
#   profile     per-kernel time and DRAM bytes of one decode forward (Nsight Compute, caches flushed,
#               clocks as they are) at T = 1, 8, 64 on both models
#   tune ARGS   mxmoe tune with ARGS (up to the next step name)
#   bench ARGS  mxmoe bench with ARGS (up to the next step name); steps may repeat: each run's output
#               goes on the end of tune.log / bench.log, the n-th run's JSON to bench-n.json (the
#               first's to bench.json)
# The test binary runs directly rather than through ctest, whose files hold the absolute paths of
# the directory the build was configured in, so a build copied or moved along with its checkout
# still runs. The tests run under a time limit (MXMOE_TEST_LIMIT_S, default 300 s), so that a hang
# is reported as one (rc 124) with the log so far, and the steps after it still run.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
if [ "${1:-}" = --build-dir ]; then
  [ $# -ge 2 ] || { echo "device-check: --build-dir needs a directory" >&2; exit 2; }
  build="$(cd "$2" && pwd)" || { echo "device-check: no directory $2" >&2; exit 2; }
  shift 2
fi
[ -x "$build/mxmoe" ] || { echo "device-check: no build in $build (./scripts/build.sh makes one)" >&2; exit 2; }
cd "$root"
out="${OUT:-/tmp/mxmoe-out}"
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# For a build with -DMXMOE_SANITIZE=address (the tests step; compute-sanitizer needs a plain build):
# the CUDA driver maps memory where AddressSanitizer's shadow gap is, and it leaks by design.
export ASAN_OPTIONS="${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
summary=()
status=0
while [ $# -gt 0 ]; do
  step="$1"; shift
  case "$step" in
    tests)
      timeout "${MXMOE_TEST_LIMIT_S:-300}" "$build/tests/mxmoe_gpu_tests" > "$out/gpu-tests.log" 2>&1
      rc=$?; status=$((status | rc))
      summary+=("gpu tests: rc=$rc, $(grep -E '^\[  (PASSED|FAILED)  \]|tests? ran' "$out/gpu-tests.log" | tr '\n' ' ')")
      ;;
    sanitizer)
      filter='*odd_E5*:*GpuDequant*:*GpuLayerArguments*:*GpuEngineFormArguments*:*GpuEngineFormGraph*:*gpt_oss_20b_T1:*gpt_oss_20b_T9:*gpt_oss_120b_T5:*GpuLayerGraph*'
      filter+=':GpuBlockScaled.*:GpuMxfp8Quantize.*:GpuBlockScaledStages.*:GpuBlockScaledRouting.*:GpuBlockScaledCheck.*'
      filter+=':*v4_E24_k6_H256_I192_T1:*v4_E24_k6_H256_I192_T7:*v4_E300_k6_H64_I96_T1'  # DeepSeek-V4's router
      filter+=':GpuFp8Rows.*:GpuFp8Staging.*:*odd_E5_k3_H96_I160_T7_fp8:*v4_E24_k6_H256_I192_T7_fp8'  # FP8 activations' rounding
      filter+=':GpuLayerRouter.*'  # both logits kernels
      timeout "${MXMOE_TEST_LIMIT_S:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/mxmoe_gpu_tests" --gtest_filter="$filter" \
        > "$out/sanitizer.log" 2>&1
      rc=$?; status=$((status | rc))
      summary+=("compute-sanitizer memcheck: rc=$rc, $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -1)")
      ;;
    racecheck)
      for tool in racecheck synccheck; do
        timeout "${MXMOE_TEST_LIMIT_S:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/mxmoe_gpu_tests" \
          --gtest_filter='Shapes/GpuLayer.*ring_E5*' > "$out/$tool.log" 2>&1
        rc=$?; status=$((status | rc))
        summary+=("compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1)")
      done
      ;;
    profile)
      : > "$out/profile.txt"
      for model in gpt-oss-20b gpt-oss-120b; do
        for tokens in 1 8 64; do
          ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip 6 \
            --launch-count 6 "$build/mxmoe" run --device gpu --model "$model" --tokens "$tokens" > "$out/ncu.csv" 2>&1
          rc=$?; status=$((status | rc))
          echo "== $model T=$tokens (ncu rc=$rc)" >> "$out/profile.txt"
          python3 tools/measure/ncu_summary.py "$out/ncu.csv" >> "$out/profile.txt"
        done
      done
      summary+=("profile: see below")
      ;;
    tune|bench)
      args=()
      while [ $# -gt 0 ] && ! [[ "$1" =~ ^(tests|sanitizer|racecheck|profile|tune|bench)$ ]]; do args+=("$1"); shift; done
      if [ "$step" = bench ]; then
        bench_runs=$((${bench_runs:-0} + 1))
        args+=(--json "$out/bench$([ "$bench_runs" -gt 1 ] && echo "-$bench_runs").json")
      fi
      echo "== mxmoe $step ${args[*]}" >> "$out/$step.log"
      "$build/mxmoe" "$step" "${args[@]}" >> "$out/$step.log" 2>&1
      rc=$?; status=$((status | rc))
      summary+=("$step ${args[*]}: rc=$rc")
      ;;
    *) echo "device-check: unknown step '$step'" >&2; exit 2 ;;
  esac
done
cat "$out/gpu.txt"
[ -f "$out/gpu-tests.log" ] && grep -E '^\[  FAILED  \]|Failure|exception' "$out/gpu-tests.log" | head -20
[ -f "$out/gpu-tests.log" ] && tail -3 "$out/gpu-tests.log"
printf '%s\n' "${summary[@]}"
[ -f "$out/profile.txt" ] && cat "$out/profile.txt"
[ -f "$out/tune.log" ] && grep -E "^  T=[0-9]+: tuned|stored" "$out/tune.log"
[ -f "$out/bench.log" ] && grep -E '^(== mxmoe|ceilings|model|gpt-oss)' "$out/bench.log" | tail -60
exit $status
