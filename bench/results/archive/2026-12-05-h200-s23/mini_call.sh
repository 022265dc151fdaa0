#!/usr/bin/env bash
# Session 23, the smallest call that says whether tiles from a counter (dyn) are right and pay, for
# a device budget of ~150 s of command: the bitwise test and its memcheck, down and dx alone
# (static vs dyn, 1x2 along M and 2x1 along N) on 120B-n2048 and 30B-n1024, and dx's DRAM bytes under
# ncu at 120B-n2048. Carry [".carry/s23"]. Returns summary.txt, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; : > $S
B=/tmp/s23; L=/tmp/s23-logs; rm -rf $B $L; mkdir -p $B $L
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
say() { echo "$*" | tee -a $S; }
for x in gt:s23/leanmoe_gpu_tests.xz bg:s23/leanmoe_bench_gemms.xz; do
  xz -dc .carry/${x#*:} > $B/${x%%:*} && chmod +x $B/${x%%:*} || say "MISSING ${x#*:}"
done
source scripts/device_env.sh
say "tests/bench $(cat .carry/s23/commit); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout 40 $B/gt --gtest_filter='ExpertGemms.CutlassDynamicTilesMatchStatic' > $L/dyn_test.txt 2>&1
say "dyn test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/dyn_test.txt | tr '\n' ' ') (t=$SECONDS)"
P=cutlass:pingpong:128x192:auto:tma
CFG=""
for c in c1x2 c1x2:dyn c2:rN c2:rN:dyn c2:dyn; do CFG="$CFG,dx=$P:$c,down=$P:$c"; done
timeout 50 $B/bg --shape 120B-n2048,30B-n1024 --gemms down,dx --iters 10 --warmup 3 --config "${CFG#,}" > $L/gemms.txt 2>&1
say "down/dx rc=$?:"; grep -E '\| (down|dx) ' $L/gemms.txt | tee -a $S
M=gpu__time_duration.sum,dram__bytes_read.sum
CFG=""
for c in c1x2 c1x2:dyn c2:rN c2:rN:dyn; do CFG="$CFG,dx=$P:$c"; done
timeout 45 ncu --clock-control none --metrics $M --csv --print-units base -k regex:device_kernel \
  $B/bg --shape 120B-n2048 --gemms dx --iters 1 --warmup 0 --config "${CFG#,}" > $L/ncu_dyn.csv 2>&1
say "ncu dx 120B-n2048 rc=$? (in order: ${CFG#,}):"
python3 dev/ncu_kernel_times.py --whole --dram $L/ncu_dyn.csv | tee -a $S
timeout 40 compute-sanitizer --tool memcheck $B/gt --gtest_filter='ExpertGemms.CutlassDynamicTilesMatchStatic' > $L/memcheck.txt 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck.txt | tr '\n' ' ') (t=$SECONDS)"
