#!/usr/bin/env bash
# Session 11, device call 1 (issue 17, 16): (a) session 10's call 7: the library's GPU tests over every
# compiled expert-GEMM configuration (tma64 included) and the merged router kernel, memcheck on the GEMM
# configurations (the working tree of c9e6d3d); (b) branch fp8quant's GPU quantization tests
# and sanitizers (.carry/fp8quant, 3bed161); (c) ncu --set full on the six expert GEMMs of one forward +
# backward of leanmoe (32a60b1) at 120B-n2048 and 7B-n256 (SonicMoE's in call 2: the carry limit).
# Binaries in .carry/s11a.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; S=.carry/sonicmoe
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude="*.ncu-rep" . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/s10c; mkdir -p $B
xz -dc .carry/s11a/leanmoe_gpu_tests_c9e6d3d.xz > $B/leanmoe_gpu_tests && chmod +x $B/leanmoe_gpu_tests
xz -dc .carry/s11a/leanmoe_32a60b1.xz > /tmp/leanmoe && chmod +x /tmp/leanmoe
echo "== (a) GPU tests (t=${SECONDS})"
timeout 60 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.*:GemmConfig*:GemmHeuristics*:CudaRouting*' > "$W/gpu_tests.log" 2>&1
echo "tests rc=$?"; grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.EveryCompiledConfig' > "$W/memcheck_gemms.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck_gemms.log"
echo "== (b) fp8quant (t=${SECONDS})"
CARRY=.carry/fp8quant FINAL="$W" W="$W" timeout 200 bash bench/results/archive/2026-12-04-h200-s11/fp8quant.device.sh 2>&1 | tail -25
echo "== (c) ncu (t=${SECONDS})"
NCU=(ncu --set full --csv --page details --print-units base)
for c in 120B-n2048 7B-n256; do
  echo "-- ncu leanmoe $c (t=${SECONDS})"
  timeout 120 "${NCU[@]}" -k 'regex:gather_grouped_gemm|GemmUniversal' -c 6 /tmp/leanmoe bench --config $c \
    --router topk_then_softmax --iters 1 --warmup 0 > "$W/ncu_leanmoe_$c.csv" 2> "$W/ncu_leanmoe_$c.err"
  echo "rc=$?"; grep -c '^"' "$W/ncu_leanmoe_$c.csv"
done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv 2>/dev/null)
cp "$W/gpu_tests.log" "$W/memcheck_gemms.log" "$FINAL/" 2>/dev/null
cp "$W/fp8quant_tests.log" "$W/fp8quant_sanitizers.log" "$FINAL/" 2>/dev/null
ls -la "$FINAL"; echo "done (t=${SECONDS})"
