#!/usr/bin/env bash
# One device call for the routing kernels (issue 17; about 5 minutes on one H200), with binaries
# built on the dev machine: the GPU routing tests (CudaRouting.* compare every routing output with
# the CPU's, CudaBackend.* / CudaRoutingGiven.* end to end, the CUDA-graph capture),
# compute-sanitizer memcheck and racecheck on them, then per-kernel times (ncu, gpu__time_duration
# only, clocks left alone) of one forward + backward of `leanmoe bench` at 7B-n256, 1.4B-n256 and
# 120B-n2048 (top-K) and sparse-T8k-d4096-n1024-E256 with token rounding, summarised per kernel.
# Each step writes into $OUT, so a step cut off by its timeout leaves the others' files.
#
# Prepare here:  LEANMOE_BUILD_DIR=build-device LEANMOE_CUDA=ON bash scripts/build.sh (or the two
#   targets: cmake --build build-device --target leanmoe_cli leanmoe_gpu_tests), then
#   mkdir -p .carry/route && xz -T2 -kc build-device/leanmoe > .carry/route/leanmoe.xz &&
#   xz -T2 -kc build-device/tests/leanmoe_gpu_tests > .carry/route/leanmoe_gpu_tests.xz &&
#   git rev-parse --short=12 HEAD > .carry/route/commit   (and .carry/blaslibs.tar.xz: prepare_carry.sh)
# Device run:    carry [".carry/route", ".carry/blaslibs.tar.xz"], command `bash scripts/device_routing.sh`.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$W"
source scripts/device_env.sh  # OpenBLAS (the tests' CPU reference) and NCCL on LD_LIBRARY_PATH
C="${LEANMOE_CARRY_BIN:-.carry/route}"
B=/tmp/route-bin; mkdir -p "$B"
for f in leanmoe leanmoe_gpu_tests; do
  if [ -f "$C/$f.xz" ]; then xz -dc "$C/$f.xz" > "$B/$f"; else cp "$C/$f" "$B/$f"; fi
  chmod +x "$B/$f"
done
echo "commit $(cat "$C/commit" 2>/dev/null || echo unknown)" | tee "$W/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$W/gpu.txt"

ROUTING='CudaRouting.*:CudaBackend.*:CudaRoutingGiven.*'
echo "== GPU routing tests (t=${SECONDS}s)"
timeout 150 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$ROUTING" >"$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12

# The sanitizers on the direct routing tests (every kernel of routing.cu, E up to 1024, K up to 16)
# and two end-to-end cases (router backward, token rounding).
SAN='CudaRouting.*:CudaBackend.TokenRoundingAllModes:CudaBackend.EmptyExpertAndHotExpert:CudaRoutingGiven.RandomRouting'
echo "== memcheck (t=${SECONDS}s)"
timeout 150 compute-sanitizer --tool memcheck "$B/leanmoe_gpu_tests" --gtest_filter="$SAN" >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -3 "$W/memcheck.log"
echo "== racecheck (t=${SECONDS}s)"
timeout 120 compute-sanitizer --tool racecheck "$B/leanmoe_gpu_tests" --gtest_filter="$SAN" >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -3 "$W/racecheck.log"

echo "== ncu per-kernel times (t=${SECONDS}s)"
summarise() { python3 dev/ncu_kernel_times.py "$1"; }  # the measured iteration, per kernel, in us
prof() {  # name, then leanmoe bench flags
  local name=$1; shift
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$B/leanmoe" bench "$@" --router topk_then_softmax --iters 1 --warmup 1 >"$W/ncu_$name.csv" 2>"$W/ncu_$name.err"
  echo "$name rc=$?"
  summarise "$W/ncu_$name.csv" | tee -a "$W/ncu_summary.txt"
}
prof 7B-n256 --config 7B-n256
prof 1.4B-n256 --config 1.4B-n256
prof 120B-n2048 --config 120B-n2048
prof T8k-tr --config sparse-T8k-d4096-n1024-E256 --routing token-rounding
echo "done (t=${SECONDS}s)"
