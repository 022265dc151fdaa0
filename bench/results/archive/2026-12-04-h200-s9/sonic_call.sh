#!/usr/bin/env bash
# Session 9, prepared device call (one H200, at most 10 minutes; not run): SonicMoE compiled and timed (eager and
# CUDA-graph replays) at 7B-n256 and 120B-n2048, leanmoe main (742d6a7) beside it in the same call,
# then per-kernel times under ncu of one SonicMoE forward + backward at 7B-n256 and of leanmoe at
# both shapes (issue 17: where the peer's time goes, kernel by kernel), and SonicMoE's kernel cache
# packed for later calls.
# Carry: .carry/sonicmoe (a copy of ../shared/anchors/sonicmoe), .carry/s9a (leanmoe linked with
# static OpenBLAS, stripped, xz; its commit).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=quack_cache.tar.xz . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
xz -dc .carry/s9a/leanmoe.xz > /tmp/leanmoe && chmod +x /tmp/leanmoe
mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1 || cat "$W/install.log"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
mkdir -p /tmp/quack_cache
echo "== sonic_bench (t=${SECONDS})"
GRAPH=1 CONFIGS=7B-n256,120B-n2048 ROUTER=topk_then_softmax OUT="$W" PYTHONUNBUFFERED=1 \
  timeout 430 python3 $S/sonic_bench.py >"$W/sonic.log" 2>&1; echo "sonic rc=$?"
grep '^{' "$W/sonic.log" | cut -c1-600; cp "$W/sonic.json" "$FINAL/" 2>/dev/null
echo "== leanmoe (t=${SECONDS})"
for c in 7B-n256 120B-n2048; do
  timeout 40 /tmp/leanmoe bench --config $c --router topk_then_softmax --graph --iters 10 --warmup 3 \
    --json "$W/leanmoe_$c.json" 2>&1 | grep -v '^\[' | tail -3
done
python3 - "$W" <<'PY' > "$FINAL/leanmoe.json"
import json, sys, glob
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/leanmoe_*.json")):
    d = json.load(open(f)); rows += d["results"]; head = d
head["results"] = rows; print(json.dumps(head, indent=1))
PY
if [ $SECONDS -lt 470 ]; then
  echo "== ncu sonic 7B-n256 (t=${SECONDS})"
  CONFIGS=7B-n256 ITERS=1 WARM=0 ROUTER=topk_then_softmax OUT="$W/ncu_sonic" timeout $((540 - SECONDS)) ncu --clock-control none \
    --metrics gpu__time_duration.sum --csv --print-units base python3 $S/sonic_bench.py \
    >"$W/ncu_sonic_7B-n256.csv" 2>"$W/ncu_sonic_7B-n256.err"; echo "rc=$?"
  grep -c '^"' "$W/ncu_sonic_7B-n256.csv"
fi
for c in 120B-n2048 7B-n256; do
  [ $SECONDS -lt 545 ] || break
  echo "== ncu leanmoe $c (t=${SECONDS})"
  timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    /tmp/leanmoe bench --config $c --router topk_then_softmax --iters 1 --warmup 1 >"$W/ncu_leanmoe_$c.csv" 2>"$W/ncu_leanmoe_$c.err"
  echo "rc=$?"; python3 dev/ncu_kernel_times.py "$W/ncu_leanmoe_$c.csv" | head -3
done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv 2>/dev/null)
echo "== cache (t=${SECONDS}): $(find /tmp/quack_cache -type f | wc -l) files, $(du -sh /tmp/quack_cache | cut -f1)"
tar cf - -C /tmp quack_cache | XZ_OPT="-T0 -6" timeout 25 xz >"$FINAL/quack_cache.tar.xz"; ls -la "$FINAL"
echo "done (t=${SECONDS})"
