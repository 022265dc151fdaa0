#!/usr/bin/env bash
# Session 43: everything the next device session carries, in one command on a CPU machine with nvcc
# (about 25 min cold on 2 cores):
#   .carry/s42, .carry/s42_layer  s42's prepare.sh (main and main + s42's three patches), with this
#                                 folder's call.sh as .carry/s42/call.sh (the one merged call);
#   .carry/vs, .carry/sonicmoe    the H200 side-by-side beside SonicMoE (bench/vs_sonic.sh): main's
#                                 CLI from the same build, the anchor script, s21's SonicMoE cache.
# Then, bench/results/archive moved out of the tree first:
#   1. BUDGET=540 bash .carry/s42/call.sh, carry [".carry/s42", ".carry/s42_layer/leanmoe_all.xz"];
#   2. on an H200, two calls within 30 s of each other (the machine is released after 30 s idle):
#      SETUP=1 CONFIGS=$ROWS DEADLINE=300 bash bench/vs_sonic.sh, carry [".carry/sonicmoe", ".carry/vs/quack_cache.tar.xz"];
#      SONIC_CARRY=/tmp/sonic_carry STEADY=1 ROUNDS=2 CONFIGS=$ROWS DEADLINE=540 bash bench/vs_sonic.sh, carry [".carry/vs"].
# Usage: bash bench/results/archive/2026-12-08-cpu-s43/prepare.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
cd "$root"
bash bench/results/archive/2026-12-07-cpu-s42/prepare.sh
cp "$here/call.sh" .carry/s42/call.sh
rm -rf .carry/vs .carry/sonicmoe
mkdir -p .carry/vs
xz -T2 -9 -c /tmp/leanmoe-s42-main/build-device/leanmoe > .carry/vs/leanmoe.xz
git rev-parse --short=12 HEAD > .carry/vs/commit
cp ../shared/anchors/torch_moe_baseline.py .carry/vs/
cp bench/results/archive/2026-12-05-h100-s21/quack_cache.tar.xz .carry/vs/
cp -r ../shared/anchors/sonicmoe .carry/sonicmoe && chmod -R u+w .carry/sonicmoe
du -sh .carry/s42 .carry/s42_layer .carry/vs .carry/sonicmoe
