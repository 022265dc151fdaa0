# fp8weights (issue 16): the FP8 layer takes the weights' codes (cfg.fp8_weights_given,
# MoEWeights::fp8) instead of quantizing W1 and W2 on every call; MoEStack hands every fp8 layer the
# expert optimizer's copy (set_fp8_copy); `leanmoe bench --fp8-weights given|per-call`.
# Run from the root of a checkout of branch fp8weights (bench/steady_iters.py reads tools/configs.cpp).
# 1. Smoke: leanmoe bench on a small fp8 row, given and per-call (30 s cap).
# 2. GPU tests: CudaFp8Weights.* (new: given == per-call bit for bit on out, dx, d_router, dW1, dW2,
#    biases, d_topk_weights in both layouts / routing given / token rounding; workspaces drop the
#    codes; misaligned codes refused; MoEStack fp8 standard and in-backward, given copy == per-call
#    bit for bit over 4 steps, copy == fp8::quantize of the weights after steps and after load),
#    CudaBackendFp8.*, CudaBackend.*, OptimGpu*, OptimFp8Gpu.*.
# 3. compute-sanitizer memcheck on CudaFp8Weights.LayerGivenEqualsPerCall (one small fp8 layer, both paths).
# 4. Layer bench, --graph, steady-state counts (bench/steady_iters.py): storage vs fp8 (given) vs fp8
#    (per-call) on 120B-n2048, 30B-n1024, olmoe-1b-7b, qwen3-30b-a3b.
# Expected run time: ~3.5-4 min (unpack 5 s, smoke 10 s, tests ~60 s, memcheck ~30 s, bench 12 runs
# ~2 min). Hard cap ~9 min (timeouts 30 + 200 + 120 + 12 x 60 s, bench loop stops at t=540 s).
# Returns $FINAL/fp8w_tests.log, $FINAL/fp8w_memcheck.log, $FINAL/fp8w_layer.md, $FINAL/fp8w_layer.tgz (JSONs).
# Pass: every selected test passed and none of CudaFp8Weights skipped; memcheck 0 errors; JSON of
# fp8 given says "fp8_weights": "given". Expected: fp8(given) ~3.5-3.7 ms faster than per-call per
# direction at 120B-n2048 (fwd ~8.5 ms vs 12.2, bwd ~20.8 vs 24.5), i.e. fp8(given) 1.2-1.35x bf16.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8w"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -x -C "$B" && chmod +x "$B/leanmoe" "$B/leanmoe_gpu_tests"
echo "fp8weights commit $(cat "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== fp8weights smoke (t=${SECONDS})"
for m in given per-call; do
  timeout 30 "$B/leanmoe" bench --T 1024 --d 512 --n 256 --E 16 --K 2 --precision fp8 --fp8-weights $m \
    --iters 3 --warmup 1 2>&1 | tail -2; echo "smoke $m rc=${PIPESTATUS[0]}"
done

echo "== fp8weights GPU tests (t=${SECONDS})"
timeout 200 "$B/leanmoe_gpu_tests" \
  --gtest_filter='CudaFp8Weights.*:CudaBackendFp8.*:CudaBackend.*:OptimGpu*:OptimFp8Gpu.*' > "$W/fp8w_tests.log" 2>&1
echo "tests rc=$? (t=${SECONDS})"
cp "$W/fp8w_tests.log" "$FINAL/"

echo "== fp8weights memcheck (t=${SECONDS})"
timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$B/leanmoe_gpu_tests" --gtest_brief=1 \
  --gtest_filter='CudaFp8Weights.LayerGivenEqualsPerCall' > "$W/fp8w_memcheck.log" 2>&1
echo "memcheck rc=$? (t=${SECONDS})"
cp "$W/fp8w_memcheck.log" "$FINAL/"

echo "== fp8weights layer bench (t=${SECONDS})"
mkdir -p "$W/fp8w_layer"
for c in 120B-n2048 30B-n1024 olmoe-1b-7b qwen3-30b-a3b; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for p in storage given per-call; do
    [ $SECONDS -lt 540 ] || { echo "$c $p skipped (time)"; continue; }
    if [ $p = storage ]; then args="--precision storage"; else args="--precision fp8 --fp8-weights $p"; fi
    timeout 60 "$B/leanmoe" bench --config $c --router topk_then_softmax --graph $args --warmup $warm --iters $iters \
      --json "$W/fp8w_layer/${c}_$p.json" > "$W/fp8w_layer/${c}_$p.txt" 2>&1; echo "$c $p rc=$? (t=${SECONDS})"
  done
done
tar -czf "$FINAL/fp8w_layer.tgz" -C "$W" fp8w_layer
python3 - "$W/fp8w_layer" > "$FINAL/fp8w_layer.md" <<'PY'
import json, sys
W = sys.argv[1]
print("graph replays, ms (eager in brackets); x = bf16 time / fp8 time; ws = fwd+bwd workspace MiB")
print("| row | bf16 fwd | fp8 given fwd | fp8 per-call fwd | bf16 bwd | fp8 given bwd | fp8 per-call bwd | given x fwd+bwd | per-call x fwd+bwd | ws bf16 / given / per-call |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in ("120B-n2048", "30B-n1024", "olmoe-1b-7b", "qwen3-30b-a3b"):
    r = {}
    for p in ("storage", "given", "per-call"):
        try:
            r[p] = json.load(open(f"{W}/{c}_{p}.json"))["results"][0]
        except Exception as e:
            r[p] = None
    if any(v is None or "fwd_graph_ms" not in v for v in r.values()):
        print(f"| {c} | missing: {[p for p, v in r.items() if v is None or 'fwd_graph_ms' not in v]} |"); continue
    b, g, q = r["storage"], r["given"], r["per-call"]
    assert g.get("fp8_weights") == "given" and q.get("fp8_weights") == "per-call", (g.get("fp8_weights"), q.get("fp8_weights"))
    t = lambda v: v["fwd_graph_ms"] + v["bwd_graph_ms"]
    ws = lambda v: (v["fwd_workspace_bytes"] + v["bwd_workspace_bytes"]) / 2**20
    f = lambda v, k: f"{v[k + '_graph_ms']:.3f} ({v[k + '_ms']:.3f})"
    print(f"| {c} | {f(b, 'fwd')} | {f(g, 'fwd')} | {f(q, 'fwd')} | {f(b, 'bwd')} | {f(g, 'bwd')} | {f(q, 'bwd')} | "
          f"{t(b) / t(g):.2f} | {t(b) / t(q):.2f} | {ws(b):.0f} / {ws(g):.0f} / {ws(q):.0f} |")
PY

echo "== fp8weights summary (t=${SECONDS})"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\] CudaFp8Weights" "$W/fp8w_tests.log" | sed 's/ ([0-9]* ms)//'
grep -E "^\[  FAILED  \] " "$W/fp8w_tests.log" | awk '!seen[$0]++' | head -20
grep -B2 -A6 "Failure" "$W/fp8w_tests.log" | head -40
grep -E "fp8 weights given == per call" "$W/fp8w_tests.log" | head -6
grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]" "$W/fp8w_tests.log" | head -3
grep -E "ERROR SUMMARY" "$W/fp8w_memcheck.log"; grep -m5 -E "Invalid|FAILED" "$W/fp8w_memcheck.log"
ok=1
grep -q "^\[  FAILED  \]" "$W/fp8w_tests.log" && ok=0
grep -q "^\[  PASSED  \]" "$W/fp8w_tests.log" || ok=0
grep -qE "SKIPPED \] CudaFp8Weights" "$W/fp8w_tests.log" && ok=0
grep -q "ERROR SUMMARY: 0 errors" "$W/fp8w_memcheck.log" || ok=0
cat "$FINAL/fp8w_layer.md"
echo "FP8WEIGHTS VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: tests passed, CudaFp8Weights not skipped; memcheck 0 errors) t=${SECONDS}s"
