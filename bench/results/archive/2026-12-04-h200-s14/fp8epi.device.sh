# fp8epi (issue 16): A and dH quantized in the FP8 up / dH epilogues again, now with the hardware
# e4m3 convert and without re-reading anything: each lane keeps the 1x128 tile's bf16 pairs it just
# stored in registers, a lane quad holds whole rows (amax = 2 shuffles), codes go out through the
# warp's staging tile as 16-byte stores. Selectable: launchers take a_q / dh_q (null = today's
# path: bf16 out, then fp8_quantize_rows); the layer switch cuda::set_fp8_output_quantization
# (`leanmoe bench --fp8-quant pass|epilogue`, default pass). Epilogue mode: up writes no bf16 A.
# Branch fp8epi, commit in $CARRY/commit.
#   0. smoke (timeout 90 s): ExpertGemmsFp8.SwiGLUDefaultPath (a_q / dh_q bit for bit vs the host)
#      and CudaBackendFp8.EpilogueQuantizationBitwise (layer pass vs epilogue, bitwise).
#   1. GEMM benches (quiet GPU, ~3 s warm-up first): two rounds of leanmoe_bench_gemms --gemms up,dh
#      --precision fp8 on 120B-n2048, 30B-n1024, olmoe-1b-7b, qwen3-30b-a3b; each GEMM three ways in
#      turn: -fp8 (GEMM alone, bf16 out), -fp8-pass (+ fp8_quantize_rows), -fp8-epi (fused).
#   2. layer: leanmoe bench --config ROW --router topk_then_softmax --graph --precision fp8, steady
#      iterations (bench/steady_iters.py), --fp8-quant pass and epilogue, on 120B-n2048 and
#      olmoe-1b-7b (order alternated per row).
#   3. GPU tests '*Fp8*' beside compute-sanitizer memcheck on ExpertGemmsFp8.*, then racecheck on
#      the default, interleaved and plain cases.
#   4. summary last.
# Expected run time ~3.5 min (smoke 15 s, GEMM benches ~50 s, layer ~70 s, tests + memcheck ~60 s,
# racecheck ~40 s). Hard cap ~6 min. Returns $FINAL/fp8epi_summary.txt (summary + raw tables) and
# $FINAL/fp8epi_tests.txt.
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the binaries link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8epi"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe_bench_gemms leanmoe; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "fp8epi commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 0. smoke (t=$((SECONDS - T0)))"
timeout -k 5 90 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemmsFp8.SwiGLUDefaultPath:CudaBackendFp8.EpilogueQuantizationBitwise' > "$W/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE (t=$((SECONDS - T0)))"; tail -3 "$W/smoke.txt"

SHAPES=120B-n2048,30B-n1024,olmoe-1b-7b,qwen3-30b-a3b
echo "== 1. GEMM benches up,dh fp8 (t=$((SECONDS - T0)))"
timeout -k 5 30 "$B/leanmoe_bench_gemms" --gemms up --shape 120B-n2048 --precision fp8 --iters 150 --warmup 3 \
  > /dev/null 2>&1  # warm-up, ~3 s
for round in 1 2; do
  if [ $SMOKE -ge 124 ]; then echo "skip GEMM benches (smoke hung)"; break; fi
  timeout -k 5 90 "$B/leanmoe_bench_gemms" --gemms up,dh --shape $SHAPES --layout hf --precision fp8 \
    --iters 20 --warmup 3 > "$W/gemms_$round.txt" 2>&1
  echo "round $round rc=$? (t=$((SECONDS - T0)))"
done

echo "== 2. layer (t=$((SECONDS - T0)))"
for row in 120B-n2048 olmoe-1b-7b; do
  read -r warm iters < <(python3 bench/steady_iters.py "$row")
  order="pass epilogue"; [ $row = olmoe-1b-7b ] && order="epilogue pass"
  for q in $order; do
    if [ $SMOKE -ge 124 ] && [ $q = epilogue ]; then continue; fi
    timeout -k 5 75 "$B/leanmoe" bench --config $row --router topk_then_softmax --graph --precision fp8 --fp8-quant $q \
      --warmup $warm --iters $iters --json "$W/layer_${row}_$q.json" > "$W/layer_${row}_$q.txt" 2>&1
    echo "$row $q rc=$? (t=$((SECONDS - T0)))"
  done
done

echo "== 3. GPU tests *Fp8* beside memcheck, then racecheck (t=$((SECONDS - T0)))"
timeout -k 5 180 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter='*Fp8*' > "$W/tests.txt" 2>&1 &
P1=$!
timeout -k 5 150 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='ExpertGemmsFp8.*' > "$W/memcheck.txt" 2>&1
R2=$?
wait $P1; R1=$?
RC='ExpertGemmsFp8.SwiGLUDefaultPath:ExpertGemmsFp8.SwiGLUInterleaved:ExpertGemmsFp8.PlainReLU2'
timeout -k 5 120 compute-sanitizer --tool racecheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter="$RC" > "$W/racecheck.txt" 2>&1
R3=$?
echo "tests rc=$R1 memcheck rc=$R2 racecheck rc=$R3 (t=$((SECONDS - T0)))"
{
  echo "## smoke (rc=$SMOKE; 124 = hung)"; grep -E "PASSED|FAILED|Failure|rror|got|want" "$W/smoke.txt" | head -30
  echo "## *Fp8* (rc=$R1; 124 = timeout)"
  grep -E "PASSED|FAILED|Failure|rror|got|want|tests ran|fp8 layer vs cpu" "$W/tests.txt" | head -60
  echo "## memcheck ExpertGemmsFp8.* (rc=$R2)"; grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
  echo "## racecheck $RC (rc=$R3)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|hazard|Error" "$W/racecheck.txt" | head -20
} > "$FINAL/fp8epi_tests.txt"

python3 - "$W" > "$W/summary.txt" <<'EOF'
import sys, os, json
W = sys.argv[1]
ms = {}  # (shape, gemm, variant) -> [ms]
for name in ("gemms_1", "gemms_2"):
    path = f"{W}/{name}.txt"
    if not os.path.exists(path): continue
    for line in open(path):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) != 11 or f[7] not in ("up", "dh"): continue
        try: t = float(f[9])
        except ValueError: continue
        v = {"hf-fp8": "gemm", "hf-fp8-pass": "pass", "hf-fp8-epi": "epi"}.get(f[1])
        if v: ms.setdefault((f[0], f[7], v), []).append(t)
fmt = lambda k: ("/".join(f"{x:.3f}" for x in ms[k])) if k in ms else "-"
best = lambda k: min(ms[k]) if k in ms else None
print("FP8 GEMMs, ms per round (r1/r2); gemm = bf16 output only; pass = gemm + fp8_quantize_rows;")
print("epi = quantized in the epilogue (up: no bf16 A); epi/pass < 1: the fused path wins")
print("| shape | GEMM | gemm | pass | epi | pass - gemm | epi - gemm | epi / pass |")
print("|---|---|---|---|---|---|---|---|")
for s, g in sorted({k[:2] for k in ms}, key=lambda k: (k[1], k[0])):
    a, p, e = best((s, g, "gemm")), best((s, g, "pass")), best((s, g, "epi"))
    d = lambda x: f"{x - a:+.3f}" if x is not None and a is not None else "-"
    r = f"{e / p:.3f}" if e and p else "-"
    print(f"| {s} | {g} | {fmt((s, g, 'gemm'))} | {fmt((s, g, 'pass'))} | {fmt((s, g, 'epi'))} | {d(p)} | {d(e)} | {r} |")
print()
print("Layer, CUDA-graph replays, ms (leanmoe bench --precision fp8 --graph, steady iterations)")
print("| row | fwd pass | fwd epi | bwd pass | bwd epi | fwd+bwd epi / pass |")
print("|---|---|---|---|---|---|")
for row in ("120B-n2048", "olmoe-1b-7b"):
    try:
        p = json.load(open(f"{W}/layer_{row}_pass.json"))["results"][0]
        e = json.load(open(f"{W}/layer_{row}_epilogue.json"))["results"][0]
        fp, fe, bp, be = p["fwd_graph_ms"], e["fwd_graph_ms"], p["bwd_graph_ms"], e["bwd_graph_ms"]
        print(f"| {row} | {fp:.3f} | {fe:.3f} | {bp:.3f} | {be:.3f} | {(fe + be) / (fp + bp):.3f} |")
    except Exception as ex:
        print(f"| {row} | missing: {ex} |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/gemms_*.txt "$W"/layer_*.txt; do [ -e "$f" ] && { echo "## $(basename $f)"; cat "$f"; }; done; } \
  > "$FINAL/fp8epi_summary.txt"
echo "== tests and sanitizers (t=$((SECONDS - T0)))"; cat "$FINAL/fp8epi_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
