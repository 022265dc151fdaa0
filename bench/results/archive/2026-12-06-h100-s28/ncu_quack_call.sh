#!/usr/bin/env bash
# Session 28: QuACK's varlen-K kernels (SonicMoE's dW1, dW2; also its down and dx) under `ncu --set
# full` at 120B-n2048, to set beside ours (s27 call 3, the same ncu flags, base clocks): their
# per-instruction stall samples and the details page. Carry [".carry/sonicmoe",
# ".carry/vs/quack_cache.tar.xz"], bench/results/archive moved out of the tree for the call (over 64 MiB
# with it). Returns summary.txt and ncu.tar.gz (per kernel: details CSV, the top of the source page,
# the source page gzipped).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." 2>/dev/null || true
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; : > "$S"
N="$(mktemp -d)"
trap 'tar czf "$FINAL/ncu.tar.gz" -C "$N" . 2>/dev/null' EXIT
say() { echo "$*" | tee -a "$S"; }
say "$(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader); $(ncu --version | tail -1)"
mkdir -p /tmp/site && tar xJf .carry/sonicmoe/lb.tar.xz -C /tmp/site &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/sonicmoe/*.whl > "$N/install.log" 2>&1
say "install rc=$? (t=$SECONDS)"
tar xJf .carry/vs/quack_cache.tar.xz -C /tmp
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages QUACK_CACHE_DIR=/tmp/quack_cache QUACK_CACHE_AUTOTUNING=1
ROW="${ROW:-120B-n2048}"
CONFIGS=$ROW WARM=0 ITERS=1 OUT=/tmp timeout 400 ncu --set full --import-source no -k regex:quackgemm_default_epi -c 6 \
  -o /tmp/r_quack python3 .carry/sonicmoe/sonic_bench.py > "$N/ncu.log" 2>&1
say "ncu rc=$? (t=$SECONDS)"
grep -E '==PROF==|error|Error' "$N/ncu.log" | cut -c1-300 | head -20 | tee -a "$S"
ncu -i /tmp/r_quack.ncu-rep --page details --csv > "$N/details.csv" 2>&1
python3 - "$N/details.csv" <<'PY' | tee -a "$S"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]; ix = {k: h.index(k) for k in h}
want = ["Duration", "SM Frequency", "Compute (SM) Throughput", "Memory Throughput", "L2 Hit Rate", "DRAM Throughput",
        "L1/TEX Cache Throughput", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Grid Size", "Cluster Size",
        "Executed Ipc Active", "Issue Slots Busy", "Theoretical Occupancy"]
seen = {}
for r in rows[1:]:
    if len(r) != len(h): continue
    k = (r[ix["ID"]], r[ix["Kernel Name"]][:90])
    if r[ix["Metric Name"]] in want:
        seen.setdefault(k, []).append(f'{r[ix["Metric Name"]]}={r[ix["Metric Value"]]}{r[ix["Metric Unit"]]}')
for k, v in seen.items(): print(k[0], k[1], "\n   ", "; ".join(v))
PY
for i in 0 1 2 3 4 5; do
  ncu -i /tmp/r_quack.ncu-rep --page source --csv --print-source sass --launch-skip $i --launch-count 1 > "$N/src_$i.csv" 2>"$N/src_$i.err"
  [ -s "$N/src_$i.csv" ] || continue
  python3 bench/ncu_source_summary.py "$N/src_$i.csv" --top 60 > "$N/sass_top_$i.txt" 2>&1
  say "kernel $i: $(head -1 "$N/sass_top_$i.txt")"; head -14 "$N/sass_top_$i.txt" | tail -12 | cut -c1-160 | tee -a "$S"
  gzip -9 "$N/src_$i.csv"
done
ls -la /tmp/r_quack.ncu-rep | tee -a "$S"
xz -T0 -6 -c /tmp/r_quack.ncu-rep > "$FINAL/r_quack.ncu-rep.xz" && ls -la "$FINAL" | tee -a "$S"
say "done t=$SECONDS"
