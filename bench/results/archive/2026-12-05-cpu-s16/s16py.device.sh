# s16py (issues 16, and the user path): the python front on cuda, as session 15's s15py.device.sh,
# with the checkout's python/leanmoe/*.py overlaid on the carried front (its .so was built against
# torch 2.11.0+cu130 at d78af67; python/csrc unchanged since, checked below by hash), so sessions 15
# and 16's python changes are the ones tested.
#   pytest, cuda-parametrized tests: test_hf_experts, test_fp8, test_routed, test_optim, test_hf,
#   test_training_loop; then bench/torch_fp8_step.py on olmoe-1b-7b and 120B-n2048 (s14 call 2's
#   command: 120B-n2048 fp8 codes step 8.30 ms, whole step 1.175x / 1.182x bf16).
# Expected ~5-6 min (caps 420 + 150 s). Returns $FINAL/s16py_pytest.log, s16py_step.log.
# Pass: no failures, "passed" > 0 (cuda tests ran).
set -uo pipefail
R="$PWD"
SITE="$W/s16site"; mkdir -p "$SITE"; tar xJf "$CARRY/site.tar.xz" -C "$SITE"
echo "s16py: $(cat "$CARRY/commit")"
have="$(cat python/csrc/* python/CMakeLists.txt python/pyproject.toml | sha1sum | cut -d' ' -f1)"
if [ "$have" != "$(cat "$CARRY/csrc.sha1")" ]; then
  echo "s16py: python/csrc changed since the carried front was built: rebuild it (not run)"; exit 1
fi
cp "$R"/python/leanmoe/*.py "$SITE/leanmoe/"
(cd /tmp && PYTHONPATH="$SITE" timeout 420 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider -k cuda \
   "$R/python/tests/test_hf_experts.py" "$R/python/tests/test_fp8.py" "$R/python/tests/test_routed.py" \
   "$R/python/tests/test_optim.py" "$R/python/tests/test_hf.py" "$R/python/tests/test_training_loop.py") \
   > "$W/s16py_pytest.log" 2>&1
echo "s16py pytest rc=$? (t=${SECONDS})"
tail -15 "$W/s16py_pytest.log"
cp "$W/s16py_pytest.log" "$FINAL/"
(cd /tmp && PYTHONPATH="$SITE" timeout 150 python3 "$R/bench/torch_fp8_step.py" --configs olmoe-1b-7b,120B-n2048 \
   --mode both --warmup-s 3 --measure-s 1.5) > "$W/s16py_step.log" 2>&1
echo "s16py step bench rc=$? (t=${SECONDS})"
tail -20 "$W/s16py_step.log"
cp "$W/s16py_step.log" "$FINAL/"
