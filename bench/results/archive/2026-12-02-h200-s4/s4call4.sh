#!/usr/bin/env bash
# Session 4, call 4: every kernel of one 120B-n2048 layer forward + backward (ncu, one launch each),
# and the same layer under nsys if the image has it.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
B=.carry/b
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes.sum --csv \
  $B/leanmoe bench --config 120B-n2048 --iters 1 --warmup 1 >"$W/ncu_layer.csv" 2>&1; echo "rc=$?"
python3 - "$W/ncu_layer.csv" <<'PY' | tee "$W/layer_kernels.txt"
import csv, sys, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[0] != "ID"]
out = {}
for r in rows:
    kid, name, metric, val = int(r[0]), r[4], r[-3], r[-1]
    out.setdefault(kid, {"name": name})[metric] = float(val.replace(",", ""))
print("id | kernel | us | GB")
for kid in sorted(out):
    o = out[kid]; n = re.sub(r"\(.*", "", o["name"])[:70]
    print(f"{kid} | {n} | {o.get('gpu__time_duration.sum', 0)/1000:.1f} | {o.get('dram__bytes.sum', 0)/1e9:.2f}")
PY
which nsys && timeout 100 nsys profile -o "$W/layer" --stats=true $B/leanmoe bench --config 120B-n2048 --iters 3 --warmup 1 >"$W/nsys.txt" 2>&1
tail -60 "$W/nsys.txt" 2>/dev/null | head -60
