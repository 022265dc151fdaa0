#!/usr/bin/env bash
# Session 11, device call 7 (issue 17): leanmoe main 7eeec6a (down's 64x64 epilogue subtiles at n <= 256,
# dW1's wide producer, the merged router kernel; .carry/s11e) beside SonicMoE (its kernel cache .carry/qc, no
# compile) in one call, both as CUDA-graph replays and eager, at 7B-n256 and 120B-n2048.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
xz -dc .carry/s11e/leanmoe.xz > /tmp/leanmoe && chmod +x /tmp/leanmoe; echo "leanmoe $(cat .carry/s11e/commit)"
[ -d /tmp/site/sonicmoe ] || { mkdir -p /tmp/site && tar xJf $S/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $S/*.whl >"$W/install.log" 2>&1; }
[ -d /tmp/quack_cache ] || xz -dc .carry/qc/quack_cache.tar.xz | tar xf - -C /tmp
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
for c in 7B-n256 120B-n2048; do
  echo "== leanmoe $c (t=${SECONDS})"
  timeout 60 /tmp/leanmoe bench --config $c --router topk_then_softmax --graph --iters 10 --warmup 3 \
    --json "$W/leanmoe_$c.json" 2>&1 | grep -v '^\[' | tail -3
  echo "== sonic $c (t=${SECONDS})"; mkdir -p "$W/s_$c"
  GRAPH=1 CONFIGS=$c ROUTER=topk_then_softmax OUT="$W/s_$c" PYTHONUNBUFFERED=1 timeout 150 \
    python3 $S/sonic_bench.py > "$W/sonic_$c.log" 2>&1; echo "rc=$?"; grep '^{' "$W/sonic_$c.log" | cut -c1-600
  cp "$W/s_$c/sonic.json" "$FINAL/sonic_$c.json" 2>/dev/null; cp "$W/leanmoe_$c.json" "$FINAL/" 2>/dev/null
done
echo "done (t=${SECONDS})"
