#!/usr/bin/env bash
# Session 14, device call 1 (issue 16): branch fp8wgrad ac7cb1e (hardware e4m3 convert in every
# quantizing kernel, rewritten transposed column pass; dW1/dW2 in FP8) and branch fp8torch2 ac5fa7b
# (the adamw_step_ segfault: a front built here by one compiler, each error path in its own process).
# Carry [".carry/s14wg", ".carry/s14t2", ".carry/blaslibs.tar.xz"] (= /work/wt/fp8wgrad.carry, /work/wt/fp8torch2.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
OUTD="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$OUTD"
source scripts/device_env.sh
D=bench/results/archive/2026-12-04-h200-s14
W="$(mktemp -d)"; CARRY=.carry/s14wg; FINAL="$OUTD"
source $D/fp8wgrad.device.sh
W="$(mktemp -d)"; CARRY=.carry/s14t2; FINAL="$OUTD"
source $D/fp8torch2.device.sh
echo "done (t=${SECONDS})"
