#!/usr/bin/env bash
# The python suite on CUDA: the front built here (torch 2.11.0+cu130, Python 3.12) against main's core.
# TESTS: test paths relative to the repository root instead of the whole suite, space-separated
# (e.g. TESTS="python/tests/test_routed.py python/tests/test_hf_experts.py::test_bf16_as_close_to_fp32_as_eager_bf16").
set -uo pipefail; R=$PWD; C=$R/.carry/py; FINAL="${OUT:-/tmp/py-out}"; mkdir -p /tmp/blas /tmp/pysite "$FINAL"
tar xJf $C/blaslibs.tar.xz -C /tmp/blas && tar xJf $C/site.tar.xz -C /tmp/pysite
export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
T=(); for t in ${TESTS:-python/tests}; do T+=("$R/$t"); done
echo "front $(cat $C/commit); $(python3 -c 'import torch,transformers;print(torch.__version__,transformers.__version__, torch.cuda.get_device_name())'); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)" | tee "$FINAL/summary.txt"
(cd /tmp && PYTHONPATH=/tmp/pysite python3 -c "import leanmoe; print('cuda_available', leanmoe.cuda_available())") 2>&1 | tee -a "$FINAL/summary.txt"
(cd /tmp && PYTHONPATH=/tmp/pysite timeout "${PYT:-480}" python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider --maxfail=30 "${T[@]}") > "$FINAL/pytest.log" 2>&1
echo "pytest rc=$? t=$SECONDS" | tee -a "$FINAL/summary.txt"
grep -E "passed|failed|error" "$FINAL/pytest.log" | tail -3 | tee -a "$FINAL/summary.txt"
grep -E "^(FAILED|ERROR)" "$FINAL/pytest.log" | head -30 | tee -a "$FINAL/summary.txt"
xz -9 "$FINAL/pytest.log"
