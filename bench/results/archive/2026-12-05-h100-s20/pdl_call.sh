#!/usr/bin/env bash
# Prepared in session 20 (not run): branch pdl (chained launches, docs/kernels.md "Kernel boundaries")
# against its base on one device call. Carry [".carry/pdl", ".carry/blaslibs.tar.xz"]; .carry/pdl
# holds leanmoe_new.xz and leanmoe_gpu_tests.xz (pdl), leanmoe_base.xz (its base), commit, commit_base
# (see the s20 README for how to make them). Most needed first (a cut call keeps what it wrote):
#   1. pdl's whole GPU suite (every kernel it chains runs there, eager and captured in graphs);
#   2. `leanmoe check --device cuda`, base and new: the printed errors must be identical (PDL changes
#      when kernels start, not what they compute);
#   3. the layer, base vs new alternating (round 2 new first), graph replays and eager, 3 rounds, on
#      1.4B-n256, 7B-n256 (where the boundaries are the largest share) and 120B-n2048;
#   4. memcheck and racecheck on the layer and routing tests (synccheck too: griddepcontrol).
# BUDGET (default 560) seconds in all. Returns summary.txt (also on stdout), gpu_tests.log, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/pdl; B=/tmp/pdl; L=/tmp/pdl-logs; rm -rf $B $L; mkdir -p $B $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-560}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
trap 'tar czf $FINAL/logs.tar.gz -C $L . 2>/dev/null' EXIT
for f in leanmoe_new leanmoe_base leanmoe_gpu_tests; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || say "MISSING $f"; done
source scripts/device_env.sh
say "new $(cat $C/commit), base $(cat $C/commit_base); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "== 1. GPU suite (t=$SECONDS)"
timeout $(cap 240) $B/leanmoe_gpu_tests --gtest_brief=1 > $FINAL/gpu_tests.log 2>&1
say "gpu tests rc=$? (t=$SECONDS)"; grep -E "^\[  FAILED|PASSED|FAILED TEST|Failure" $FINAL/gpu_tests.log | head -20 | tee -a $S
say "== 2. check, base vs new (t=$SECONDS)"
for v in base new; do timeout $(cap 60) $B/leanmoe_$v check --device cuda --seeds 1 > $L/check_$v.txt 2>&1; say "check $v rc=$?"; done
if cmp -s $L/check_base.txt $L/check_new.txt; then say "check: IDENTICAL ($(wc -l < $L/check_new.txt) lines)";
else say "check: DIFFER"; diff $L/check_base.txt $L/check_new.txt | head -20 | tee -a $S; fi
say "== 3. layer base vs new, graph replays and eager, three rounds (t=$SECONDS)"
for r in 1 2 3; do for c in 1.4B-n256 7B-n256 120B-n2048; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  order="base new"; [ $r = 2 ] && order="new base"
  for v in $order; do
    timeout $(cap 40) $B/leanmoe_$v bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
    say "r$r $c $v rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print({k: v for k, v in r.items() if 'ms' in k and not k.endswith('_all')})" $L/layer_r${r}_${c}_$v.json 2>&1 | tail -1)"
  done
done; done
say "== 4. sanitizers (t=$SECONDS)"
F='CudaBackend.TopKRaggedBothConventions:CudaBackend.EmptyExpertAndHotExpert:CudaBackend.TokensNotAMultipleOfTheTile:CudaBackend.SingleToken:CudaRouting*:CudaRoutingGiven.CaptureIntoOneGraph'
for tool in memcheck racecheck synccheck; do
  timeout $(cap 60) compute-sanitizer --tool $tool --error-exitcode 9 $B/leanmoe_gpu_tests --gtest_brief=1 --gtest_filter="$F" \
    > $L/$tool.log 2>&1
  say "$tool rc=$? (t=$SECONDS) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $L/$tool.log | tr '\n' ' ')"
done
say "== done (t=$SECONDS)"
