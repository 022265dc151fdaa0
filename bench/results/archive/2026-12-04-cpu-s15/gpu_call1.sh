#!/usr/bin/env bash
# Prepared in session 15 (no GPU that session), NOT RUN yet: the next session's first device call.
# 1. branch sass 9f9cae0 (issue 17): the gather kernel's consumers with wgmma descriptors built once
#    and advanced in uniform registers, one release arrive per warp: GPU tests, memcheck + racecheck,
#    ncu instruction counts and leanmoe_bench_gemms base vs new (sass.device.sh, ~4 min).
# 2. branch epfp8 0262b60 (c8526aa merged with main 935a307; issue 16): the EP layer in FP8 on CUDA, P ranks on one GPU, memcheck
#    (s14's epfp8.device.sh, ~1.5 min).
# Carry [".carry/s15sass", ".carry/s14epf", ".carry/blaslibs.tar.xz"] (= /work/wt/sass.carry,
# /work/wt/epfp8.carry; ~34 MB). Expected ~6 min; caps 390 + 150 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
W="$(mktemp -d)" CARRY=.carry/s15sass timeout -k 5 390 bash -c "source bench/results/archive/2026-12-04-cpu-s15/sass.device.sh"
echo "sass fragment rc=$? (t=${SECONDS})"
W="$(mktemp -d)" CARRY=.carry/s14epf timeout -k 5 150 bash -c "source bench/results/archive/2026-12-04-h200-s14/epfp8.device.sh"
echo "epfp8 fragment rc=$? (t=${SECONDS})"
echo "done (t=${SECONDS})"
