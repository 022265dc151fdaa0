#!/usr/bin/env bash
# Prepared in session 15 (no GPU that session), NOT RUN yet. Run after gpu_call1.sh passed for sass.
# branch dhepi2 d017d0d (issue 17, on top of sass): the dH (and up, dW) epilogue's instruction diet,
# 37.1 -> 26.4 SASS instructions per accumulator element in the default dH kernel (QuACK's 22.4-24.8),
# meant bit-identical: GPU tests (ExpertGemms.*, ExpertGemmsFp8.*, CudaBackend*), memcheck +
# racecheck, output digests base (sass) vs new on 12 cases, ncu instructions, bench dh,up base vs new
# (dhepi2.device.sh, ~4 min). Carry [".carry/s15dh", ".carry/blaslibs.tar.xz"] (= /work/wt/dhepi2.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
W="$(mktemp -d)" CARRY=.carry/s15dh timeout -k 5 540 bash -c "source bench/results/archive/2026-12-04-cpu-s15/dhepi2.device.sh"
echo "dhepi2 fragment rc=$? (t=${SECONDS})"
