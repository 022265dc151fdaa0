#!/usr/bin/env bash
# Prepared in session 29, for the next session: where dW1's consumers wait. Probe 9 (branch probe,
# probe9.patch: LEANMOE_PROBE=9) stamps clock64 in CTA 0 of each gather launch per k-tile (producer:
# empty wait returned, loads issued; consumer: full wait returned, after wgmma_wait<1>) and per tile
# (epilogue begin and end); leanmoe_bench_gemms writes the last launch's timeline_*.csv. dW1 and dW2
# at three rows, then timeline.py's summary. Carry [".carry/p9"] (leanmoe_bench_gemms of the probe
# build, xz). ~60 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack p9=.carry/p9/bg_p9.xz
say "$(cat .carry/p9/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
here=$PWD
for shape in 120B-n2048 30B-n1024 gpt-oss-20b; do
  (cd "$L" && timeout "$(cap 60)" "$B/p9" --shape $shape --gemms dw1,dw2 --iters 5 --warmup 2 > "bench_$shape.txt" 2>&1)
  say "$shape rc=$? $(grep -E '^\| ' "$L/bench_$shape.txt" | grep -v '^| shape' | tr '\n' ' ') (t=$SECONDS)"
done
python3 "$here/bench/results/archive/2026-12-06-h100-s29/timeline.py" "$L"/timeline_*.csv | tee -a "$S"
say "done t=$SECONDS"
