#!/usr/bin/env bash
# Session 4, call 1: where up/dh spend their time (ncu PC sampling, 120B-n2048), clocks under
# sustained load, v1 vs ws up; then GPU tests and the python suite (EP_REQUIRE fix) on this commit.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
for g in up dh; do
  echo "== ncu source $g"
  timeout 100 ncu --clock-control none -k regex:ws_grouped_gemm --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no -o "$W/ncu_$g" \
    $B/leanmoe_bench_gemms --config 120B-n2048 --gemms $g --iters 1 --warmup 1 >"$W/ncu_run_$g.log" 2>&1; echo "rc=$?"
  ncu -i "$W/ncu_$g.ncu-rep" --page source --csv --print-source sass >"$W/ncu_src_$g.csv" 2>&1
  ncu -i "$W/ncu_$g.ncu-rep" --page details >"$W/ncu_details_$g.txt" 2>&1
  grep -E "Duration|Throughput|Stall|Warp Cycles|Issued" "$W/ncu_details_$g.txt" | head -30
  rm -f "$W/ncu_$g.ncu-rep"
done
echo "== sustained clocks: all six GEMMs at 120B-n2048, 20 launches each"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 >"$W/clocks.txt" 2>&1 &
SMI=$!
timeout 90 $B/leanmoe_bench_gemms --config 120B-n2048 --iters 20 2>&1 | tee "$W/gemms_default.txt"
kill $SMI
awk -F', ' 'NR>1{c[$2]++} END{for(k in c) print k, c[k]}' "$W/clocks.txt" | sort | tail -12
echo "== v1 up/dh for comparison"
LEANMOE_GEMM_WS=0 timeout 60 $B/leanmoe_bench_gemms --config 120B-n2048 --gemms up,dh --iters 20 2>&1 | grep '^| [0-9a-z]' | tee "$W/gemms_v1.txt"
echo "== GPU tests"; timeout 200 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran" "$W/gpu_tests.log" | tail -12
echo "== python front: build against this commit's core, pytest"
R="$PWD"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./python \
  -Ccmake.define.LEANMOE_CORE_LIBRARY="$R/$B/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  >"$W/python_build.log" 2>&1 || { echo "python build failed"; tail -20 "$W/python_build.log"; exit 1; }
(cd /tmp && PYTHONPATH=/tmp/site timeout 170 python3 -m pytest -q "$R/python/tests") >"$W/pytest.log" 2>&1
echo "pytest rc=$?"; tail -15 "$W/pytest.log"
