# fp8step (issue 16: the fp8 layer's optimizer step at a bf16 layer's cost; branch fp8step): bf16
# moments in leanmoe's fused update (fp32 math, moments rounded to bf16 on store), which ExpertAdamW
# now keeps for fp8 layers like torch's fused AdamW keeps them for bf16 layers (14 instead of ~24
# bytes moved per weight, + the codes).
# 1. leanmoe_gpu_tests --gtest_filter='Optim*' (OptimGpu, OptimGpuStack, OptimFp8Gpu; new:
#    *Bf16Moments*: GPU == CPU bit for bit, in-backward == standard bit for bit), cap 90 s.
# 2. compute-sanitizer memcheck and racecheck on the new kernels' tests
#    (OptimFp8Gpu.Bf16Moments*, OptimGpu.Bf16Moments*), caps 60 + 45 s.
# 3. pytest test_fp8.py + test_optim.py with the carried front ($CARRY/site.tar.xz: built here by
#    g++ 12 against torch 2.11.0+cu130 / Python 3.12, linked with this branch's CUDA core), cap 150 s.
# 4. vs_torch.py: an fp8 layer's leanmoe update (bf16 moments) against torch's fused AdamW on the
#    same bf16 weights/gradients on the GPU: % of p, m, v bitwise equal after 1 and 5 steps (the docs
#    say "not bitwise equal, same formula": this measures how far), cap 45 s.
# 5. bench/torch_fp8_step.py olmoe-1b-7b,120B-n2048, both modes, 3 s warm-up, 1.5 s measure, cap 150 s.
# Expected run time: ~4 min (tests ~0.5 min, sanitizers ~1 min, pytest ~1 min, vs_torch ~10 s,
# bench ~2 min).
# Returns $FINAL/fp8step_gpu.log, fp8step_sanitizer.log, fp8step_pytest.log, fp8step_vs_torch.log,
# fp8step_bench.log.
# Pass: all gtest passed (none skipped), sanitizers 0 errors, pytest all passed, bench table with the
# 'fp8 codes' step time close to the bf16 one (was 12.17 vs 8.70 ms at 120B-n2048).
set -uo pipefail
echo "fp8step commit $(cat "$CARRY/commit" 2>/dev/null)"
R="$PWD"
xz -dc "$CARRY/leanmoe_gpu_tests.xz" > "$W/leanmoe_gpu_tests" && chmod +x "$W/leanmoe_gpu_tests"
SITE="$W/site"; mkdir -p "$SITE"; tar xJf "$CARRY/site.tar.xz" -C "$SITE"

echo "== fp8step gtest Optim* (t=${SECONDS})"
(cd "$R" && timeout 90 "$W/leanmoe_gpu_tests" --gtest_filter='Optim*' --gtest_brief=1) > "$W/fp8step_gpu.log" 2>&1
echo "gtest rc=$? (t=${SECONDS})"
cp "$W/fp8step_gpu.log" "$FINAL/"

echo "== fp8step sanitizers (t=${SECONDS})"
{
  echo "-- memcheck"
  (cd "$R" && timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$W/leanmoe_gpu_tests" \
     --gtest_filter='OptimFp8Gpu.Bf16Moments*:OptimGpu.Bf16Moments*' --gtest_brief=1 2>&1 | tail -6); echo "memcheck rc=${PIPESTATUS[0]}"
  echo "-- racecheck"
  (cd "$R" && timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 "$W/leanmoe_gpu_tests" \
     --gtest_filter='OptimFp8Gpu.Bf16Moments*' --gtest_brief=1 2>&1 | tail -6); echo "racecheck rc=${PIPESTATUS[0]}"
} > "$W/fp8step_sanitizer.log" 2>&1
cp "$W/fp8step_sanitizer.log" "$FINAL/"
echo "sanitizers done (t=${SECONDS})"

echo "== fp8step pytest (t=${SECONDS})"
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 2"
(cd /tmp && PYTHONPATH="$SITE" timeout 150 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider $XD \
   "$R/python/tests/test_fp8.py" "$R/python/tests/test_optim.py") > "$W/fp8step_pytest.log" 2>&1
echo "pytest rc=$? (t=${SECONDS})"
cp "$W/fp8step_pytest.log" "$FINAL/"

echo "== fp8step vs torch's fused AdamW (t=${SECONDS})"
cat > "$W/vs_torch.py" <<'PY'
# The leanmoe update with bf16 moments (ExpertAdamW on an fp8 layer) against torch's fused AdamW on
# the same bf16 weights and gradients: share of elements bitwise equal, and the largest difference
# relative to the tensor's largest value, after 1 and 5 steps.
import sys, torch, leanmoe
from leanmoe.optim import ExpertAdamW
dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
torch.manual_seed(0)
m = leanmoe.MoE(1024, 512, 8, 2, precision="fp8", device=dev, dtype=torch.bfloat16)
hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ps = [m.gate_up_proj, m.down_proj]
ours = ExpertAdamW(ps, in_backward=False, **hyper)
w = [p.detach().clone().requires_grad_() for p in ps]
theirs = torch.optim.AdamW(w, fused=True, **hyper)
def rel(a, b):  # largest difference relative to the tensor's largest value
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max()).item()
for step in range(1, 6):
    for p, q in zip(ps, w):
        p.grad = (torch.randn(p.shape, generator=torch.Generator().manual_seed(step)) * 1e-2).to(p)
        q.grad = p.grad.clone()
    ours.step(); theirs.step()
    if step in (1, 5):
        for name, p, q in zip(("gate_up_proj", "down_proj"), ps, w):
            row = [f"step {step} {name}:"]
            for what, a, b in (("p", p, q), ("m", ours.state[p]["exp_avg"], theirs.state[q]["exp_avg"]),
                               ("v", ours.state[p]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])):
                row.append(f"{what} {100 * (a.view(torch.int16) == b.view(torch.int16)).float().mean().item():.3f}% equal"
                           f" (max diff {rel(a, b):.1e} of max)")
            print("  ".join(row))
PY
(cd /tmp && PYTHONPATH="$SITE" timeout 45 python3 "$W/vs_torch.py" cuda) > "$W/fp8step_vs_torch.log" 2>&1
echo "vs_torch rc=$? (t=${SECONDS})"
cp "$W/fp8step_vs_torch.log" "$FINAL/"

echo "== fp8step bench (t=${SECONDS})"
(cd /tmp && PYTHONPATH="$SITE" timeout 150 python3 "$R/bench/torch_fp8_step.py" --configs olmoe-1b-7b,120B-n2048 \
   --mode both --warmup-s 3 --measure-s 1.5) > "$W/fp8step_bench.log" 2>&1
echo "bench rc=$? (t=${SECONDS})"
cp "$W/fp8step_bench.log" "$FINAL/"

echo "== fp8step summary (t=${SECONDS})"
grep -E "tests? from .* ran|^\[  (PASSED|FAILED|SKIPPED) " "$W/fp8step_gpu.log" | head -20
grep -E "ERROR SUMMARY|rc=" "$W/fp8step_sanitizer.log"
grep -E "[0-9]+ (passed|failed)" "$W/fp8step_pytest.log" | tail -1
grep -E "^(FAILED|ERROR)|Fatal Python error" "$W/fp8step_pytest.log" | head -10
grep -E "^SKIPPED" "$W/fp8step_pytest.log" | head -5
tail -4 "$W/fp8step_vs_torch.log"
sed -n '/^| config/,$p' "$W/fp8step_bench.log"
tail -3 "$W/fp8step_bench.log" | grep -i -E "error|Traceback" || true
ok=1
grep -qE "^\[  PASSED  \]" "$W/fp8step_gpu.log" || ok=0
grep -qE "^\[  (FAILED|SKIPPED) " "$W/fp8step_gpu.log" && ok=0
[ "$(grep -c 'ERROR SUMMARY: 0 errors' "$W/fp8step_sanitizer.log")" -ge 2 ] || ok=0
grep -qE "[0-9]+ passed" "$W/fp8step_pytest.log" || ok=0
grep -qE "[0-9]+ (failed|error)|Fatal Python error" "$W/fp8step_pytest.log" && ok=0
grep -q "^| 120B-n2048 | in_backward | fp8 codes" "$W/fp8step_bench.log" || ok=0
echo "FP8STEP VERDICT: $([ $ok = 1 ] && echo PASS || echo FAIL) (needs: Optim* gtest passed, 0 sanitizer errors, pytest passed, bench table complete; read the step column) t=${SECONDS}s"
