#!/usr/bin/env bash
# Session 4, call 2: the leaner varlen-M producer: GPU tests, memcheck, per-GEMM bench, ncu PC
# sampling of up/dh again; the python suite (-v, to name a crashing test) on this commit.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
echo "== GPU tests"; timeout 150 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12
echo "== per GEMM (commit $(cat $B/commit))"
timeout 100 $B/leanmoe_bench_gemms --config 7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b --iters 20 2>&1 | tee "$W/gemms_default.txt"
echo "== memcheck"; timeout 100 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.OneExpertTakesAllRows:CudaBackend.SingleToken*' >"$W/memcheck.log" 2>&1
echo "memcheck rc=$?"; tail -2 "$W/memcheck.log"
for g in up dh; do
  echo "== ncu source $g"
  timeout 80 ncu --clock-control none -k regex:ws_grouped_gemm --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no -o "$W/ncu_$g" \
    $B/leanmoe_bench_gemms --config 120B-n2048 --gemms $g --iters 1 --warmup 1 >"$W/ncu_run_$g.log" 2>&1; echo "rc=$?"
  ncu -i "$W/ncu_$g.ncu-rep" --page source --csv --print-source sass >"$W/ncu_src_$g.csv" 2>&1
  ncu -i "$W/ncu_$g.ncu-rep" --page details >"$W/ncu_details_$g.txt" 2>&1
  grep -E "Duration|Compute \(SM\)|L2 Cache Throughput" "$W/ncu_details_$g.txt" | head -5
  rm -f "$W/ncu_$g.ncu-rep"
done
echo "== python front: build against this commit's core, pytest -v"
R="$PWD"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 150 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./python \
  -Ccmake.define.LEANMOE_CORE_LIBRARY="$R/$B/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  >"$W/python_build.log" 2>&1 || { echo "python build failed"; tail -20 "$W/python_build.log"; exit 1; }
(cd /tmp && PYTHONPATH=/tmp/site timeout 170 python3 -m pytest -v -p no:cacheprovider "$R/python/tests") >"$W/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$W/pytest.log" | tail -8; grep -B2 "Fatal Python" "$W/pytest.log" | head
