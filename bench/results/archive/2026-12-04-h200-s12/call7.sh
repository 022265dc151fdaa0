#!/usr/bin/env bash
# Session 12, device call 7 (issue 16): branch fp8weights's fragment (.carry/fp8weights, commit inside): the
# FP8 layer taking the weights' codes (MoEWeights::fp8, from the optimizer's copy) instead of quantizing
# per call: tests, memcheck, layer bench storage vs fp8 given vs fp8 per-call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=fp8weights/fp8weights . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/fp8weights"
CARRY=.carry/fp8weights W="$W/fp8weights" FINAL="$FINAL" timeout 330 \
  bash bench/results/archive/2026-12-04-h200-s12/fp8weights.device.sh 2>&1 | tee "$W/fp8weights.log" | tail -40
echo "done (t=${SECONDS})"
