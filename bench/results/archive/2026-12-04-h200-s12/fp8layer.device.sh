# fp8layer (issue 16): down_proj_fp8 / dx_expert_fp8 in the library on CUTLASS 4.2's FP8 blockwise
# ptr-array grouped GEMM (compiled_gemm_configs(kind, true): cutlass:coop:128x128:auto:tma:c1x2,
# :c2 (2x1), cutlass:pingpong:64x128:auto:tma:c2), chosen by fp8 rules in gemm_heuristics.cpp; the
# CUDA layer's FP8 path (needs branch fp8gather's up/dh FP8 launchers: on this branch they throw
# "not built on this branch", so CudaBackendFp8.MatchesCpuFp8 / LayoutsBiasesActivations FAIL here
# by design). Branch fp8layer, commit in $CARRY/commit; binaries -DLEANMOE_STATIC_BLAS=ON, stripped.
#   0. smoke (timeout 60 s): ExpertGemmsFp8.DownRagged:DxRagged (first run of the FP8 kernels in the
#      library; fresh random tiles spanning 2^16, quantized on the GPU, vs a double host loop).
#   1. benches on a quiet GPU: leanmoe_bench_gemms --gemms down,dx on 7B-n1024, 30B-n1024, 120B-n2048,
#      olmoe-1b-7b, qwen3-30b-a3b: a throwaway warm-up run, then two interleaved rounds of bf16 /
#      --fp8 (heuristic) / --fp8 with each compiled FP8 config (c1x2, c2x1, pp64 c2x1).
#   2. GPU tests: ExpertGemmsFp8.*, ExpertGemms.*, GemmConfig.*, CudaBackend.* (bf16 regressions: the
#      CUTLASS template and the backend's workspaces changed), CudaBackendFp8.* (expected: the two
#      comparisons fail with "not built on this branch", Refusals passes), Fp8Quantize*; beside them
#      compute-sanitizer memcheck on ExpertGemmsFp8.EveryCompiledConfig (the 3 FP8 kernels, down and
#      dx, ragged with an empty expert, 3 CTAs).
#   3. summary last: per shape and GEMM, bf16 ms, FP8 ms per config (best of 2 rounds), the
#      heuristic's FP8 config, speed-up heuristic FP8 / bf16 and best FP8 / heuristic FP8.
# Expected run time ~2.5-3 min (smoke ~5 s, 13 bench runs ~8 s each, tests + memcheck ~60 s).
# Hard cap ~7 min. Returns $FINAL/fp8layer_gemms.txt (summary + raw tables) and
# $FINAL/fp8layer_tests.txt (test and sanitizer summaries, failures).
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8layer"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "fp8layer commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 0. smoke: ExpertGemmsFp8.DownRagged:DxRagged (t=$((SECONDS - T0)))"
timeout -k 5 60 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.DownRagged:ExpertGemmsFp8.DxRagged' \
  > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -6 "$W/smoke.txt"

SHAPES=7B-n1024,30B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b
C12=cutlass:coop:128x128:auto:tma:c1x2; C21=cutlass:coop:128x128:auto:tma:c2; P21=cutlass:pingpong:64x128:auto:tma:c2
FP8_OK=$([ $SMOKE -eq 0 ] && echo 1 || echo 0)
echo "== 1. benches down,dx: bf16 / fp8 heuristic / fp8 c1x2 / c2x1 / pp64, two rounds (t=$((SECONDS - T0)))"
# A throwaway run first: the start of a run sits in the power ramp (docs/kernels.md, s11 call 10).
timeout -k 5 40 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 > "$W/ramp.txt" 2>&1
for round in 1 2; do
  for v in bf16 fp8 c12 c21 p21; do
    args=""
    [ $v = fp8 ] && args="--fp8"
    [ $v = c12 ] && args="--fp8 --config down=$C12,dx=$C12"
    [ $v = c21 ] && args="--fp8 --config down=$C21,dx=$C21"
    [ $v = p21 ] && args="--fp8 --config down=$P21,dx=$P21"
    if [ $v != bf16 ] && [ $FP8_OK -ne 1 ]; then echo "skip $v (smoke failed or an FP8 bench hung)"; continue; fi
    timeout -k 5 40 "$B/leanmoe_bench_gemms" --gemms down,dx --shape $SHAPES --iters 20 --warmup 3 $args \
      > "$W/gemms_${v}_$round.txt" 2>&1
    rc=$?
    echo "round $round $v rc=$rc (t=$((SECONDS - T0)))"
    [ $v != bf16 ] && [ $rc -ge 124 ] && FP8_OK=0
  done
done

echo "== 2. GPU tests beside memcheck (t=$((SECONDS - T0)))"
TESTS='ExpertGemmsFp8.*:ExpertGemms.*:GemmConfig.*:CudaBackend.*:CudaBackendFp8.*:Fp8Quantize*'
timeout -k 5 240 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$TESTS" > "$W/tests.txt" 2>&1 &
P1=$!
timeout -k 5 240 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter=ExpertGemmsFp8.EveryCompiledConfig > "$W/memcheck.txt" 2>&1 &
P2=$!
wait $P1; R1=$?; wait $P2; R2=$?
echo "tests rc=$R1 memcheck rc=$R2 (t=$((SECONDS - T0)))"
{
  echo "## smoke (rc=$SMOKE; 124 = hung)"; grep -E "PASSED|FAILED|Failure|rror|got|tol" "$W/smoke.txt" | head -30
  echo "## $TESTS (rc=$R1; 124 = timeout; CudaBackendFp8.MatchesCpuFp8 / LayoutsBiasesActivations expected to fail"
  echo "## with 'not built on this branch')"
  grep -E "PASSED|FAILED|Failure|rror|got|tests ran|fp8 layer vs cpu" "$W/tests.txt" | head -60
  echo "## memcheck ExpertGemmsFp8.EveryCompiledConfig (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
} > "$FINAL/fp8layer_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os
W = sys.argv[1]
V = ('bf16', 'fp8', 'c12', 'c21', 'p21')
def rows(path):
    out = {}
    if not os.path.exists(path): return out
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) == 11 and f[7] in ('down', 'dx'):
            try: out[f[0], f[7]] = (f[8], float(f[9]), float(f[10]))
            except ValueError: pass
    return out
runs = {(v, r): rows(f"{W}/gemms_{v}_{r}.txt") for v in V for r in (1, 2)}
keys = []
for d in runs.values():
    for k in d:
        if k not in keys: keys.append(k)
short = lambda k: k.replace('cutlass:', '').replace(':auto:tma', '').replace(':m132', '')
print("ms = best of 2 rounds (r1 / r2 in the raw tables); x = bf16 ms / heuristic FP8 ms; best/heur = best FP8 config ms / heuristic FP8 ms")
print("| shape | GEMM | bf16 | fp8 heuristic (config) | c1x2 | c2x1 | pp64 c2x1 | x | best/heur | FP8 TFLOP/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
tot = {v: 0.0 for v in V}
for s, g in keys:
    best, kern, tf = {}, '', ''
    for v in V:
        got = [runs[v, r][(s, g)] for r in (1, 2) if (s, g) in runs[v, r]]
        best[v] = min(x[1] for x in got) if got else None
        if v == 'fp8' and got:
            kern = short(got[0][0]); tf = f"{max(x[2] for x in got):.0f}"
    c = lambda v: '-' if best[v] is None else f"{best[v]:.3f}"
    x = f"{best['bf16'] / best['fp8']:.2f}" if best['bf16'] and best['fp8'] else '-'
    alts = [best[v] for v in ('c12', 'c21', 'p21') if best[v]]
    bh = f"{min(alts) / best['fp8']:.3f}" if alts and best['fp8'] else '-'
    if all(best[v] for v in V):
        for v in V: tot[v] += best[v]
    print(f"| {s} | {g} | {c('bf16')} | {c('fp8')} ({kern}) | {c('c12')} | {c('c21')} | {c('p21')} | {x} | {bh} | {tf} |")
if tot['fp8']:
    print(f"| sum | | {tot['bf16']:.3f} | {tot['fp8']:.3f} | {tot['c12']:.3f} | {tot['c21']:.3f} | {tot['p21']:.3f} | "
          f"{tot['bf16'] / tot['fp8']:.2f} | | |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/gemms_*_*.txt; do echo "## $(basename $f)"; cat "$f"; done; } > "$FINAL/fp8layer_gemms.txt"
echo "== tests and sanitizer (t=$((SECONDS - T0)))"; cat "$FINAL/fp8layer_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
