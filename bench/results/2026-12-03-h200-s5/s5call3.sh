#!/usr/bin/env bash
# Session 5, call 3: the GPU tests with the new graph-capture test (forward + backward in one CUDA
# graph, global capture mode), and compute-sanitizer memcheck on it.
set -uo pipefail
FINAL="$OUT"; W="$(mktemp -d)"
trap 'cp $W/*.log "$FINAL/" 2>/dev/null' EXIT
mkdir -p /tmp/blas && tar xJf .carry/blaslibs.tar.xz -C /tmp/blas && export LD_LIBRARY_PATH=/tmp/blas:${LD_LIBRARY_PATH:-}
[ -e /usr/local/cuda/lib/libnccl.so.2 ] || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B=.carry/b; commit="$(cat $B/commit)"
echo "== GPU tests ($commit)"; timeout 170 $B/leanmoe_gpu_tests --gtest_brief=1 >"$W/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "PASSED|FAILED|tests ran|Failure|capture|Expected|Which is" "$W/gpu_tests.log" | head -30
timeout 120 compute-sanitizer --tool memcheck $B/leanmoe_gpu_tests --gtest_filter='CudaBackend.ForwardAndBackwardCaptureIntoOneGraph' >"$W/memcheck_graph.log" 2>&1
echo "memcheck rc=$?"; tail -1 "$W/memcheck_graph.log"
