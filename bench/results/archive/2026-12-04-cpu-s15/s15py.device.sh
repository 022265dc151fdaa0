# s15py (issues 16, and the user path): session 15's python changes on the GPU, which ran on the CPU
# only: transformers' experts_implementation="leanmoe_fp8" with the weights' FP8 codes handed to the
# routed operators (moe_routed_forward / backward / backward_adamw_ take fp8_weights), the 17 fixes
# of branch breakit (frozen experts, tied weights, copies, autograd.grad, masters, precision switch),
# with the front built here against torch 2.11.0+cu130 and main's CUDA core ($CARRY/site.tar.xz;
# the .so depends on torch's ABI only, not Python's).
#   pytest, cuda-parametrized tests only (the CPU ones ran here): test_hf_experts (FP8 experts vs the
#   torch emulation, near fp32, codes kept == per call bit for bit over 3 steps incl. in-backward),
#   test_fp8 (codes, tied weights, copies), test_routed, test_optim, test_hf.
# Then bench/torch_fp8_step.py on olmoe-1b-7b and 120B-n2048, both modes (s14 call 2's command): the
# in-backward host checks breakit added per call (torch's engine asked whether the weights get a
# gradient; the master's version check) must leave the step times of s14 call 2 (120B-n2048 fp8
# codes step 8.30 ms, whole step 1.175x / 1.182x bf16) unchanged.
# Expected run time: ~5 min (caps 420 + 150 s). Returns $FINAL/s15py_pytest.log, s15py_step.log.
# Pass: no failures; "passed" count > 0 (the cuda-parametrized tests ran, none skipped for a missing backend).
set -uo pipefail
R="$PWD"
SITE="$W/s15site"; mkdir -p "$SITE"; tar xJf "$CARRY/site.tar.xz" -C "$SITE"
echo "s15py: $(cat "$CARRY/commit")"
(cd /tmp && PYTHONPATH="$SITE" timeout 420 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -k cuda \
   "$R/python/tests/test_hf_experts.py" "$R/python/tests/test_fp8.py" "$R/python/tests/test_routed.py" \
   "$R/python/tests/test_optim.py" "$R/python/tests/test_hf.py") > "$W/s15py_pytest.log" 2>&1
echo "s15py pytest rc=$? (t=${SECONDS})"
tail -15 "$W/s15py_pytest.log"
cp "$W/s15py_pytest.log" "$FINAL/"
(cd /tmp && PYTHONPATH="$SITE" timeout 150 python3 "$R/bench/torch_fp8_step.py" --configs olmoe-1b-7b,120B-n2048 \
   --mode both --warmup-s 3 --measure-s 1.5) > "$W/s15py_step.log" 2>&1
echo "s15py step bench rc=$? (t=${SECONDS})"
tail -20 "$W/s15py_step.log"
cp "$W/s15py_step.log" "$FINAL/"
