#!/usr/bin/env bash
# Session 12, device call 2 (issue 17), right after call 2a on the same warm machine: leanmoe main
# (.carry/vs: the binary, its commit, SonicMoE's kernel cache for 7B-n256 and 120B-n2048) beside
# SonicMoE (installed by call 2a) at the GPU's steady state, alternating per row, two rounds
# (bench/vs_sonic.sh STEADY=1: ~3 s of warm-up per run, past the power ramp).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
[ -d /tmp/site/sonicmoe ] || { echo "call 2a's install is gone (the machine was released)"; exit 1; }
SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=2 CONFIGS=7B-n256,120B-n2048 DEADLINE=560 bash bench/vs_sonic.sh
