#!/usr/bin/env bash
# Session 22: one 120B-n2048 forward + backward of the old (4e0f7fb) and new leanmoe under ncu, every
# kernel alone, time and DRAM bytes read per step (dev/ncu_vs_sonic.py A B METRIC leanmoe).
# Why: the new heuristic took dx from 10.3 to 7.5 ms alone, but the layer's backward only 25.5 -> 24.9.
# Then the drift test below. Carry [".carry/vs", ".carry/s22"]. Returns summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; W=$(mktemp -d)
xz -dc .carry/s22/leanmoe_old.xz > $W/old && xz -dc .carry/vs/leanmoe.xz > $W/new && chmod +x $W/old $W/new
source scripts/device_env.sh
M=gpu__time_duration.sum,dram__bytes_read.sum
for v in old new; do
  timeout 80 ncu --clock-control none --metrics $M --csv --print-units base $W/$v bench --config 120B-n2048 \
    --router topk_then_softmax --iters 1 --warmup 1 > $W/ncu_$v.csv 2> $W/ncu_$v.err
done
for m in gpu__time_duration.sum dram__bytes_read.sum; do
  python3 dev/ncu_vs_sonic.py $W/ncu_new.csv $W/ncu_old.csv $m leanmoe 2>&1 | sed 's/SonicMoE/old/g; s/leanmoe - old/new - old/' | tee -a $S
done
# Drift: the persistent GEMMs stride by the grid (tile t, t + CTAs, ...), so over a long run the CTAs'
# positions in the tile order spread apart and the tiles in flight stop sharing operands. If so, DRAM
# bytes per FLOP grow with the tiles each CTA runs: the same expert shapes (d 4096, n 2048, E 64,
# K 4) at T = 4096 (~21 dx tiles per CTA) and 32768 (~170), old and new builds, GB read per GFLOP.
for v in old new; do for T in 4096 32768; do
  timeout 60 ncu --clock-control none --metrics $M --csv --print-units base -k regex:'device_kernel|gather_grouped' \
    $W/$v bench --T $T --d 4096 --n 2048 --E 64 --K 4 --router topk_then_softmax --iters 1 --warmup 1 > $W/drift_${v}_$T.csv 2>&1
  python3 - $W/drift_${v}_$T.csv $v $T <<'PY' | tee -a $S
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows: sys.exit(print(sys.argv[2], "T", sys.argv[3], "no ncu rows"))
h = rows[0]; k, m, v, i = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
per = {}
for r in rows[1:]: per.setdefault(r[i], [r[k][:40], {}])[1][r[m]] = float(r[v].replace(",", ""))
T = int(sys.argv[3]); flop = 2 * T * 4 * 4096 * 4096  # one 2n x d GEMM per routed row (up, dx, dW1)
print(sys.argv[2], "T", T, "; ".join(f"{kid} {name}: {x['gpu__time_duration.sum']/1e3:.0f} us {x['dram__bytes_read.sum']/1e9:.2f} GB {x['dram__bytes_read.sum']/flop*1e3:.2f} B/kFLOP(2n.d)" for kid, (name, x) in per.items()))
PY
done; done
