#!/usr/bin/env bash
# Session 13, device call 1 (issues 16, 17): main c067b72 (= 80aa44e's library: FP8 down/dx
# cooperative 128x128 1x2 / 2x1, dH quantized on the GEMM stream; never run on the GPU before).
# (1) the whole GPU test suite, memcheck over the FP8 layer tests; (2) the layer in FP8 (weights'
# codes given) against bf16 on every grid row FP8 takes with d >= 2048 (CUDA-graph replays, ~3 s
# warm-up each: bench/steady_iters.py); (3) in the background, the python front built against the
# carried core for call 2 (train_lm, /tmp/site). Carry [".carry/s13a", ".carry/blaslibs.tar.xz"].
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; C=.carry/s13a
source scripts/device_env.sh
for f in leanmoe leanmoe_gpu_tests libleanmoe.a; do xz -dc $C/$f.xz > "$W/$f"; done
chmod +x "$W/leanmoe" "$W/leanmoe_gpu_tests"; mkdir -p /tmp/core && cp "$W/libleanmoe.a" /tmp/core/ && cp $C/commit /tmp/core/
echo "main $(cat $C/commit)"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
( CMAKE_BUILD_PARALLEL_LEVEL=12 timeout 300 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
    ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=/tmp/core/libleanmoe.a \
    -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 > /tmp/python_build.log 2>&1; echo "python build rc=$?" >> /tmp/python_build.log ) &
PB=$!
T="$W/leanmoe_gpu_tests"
timeout 240 "$T" --gtest_brief=1 > "$W/tests.log" 2>&1 &
P1=$!
timeout 240 compute-sanitizer --tool memcheck --print-limit 10 "$T" --gtest_brief=1 --gtest_filter='CudaBackendFp8.*:CudaFp8Weights.*' > "$W/memcheck.log" 2>&1 &
P2=$!
wait $P1; R1=$?; wait $P2; R2=$?
{ echo "gpu tests rc=$R1 memcheck rc=$R2"; grep -E "PASSED|FAILED|tests ran" "$W/tests.log"; grep -B3 -A12 Failure "$W/tests.log" | head -50
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log" | head; } | tee "$FINAL/tests.txt"
ROWS="30B-n256 30B-n512 30B-n1024 120B-n512 120B-n1024 120B-n2048 olmoe-1b-7b qwen3-30b-a3b"
for c in $ROWS; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for p in storage fp8; do
    timeout 60 "$W/leanmoe" bench --config $c --router topk_then_softmax --graph --precision $p --warmup $warm --iters $iters \
      --json "$W/layer_${c}_$p.json" > /dev/null 2>&1 || echo "$c $p rc=$?"
  done
done
python3 - "$W" "$ROWS" <<'PY' | tee "$FINAL/fp8_layer.md"
import json, sys
W, rows = sys.argv[1], sys.argv[2].split()
print("CUDA-graph replays, ms; TFLOP/s bf16-equivalent (fwd+bwd 18·T·K·d·n / time); fp8 = weights' codes given\n")
print("| row | bf16 fwd | fp8 fwd | bf16 bwd | fp8 bwd | fwd x | bwd x | fwd+bwd x | fp8 fwd+bwd TFLOP/s |")
print("|---|---|---|---|---|---|---|---|---|")
for c in rows:
    try:
        b = json.load(open(f"{W}/layer_{c}_storage.json"))["results"][0]; q = json.load(open(f"{W}/layer_{c}_fp8.json"))["results"][0]
    except Exception as e:
        print(f"| {c} | missing: {e} |"); continue
    fb, bb, fq, bq = b["fwd_graph_ms"], b["bwd_graph_ms"], q["fwd_graph_ms"], q["bwd_graph_ms"]
    tf = (b["fwd_flops"] + b["bwd_flops"]) / ((fq + bq) * 1e-3) / 1e12
    print(f"| {c} | {fb:.3f} | {fq:.3f} | {bb:.3f} | {bq:.3f} | {fb/fq:.2f} | {bb/bq:.2f} | {(fb+bb)/(fq+bq):.2f} | {tf:.0f} |")
PY
tar czf "$FINAL/layer_json.tgz" -C "$W" $(cd "$W" && ls layer_*.json)
wait $PB; tail -3 /tmp/python_build.log | tee "$FINAL/python_build.txt"
PYTHONPATH=/tmp/site python3 -c "import leanmoe, torch; print('leanmoe', leanmoe.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -2 | tee -a "$FINAL/python_build.txt"
echo "done (t=${SECONDS})"
