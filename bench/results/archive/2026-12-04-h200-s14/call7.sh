#!/usr/bin/env bash
# Session 14, device call 7 (issue 16): branch epfp8 c8526aa: the expert-parallel layer in FP8 on
# CUDA (P ranks on one GPU) against the single-GPU FP8 layer; memcheck on the FP8 EP tests.
# Carry [".carry/s14epf", ".carry/blaslibs.tar.xz"] (= /work/wt/epfp8.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
W="$(mktemp -d)"; CARRY=.carry/s14epf
source bench/results/archive/2026-12-04-h200-s14/epfp8.device.sh
echo "done (t=${SECONDS})"
