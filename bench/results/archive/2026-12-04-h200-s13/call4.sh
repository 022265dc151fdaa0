#!/usr/bin/env bash
# Session 13, device call 4 (issue 17): branch dw1feed c15c159, QuACK's producer organisation for dW1 /
# dW2 as compiled variants (rot, nf, rotnf): tests, sanitizers, benches; the fragment
# dw1feed.device.sh beside this script. Carry [".carry/s13df", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; CARRY=.carry/s13df
source scripts/device_env.sh
source bench/results/archive/2026-12-04-h200-s13/dw1feed.device.sh
echo "done (t=${SECONDS})"
