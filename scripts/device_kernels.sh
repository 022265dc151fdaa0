#!/usr/bin/env bash
# One device call for the expert GEMM kernels (about 4 minutes on one H200), with binaries built on
# the dev machine: the GPU tests, compute-sanitizer memcheck and racecheck on a reduced filter, and
# leanmoe_bench_gemms on the heuristic's configurations of four grid shapes (each row prints the
# configuration that ran), plus one run with explicit --config values. Each step writes straight into
# $OUT (7 files), so a step cut off by its timeout leaves the others' files; the A/B (4 runs of at
# most 45 s) is skipped once 6 minutes have passed, to end inside a 10-minute call.
#
# Prepare here:  bash scripts/prepare_carry.sh        (.carry/bin and .carry/blaslibs.tar.xz)
#   optional:    bash scripts/prepare_baseline_bench.sh <commit>   (.carry/bin/leanmoe_bench_gemms_base:
#                the same per-GEMM runs from that commit's binary, interleaved, two rounds: an A/B in one call)
# Device run:    carry [".carry/bin", ".carry/blaslibs.tar.xz"], command `bash scripts/device_kernels.sh`.
# LEANMOE_CARRY_BIN names another folder holding leanmoe_gpu_tests and leanmoe_bench_gemms.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$W"
source scripts/device_env.sh  # OpenBLAS (the tests' CPU reference) and NCCL on LD_LIBRARY_PATH
B="${LEANMOE_CARRY_BIN:-.carry/bin}"
commit="$(cat "$B/commit" 2>/dev/null || echo unknown)"
echo "commit $commit" | tee "$W/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$W/gpu.txt"

echo "== GPU tests (t=${SECONDS}s)"
timeout 200 "$B/leanmoe_gpu_tests" --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -8

echo "== memcheck (t=${SECONDS}s)"
timeout 100 compute-sanitizer --tool memcheck "$B/leanmoe_gpu_tests" \
  --gtest_filter='ExpertGemms.*:CudaBackend.SingleToken:CudaBackend.EmptyExpertAndHotExpert' >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -2 "$W/memcheck.log"
echo "== racecheck (t=${SECONDS}s)"
timeout 60 compute-sanitizer --tool racecheck "$B/leanmoe_gpu_tests" \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.WideExperts:ExpertGemms.FewPersistentCtas' \
  >"$W/racecheck.log" 2>&1
echo "racecheck rc=$?"; tail -2 "$W/racecheck.log"

SHAPES=7B-n256,olmoe-1b-7b,120B-n2048,gpt-oss-20b
echo "== each expert GEMM on its own, heuristic configurations (t=${SECONDS}s)"
timeout 60 "$B/leanmoe_bench_gemms" --shape $SHAPES --iters 20 >"$W/gemms.txt" 2>&1
echo "gemms rc=$?"; cat "$W/gemms.txt"

echo "== explicit --config (t=${SECONDS}s)"
explicit=up=gather:coop:128x256:s4:warp:c1:b4,dh=gather:coop:128x256:s4:warp:c2:b4
explicit=$explicit,down=cutlass:pingpong:128x192:auto:tma:c2
timeout 40 "$B/leanmoe_bench_gemms" --shape 120B-n2048,7B-n256 --gemms up,dh,down --iters 20 --config "$explicit" \
  >"$W/gemms_explicit.txt" 2>&1; echo "explicit rc=$?"; cat "$W/gemms_explicit.txt"

if [ -x "$B/leanmoe_bench_gemms_base" ] && [ "$SECONDS" -le 360 ]; then
  base="$(cat "$B/base_commit" 2>/dev/null || echo unknown)"
  # Binaries from before the --shape flag took the shape names as --config.
  shape_flag=--shape; "$B/leanmoe_bench_gemms_base" --help | grep -q -- --shape || shape_flag=--config
  echo "== A/B: $base vs $commit, two rounds interleaved (t=${SECONDS}s)"
  for round in 1 2; do
    echo "### round $round: base $base"
    timeout 45 "$B/leanmoe_bench_gemms_base" $shape_flag $SHAPES --iters 20 2>&1 | grep '^| [0-9a-zA-Z]'
    echo "### round $round: $commit"
    timeout 45 "$B/leanmoe_bench_gemms" --shape $SHAPES --iters 20 2>&1 | grep '^| [0-9a-zA-Z]'
  done >"$W/gemms_ab.txt"; cat "$W/gemms_ab.txt"
fi
echo "done (t=${SECONDS}s)"
