#!/usr/bin/env bash
# Session 10, device call 6 (~30 s; issue 17): down's CUTLASS ping-pong 128x192 1x2 with CUTLASS's
# epilogue subtiles (64x32) against 64x64 and 64x96 in one harness (dev/cutlass_tiles, .carry/s10b).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
xz -dc .carry/s10b/cutlass_tiles.xz > /tmp/cutlass_tiles && chmod +x /tmp/cutlass_tiles
timeout 45 /tmp/cutlass_tiles --shapes grid --kinds down --only pp128x192c1x2 --raster m --iters 10 --warmup 2 \
  --sets 3 > "$FINAL/tiles_epi.log" 2>&1; echo "rc=$?"; grep -c WRONG "$FINAL/tiles_epi.log"
sed -n '/^== down/,$p' "$FINAL/tiles_epi.log"
