#!/usr/bin/env bash
# Session 27, call 2. (a) dW2 on 128x192 tiles, 5 stages (`gather:coop:128x192:s5:tma:c2`) against
# 128x256 (the heuristic's): at gpt-oss-20b n = 2880 is 11.25 column tiles of 256 (12 run, 6% of the
# MMAs on padding) and 15 of 192; with transposed weights (gpt-oss's own layout) dW1ᵀ runs dW2's
# kernel over N = 2n = 5760 (22.5 tiles of 256, 30 of 192). (b) bf16 up in 2x1 clusters against up
# alone on more grid rows than call 1 (the rule). (c) The layer at gpt-oss-20b in its transposed
# layout and HF, graph replays, the variants rotating. Tests of the gather kernel first, memcheck and
# racecheck on the 128x192 kernel. Carry [".carry/w"] (leanmoe, leanmoe_bench_gemms,
# leanmoe_gpu_tests of the branch, xz). Returns summary.txt, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack gt=.carry/w/leanmoe_gpu_tests.xz bg=.carry/w/leanmoe_bench_gemms.xz leanmoe=.carry/w/leanmoe.xz
say "call2 $(cat .carry/w/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
timeout "$(cap 160)" "$B/gt" --gtest_filter='ExpertGemms*:GemmHeuristics.*:GemmConfig*:LayerGemmConfigs.*' > "$L/gpu_tests.log" 2>&1
say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests.log" | tr '\n' ' ') (t=$SECONDS)"
grep -E '^\[  FAILED  \]' "$L/gpu_tests.log" | head -5 | tee -a "$S"
T192='ExpertGemms/Dw2Config.RaggedAndFewCtas/gather_coop_128x192_s5_tma_c2'
timeout "$(cap 90)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter="$T192" > "$L/memcheck.log" 2>&1
say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck.log" | tail -1) (t=$SECONDS)"
timeout "$(cap 90)" compute-sanitizer --tool racecheck "$B/gt" --gtest_filter="$T192" > "$L/racecheck.log" 2>&1
say "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | tail -1) (t=$SECONDS)"
G=gather:coop
W256=$G:128x256:s4:tma:c2; W192=$G:128x192:s5:tma:c2
for r in 1 2; do
  if [ $r = 1 ]; then o="$W256 $W192 $W256 $W192"; else o="$W192 $W256 $W192 $W256"; fi
  set -- $o
  timeout "$(cap 80)" "$B/bg" --shape gpt-oss-20b,120B-n2048,qwen3-30b-a3b,olmoe-1b-7b --gemms dw2 --iters 20 --warmup 3 \
    --warm-seconds 2 --config "dw2=$1,dw2=$2,dw2=$3,dw2=$4" > "$L/dw2_r$r.txt" 2>&1
  say "dw2 alone r$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/dw2_r$r.txt" | grep -v '^| shape' | tee -a "$S"
  timeout "$(cap 60)" "$B/bg" --shape gpt-oss-20b --layout transposed --gemms dw1,dw2 --iters 20 --warmup 3 \
    --warm-seconds 2 --config "dw1=$1,dw1=$2,dw1=$3,dw1=$4" > "$L/dw1t_r$r.txt" 2>&1
  say "gpt-oss transposed dw1 r$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/dw1t_r$r.txt" | grep -v '^| shape' | tee -a "$S"
done
U=$G:128x256:s4:warp
for r in 1 2; do
  if [ $r = 1 ]; then cfg="up=$U:c1,up=$U:c2,up=$U:c1,up=$U:c2"; else cfg="up=$U:c2,up=$U:c1,up=$U:c2,up=$U:c1"; fi
  timeout "$(cap 120)" "$B/bg" --shape 7B-n256,1.4B-n256,7B-n1024,qwen3-30b-a3b,granite-3.1-3b-a800m,30B-n256,120B-n1024,sparse-T16k-d4096-n1024-E256 \
    --gemms up --iters 20 --warmup 3 --warm-seconds 2 --config "$cfg" > "$L/up_r$r.txt" 2>&1
  say "up alone r$r rc=$? (t=$SECONDS)"; grep -E '^\| ' "$L/up_r$r.txt" | grep -v '^| shape' | tee -a "$S"
done
# gpt-oss stores W1 [E, d, 2n] (--layout transposed): there dW1ᵀ runs dW2's kernel (dw1=), in HF dW2 does.
declare -A V=([t_base]="--layout transposed" [t_192]="--layout transposed --gemm-config dw1=$W192"
              [t_192up2]="--layout transposed --gemm-config dw1=$W192,up=$U:c2"
              [h_base]="" [h_192]="--gemm-config dw2=$W192" [h_192up2]="--gemm-config dw2=$W192,up=$U:c2")
[ $((budget - SECONDS)) -gt 70 ] && layer_rounds 2 gpt-oss-20b t_base t_192 t_192up2
[ $((budget - SECONDS)) -gt 70 ] && layer_rounds 2 gpt-oss-20b h_base h_192 h_192up2
say "done t=$SECONDS"
