# fp8epi2 (issue 16): A and dH quantized in the FP8 up / dH epilogues as the layer's ONLY path (the
# pass/epilogue switch and `leanmoe bench --fp8-quant` are gone); forward's FP8 workspace holds no
# bf16 A (R·n·2 bytes fewer: 512 MiB at 120B-n2048). Kernels unchanged since s14 call 4 (4685116:
# tests 42/42, memcheck 0, racecheck 0 hazards); this checks the layer wiring and gives the layer's
# fp8 vs bf16 numbers. Branch fp8epi, commit in $CARRY/commit.
#   1. GPU tests '*Fp8*:CudaBackend*:*Workspace*' (timeout 180 s) beside compute-sanitizer memcheck on
#      'ExpertGemmsFp8.*:CudaBackendFp8.*' (timeout 200 s). New: CudaBackendFp8.ForwardWorkspaceHoldsNoBf16A.
#   2. layer: leanmoe bench --config ROW --router topk_then_softmax --graph, --precision storage (bf16)
#      and fp8 (weights' codes given), steady iterations (bench/steady_iters.py), order alternated per
#      row, on 120B-n2048, 30B-n1024, olmoe-1b-7b, qwen3-30b-a3b (8 runs, ~6-10 s each).
#   3. summary last: fwd / bwd graph ms, fp8 vs bf16 ratios, forward workspace MiB (fp8's, and what
#      it would be with the bf16 A it no longer holds).
# Expected run time ~3 min (tests + memcheck ~90 s in parallel, layer ~80 s). Hard cap ~6.5 min.
# Returns $FINAL/fp8epi2_summary.txt (summary + raw layer output) and $FINAL/fp8epi2_tests.txt.
set -uo pipefail
T0=$SECONDS
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the binaries link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8epi2"; mkdir -p "$B"
for f in leanmoe_gpu_tests leanmoe; do xz -dc "$CARRY/$f.xz" > "$B/$f" && chmod +x "$B/$f"; done
echo "fp8epi2 commit $(cat "$CARRY/commit")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

echo "== 1. GPU tests beside memcheck (t=$((SECONDS - T0)))"
TF='*Fp8*:CudaBackend*:*Workspace*'; MF='ExpertGemmsFp8.*:CudaBackendFp8.*'
[ -n "${LAYER_ONLY:-}" ] && TF=NONE && MF=NONE  # s14 call 6: the layer rows only
timeout -k 5 180 "$B/leanmoe_gpu_tests" --gtest_brief=1 --gtest_filter="$TF" \
  > "$W/tests.txt" 2>&1 &
P1=$!
timeout -k 5 200 compute-sanitizer --tool memcheck --print-limit 10 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter="$MF" > "$W/memcheck.txt" 2>&1
R2=$?
wait $P1; R1=$?
echo "tests rc=$R1 memcheck rc=$R2 (t=$((SECONDS - T0)))"
{
  echo "## *Fp8*:CudaBackend*:*Workspace* (rc=$R1; 124 = timeout)"
  grep -E "PASSED|FAILED|Failure|rror|got|want|tests ran|fp8 layer vs cpu|Expected|Which is" "$W/tests.txt" | head -60
  echo "## memcheck ExpertGemmsFp8.*:CudaBackendFp8.* (rc=$R2; 124 = timeout)"
  grep -E "ERROR SUMMARY|PASSED|FAILED|Invalid|Error" "$W/memcheck.txt" | head -20
} > "$FINAL/fp8epi2_tests.txt"

echo "== 2. layer bf16 vs fp8 (t=$((SECONDS - T0)))"
ROWS="${ROWS:-120B-n2048 30B-n1024 olmoe-1b-7b qwen3-30b-a3b}"
i=0
for row in $ROWS; do
  read -r warm iters < <(python3 bench/steady_iters.py "$row")
  order="storage fp8"; [ $((i % 2)) = 1 ] && order="fp8 storage"; i=$((i + 1))
  for p in $order; do
    timeout -k 5 60 "$B/leanmoe" bench --config $row --router topk_then_softmax --graph --precision $p \
      --warmup $warm --iters $iters --json "$W/layer_${row}_$p.json" > "$W/layer_${row}_$p.txt" 2>&1
    echo "$row $p rc=$? (t=$((SECONDS - T0)))"
  done
done

python3 - "$W" $ROWS > "$W/summary.txt" <<'EOF'
import sys, json
W, rows = sys.argv[1], sys.argv[2:]
MiB = 2.0 ** 20
print("Layer, CUDA-graph replays, ms (leanmoe bench --router topk_then_softmax --graph, steady iterations);")
print("fp8 = weights' codes given, A and dH quantized in the epilogues (no bf16 A). ratio = fp8 / bf16 (< 1: fp8 faster)")
print("fwd ws: forward workspace MiB (plan_layer); fp8 +A: what fp8's was with the bf16 A (+ R·n·2 bytes)")
print("| row | fwd bf16 | fwd fp8 | bwd bf16 | bwd fp8 | fwd ratio | bwd ratio | fwd+bwd ratio | fwd ws bf16 | fwd ws fp8 | fp8 +A |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for row in rows:
    try:
        b = json.load(open(f"{W}/layer_{row}_storage.json"))["results"][0]
        f = json.load(open(f"{W}/layer_{row}_fp8.json"))["results"][0]
        fb, ff, bb, bf = b["fwd_graph_ms"], f["fwd_graph_ms"], b["bwd_graph_ms"], f["bwd_graph_ms"]
        a = f["rows_topk"] * f["n"] * 2  # top-K routing: R = T·K
        print(f"| {row} | {fb:.3f} | {ff:.3f} | {bb:.3f} | {bf:.3f} | {ff / fb:.3f} | {bf / bb:.3f} | "
              f"{(ff + bf) / (fb + bb):.3f} | {b['fwd_workspace_bytes'] / MiB:.1f} | {f['fwd_workspace_bytes'] / MiB:.1f} | "
              f"{(f['fwd_workspace_bytes'] + a) / MiB:.1f} |")
    except Exception as ex:
        print(f"| {row} | missing: {ex!r} |")
EOF
{ cat "$W/summary.txt"; for f in "$W"/layer_*.txt; do [ -e "$f" ] && { echo "## $(basename $f)"; grep -v "iteration" "$f"; }; done; } \
  > "$FINAL/fp8epi2_summary.txt"
echo "== tests and memcheck (t=$((SECONDS - T0)))"; cat "$FINAL/fp8epi2_tests.txt"
echo "== summary (t=$((SECONDS - T0)))"; cat "$W/summary.txt"
