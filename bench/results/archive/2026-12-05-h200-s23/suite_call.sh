#!/usr/bin/env bash
# Session 23, on whichever part comes: the whole GPU suite of main (with the tests written after
# session 22's device time: LayerGemmConfigs.TileOrderKeepsOutputsBitwise, ExpertGemms.CutlassGridAboveTheSmCount,
# the changed LaunchersRefuseConfigsByName) and the dynamic tile scheduler (GemmConfig dyn: its test,
# down and dx timed and dx's DRAM bytes under ncu against the static stride), memcheck on those, then the drift test of
# docs/kernels.md "Clusters for down and dx by DRAM bandwidth" (call 1 measured the layer's GEMMs'
# DRAM bytes at T = 4096 vs 32768; this script's first version), then the layer with the fastest
# down and dx configurations of the timings vs the heuristic's. Carry [".carry/vs", ".carry/s23"]. Returns summary.txt,
# gpu_tests.log, logs.tar.gz. BUDGET seconds (default 540).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; : > $S
B=/tmp/s23; L=/tmp/s23-logs; rm -rf $B $L; mkdir -p $B $L
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-540}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
for x in leanmoe:vs/leanmoe.xz gt:s23/leanmoe_gpu_tests.xz bg:s23/leanmoe_bench_gemms.xz; do
  xz -dc .carry/${x#*:} > $B/${x%%:*} && chmod +x $B/${x%%:*} || say "MISSING ${x#*:}"
done
source scripts/device_env.sh
say "leanmoe $(cat .carry/vs/commit), tests $(cat .carry/s23/commit); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
timeout $(cap 60) $B/gt --gtest_filter='ExpertGemms.CutlassDynamicTilesMatchStatic' > $L/dyn_test.txt 2>&1
say "dyn test rc=$? $(grep -E '^\[  (PASSED|FAILED) |OK \]|FAILED  \]' $L/dyn_test.txt | tr '\n' ' ') (t=$SECONDS)"
P=cutlass:pingpong:128x192:auto:tma
# Tiles from a counter (dyn) against CUTLASS's static stride, and oversubscribed grids, dx and down alone.
CFG=""
for c in c1x2 c1x2:dyn c2:rN c2:rN:dyn c2:dyn c1x2:rN:dyn c1x2:m528 c2:rN:m528 c1x2:dyn:m128 c2:rN:dyn:m128; do CFG="$CFG,dx=$P:$c,down=$P:$c"; done
timeout $(cap 100) $B/bg --shape 120B-n2048,30B-n1024,gpt-oss-20b,olmoe-1b-7b --gemms down,dx --iters 10 --warmup 3 --config "${CFG#,}" > $L/ctas.txt 2>&1
say "down/dx by config rc=$?:"; grep -E '\| (down|dx) ' $L/ctas.txt | tee -a $S
M=gpu__time_duration.sum,dram__bytes_read.sum
CFG=""
for c in c1x2 c1x2:dyn c2:rN c2:rN:dyn c2:dyn; do CFG="$CFG,dx=$P:$c"; done
timeout $(cap 80) ncu --clock-control none --metrics $M --csv --print-units base -k regex:device_kernel \
  $B/bg --shape 120B-n2048 --gemms dx --iters 1 --warmup 0 --config "${CFG#,}" > $L/ncu_dyn.csv 2>&1
say "ncu dx 120B-n2048 rc=$? (configs in order: ${CFG#,}):"
python3 dev/ncu_kernel_times.py --whole --dram $L/ncu_dyn.csv | tee -a $S
# The layer, graph replays, alternating: the heuristic's kernels vs the fastest down and dx configuration
# timed above on that row (max_ctas left to the layer: 128 CTAs in the overlapped backward).
best() {  # row kind -> the fastest configuration of that kind on that row on the full grid, without its mK
  awk -F'|' -v r=" $1 " -v k=" $2 " '$2 == r && $9 == k && $10 !~ /:m(528|128) / {gsub(/ /, "", $10); gsub(/ /, "", $11); print $11, $10}' $L/ctas.txt |
    sort -g | head -1 | awk '{print $2}' | sed 's/:m[0-9]*$//'
}
layer_round() { local r=$1; for c in 120B-n2048 30B-n1024 gpt-oss-20b olmoe-1b-7b; do
  [ $((budget - SECONDS)) -lt 30 ] && return
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  dx=$(best $c dx); down=$(best $c down)
  for v in $([ $r = 1 ] && echo "default best" || echo "best default"); do
    extra=(); [ $v = best ] && [ -n "$dx" ] && [ -n "$down" ] && extra=(--gemm-config "dx=$dx,down=$down")
    timeout $(cap 45) $B/leanmoe bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      "${extra[@]}" --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
    say "layer r$r $c $v rc=$? ${extra[*]} (t=$SECONDS)"
  done
done; }
layer_round 1
NEW='ExpertGemms.CutlassDynamicTilesMatchStatic:LayerGemmConfigs.TileOrderKeepsOutputsBitwise:ExpertGemms.CutlassGridAboveTheSmCount:ExpertGemms.LaunchersRefuseConfigsByName'
timeout $(cap 90) compute-sanitizer --tool memcheck $B/gt --gtest_filter="$NEW" > $L/memcheck.txt 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/memcheck.txt | tr '\n' ' ') (t=$SECONDS)"
timeout $(cap 300) $B/gt > $FINAL/gpu_tests.log 2>&1; say "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $FINAL/gpu_tests.log | tr '\n' ' ') (t=$SECONDS)"
grep -E '^\[  FAILED  \]' $FINAL/gpu_tests.log | sort -u | tee -a $S
layer_round 2
python3 bench/layer_ab.py $L | tee -a $S
say "== done (t=$SECONDS)"
