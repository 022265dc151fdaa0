#!/usr/bin/env bash
# Session 13, device call 5 (issue 16): branch fp8torch (the PyTorch front keeps the weights' FP8 codes,
# written by ExpertAdamW's fused update): the fragment fp8torch.device.sh beside this script, run from a
# checkout of that branch (its python/ and bench/torch_fp8_step.py). Carry [".carry/s13ft",
# ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; CARRY=.carry/s13ft
source scripts/device_env.sh
source bench/results/archive/2026-12-04-h200-s13/fp8torch.device.sh
echo "done (t=${SECONDS})"
