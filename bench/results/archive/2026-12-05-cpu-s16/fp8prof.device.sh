# fp8prof (issue 16): why the FP8 gather GEMMs (up, dH) run at about half the FP8 tensor-core rate
# while bf16 up reaches ~70% of its own. No profile of an FP8 kernel exists yet. ncu (clocks at
# base) on one launch each of up, dh (gather kernel) and down, dx (CUTLASS) at 120B-n2048, bf16 and
# fp8, with the sections that separate the candidate limits: tensor pipe active %, shared-memory
# wavefronts and bank conflicts (FP8's two m64n128 halves re-read A per half), issue slots and
# warp stall reasons (the per-half wgmma wait + promotion), L2 throughput.
# Binaries: main's leanmoe_bench_gemms (the sass carry's leanmoe_bench_gemms_base, main c3d7d1f:
# the FP8 kernels there are main's) and branch sass's (its FP8 consumer 163 -> 149 SASS per k-tile).
# Expected run time ~2-3 min (8 kernels x ~20 passes, twice); cap 240 s.
# Returns $FINAL/fp8prof_details.tgz (ncu's details of both runs) and fp8prof_summary.txt.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/fp8prof"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - leanmoe_bench_gemms leanmoe_bench_gemms_base
chmod +x "$B"/leanmoe_*
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats"
METRICS="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,gpu__time_duration.sum,lts__t_bytes.sum.per_second"
for v in main sass; do
  exe="$B/leanmoe_bench_gemms"; [ $v = main ] && exe="$B/leanmoe_bench_gemms_base"
  echo "== ncu $v (t=${SECONDS})"
  timeout 110 ncu $SECTIONS $METRICS -k regex:'gather_grouped_gemm|device_kernel' --print-units base \
    "$exe" --shape 120B-n2048 --gemms up,dh,down,dx --precision bf16,fp8 --iters 1 --warmup 0 \
    > "$W/fp8prof_$v.txt" 2>&1
  echo "ncu $v rc=$? (t=${SECONDS})"
done
tar czf "$FINAL/fp8prof_details.tgz" -C "$W" fp8prof_main.txt fp8prof_sass.txt  # 8 files at most come back
echo "== fp8prof summary (t=${SECONDS})"
python3 - "$W/fp8prof_main.txt" "$W/fp8prof_sass.txt" <<'PY' | tee "$FINAL/fp8prof_summary.txt"
import re, sys
KEYS = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "smsp__inst_executed.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "lts__t_bytes.sum.per_second",
        "Issue Slots Busy", "No Eligible", "Warp Cycles Per Issued Instruction", "Memory Throughput",
        "Compute (SM) Throughput", "L2 Cache Throughput", "Shared Memory"]
for path in sys.argv[1:]:
    print(f"### {path.rsplit('/', 1)[-1]}")
    kernel = None
    for line in open(path, errors="replace"):
        m = re.match(r"\s{0,4}(\S.*?)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            kernel = m.group(1)[:110]
            print(f"- {kernel}")
            continue
        if kernel and any(k in line for k in KEYS):
            print("    " + " ".join(line.split()))
PY
# The promotion structure in isolation (dev/fp8_promotion_bench.cu, carried in .carry/s16pb; ~5 s):
# operands resident in shared memory, no producer, no epilogue: bf16 / fp8 ceilings against the
# library's per-half wait + promotion and DeepGEMM's 64x192 single part. stdout only (8 files).
if [ -f .carry/s16pb/fp8_promotion_bench.xz ]; then
  echo "== promotion bench (t=${SECONDS})"
  xz -dc .carry/s16pb/fp8_promotion_bench.xz > "$W/fp8_promotion_bench" && chmod +x "$W/fp8_promotion_bench"
  timeout 60 "$W/fp8_promotion_bench" 20000
  echo "promotion bench rc=$? (t=${SECONDS})"
fi
