# fp8torch (issue 16, FP8 through PyTorch; branch fp8torch): leanmoe.MoE(precision="fp8") keeps its
# weights' FP8 codes (buffers), hands them to the layer (fp8_weights_given: no weight quantized per
# call) and ExpertAdamW's fused update (leanmoe::optim::update_tensor, set_fp8_copy's kernel) rewrites
# them, in backward and in step(); stale codes (load_state_dict, edits, other optimizers, .to()) are
# found and rewritten before the next call.
#
# Python front: uses PYTHONPATH=/tmp/site when it holds this branch's operators (the lead's build, as
# scripts/device_train.sh does, against $CARRY/libleanmoe.a.xz: CUDA core, OpenBLAS static); if not
# (no torch.ops.leanmoe.fp8_weight_codes_ there), builds it itself into $W/site (~2.5 min, 16 cores).
# 1. pytest: python/tests/test_fp8.py (all: CUDA = codes kept == quantized per call bit for bit on
#    outputs and every gradient over 4 steps standard and in-backward, stale-codes cases, .data +
#    refresh, resume, torch.compile aot_eager/inductor), test_optim.py and test_compile.py (-k cuda).
# 2. bench/torch_fp8_step.py: one layer forward+backward+ExpertAdamW step, T = 32768, olmoe-1b-7b and
#    120B-n2048, standard and in-backward, bf16 / fp8 per call / fp8 codes; 3 s warm-up per variant,
#    1.5 s measured (CUDA events), medians; peak ~30 GB of device memory.
# No new kernels (the update+copy kernel and fp8_quantize_blocks ran under the sanitizers in fp8optim's
# call), so no sanitizer step.
# Expected run time: ~3.5 min with /tmp/site ready (tests ~1.5 min, bench ~1.5 min; caps 220 + 170 s);
# ~6 min when it builds the front itself.
# Returns $FINAL/fp8torch_tests.log, $FINAL/fp8torch_bench.log (and fp8torch_build.log on a build failure).
# Pass: tests all passed, none of the CUDA ones skipped; the bench table printed. What to read: the
# "fp8 codes" rows' speedup vs bf16 (fwd+bwd and total) against "fp8 per call".
set -uo pipefail
echo "fp8torch commit $(cat "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
SITE=/tmp/site
has_ops() { PYTHONPATH="$1" python3 -c "import torch, leanmoe; torch.ops.leanmoe.fp8_weight_codes_" >/dev/null 2>&1; }
if ! has_ops "$SITE"; then
  echo "== fp8torch: building the python front into \$W/site (t=${SECONDS})"
  SITE="$W/site"
  xz -dc "$CARRY/libleanmoe.a.xz" > "$W/libleanmoe.a"
  blas="$(for d in /tmp/blas ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }}; do [ -e "$d/libopenblas.so.0" ] && echo "$d/libopenblas.so.0" && break; done)"
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 python3 -m pip install -q --no-build-isolation --no-deps --target "$SITE" \
    ./python -Ccmake.define.LEANMOE_CORE_LIBRARY="$W/libleanmoe.a" ${blas:+-Ccmake.define.LEANMOE_BLAS_LIBRARY=$blas} \
    > "$W/fp8torch_build.log" 2>&1 || { echo "fp8torch: python build failed"; tail -30 "$W/fp8torch_build.log"; cp "$W/fp8torch_build.log" "$FINAL/"; }
  echo "built (t=${SECONDS})"
fi
R="$PWD"

echo "== fp8torch pytest (t=${SECONDS})"
(cd /tmp && PYTHONPATH="$SITE" timeout 220 python3 -m pytest -q -rs "$R/python/tests/test_fp8.py" \
   "$R/python/tests/test_optim.py" "$R/python/tests/test_compile.py" -k "fp8 or cuda") > "$W/fp8torch_tests.log" 2>&1
echo "pytest rc=$? (t=${SECONDS})"
cp "$W/fp8torch_tests.log" "$FINAL/"

echo "== fp8torch bench (t=${SECONDS})"
(cd /tmp && PYTHONPATH="$SITE" timeout 170 python3 "$R/bench/torch_fp8_step.py" --configs olmoe-1b-7b,120B-n2048 \
   --mode both --warmup-s 3 --measure-s 1.5) > "$W/fp8torch_bench.log" 2>&1
echo "bench rc=$? (t=${SECONDS})"
cp "$W/fp8torch_bench.log" "$FINAL/"

echo "== fp8torch summary (t=${SECONDS})"
grep -E "passed|failed|error" "$W/fp8torch_tests.log" | tail -3
grep -E "^(FAILED|ERROR|SKIPPED)" "$W/fp8torch_tests.log" | head -20
grep -B2 -A12 "^_____" "$W/fp8torch_tests.log" | grep -E "^E |Error" | head -20
sed -n '/^| config/,$p' "$W/fp8torch_bench.log"
tail -3 "$W/fp8torch_bench.log" | grep -i -E "error|Traceback" || true
ok=1
grep -qE "[0-9]+ passed" "$W/fp8torch_tests.log" || ok=0
grep -qE "[0-9]+ (failed|error)" "$W/fp8torch_tests.log" && ok=0
grep -qE "^SKIPPED.*(no GPU|without its CUDA backend)" "$W/fp8torch_tests.log" && ok=0
grep -q "^| 120B-n2048 | in_backward | fp8 codes" "$W/fp8torch_bench.log" || ok=0
echo "FP8TORCH VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: pytest all passed, no CUDA test skipped; bench table complete) t=${SECONDS}s"
