#!/usr/bin/env bash
# Session 14, device call 3 (issue 17): branch dw1xt 063fac5 (dW1 in QuACK's orientation ':xt', wait
# peeks ':pk', dw2 at 256x128) and branch downpp af2e618 (down/dx on the gather kernel, ping-pong
# 128x192), each fragment under its own time cap.
# Carry [".carry/s14xt", ".carry/s14pp", ".carry/blaslibs.tar.xz"] (= /work/wt/dw1xt.carry, /work/wt/downpp.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
export FINAL
D=bench/results/archive/2026-12-04-h200-s14
W="$(mktemp -d)" CARRY=.carry/s14xt timeout -k 5 215 bash -c "source $D/dw1xt.device.sh"; echo "dw1xt rc=$? (t=${SECONDS})"
W="$(mktemp -d)" CARRY=.carry/s14pp timeout -k 5 190 bash -c "source $D/downpp.device.sh"; echo "downpp rc=$? (t=${SECONDS})"
echo "done (t=${SECONDS})"
