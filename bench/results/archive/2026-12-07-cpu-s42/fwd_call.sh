#!/usr/bin/env bash
# Session 42: the bf16 forward in expert groups (fwdgroups.patch, `leanmoe bench --fwd-overlap
# G[:S]`): each group's up on the GEMM stream leaving S SMs, its down on those S SMs beside the next
# group's up. Why: at n = 256 down and the gather-sum are DRAM-bound and up is compute-bound; the
# floor model (dev/layer_floor.py --overlapped) puts the forward 14-22% lower with them beside each
# other. The same binary (main + the folder's patches) with and without the flag, graph replays at
# the steady state, 2 rounds, variants rotated; the small rows first. Run after call.sh's
# ForwardOverlap tests passed. Carry [".carry/s42_layer"], bench/results/archive moved out. BUDGET=540.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/device_call.sh
unpack leanmoe=.carry/s42_layer/leanmoe_all.xz
header .carry/s42_layer/commit
declare -A V
V[off]=""
V[g4s16]="--fwd-overlap 4:16"
V[g2s24]="--fwd-overlap 2:24"
layer_rounds 2 7B-n256,1.4B-n256,olmoe-1b-7b,1.4B-n512 off g4s16 g2s24
say "done t=$SECONDS"
