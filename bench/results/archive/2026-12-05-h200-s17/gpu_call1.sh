#!/usr/bin/env bash
# Session 17, device call 1, main's binaries (carry .carry/s17c1: xz-packed leanmoe_gpu_tests,
# leanmoe_bench_gemms, leanmoe_dev_fp8_promotion, built here from the commit in .carry/s17c1/commit,
# OpenBLAS linked in):
#   1. the whole GPU test suite (first run of main since 9a110a9's training-loop and new-user fixes);
#   2. issue 16: fp8prof.device.sh's ncu sections of up / dH / down / dx, bf16 and fp8, at 120B-n2048
#      (no FP8 kernel had been profiled), main's binary only;
#   3. dev/fp8_promotion_bench.cu: the FP8 mainloop's promotion structure with resident operands.
# Returns gpu_tests.log, fp8prof.txt.gz, fp8prof_summary.txt; the rest on stdout. ~5 min, caps 560 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
source scripts/device_env.sh
C=.carry/s17c1; B=/tmp/s17c1; mkdir -p $B
for f in leanmoe_gpu_tests leanmoe_bench_gemms leanmoe_dev_fp8_promotion; do xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f; done
echo "commit $(cat $C/commit)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader

echo "== GPU tests (t=${SECONDS})"
timeout 240 $B/leanmoe_gpu_tests --gtest_brief=1 > "$FINAL/gpu_tests.log" 2>&1
echo "gpu tests rc=$? (t=${SECONDS})"
grep -E "^\[  FAILED|tests? ran|PASSED|FAILED TEST" "$FINAL/gpu_tests.log" | head -30

echo "== fp8prof ncu (t=${SECONDS})"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats"
METRICS="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,gpu__time_duration.sum,lts__t_bytes.sum.per_second"
timeout 170 ncu $SECTIONS $METRICS -k regex:'gather_grouped_gemm|device_kernel' --print-units base \
  $B/leanmoe_bench_gemms --shape 120B-n2048 --gemms up,dh,down,dx --precision bf16,fp8 --iters 1 --warmup 0 \
  > /tmp/fp8prof.txt 2>&1
echo "ncu rc=$? (t=${SECONDS})"
gzip -c /tmp/fp8prof.txt > "$FINAL/fp8prof.txt.gz"
python3 - /tmp/fp8prof.txt <<'PY' | tee "$FINAL/fp8prof_summary.txt"
import re, sys
KEYS = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.sum", "smsp__inst_executed.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
        "lts__t_bytes.sum.per_second", "Issue Slots Busy", "No Eligible", "Warp Cycles Per Issued Instruction",
        "Memory Throughput", "Compute (SM) Throughput", "L2 Cache Throughput", "Registers Per Thread",
        "Stall", "Achieved Occupancy"]
kernel = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s{0,4}(\S.*?)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m:
        kernel = m.group(1)[:140]; print(f"- {kernel}"); continue
    if kernel and any(k in line for k in KEYS):
        print("    " + " ".join(line.split()))
PY

echo "== promotion bench (t=${SECONDS})"
timeout 60 $B/leanmoe_dev_fp8_promotion 20000
echo "promotion bench rc=$? (t=${SECONDS})"
echo "done (t=${SECONDS})"
