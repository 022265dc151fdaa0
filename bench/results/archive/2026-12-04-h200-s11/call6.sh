#!/usr/bin/env bash
# Session 11, device call 6 (issues 17, 15). Main with bwdgemm merged (dW1's wide producer) and token
# rounding's metadata kernels (.carry/s11d: leanmoe, leanmoe_gpu_tests, commit): (a) the expert-GEMM,
# config and routing GPU tests, memcheck on two small cases running dW1's kernel; (b) ncu per kernel at
# sparse-T8k for top-K and nearest (the rounding passes, against call 4's); (c) helper branch downtma's
# fragment (.carry/downtma) when carried: down/dx through the gather kernel with A by TMA.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=bin --exclude=downtma . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/bin"
for f in leanmoe leanmoe_gpu_tests; do xz -dc .carry/s11d/$f.xz > "$W/bin/$f" && chmod +x "$W/bin/$f"; done
echo "main $(cat .carry/s11d/commit)"
echo "== (a) GPU tests (t=${SECONDS})"
timeout 200 "$W/bin/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*:CudaRouting*' > "$W/main_gpu_tests.log" 2>&1
echo "rc=$?"; grep -E "PASSED|FAILED|tests ran" "$W/main_gpu_tests.log"; grep -B2 -A8 "Failure" "$W/main_gpu_tests.log" | head -30
timeout 80 compute-sanitizer --tool memcheck --print-limit 20 "$W/bin/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.FewPersistentCtas' > "$W/main_memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/main_memcheck.log"
echo "== (b) ncu sparse-T8k (t=${SECONDS})"
for m in topk nearest; do
  r=""; [ $m = nearest ] && r="--routing token-rounding --rounding nearest"
  timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$W/bin/leanmoe" bench --config sparse-T8k-d4096-n1024-E256 --router topk_then_softmax $r --iters 1 --warmup 0 \
    > "$W/ncu_$m.csv" 2> "$W/ncu_$m.err"; echo "rc=$?"
done
python3 dev/ncu_kernel_times.py --whole --side-by-side topk="$W/ncu_topk.csv" nearest="$W/ncu_nearest.csv" \
  > "$FINAL/ncu_t8k_side_by_side.txt" 2>&1
grep -E "rounding|round_|routes|scan_|pairs|topk|total|other" "$FINAL/ncu_t8k_side_by_side.txt" | head -24
if [ -d .carry/downtma ]; then
  echo "== (c) downtma (t=${SECONDS})"; mkdir -p "$W/downtma"
  CARRY=.carry/downtma W="$W/downtma" FINAL="$FINAL" timeout $((570 - SECONDS)) \
    bash bench/results/archive/2026-12-04-h200-s11/downtma.device.sh > "$W/downtma.log" 2>&1; echo "rc=$?"; tail -50 "$W/downtma.log"
fi
echo "done (t=${SECONDS})"
