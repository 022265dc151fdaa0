#!/usr/bin/env bash
# Session 17, device call 3 (on the warm machine after call 2): the layer, base (main 59cf971's leanmoe)
# vs combo (e9348a6), alternating, two rounds, 4 rows, bf16 and fp8 (fwd / bwd ms from `leanmoe bench`),
# and dw2 alone again (call 2: +7% at 120B-n2048; DW2=0 skips it). Carry .carry/s17c3. stdout only.
# (first run printed no layer rows: its grep looked for a table, the CLI prints columns.)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_env.sh
C=.carry/s17c3; B=/tmp/s17c3; mkdir -p $B
for f in leanmoe leanmoe_base leanmoe_bench_gemms leanmoe_bench_gemms_base; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f; done
for r in 1 2; do
  for row in 120B-n2048 30B-n512 olmoe-1b-7b 7B-n256; do
    for p in bf16 fp8; do
      for v in leanmoe_base leanmoe; do
        echo "## r$r $row $p $v"
        timeout 40 $B/$v bench --config $row --precision $p --iters 20 --warmup 5 2>&1 | grep -E "^(120B|30B|olmoe|7B)|rror"
      done
    done
  done
done
[ "${DW2:-1}" = 1 ] && for r in 1 2; do for v in leanmoe_bench_gemms_base leanmoe_bench_gemms; do
  echo "## dw2 r$r $v"; timeout 30 $B/$v --shape 120B-n2048,olmoe-1b-7b --gemms dw2,dw1 | grep -E "^\| [0-9a-z]"
done; done
echo "done (t=$SECONDS)"
