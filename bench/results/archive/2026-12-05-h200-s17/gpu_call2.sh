#!/usr/bin/env bash
# Session 17, device call 2: branch combo = main (with v4act, DeepSeek-V4's clamped SwiGLU) + sass
# (consumer wgmma descriptors built once and advanced) + dhepi (dH / up epilogue instruction diet),
# against base = main's kernels (branch dhepi-base: main + only bench_gemms --digest).
# Carry .carry/s17c2 (xz): leanmoe_gpu_tests, leanmoe_bench_gemms, leanmoe_dev_fp8_promotion,
# leanmoe_dev_ex2_ftz_check of combo; leanmoe_bench_gemms_base. Steps, each capped, all within ~570 s:
#   1. ex2.approx.ftz sigmoid / silu bitwise equal to __expf's for all 2^32 floats (dhepi's premise);
#   2. output digests base vs combo, must be identical: up, dh at 4 shapes bf16 + fp8; all six GEMMs at
#      7B-n256 and olmoe-1b-7b, W1 interleaved, hf and transposed; dw1, dw2 at 120B-n2048 and 30B-n512;
#      up, dh at gpt-oss-20b (a 64-column last tile), plain and interleaved;
#   3. the whole GPU suite (with v4act's DeepSeek-V4 tests);
#   4. leanmoe_bench_gemms base vs combo, two interleaved rounds, up/dh/dw1/dw2 bf16 and up/dh fp8, 4 shapes;
#   5. compute-sanitizer memcheck and racecheck on small expert-GEMM tests;
#   6. dev/fp8_promotion_bench (with the two-part variants: does wait<1> promotion keep the pipe fed?);
#   7. if time is left: ncu of up / dh / down / dx, bf16 and fp8, at 120B-n2048 (issue 16).
# Returns summary.txt (also on stdout), s17c2_out.tar.gz (all logs).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
L=/tmp/s17c2-logs; rm -rf $L; mkdir -p $L
source scripts/device_env.sh
C=.carry/s17c2; B=/tmp/s17c2-bin; mkdir -p $B
for f in leanmoe_bench_gemms leanmoe_bench_gemms_base leanmoe_gpu_tests leanmoe_dev_ex2_ftz_check leanmoe_dev_fp8_promotion; do
  xz -dc $C/$f.xz > $B/$f && chmod +x $B/$f || echo "MISSING $f"
done
S=$FINAL/summary.txt; : > $S
say() { echo "$*" | tee -a $S; }
budget=570
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
say "combo $(cat $C/commit); $(nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader)"
G=$B/leanmoe_bench_gemms; G0=$B/leanmoe_bench_gemms_base

say "== 1. ex2 ftz check (t=$SECONDS)"
timeout $(cap 25) $B/leanmoe_dev_ex2_ftz_check > $L/ex2_ftz.log 2>&1; say "rc=$? $(tail -3 $L/ex2_ftz.log)"

say "== 2. digests base vs combo (t=$SECONDS)"
D1="--shape 120B-n2048,30B-n512,7B-n256,olmoe-1b-7b --gemms up,dh --precision bf16,fp8 --digest"
D2="--shape 7B-n256,olmoe-1b-7b --gemms up,down,dh,dw2,dx,dw1 --precision bf16,fp8 --interleaved --layout hf,transposed --digest"
D3="--shape gpt-oss-20b --gemms up,dh --precision bf16 --layout hf,transposed --digest"
D5="--shape 120B-n2048,30B-n512 --gemms dw1,dw2 --precision bf16 --layout hf,transposed --digest"
for v in base new; do
  bin=$G; [ $v = base ] && bin=$G0
  timeout $(cap 50) $bin $D1 > $L/digest1_$v.md 2>&1; echo "digest1 $v rc=$?" >> $S
  timeout $(cap 30) $bin $D2 > $L/digest2_$v.md 2>&1; echo "digest2 $v rc=$?" >> $S
  timeout $(cap 25) $bin $D3 > $L/digest3_$v.md 2>&1; echo "digest3 $v rc=$?" >> $S
  timeout $(cap 25) $bin $D3 --interleaved > $L/digest4_$v.md 2>&1; echo "digest4 $v rc=$?" >> $S
  timeout $(cap 30) $bin $D5 > $L/digest5_$v.md 2>&1; echo "digest5 $v rc=$?" >> $S
done
for d in digest1 digest2 digest3 digest4 digest5; do
  rows=$(grep -c '^| [^s-]' $L/${d}_new.md)
  if cmp -s $L/${d}_base.md $L/${d}_new.md && [ "$rows" -gt 0 ]; then say "$d: IDENTICAL ($rows rows)";
  else say "$d: DIFFER (rows new $rows)"; diff $L/${d}_base.md $L/${d}_new.md | head -20 | tee -a $S; fi
done

say "== 3. GPU tests, whole suite (t=$SECONDS)"
timeout $(cap 180) stdbuf -oL $B/leanmoe_gpu_tests --gtest_brief=1 > $L/gpu_tests.log 2>&1
say "gpu tests rc=$? (t=$SECONDS)"; grep -E "^\[  FAILED|PASSED|tests? ran|Failure" $L/gpu_tests.log | head -20 | tee -a $S

say "== 4. bench base vs combo, 2 interleaved rounds (t=$SECONDS)"
for r in 1 2; do for v in base new; do
  bin=$G; [ $v = base ] && bin=$G0
  timeout $(cap 40) $bin --shape 120B-n2048,30B-n512,7B-n256,olmoe-1b-7b --gemms up,dh,dw1,dw2 --precision bf16,fp8 \
    > $L/bench_${v}_r$r.md 2>&1; echo "bench $v r$r rc=$? (t=$SECONDS)" >> $S
done; done
python3 - $L <<'PY' | tee -a $S
import sys, glob, re, statistics as st
d = sys.argv[1]; ms = {}
for f in sorted(glob.glob(f"{d}/bench_*_r*.md")):
    v = re.search(r"bench_(base|new)_r", f).group(1)
    for line in open(f):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) == 11 and c[0] != "shape" and not c[0].startswith("-"):
            try: ms.setdefault((c[0], c[7], c[8][:60]), {}).setdefault(v, []).append(float(c[9]))
            except ValueError: pass
print("| shape | GEMM | kernel | base ms (rounds) | combo ms (rounds) | combo/base (means) |\n|---|---|---|---|---|---|")
for k, r in ms.items():
    b, n = r.get("base", []), r.get("new", [])
    ratio = f"{st.mean(n) / st.mean(b):.3f}" if b and n else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {' '.join(f'{x:.3f}' for x in b)} | {' '.join(f'{x:.3f}' for x in n)} | {ratio} |")
PY

say "== 5. compute-sanitizer (t=$SECONDS)"
timeout $(cap 50) compute-sanitizer --tool memcheck --error-exitcode 9 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.FewPersistentCtas:ExpertGemms.RaggedWithEmptyExpert:ExpertGemmsFp8.SingleToken' > $L/memcheck.log 2>&1
say "memcheck rc=$? (t=$SECONDS)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -5 | tee -a $S
timeout $(cap 50) compute-sanitizer --tool racecheck --error-exitcode 9 $B/leanmoe_gpu_tests --gtest_brief=1 \
  --gtest_filter='ExpertGemms.FewPersistentCtas:ExpertGemmsFp8.SingleToken' > $L/racecheck.log 2>&1
say "racecheck rc=$? (t=$SECONDS)"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $L/racecheck.log | head -5 | tee -a $S

say "== 6. promotion bench (t=$SECONDS)"
timeout $(cap 40) $B/leanmoe_dev_fp8_promotion 20000 2>&1 | tee -a $S

if [ $((budget - SECONDS)) -gt 60 ]; then
  say "== 7. ncu up/dh/down/dx bf16+fp8 at 120B-n2048 (t=$SECONDS)"
  SECTIONS="--section SpeedOfLight --section SchedulerStats --section WarpStateStats"
  METRICS="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,gpu__time_duration.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
  timeout $(cap 200) ncu $SECTIONS $METRICS -k regex:'gather_grouped_gemm|device_kernel' --print-units base \
    $G --shape 120B-n2048 --gemms up,dh,down,dx --precision bf16,fp8 --iters 1 --warmup 0 > $L/ncu.txt 2>&1
  say "ncu rc=$? (t=$SECONDS)"
  python3 - $L/ncu.txt <<'PY' | tee -a $S
import re, sys
KEYS = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active", "smsp__inst_executed.sum",
        "bank_conflicts", "Issue Slots Busy", "No Eligible", "Warp Cycles Per Issued Instruction", "Compute (SM) Throughput"]
kernel = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s{0,4}(\S.*?)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m:
        kernel = m.group(1)[:120]; print(f"- {kernel}"); continue
    if kernel and any(k in line for k in KEYS):
        print("    " + " ".join(line.split()))
PY
fi
tar czf $FINAL/s17c2_out.tar.gz -C $L .
say "done (t=$SECONDS)"
