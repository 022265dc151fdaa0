#!/usr/bin/env bash
# Session 14, device call 2 (issue 16): branch fp8step 168a484 (merged into main): bf16 moments in
# leanmoe's fused update, kept by ExpertAdamW for fp8 layers as torch keeps them for bf16 layers.
# Carry [".carry/s14st", ".carry/blaslibs.tar.xz"] (= /work/wt/fp8step.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
W="$(mktemp -d)"; CARRY=.carry/s14st
source bench/results/archive/2026-12-04-h200-s14/fp8step.device.sh
echo "done (t=${SECONDS})"
