#!/usr/bin/env bash
# Prepared in session 27, not run (no device time left): what the gathered rows' scattered addresses
# cost. The gather kernels (up, dH, dW2, dW1) alone under uniform top-K routing and under
# `--routing contiguous` (every expert's rows runs of consecutive tokens: the gathered X / dO rows
# read in address order), the same shapes, 2 rounds, routings by turns. If dW1 at contiguous routing
# closes most of its gap to QuACK, the gathered loads' latency is the limit; if not, the per-k-tile
# path (docs/kernels.md "Up in clusters, dW2 at 128x192, 32-deep dW k-tiles"). ~150 s.
# Carry [".carry/diag"] (bg.xz = leanmoe_bench_gemms of main at or after the --routing commit, commit).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack bg=.carry/diag/bg.xz
say "routing diag $(cat .carry/diag/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
for r in uniform contiguous contiguous uniform; do
  timeout "$(cap 60)" "$B/bg" --shape 120B-n2048,gpt-oss-20b,olmoe-1b-7b --gemms dw2,up,dh,dw1 --routing $r --iters 20 \
    --warmup 3 --warm-seconds 2 > "$L/$r.txt" 2>&1
  say "$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/$r.txt" | grep -v '^| shape' | tee -a "$S"
done
