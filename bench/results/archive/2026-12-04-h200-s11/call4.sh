#!/usr/bin/env bash
# Session 11, device call 4 (issue 15): helper branch trspeed (1db097a): token rounding's speed on the four
# sparse rows against a measured padding-free bound (leanmoe bench --routing balanced), and ncu per kernel
# at sparse-T8k for top-K, nearest and balanced. Carry: .carry/trspeed (copy of /work/wt/trspeed.carry).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
CARRY=.carry/trspeed W="$(mktemp -d)" FINAL="$FINAL" bash bench/results/archive/2026-12-04-h200-s11/trspeed.device.sh
