#!/usr/bin/env bash
# Session 29: the layer with wgepi's dW epilogue (one 64x32 TMA store per chunk of a consumer
# warpgroup's slice) against main, as graph replays at the steady state, rotating order, 3 rounds at
# four rows. Carry [".carry/wgl"] (the leanmoe CLI of wgepi 2ea9d99 and of main 2845cbb, xz).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe_new=.carry/wgl/leanmoe_new.xz leanmoe_p0=.carry/wgl/leanmoe_p0.xz
say "$(cat .carry/wgl/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
declare -A V=([p0]="" [new]="")
layer_rounds 3 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b p0 new
say "done t=$SECONDS"
