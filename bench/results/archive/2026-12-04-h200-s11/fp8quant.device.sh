# fp8quant (issue 16): the FP8 quantization kernels fp8_quantize_rows / fp8_quantize_blocks
# (src/cuda/fp8_quantize.cu, branch fp8quant) bit for bit against fp8::quantize on the host, then
# compute-sanitizer memcheck and racecheck on them.
# Expected run time: ~40 s (tests ~10 s, most of it the host side of RowTilesBeyondOneGrid's 135M
# values; memcheck ~15 s, racecheck ~10 s). Hard cap 3 minutes (timeouts 60 + 60 + 45 s).
# Returns $FINAL/fp8quant_tests.log and $FINAL/fp8quant_sanitizers.log.
# Pass: "[  PASSED  ] 7 tests" (0 skipped), memcheck "ERROR SUMMARY: 0 errors", racecheck
# "RACECHECK SUMMARY: 0 hazards". A failing comparison prints the first 5 differing elements with
# their [e, r, c] and bf16 value.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8quant"; mkdir -p "$B"
xz -dc "$CARRY/leanmoe_gpu_tests.xz" > "$B/leanmoe_gpu_tests" && chmod +x "$B/leanmoe_gpu_tests"
echo "fp8quant commit $(cat "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== fp8quant GPU tests (t=${SECONDS})"
timeout 60 "$B/leanmoe_gpu_tests" --gtest_filter='*Fp8*' > "$W/fp8quant_tests.log" 2>&1
echo "tests rc=$? (t=${SECONDS})"
cp "$W/fp8quant_tests.log" "$FINAL/"

echo "== fp8quant sanitizers (t=${SECONDS})"
# RowTilesBeyondOneGrid (2^20+ tiles) is left out: under memcheck it would take minutes.
SAN='Fp8QuantizeGpu.*:-Fp8QuantizeGpu.RowTilesBeyondOneGrid:Fp8QuantizeGpu.AdversarialInputsHoldWhatTheyClaim'
: > "$W/fp8quant_sanitizers.log"
for tool in memcheck racecheck; do
  echo "---- $tool" >> "$W/fp8quant_sanitizers.log"
  timeout $([ $tool = memcheck ] && echo 60 || echo 45) compute-sanitizer --tool $tool --print-limit 20 \
    "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$SAN" >> "$W/fp8quant_sanitizers.log" 2>&1
  echo "$tool rc=$? (t=${SECONDS})"
done
cp "$W/fp8quant_sanitizers.log" "$FINAL/"

echo "== fp8quant summary (t=${SECONDS})"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] Fp8" "$W/fp8quant_tests.log" | sed 's/ ([0-9]* ms)//' | awk '!seen[$0]++'
grep -A3 "Failure" "$W/fp8quant_tests.log" | head -30
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$W/fp8quant_sanitizers.log"
grep -m5 -E "Invalid|Race|Hazard" "$W/fp8quant_sanitizers.log"
ok=1
grep -q "^\[  PASSED  \] 7 tests" "$W/fp8quant_tests.log" || ok=0
grep -q "SKIPPED" "$W/fp8quant_tests.log" && ok=0
[ "$(grep -c 'ERROR SUMMARY: 0 errors' "$W/fp8quant_sanitizers.log")" = 1 ] || ok=0
[ "$(grep -c 'RACECHECK SUMMARY: 0 hazards' "$W/fp8quant_sanitizers.log")" = 1 ] || ok=0
echo "FP8QUANT VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: 7 tests passed, none skipped; memcheck 0 errors; racecheck 0 hazards) t=${SECONDS}s"
