#!/usr/bin/env bash
# Session 8, device call 1 (one H200, at most 10 minutes): SonicMoE alone. Its kernels compiled and
# autotuned for 7B-n256 and 120B-n2048 (sonic_bench.py, GRAPH=1), then per-kernel times of one of
# its forward + backward under ncu at both shapes (issue 17: where the peer's time goes, kernel by
# kernel, beside leanmoe's from session 7's ncu), and its kernel cache packed for later calls.
# Carry: .carry/sonicmoe (a copy of ../shared/anchors/sonicmoe).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=quack_cache.tar.xz . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1 || cat "$W/install.log"
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
mkdir -p /tmp/quack_cache
echo "== sonic_bench (t=${SECONDS})"
GRAPH=1 CONFIGS=7B-n256,120B-n2048 ROUTER=topk_then_softmax OUT="$W" PYTHONUNBUFFERED=1 \
  timeout 430 python3 $S/sonic_bench.py >"$W/sonic.log" 2>&1; echo "sonic rc=$?"
grep '^{' "$W/sonic.log" | cut -c1-400; cp "$W/sonic.json" "$FINAL/" 2>/dev/null
for c in 7B-n256 120B-n2048; do
  [ $SECONDS -lt 440 ] || break
  echo "== ncu $c (t=${SECONDS})"
  mkdir -p "$W/ncu_$c"
  CONFIGS=$c ITERS=1 WARM=0 ROUTER=topk_then_softmax OUT="$W/ncu_$c" timeout 100 ncu --clock-control none \
    --metrics gpu__time_duration.sum --csv --print-units base python3 $S/sonic_bench.py \
    >"$W/ncu_sonic_$c.csv" 2>"$W/ncu_sonic_$c.err" || true
  grep -c '^"' "$W/ncu_sonic_$c.csv"
  cp "$W/ncu_sonic_$c.csv" "$FINAL/"
done
echo "== cache (t=${SECONDS}): $(find /tmp/quack_cache -type f | wc -l) files, $(du -sh /tmp/quack_cache | cut -f1)"
tar cf - -C /tmp quack_cache | XZ_OPT="-T0 -6" timeout 40 xz >"$FINAL/quack_cache.tar.xz"; ls -la "$FINAL"
echo "done (t=${SECONDS})"
