#!/usr/bin/env bash
# Session 5, call 3: the GPU tests with two new ones (ForwardAndBackwardCaptureIntoOneGraph: forward +
# backward in one CUDA graph, global capture mode; WsTmaGather: the varlen-M A rows by one-row TMA
# boxes, LEANMOE_GEMM_WS_GATHER=tma), memcheck on both, then up/dH with cp.async vs TMA row gather
# (two rounds, interleaved) if the tests pass.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.log $W/*.txt "$FINAL/" 2>/dev/null' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b; commit="$(cat $B/commit)"
echo "== GPU tests ($commit)"; timeout 200 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; trc=$?; echo "gpu tests rc=$trc"
grep -E "PASSED|FAILED|tests ran|Failure|capture|Expected|Which is|error" "$W/gpu_tests.log" | head -30
echo "== memcheck (t=${SECONDS}s)"
timeout 90 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests \
  --gtest_filter='CudaBackend.ForwardAndBackwardCaptureIntoOneGraph:ExpertGemms.RaggedWithEmptyExpert' >"$W/memcheck_graph.log" 2>&1
echo "memcheck graph rc=$?"; tail -1 "$W/memcheck_graph.log"
LEANMOE_GEMM_WS_GATHER=tma timeout 90 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests \
  --gtest_filter='ExpertGemms.RaggedWithEmptyExpert:ExpertGemms.SingleToken:ExpertGemms.OneExpertTakesAllRows:ExpertGemms.ManyExperts' >"$W/memcheck_tma.log" 2>&1
echo "memcheck tma rc=$?"; tail -1 "$W/memcheck_tma.log"
grep -q "WsTmaGather" "$W/gpu_tests.log" && ! grep -q "FAILED.*WsTmaGather" "$W/gpu_tests.log" || { echo "tma gather not passing: no A/B"; exit 0; }
echo "== up/dH: cp.async vs TMA row gather (t=${SECONDS}s)"
C=7B-n256,120B-n2048,olmoe-1b-7b,gpt-oss-20b,30B-n512
for round in 1 2; do for g in cpasync tma; do
  echo "### round $round LEANMOE_GEMM_WS_GATHER=$g"
  LEANMOE_GEMM_WS_GATHER=$g timeout 50 $B/leanmoe_bench_gemms --config $C --gemms up,dh --iters 20 2>&1 | grep '^| [0-9a-z]'
done; done > "$W/gemms_gather.txt"; echo "A/B done (t=${SECONDS}s)"
awk '/^###/{v=$NF} /^\| /{t[v" "$(NF-5)]+=$(NF-3)} END{for (k in t) print k, t[k]}' "$W/gemms_gather.txt" | grep -v GEMM | sort | tee "$W/gather_sums.txt"
grep -E "120B-n2048|7B-n256" "$W/gemms_gather.txt"
