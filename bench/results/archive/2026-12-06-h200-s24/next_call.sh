#!/usr/bin/env bash
# For the session after 24, main's binaries without SonicMoE: the kernel trace tried on a small run,
# the layer at 120B-n2048 traced at the steady state (per kernel: time, SM clock, power), down and dx
# configurations and the gather kinds' bands timed at the power cap (--warm-seconds 2), then main's
# whole GPU suite (e772cb2's SM-count change has not run on a GPU). Carry [".carry/vs", ".carry/s25"]
# (scripts/prepare_carry.sh vs-sonic, then .carry/s25 = xz of build-device's leanmoe_gpu_tests and
# leanmoe_bench_gemms and the commit). BUDGET seconds (default 560; scripts/device_call.sh). Returns
# summary.txt, gpu_tests.log, logs.tar.gz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
source scripts/device_call.sh
unpack leanmoe=.carry/vs/leanmoe.xz gt=.carry/s25/leanmoe_gpu_tests.xz bg=.carry/s25/leanmoe_bench_gemms.xz
TR="$(realpath .carry/vs/trace/libkernel_trace.so)"
say "leanmoe $(cat .carry/vs/commit), tests/bench $(cat .carry/s25/commit); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
CUDA_INJECTION64_PATH=$TR KERNEL_TRACE_OUT=$L/trace_small.csv timeout $(cap 40) $B/leanmoe bench --config 7B-n256 \
  --router topk_then_softmax --graph --iters 5 --warmup 2 > $L/small.txt 2>&1
say "trace try rc=$? $(tail -1 $L/small.txt)"
python3 dev/kernel_trace/summary.py $L/trace_small.csv --last 1 --width 80 2>&1 | head -12 | tee -a $S
read -r warm iters < <(python3 bench/steady_iters.py 120B-n2048)
CUDA_INJECTION64_PATH=$TR KERNEL_TRACE_OUT=$L/trace_120B.csv timeout $(cap 60) $B/leanmoe bench --config 120B-n2048 \
  --router topk_then_softmax --graph --iters $iters --warmup $warm > $L/layer_120B.txt 2>&1
say "traced layer 120B-n2048 rc=$?: $(grep -E '^120B' $L/layer_120B.txt)"
python3 dev/kernel_trace/summary.py $L/trace_120B.csv --last 3 --width 90 2>&1 | head -30 | tee -a $S
P=cutlass:pingpong:128x192:auto:tma
CFG=""; for c in c1x2 c2:rN c2 c1x2:rN; do CFG="$CFG,dx=$P:$c,down=$P:$c"; done
timeout $(cap 150) $B/bg --shape 120B-n2048,30B-n1024 --gemms down,dx --iters 20 --warmup 3 --warm-seconds 2 \
  --config "${CFG#,}" > $L/cap_configs.txt 2>&1
say "down/dx at the cap rc=$?:"; grep -E '\| (down|dx) ' $L/cap_configs.txt | tee -a $S
# The gather kinds' run-time bands at the cap (up: column tiles per band; dW1 / dW2: row units walked
# together, docs/kernels.md "Varlen-K tile bands", not a default yet).
G=gather:coop
CFG="up=$G:128x256:s4:warp:c1:b4,up=$G:128x256:s4:warp:c1:b8,up=$G:128x256:s4:warp:c1:b16"
for b in b1 b2 b4; do CFG="$CFG,dw1=$G:256x128:s4:warp:c2:$b,dw2=$G:128x256:s4:warp:c2:$b"; done
timeout $(cap 90) $B/bg --shape 120B-n2048 --gemms up,dw1,dw2 --iters 20 --warmup 3 --warm-seconds 2 \
  --config "$CFG" > $L/cap_bands.txt 2>&1
say "bands at the cap rc=$?:"; grep -E '\| (up|dw1|dw2) ' $L/cap_bands.txt | tee -a $S
timeout $(cap 250) $B/gt > $FINAL/gpu_tests.log 2>&1
say "suite rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $FINAL/gpu_tests.log | tr '\n' ' ') (t=$SECONDS)"
say "== done (t=$SECONDS)"
