# fp8wgrad stage A (issue 16): dW1 / dW2 in FP8 (dw1_fp8, dw2_fp8: transposed 128x1-tile quantization
# of dH / A' and of the gathered X / dO rows, fp8_quantize_columns, then CUTLASS 4.2's FP8 blockwise
# grouped GEMM with per-row scales on both operands, compiled cooperative 128x128 in 1x2 and 2x1
# clusters). Not wired into the layer yet (the layer still runs bf16 dW). Branch fp8wgrad, commit in
# $CARRY/commit.
#   0. smoke (timeout 60 s): WgradFp8Quantize.* (bit-exact vs the host definition) and
#      WgradFp8.RaggedWithEmptyExpertBothLayouts (first run of the new CUTLASS kernels).
#   1. benches (quiet GPU): a ~3 s warm-up run (dw1 bf16 at 120B-n2048, 400 launches), then two rounds of
#      leanmoe_bench_gemms --gemms dw1,dw2 on 6 shapes: bf16 (default gather kernels) and fp8 with both
#      compiled configs (c1x2, c2x1), each FP8 row twice: with the two quantization passes ("-fp8") and
#      the GEMM alone ("-fp8-gemmonly"). Round 1 both layouts (hf, transposed), round 2 hf only.
#   2. GPU tests (WgradFp8*, ExpertGemmsFp8.*, ExpertGemms.*, GemmConfig.*, Fp8Quantize*, CudaBackend*:
#      regressions of the refactored encode_block store / CUTLASS run path, the layer with bf16 dW on an
#      FP8 shape) beside compute-sanitizer memcheck (WgradFp8Quantize.*, WgradFp8.EveryCompiledConfig,
#      WgradFp8.OneTokenAndNoTokens) and racecheck (WgradFp8Quantize.*: the new quantize kernel's shared tiles).
#   3. summary last: per shape, GEMM and layout: bf16 ms, FP8 ms with passes and GEMM-only per config
#      (best of the rounds), passes ms (= with - GEMM-only), speed-up bf16 / best FP8-with-passes.
# Expected run time ~3.5 min (warm-up 4 s, benches ~100 s, tests + sanitizers ~90 s in parallel). Hard
# cap ~7 min. Returns $FINAL/fp8wgrad_gemms.txt (summary + raw tables), $FINAL/fp8wgrad_tests.txt.
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8wgrad"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "fp8wgrad commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 0. smoke (t=$((SECONDS - T0)))"
timeout -k 5 60 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='WgradFp8Quantize.*:WgradFp8.RaggedWithEmptyExpertBothLayouts' > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -4 "$W/smoke.txt"

SHAPES=120B-n2048,30B-n1024,olmoe-1b-7b,qwen3-30b-a3b,120B-n512,7B-n1024
C12=cutlass:coop:128x128:auto:tma:c1x2; C21=cutlass:coop:128x128:auto:tma:c2
echo "== 1. benches dw1,dw2 (t=$((SECONDS - T0)))"
timeout -k 5 30 "$B/leanmoe_bench_gemms" --gemms dw1 --shape 120B-n2048 --iters 400 --warmup 3 > /dev/null 2>&1
FP8_OK=$([ $SMOKE -eq 0 ] && echo 1 || echo 0)
for round in 1 2; do
  LAYOUTS=$([ $round = 1 ] && echo hf,transposed || echo hf)
  timeout -k 5 60 "$B/leanmoe_bench_gemms" --gemms dw1,dw2 --shape $SHAPES --layout $LAYOUTS --precision bf16 \
    --iters 20 --warmup 3 > "$W/bf16_$round.txt" 2>&1
  echo "round $round bf16 rc=$? (t=$((SECONDS - T0)))"
  if [ $FP8_OK -ne 1 ]; then echo "skip fp8 (smoke failed or an FP8 bench hung)"; continue; fi
  timeout -k 5 90 "$B/leanmoe_bench_gemms" --gemms dw1,dw2 --shape $SHAPES --layout $LAYOUTS --precision fp8 \
    --iters 20 --warmup 3 --config dw1=$C12,dw1=$C21,dw2=$C12,dw2=$C21 > "$W/fp8_$round.txt" 2>&1
  rc=$?
  echo "round $round fp8 rc=$rc (t=$((SECONDS - T0)))"
  [ $rc -ge 124 ] && FP8_OK=0
done

echo "== 2. GPU tests beside memcheck, then racecheck (t=$((SECONDS - T0)))"
TESTS='WgradFp8*:ExpertGemmsFp8.*:ExpertGemms.*:GemmConfig.*:Fp8Quantize*:CudaBackend*'
timeout -k 5 240 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$TESTS" > "$W/tests.txt" 2>&1 &
P1=$!
timeout -k 5 200 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='WgradFp8Quantize.*:WgradFp8.EveryCompiledConfig:WgradFp8.OneTokenAndNoTokens' > "$W/memcheck.txt" 2>&1
R2=$?
timeout -k 5 150 compute-sanitizer --tool racecheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='WgradFp8Quantize.*' > "$W/racecheck.txt" 2>&1
R3=$?
wait $P1; R1=$?
echo "tests rc=$R1 memcheck rc=$R2 racecheck rc=$R3 (t=$((SECONDS - T0)))"
{
  echo "## smoke (rc=$SMOKE; 124 = hung)"; grep -E "PASSED|FAILED|Failure|rror|got|want" "$W/smoke.txt" | head -30
  echo "## $TESTS (rc=$R1; 124 = timeout)"
  grep -E "PASSED|FAILED|Failure|rror|got|want|tests ran|fp8 layer vs cpu" "$W/tests.txt" | head -60
  echo "## memcheck (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
  echo "## racecheck (rc=$R3)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|hazard|Error" "$W/racecheck.txt" | head -20
} > "$FINAL/fp8wgrad_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os
W = sys.argv[1]
ms = {}  # (shape, gemm, layout, variant) -> [ms]
for name in ("bf16_1", "bf16_2", "fp8_1", "fp8_2"):
    path = f"{W}/{name}.txt"
    if not os.path.exists(path): continue
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) != 11 or f[7] not in ("dw1", "dw2"): continue
        try: t = float(f[9])
        except ValueError: continue
        layout = f[1]
        base = layout.split('-')[0]
        if layout.endswith("-fp8-gemmonly"): v = "gemm " + ("c1x2" if "c1x2" in f[8] else "c2x1")
        elif layout.endswith("-fp8"): v = "full " + ("c1x2" if "c1x2" in f[8] else "c2x1")
        else: v = "bf16"
        ms.setdefault((f[0], f[7], base, v), []).append(t)
best = lambda k: min(ms[k]) if k in ms else None
keys = sorted({k[:3] for k in ms}, key=lambda k: (k[2], k[1], k[0]))
print("ms, best of the rounds; full = dw*_fp8 with both quantization passes; gemm = the FP8 GEMM alone;")
print("passes = full - gemm (same config); x = bf16 / best full FP8")
print("| shape | GEMM | layout | bf16 | full c1x2 | full c2x1 | gemm c1x2 | gemm c2x1 | passes | x |")
print("|---|---|---|---|---|---|---|---|---|---|")
tot = {}
for s, g, l in keys:
    v = {x: best((s, g, l, x)) for x in ("bf16", "full c1x2", "full c2x1", "gemm c1x2", "gemm c2x1")}
    c = lambda x: '-' if v[x] is None else f"{v[x]:.3f}"
    fulls = [(v[f"full {k}"], k) for k in ("c1x2", "c2x1") if v[f"full {k}"] is not None]
    bf, bk = min(fulls) if fulls else (None, None)
    passes = f"{bf - v[f'gemm {bk}']:.3f}" if bf is not None and v[f'gemm {bk}'] is not None else '-'
    x = f"{v['bf16'] / bf:.2f}" if bf and v['bf16'] else '-'
    if bf and v['bf16']:
        t = tot.setdefault((g, l), [0.0, 0.0]); t[0] += v['bf16']; t[1] += bf
    print(f"| {s} | {g} | {l} | {c('bf16')} | {c('full c1x2')} | {c('full c2x1')} | {c('gemm c1x2')} | {c('gemm c2x1')} | {passes} | {x} |")
for (g, l), (b, f) in sorted(tot.items()):
    print(f"| sum | {g} | {l} | {b:.3f} | best full {f:.3f} | | | | | {b / f:.2f} |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/bf16_*.txt "$W"/fp8_*.txt; do echo "## $(basename $f)"; cat "$f"; done; } > "$FINAL/fp8wgrad_gemms.txt"
echo "== tests and sanitizers (t=$((SECONDS - T0)))"; cat "$FINAL/fp8wgrad_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
