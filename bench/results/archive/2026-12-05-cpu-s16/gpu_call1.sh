#!/usr/bin/env bash
# Prepared in session 16 (no GPU that session), NOT RUN yet: the next session's first device call.
# Session 15's gpu_call1.sh (branch sass: tests, sanitizers, ncu counts, bench base vs new, ~4 min;
# branch epfp8: the CUDA EP layer in FP8, ~1.5 min), then fp8prof.device.sh (issue 16: ncu sections
# of the FP8 and bf16 up / dH / down / dx kernels at 120B-n2048, main's and sass's; ~2-3 min).
# Carry [".carry/s15sass", ".carry/s14epf", ".carry/blaslibs.tar.xz", ".carry/s16pb"] (~39 MB with the tree).
# Expected ~8 min; caps 330 + 120 + 240 s, the whole call within the 600 s limit.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
W="$(mktemp -d)" CARRY=.carry/s15sass timeout -k 5 330 bash -c "source bench/results/archive/2026-12-04-cpu-s15/sass.device.sh"
echo "sass fragment rc=$? (t=${SECONDS})"
W="$(mktemp -d)" CARRY=.carry/s14epf timeout -k 5 120 bash -c "source bench/results/archive/2026-12-04-h200-s14/epfp8.device.sh"
echo "epfp8 fragment rc=$? (t=${SECONDS})"
left=$((585 - SECONDS)); [ $left -gt 240 ] && left=240
W="$(mktemp -d)" CARRY=.carry/s15sass timeout -k 5 $left bash -c "source bench/results/archive/2026-12-05-cpu-s16/fp8prof.device.sh"
echo "fp8prof fragment rc=$? (t=${SECONDS})"
echo "done (t=${SECONDS})"
