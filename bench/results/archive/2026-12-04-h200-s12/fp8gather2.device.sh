# fp8gather (issue 16), second fragment: FP8 up/dH mainloop variants + A and dH quantized in the
# epilogues (a_q, dh_q). Smoke test first, the FP8 GPU tests (the default configs up c1, dH c2 on
# every function; the candidates up c2, c1:p64, c2:p64, dH c2:p64, compiled for the default path
# only, on the 4 default-path cases; a_q / dh_q checked bit for bit against fp8_quantize_rows of the
# same launch's bf16 output), the bf16 ExpertGemms tests (the up epilogue's source was refactored;
# its SASS compared identical here),
# memcheck + racecheck on small FP8 cases, then up and dH: bf16, fp8 and fp8q (quantized outputs)
# on the default configs and fp8 on the variants, 5 shapes, a ~3 s throwaway warm-up, two rounds.
# Expected run time: ~4 min (smoke ~10 s, FP8 tests ~30 s, bf16 ExpertGemms ~30 s, sanitizers
# ~90 s, benches ~90 s). Hard cap ~9 min (timeouts). A hang (a wrong barrier, e.g. in up's new
# 2x1 cluster path) shows as the smoke test's rc=124: then everything FP8 after it is skipped.
# Returns $FINAL/fp8gather_tests.log, $FINAL/fp8gather_sanitizers.log, $FINAL/fp8gather_bench.md.
# Pass: FP8 tests 10/10 passed (none skipped), bf16 ExpertGemms all passed, memcheck 0 errors,
# racecheck 0 hazards; the table: per shape and GEMM, every variant's ms and speed-up over bf16.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8gather"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "fp8gather commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
T="$B/leanmoe_gpu_tests"; LOG="$W/fp8gather_tests.log"; SANLOG="$W/fp8gather_sanitizers.log"; BENCH="$W/fp8gather_bench.md"
: > "$LOG"; : > "$SANLOG"; : > "$BENCH"

echo "== fp8gather smoke (t=${SECONDS})"
timeout 90 "$T" --gtest_filter='ExpertGemmsFp8.SingleToken' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"

if [ $smoke -ne 124 ]; then
  echo "== fp8gather FP8 tests (t=${SECONDS})"
  timeout 180 "$T" --gtest_filter='ExpertGemmsFp8.*' >> "$LOG" 2>&1
  echo "fp8 tests rc=$? (t=${SECONDS})"
  echo "== fp8gather bf16 ExpertGemms tests (t=${SECONDS})"
  timeout 150 "$T" --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' >> "$LOG" 2>&1
  echo "bf16 tests rc=$? (t=${SECONDS})"

  echo "== fp8gather sanitizers (t=${SECONDS})"
  # memcheck: default path (all six kernels; one expert: many cluster tiles) + interleaved (dH's
  # quantized post-pass over pairs) + plain biased; racecheck: the default path and plain.
  echo "---- memcheck" >> "$SANLOG"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$T" --gtest_brief=1 \
    --gtest_filter='ExpertGemmsFp8.SingleToken:ExpertGemmsFp8.OneExpertTakesEverything:ExpertGemmsFp8.SwiGLUInterleaved:ExpertGemmsFp8.PlainGeluBiased' >> "$SANLOG" 2>&1
  echo "memcheck rc=$? (t=${SECONDS})"
  echo "---- racecheck" >> "$SANLOG"
  timeout 150 compute-sanitizer --tool racecheck --print-limit 20 "$T" --gtest_brief=1 \
    --gtest_filter='ExpertGemmsFp8.SingleToken:ExpertGemmsFp8.PlainGeluBiased' >> "$SANLOG" 2>&1
  echo "racecheck rc=$? (t=${SECONDS})"

  echo "== fp8gather benches (t=${SECONDS})"
  G="$B/leanmoe_bench_gemms"
  SHAPES=7B-n1024,30B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b
  K='gather:coop:128x256:s4:warp'
  VARIANTS="up=$K:c2,up=$K:c1:p64,up=$K:c2:p64,dh=$K:c2:p64"
  # ~3 s at full load so both rounds run at the power-capped steady state (docs/kernels.md).
  timeout 60 "$G" --shape 120B-n2048 --gemms up,dh --precision fp8 --iters 200 --warmup 10 > /dev/null 2>&1
  echo "warm-up done (t=${SECONDS})"
  for round in 1 2; do
    echo "round $round" >> "$BENCH"
    timeout 120 "$G" --shape $SHAPES --gemms up,dh --precision bf16,fp8,fp8q --iters 20 --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round defaults rc=$? (t=${SECONDS})"
    timeout 120 "$G" --shape $SHAPES --gemms up,dh --precision fp8 --config "$VARIANTS" --iters 20 --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round variants rc=$? (t=${SECONDS})"
  done
fi
cp "$LOG" "$SANLOG" "$BENCH" "$FINAL/" 2>/dev/null

echo "== fp8gather summary (t=${SECONDS})"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] ExpertGemms" "$LOG" | sed 's/ ([0-9]* ms)//' | awk '!seen[$0]++' | grep -v " OK " | head -20
echo "ExpertGemmsFp8 OK: $(grep -E '^\[       OK \] ExpertGemmsFp8' "$LOG" | sed 's/ (.*//' | sort -u | wc -l)/10;" \
     "bf16 ExpertGemms OK: $(grep -E '^\[       OK \] ExpertGemms\.' "$LOG" | sed 's/ (.*//' | sort -u | wc -l)"
grep -B2 -A6 "Failure" "$LOG" | head -40
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$SANLOG"
grep -m5 -E "Invalid|Race|Hazard|rror" "$SANLOG" | grep -v SUMMARY
# Per shape, GEMM and variant (precision + config without band/max_ctas): median ms averaged over
# the two rounds, speed-up over bf16, bf16-equivalent TFLOP/s.
awk -F'|' '/^\| [^s-]/ && $9 ~ /up|dh/ {
  sh=$2; g=$9; lay=$3; cfg=$10; gsub(/ /,"",sh); gsub(/ /,"",g); gsub(/ /,"",lay); gsub(/ /,"",cfg);
  sub(/^hf-?/,"",lay); if (lay=="") lay="bf16"; gsub(/:b[0-9]+/,"",cfg); gsub(/:m[0-9]+/,"",cfg);
  sub(/^gather:coop:128x256:s4:warp:/,"",cfg); v=lay" "cfg; key=sh" "g;
  ms[key,v]+=$11; cnt[key,v]++; tf[key,v]+=$12;
  if (!(key in seenk)) {seenk[key]=1; ko[++nk]=key} if (!((key,v) in seenv)) {seenv[key,v]=1; vo[key,++nv[key]]=v} }
END { printf "| shape | GEMM | variant | ms | x bf16 | TFLOP/s (bf16-equiv.) |\n|---|---|---|---|---|---|\n";
  for (i=1;i<=nk;i++) { k=ko[i]; split(k,p," "); b=""; for (j=1;j<=nv[k];j++) if (vo[k,j] ~ /^bf16/) b=vo[k,j];
    for (j=1;j<=nv[k];j++) { v=vo[k,j]; m=ms[k,v]/cnt[k,v];
      printf "| %s | %s | %s | %.3f | %s | %.0f |\n", p[1], p[2], v, m, (b!="" ? sprintf("%.2fx", (ms[k,b]/cnt[k,b])/m) : "-"), tf[k,v]/cnt[k,v] } } }' "$BENCH"
grep -m3 "leanmoe_bench_gemms:" "$BENCH"
ok=1
[ "$(grep -E '^\[       OK \] ExpertGemmsFp8' "$LOG" | sed 's/ (.*//' | sort -u | wc -l)" = 10 ] || ok=0
grep -qE "^\[  (FAILED|SKIPPED) +\]" "$LOG" && ok=0
[ "$(grep -c 'ERROR SUMMARY: 0 errors' "$SANLOG")" = 1 ] || ok=0
[ "$(grep -c 'RACECHECK SUMMARY: 0 hazards' "$SANLOG")" = 1 ] || ok=0
echo "FP8GATHER VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: 10 FP8 tests passed, no test failed or skipped; memcheck 0 errors; racecheck 0 hazards) t=${SECONDS}s"
