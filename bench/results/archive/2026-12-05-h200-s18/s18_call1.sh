#!/usr/bin/env bash
# Session 18, device call 1 (carry [".carry/s18", ".carry/blaslibs.tar.xz"]; the binaries and the python
# front unpacked in /tmp/s18), alone on the GPU, the most needed first (a cut call keeps what it wrote to $OUT):
#   1. the whole GPU suite of gsum (main + gsum.patch);
#   2. the python suite on CUDA (the front built here against torch 2.11.0+cu130 and gsum's core;
#      sessions 15-17's python changes had run on the CPU only);
#   3. gather_sum_kernel's time under ncu, base (main 1dfa407: one row at a time) vs new (gsum: four
#      rows loaded before they are summed), forward aggregate and backward dx, 4 rows;
#   4. `leanmoe check --device cuda` with both binaries: the printed errors must be identical
#      (the sum's order is unchanged);
#   5. the layer, base vs new alternating, 7B-n256 and 120B-n2048 (backward's dx gather-sum runs
#      beside dW1 on the SMs dW1 leaves: there the loads in flight per thread may matter);
#   6. compute-sanitizer memcheck and racecheck on the layer tests that run the gather-sum.
# BUDGET (default 560) seconds in all; NCU=0 skips step 3.
# Returns summary.txt (also on stdout), gpu_tests.log, pytest.log and s18c1_logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
C=.carry/s18; B=/tmp/s18; L=/tmp/s18c1-logs; rm -rf $B $L; mkdir -p $B/site $L
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget="${BUDGET:-560}"  # seconds for the whole call; steps are cut to what is left
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
for f in leanmoe_new leanmoe_base leanmoe_gpu_tests; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || say "MISSING $f"; done
tar xJf $C/site.tar.xz -C $B/site || say "staging failed"
source scripts/device_env.sh  # OpenBLAS for the python front, NCCL for every binary
say "new $(cat $C/commit), base $(cat $C/commit_base); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "== 1. GPU suite (gsum) (t=$SECONDS)"
timeout $(cap 240) $B/leanmoe_gpu_tests --gtest_brief=1 > $FINAL/gpu_tests.log 2>&1
say "gpu tests rc=$? (t=$SECONDS)"; grep -E "^\[  FAILED|PASSED|FAILED TEST|Failure" $FINAL/gpu_tests.log | head -20 | tee -a $S
say "== 2. python suite on CUDA: front $(cat $C/commit); $(python3 -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>&1 | tail -1) (t=$SECONDS)"
R="$PWD"
(cd /tmp && PYTHONPATH=$B/site timeout $(cap 300) python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider --maxfail=30 \
   "$R/python/tests") > $FINAL/pytest.log 2>&1
say "pytest rc=$? (t=$SECONDS)"; grep -E "passed|failed|error" $FINAL/pytest.log | tail -3 | tee -a $S
grep -E "^(FAILED|ERROR)" $FINAL/pytest.log | head -30 | tee -a $S
say "== 3. ncu gather_sum_kernel (t=$SECONDS)"
if [ "${NCU:-1}" != 1 ]; then say "skipped (NCU=0)"; else for c in 7B-n256 30B-n512 120B-n2048 olmoe-1b-7b; do
  for v in base new; do
    timeout $(cap 40) ncu -k regex:gather_sum --metrics gpu__time_duration.sum --csv --print-units base \
      $B/leanmoe_$v bench --config $c --router topk_then_softmax --iters 2 --warmup 1 > $L/ncu_${c}_$v.csv 2>&1
    rc=$?
    us=$(grep gpu__time_duration $L/ncu_${c}_$v.csv | awk -F'","' '{gsub(/[",]/,"",$NF); printf "%.1f ", $NF/1000}')
    say "$c $v rc=$rc gather_sum us (fwd, bwd alternating): $us"
  done
done; fi
say "== 4. check, base vs new (t=$SECONDS)"
for v in base new; do timeout $(cap 60) $B/leanmoe_$v check --device cuda --seeds 1 > $L/check_$v.txt 2>&1; echo "check $v rc=$?" >> $S; done
if cmp -s $L/check_base.txt $L/check_new.txt; then say "check: IDENTICAL ($(wc -l < $L/check_new.txt) lines)";
else say "check: DIFFER"; diff $L/check_base.txt $L/check_new.txt | head -20 | tee -a $S; fi
say "== 5. layer base vs new, graph replays, two rounds alternating (t=$SECONDS)"
for r in 1 2; do for c in 7B-n256 120B-n2048; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  order="base new"; [ $r = 2 ] && order="new base"
  for v in $order; do
    timeout $(cap 40) $B/leanmoe_$v bench --config $c --router topk_then_softmax --graph --iters $iters --warmup $warm \
      --json $L/layer_r${r}_${c}_$v.json > $L/layer_r${r}_${c}_$v.txt 2>&1
    say "r$r $c $v rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print({k: v for k, v in r.items() if 'ms' in k and not k.endswith('_all')})" $L/layer_r${r}_${c}_$v.json 2>&1 | tail -1)"
  done
done; done
say "== 6. sanitizers on the layer tests that run the gather-sum (t=$SECONDS)"
F='CudaBackend.TopKRaggedBothConventions:CudaBackend.EmptyExpertAndHotExpert:CudaBackend.TokensNotAMultipleOfTheTile:CudaBackend.SingleToken'
for tool in memcheck racecheck; do
  timeout $(cap 60) compute-sanitizer --tool $tool --error-exitcode 9 $B/leanmoe_gpu_tests --gtest_brief=1 --gtest_filter="$F" \
    > $L/$tool.log 2>&1
  say "$tool rc=$? (t=$SECONDS) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $L/$tool.log | tr '\n' ' ')"
done
say "== done (t=$SECONDS)"
tar czf $FINAL/s18c1_logs.tar.gz -C $L .
