#!/usr/bin/env bash
# Session 12, device call 8 (issue 16): main with fp8gather's cleanup, fp8weights and fp8optim merged
# (.carry/s12f: leanmoe, leanmoe_gpu_tests, commit): the FP8 tests (FP8 up now in 2x1 clusters for every
# function), the FP8 layer tests, memcheck and racecheck on FP8 up/dH tests, the layer fp8 (codes given)
# vs bf16 at 120B-n2048 and olmoe-1b-7b.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
source scripts/device_env.sh
for f in leanmoe leanmoe_gpu_tests; do xz -dc .carry/s12f/$f.xz > "$W/$f" && chmod +x "$W/$f"; done
echo "main $(cat .carry/s12f/commit)"; T="$W/leanmoe_gpu_tests"
timeout 30 "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.SingleToken' > "$W/smoke.log" 2>&1; echo "smoke rc=$?"
timeout 120 "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.*:CudaBackendFp8.*:CudaFp8Weights.*:GemmConfig.*:GemmHeuristics.*' > "$W/tests.log" 2>&1 &
P1=$!
timeout 120 compute-sanitizer --tool memcheck --print-limit 10 "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.GeGLUInterleavedBiased:ExpertGemmsFp8.NoTokens' > "$W/memcheck.log" 2>&1 &
P2=$!
timeout 120 compute-sanitizer --tool racecheck --print-limit 10 --kernel-name kns=gather_grouped_gemm_kernel "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.SingleToken' > "$W/racecheck.log" 2>&1 &
P3=$!
wait $P1; R1=$?; wait $P2; R2=$?; wait $P3; R3=$?
{ echo "tests rc=$R1 memcheck rc=$R2 racecheck rc=$R3"; grep -E "PASSED|FAILED|tests ran" "$W/tests.log"; grep -B3 -A10 Failure "$W/tests.log" | head -40
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$W/memcheck.log" "$W/racecheck.log"; } | tee "$FINAL/s12f_tests.txt"
for c in 120B-n2048 olmoe-1b-7b; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for p in storage fp8; do
    timeout 40 "$W/leanmoe" bench --config $c --router topk_then_softmax --graph --precision $p --warmup $warm --iters $iters \
      --json "$FINAL/layer_${c}_$p.json" > /dev/null 2>&1; echo "$c $p rc=$?"
  done
done
python3 - "$FINAL" <<'PY' | tee "$FINAL/s12f_layer.md"
import json, sys
F = sys.argv[1]
print("| row | bf16 fwd | fp8 fwd | bf16 bwd | fp8 bwd | fwd x | bwd x | fwd+bwd x | fp8 weights |")
print("|---|---|---|---|---|---|---|---|---|")
for c in ("120B-n2048", "olmoe-1b-7b"):
    b = json.load(open(f"{F}/layer_{c}_storage.json"))["results"][0]; q = json.load(open(f"{F}/layer_{c}_fp8.json"))["results"][0]
    fb, bb, fq, bq = b["fwd_graph_ms"], b["bwd_graph_ms"], q["fwd_graph_ms"], q["bwd_graph_ms"]
    print(f"| {c} | {fb:.3f} | {fq:.3f} | {bb:.3f} | {bq:.3f} | {fb/fq:.2f} | {bb/bq:.2f} | {(fb+bb)/(fq+bq):.2f} | {q.get('fp8_weights', '?')} |")
PY
echo "done (t=${SECONDS})"
