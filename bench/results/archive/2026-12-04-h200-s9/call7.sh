#!/usr/bin/env bash
# Session 9, device call 7 (one H200): per-kernel times (ncu, gpu__time_duration) of one leanmoe
# bench iteration, main at the session's start (742d6a7) and now (f095a52), at 7B-n256 and 120B-n512:
# call 6 found the layer's forward 2.7% / 3.2% slower there while down alone was faster.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; W="$(mktemp -d)"
B=/tmp/c7; mkdir -p $B
xz -dc .carry/s9a/leanmoe.xz > $B/leanmoe_old; xz -dc .carry/m5/leanmoe.xz > $B/leanmoe_new; chmod +x $B/*
for c in 7B-n256 120B-n512; do for v in old new; do
  timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $B/leanmoe_$v bench --config $c --router topk_then_softmax --iters 1 --warmup 1 >"$W/ncu_${v}_$c.csv" 2>"$W/ncu_${v}_$c.err"
  echo "$v $c rc=$?"
done; done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*)
for c in 7B-n256 120B-n512; do
  python3 - "$W/ncu_old_$c.csv" "$W/ncu_new_$c.csv" <<'PY'
import sys
sys.path.insert(0, "dev")
from ncu_kernel_times import kernel_times
o, n = kernel_times(sys.argv[1]), kernel_times(sys.argv[2])
print(f"== {sys.argv[1].split('ncu_old_')[1]}: old {sum(t for _, t in o):.1f} us, new {sum(t for _, t in n):.1f} us")
for i in range(max(len(o), len(n))):
    a = o[i] if i < len(o) else ("", 0); b = n[i] if i < len(n) else ("", 0)
    print(f"{a[1]:9.1f} {b[1]:9.1f}  {a[0][:60]:60} | {b[0][:60]}")
PY
done | tee "$FINAL/ncu_ab.txt"
