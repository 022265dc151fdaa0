# s15py (issues 16, and the user path): session 15's python changes on the GPU, which ran on the CPU
# only: transformers' experts_implementation="leanmoe_fp8" with the weights' FP8 codes handed to the
# routed operators (moe_routed_forward / backward / backward_adamw_ take fp8_weights), the 17 fixes
# of branch breakit (frozen experts, tied weights, copies, autograd.grad, masters, precision switch),
# with the front built here against torch 2.11.0+cu130 and main's CUDA core ($CARRY/site.tar.xz;
# the .so depends on torch's ABI only, not Python's).
#   pytest, cuda-parametrized tests only (the CPU ones ran here): test_hf_experts (FP8 experts vs the
#   torch emulation, near fp32, codes kept == per call bit for bit over 3 steps incl. in-backward),
#   test_fp8 (codes, tied weights, copies), test_routed, test_optim, test_hf.
# Expected run time: ~3 min (cap 420 s). Returns $FINAL/s15py_pytest.log.
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
