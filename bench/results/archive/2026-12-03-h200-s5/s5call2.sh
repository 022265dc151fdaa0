#!/usr/bin/env bash
# Session 5, call 2 (commit 0a6abcd8ec24): the python suite on the H200 (the front built there against
# this commit's core), the in-backward stack benchmark, and a re-sweep of the varlen-M tile band
# (LEANMOE_GEMM_WS_BAND 4 / 8 / 16) and of ping-pong for up and dH with session 4's epilogues.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'for f in inbackward.md inbackward.json; do [ -f "$W/$f" ] && cp "$W/$f" "$FINAL/"; done; cp $W/*.txt "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tar.gz" -C "$W" .' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/c; commit="$(cat $B/commit)"; R="$PWD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$W/gpu.txt"
echo "== python front: build against this commit's core ($commit), pytest"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 170 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site ./python \
  -Ccmake.define.LEANMOE_CORE_LIBRARY="$R/$B/libleanmoe.a" -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
  >"$W/python_build.log" 2>&1 && echo "python build ok (t=${SECONDS}s)" || { echo "python build failed"; tail -20 "$W/python_build.log"; }
(cd /tmp && PYTHONPATH=/tmp/site timeout 170 python3 -m pytest -v -p no:cacheprovider "$R/python/tests") >"$W/pytest.log" 2>&1
echo "pytest rc=$? (t=${SECONDS}s)"; grep -E "FAILED|ERROR|passed|failed" "$W/pytest.log" | tail -8
echo "== in-backward stack"; timeout 120 $B/leanmoe_bench_inbackward --device cuda --commit "$commit" --out "$W" >"$W/inbackward.log" 2>&1
echo "inbackward rc=$? (t=${SECONDS}s)"; tail -12 "$W/inbackward.log"
C=7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b,30B-n512
for round in 1 2; do for v in "LEANMOE_GEMM_WS_BAND=8" "LEANMOE_GEMM_WS_BAND=4" "LEANMOE_GEMM_WS_BAND=16" "LEANMOE_GEMM_WS=2"; do
  echo "### round $round $v"
  env $v timeout 40 $B/leanmoe_bench_gemms --config $C --gemms up,dh --iters 20 2>&1 | grep '^| [0-9a-z]'
done; done > "$W/gemms_band.txt"; echo "sweep done (t=${SECONDS}s)"
# Sum of ms per variant and GEMM over the configs and both rounds.
awk '/^###/{v=$NF} /^\| /{t[v" "$(NF-5)]+=$(NF-3)} END{for (k in t) print k, t[k]}' "$W/gemms_band.txt" | sort | tee "$W/band_sums.txt"
