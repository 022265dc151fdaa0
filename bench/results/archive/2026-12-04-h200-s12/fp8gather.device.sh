# fp8gather (issue 16): the FP8 gather kernel for up and dH (up_proj_act_fp8, dh_act_bwd_fp8; branch
# fp8gather): smoke test, the FP8 GPU tests, the bf16 ExpertGemms tests (host code of the launch path
# changed; the 44 bf16 kernels' SASS is identical to main's), memcheck + racecheck on two small FP8
# tests, then up and dH fp8 vs bf16 on 5 shapes (a throwaway warm-up run, two interleaved rounds).
# Expected run time: ~2.5 min (smoke ~5 s, FP8 tests ~15 s, bf16 ExpertGemms ~30 s, sanitizers
# ~40 s, benches ~60 s). Hard cap ~6.5 min (timeouts). A hang (a wrong barrier) shows as the smoke
# test's rc=124: then everything FP8 after it is skipped.
# Returns $FINAL/fp8gather_tests.log, $FINAL/fp8gather_sanitizers.log, $FINAL/fp8gather_bench.md.
# Pass: FP8 tests 10/10 passed (none skipped), bf16 ExpertGemms all passed, memcheck 0 errors,
# racecheck 0 hazards; the summary table prints bf16 ms, fp8 ms and fp8's speedup per shape and GEMM.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8gather"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "fp8gather commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
T="$B/leanmoe_gpu_tests"; LOG="$W/fp8gather_tests.log"; SANLOG="$W/fp8gather_sanitizers.log"; BENCH="$W/fp8gather_bench.md"
: > "$LOG"; : > "$SANLOG"; : > "$BENCH"

echo "== fp8gather smoke (t=${SECONDS})"
timeout 60 "$T" --gtest_filter='ExpertGemmsFp8.SwiGLUDefaultPath' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"

if [ $smoke -ne 124 ]; then
  echo "== fp8gather FP8 tests (t=${SECONDS})"
  timeout 120 "$T" --gtest_filter='ExpertGemmsFp8.*' >> "$LOG" 2>&1
  echo "fp8 tests rc=$? (t=${SECONDS})"
  echo "== fp8gather bf16 ExpertGemms tests (t=${SECONDS})"
  timeout 150 "$T" --gtest_filter='ExpertGemms.*:GemmConfig.*:GemmHeuristics.*' >> "$LOG" 2>&1
  echo "bf16 tests rc=$? (t=${SECONDS})"

  echo "== fp8gather sanitizers (t=${SECONDS})"
  SAN='ExpertGemmsFp8.SingleToken:ExpertGemmsFp8.PlainGeluBiased'
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$SANLOG"
    timeout 90 compute-sanitizer --tool $tool --print-limit 20 "$T" --gtest_brief=1 --gtest_filter="$SAN" >> "$SANLOG" 2>&1
    echo "$tool rc=$? (t=${SECONDS})"
  done

  echo "== fp8gather benches (t=${SECONDS})"
  G="$B/leanmoe_bench_gemms"
  SHAPES=7B-n1024,30B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b
  timeout 60 "$G" --shape 120B-n2048 --gemms up,dh --precision bf16,fp8 --iters 10 --warmup 3 > /dev/null 2>&1  # boost clocks settle
  for round in 1 2; do
    echo "round $round" >> "$BENCH"
    timeout 120 "$G" --shape $SHAPES --gemms up,dh --precision bf16,fp8 --iters 20 --warmup 3 >> "$BENCH" 2>&1
    echo "bench round $round rc=$? (t=${SECONDS})"
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
# Per shape and GEMM: median ms of bf16 and fp8 averaged over the two rounds, and fp8's speedup.
awk -F'|' '/^\| [^s-]/ && $9 ~ /up|dh/ {
  sh=$2; g=$9; gsub(/ /,"",sh); gsub(/ /,"",g); fp=($3 ~ /fp8/); key=sh" "g;
  ms[key,fp]+=$11; cnt[key,fp]++; tf[key,fp]+=$12; if (!(key in seen)) {seen[key]=1; order[++n]=key} }
END { printf "| shape | GEMM | bf16 ms | fp8 ms | fp8 speedup | bf16 TFLOP/s | fp8 TFLOP/s (bf16-equiv.) |\n|---|---|---|---|---|---|---|\n";
  for (i=1;i<=n;i++) { k=order[i]; split(k,p," ");
    if (cnt[k,0] && cnt[k,1]) printf "| %s | %s | %.3f | %.3f | %.2fx | %.0f | %.0f |\n", p[1], p[2], ms[k,0]/cnt[k,0], ms[k,1]/cnt[k,1],
      ms[k,0]/ms[k,1], tf[k,0]/cnt[k,0], tf[k,1]/cnt[k,1];
    else printf "| %s | %s | missing bf16=%d fp8=%d rows |\n", p[1], p[2], cnt[k,0], cnt[k,1] } }' "$BENCH"
grep -m3 "leanmoe_bench_gemms:" "$BENCH"
ok=1
[ "$(grep -E '^\[       OK \] ExpertGemmsFp8' "$LOG" | sed 's/ (.*//' | sort -u | wc -l)" = 10 ] || ok=0
grep -qE "^\[  (FAILED|SKIPPED) +\]" "$LOG" && ok=0
[ "$(grep -c 'ERROR SUMMARY: 0 errors' "$SANLOG")" = 1 ] || ok=0
[ "$(grep -c 'RACECHECK SUMMARY: 0 hazards' "$SANLOG")" = 1 ] || ok=0
echo "FP8GATHER VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: 10 FP8 tests passed, no test failed or skipped; memcheck 0 errors; racecheck 0 hazards) t=${SECONDS}s"
