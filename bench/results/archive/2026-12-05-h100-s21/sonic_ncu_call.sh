#!/usr/bin/env bash
# Prepared in session 21 (not run): one forward + backward of SonicMoE and of leanmoe under ncu on the
# same GPU, kernel by kernel, time and DRAM bytes (is our dx, 9.77 ms on the H100, DRAM-bound where
# QuACK's is not?). Run right after `SETUP=1 CONFIGS=<rows incl. 120B-n2048,30B-n1024> bash bench/vs_sonic.sh`
# on the same warm machine (it leaves SonicMoE in /tmp/site, its kernels in /tmp/quack_cache and
# sonic_bench.py in /tmp/sonic_carry), carry [".carry/vs"] (scripts/prepare_carry.sh vs-sonic).
# Returns summary.txt (also on stdout: dev/ncu_vs_sonic.py tables) and ncu.tgz. ~4-6 min.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
trap '(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_* 2>/dev/null)' EXIT
[ -f /tmp/sonic_carry/sonic_bench.py ] && [ -d /tmp/site/sonicmoe ] || { say "SonicMoE not installed here: run SETUP first"; exit 1; }
xz -dc .carry/vs/leanmoe.xz > /tmp/lm_ncu && chmod +x /tmp/lm_ncu
source scripts/device_env.sh
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
say "leanmoe $(cat .carry/vs/commit); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
NCU=(ncu --clock-control none --metrics $M --csv --print-units base)
for c in ${CONFIGS:-120B-n2048 30B-n1024}; do
  say "== $c (t=$SECONDS)"; mkdir -p "$W/o_$c"
  CONFIGS=$c ITERS=1 WARM=1 ROUTER=topk_then_softmax OUT="$W/o_$c" timeout 200 \
    "${NCU[@]}" python3 /tmp/sonic_carry/sonic_bench.py > "$W/ncu_sonic_$c.csv" 2> "$W/ncu_sonic_$c.err"
  say "sonic rc=$? rows $(grep -c '^"' "$W/ncu_sonic_$c.csv")"
  timeout 90 "${NCU[@]}" /tmp/lm_ncu bench --config $c --router topk_then_softmax --iters 1 --warmup 1 \
    > "$W/ncu_leanmoe_$c.csv" 2> "$W/ncu_leanmoe_$c.err"
  say "leanmoe rc=$? rows $(grep -c '^"' "$W/ncu_leanmoe_$c.csv")"
  for m in gpu__time_duration.sum dram__bytes_read.sum dram__bytes_write.sum; do
    python3 dev/ncu_vs_sonic.py "$W/ncu_leanmoe_$c.csv" "$W/ncu_sonic_$c.csv" $m 2>&1 | tee -a $S
  done
done
say "== done (t=$SECONDS)"
