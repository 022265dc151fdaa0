#!/usr/bin/env bash
# Prepared in session 29, for the next session: where dW1's consumers wait. Probe 9 (branch probe,
# probe9.patch: LEANMOE_PROBE=9) stamps clock64 in CTA 0 of each gather launch per k-tile (producer:
# empty wait returned, loads issued; consumer: full wait returned, after wgmma_wait<1>) and per tile
# (epilogue begin and end); leanmoe_bench_gemms writes the last launch's timeline_*.csv. dW1 and dW2
# at three rows, then timeline.py's summary. Also, under ncu at base clocks, the transposed-layout dW2
# on dW2's kernel with dw1t's transposed store (`--config dw2=gather:coop:128x256:s4:tma:c2`) against
# main's (dW1's 256x128 kernel): the one untimed case before a single varlen-K kernel could replace two.
# Carry [".carry/p9", ".carry/wgc/bg_new.xz", ".carry/wgc/bg_p0.xz"] (leanmoe_bench_gemms of the probe
# build, of dw1t 5835bd9 and of main, xz). ~90 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p9=.carry/p9/bg_p9.xz new=.carry/wgc/bg_new.xz p0=.carry/wgc/bg_p0.xz
say "$(cat .carry/p9/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
here=$PWD
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  (cd "$L" && timeout "$(cap 60)" "$B/p9" --shape $shape --gemms dw1,dw2 --iters 5 --warmup 2 > "bench_$shape.txt" 2>&1)
  say "$shape rc=$? $(grep -E '^\| ' "$L/bench_$shape.txt" | grep -v '^| shape' | tr '\n' ' ') (t=$SECONDS)"
done
python3 "$here/bench/results/archive/2026-12-06-h100-s29/timeline.py" "$L"/timeline_*.csv | tee -a "$S"
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  ncu_ms "${shape}_transposed_dw2_p0" p0 --shape $shape --layout transposed --gemms dw2
  ncu_ms "${shape}_transposed_dw2_t" new --shape $shape --layout transposed --gemms dw2 \
    --config dw2=gather:coop:128x256:s4:tma:c2
done
say "done t=$SECONDS"
