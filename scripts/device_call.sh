# Sourced by a device call script (bench/results/archive/*/*_call.sh) from the repository root, after
# `set -uo pipefail`: the frame such calls share. Sets FINAL (the folder that comes back: $OUT), S
# (FINAL/summary.txt, emptied), B and L (fresh folders for the unpacked binaries and the logs; the
# logs go back as FINAL/logs.tar.gz at exit); defines say (echo, also into S), cap N (N seconds, or
# what is left of BUDGET, default 560, at least 5), unpack NAME=FILE.xz ... (binaries into B),
# step, gpu_tests, dev_bench, gemm_rounds, ncu_ms, ncu_sections, digest, layer_rounds and trace_summaries
# (below); then sources scripts/device_env.sh.
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"; S=$FINAL/summary.txt; : > "$S"
B="$(mktemp -d)"; L="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$L" . 2>/dev/null' EXIT
say() { echo "$*" | tee -a "$S"; }
budget="${BUDGET:-560}"
cap() { local left=$((budget - SECONDS)); [ $left -lt 5 ] && left=5; [ $1 -lt $left ] && echo $1 || echo $left; }
unpack() {
  local x
  for x in "$@"; do xz -dc "${x#*=}" > "$B/${x%%=*}" && chmod +x "$B/${x%%=*}" || say "MISSING ${x#*=}"; done
}
# header COMMIT_FILE: the call's first summary line, what runs (the file's text) and on which GPU.
header() { say "$(cat "$1"); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"; }
# step N TITLE: whether step N of a call script runs (N >= FROM, default 1: a second call resumes
# where the cap cut the first, FROM=N), saying so into S.
step() {
  [ "$1" -ge "${FROM:-1}" ] || return 1
  say "step $1: $2 (t=$SECONDS)"
}
# gpu_tests FILTER [SANITIZED]: $B/gt (leanmoe_gpu_tests) on the gtest FILTER ('*': the whole suite), the verdict and any
# failures into S; then memcheck and racecheck on the tests SANITIZED names. Logs into L (L/gpu_tests_N.log
# for the N-th call).
gpu_tests_calls=0
gpu_tests() {
  local n=$((++gpu_tests_calls))  # each call its own logs
  timeout "$(cap 240)" "$B/gt" --gtest_filter="$1" > "$L/gpu_tests_$n.log" 2>&1
  say "tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/gpu_tests_$n.log" | tr '\n' ' ') (t=$SECONDS)"
  grep -E '^\[  FAILED  \]' "$L/gpu_tests_$n.log" | head -5 | tee -a "$S"
  [ -n "${2:-}" ] || return 0
  timeout "$(cap 90)" compute-sanitizer --tool memcheck "$B/gt" --gtest_filter="$2" > "$L/memcheck_$n.log" 2>&1
  say "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$L/memcheck_$n.log" | tail -1) (t=$SECONDS)"
  timeout "$(cap 90)" compute-sanitizer --tool racecheck "$B/gt" --gtest_filter="$2" > "$L/racecheck_$n.log" 2>&1
  say "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck_$n.log" | tail -1) (t=$SECONDS)"
}
# dev_bench NAME BIN ARGS...: a dev/ bench $B/BIN ARGS (at most 60 s), its output into L/NAME.txt, its rc
# and its table rows into S.
dev_bench() {
  local name=$1 bin=$2
  shift 2
  timeout "$(cap 60)" "$B/$bin" "$@" > "$L/$name.txt" 2>&1
  say "$name rc=$? (t=$SECONDS)"; grep -E '^\|' "$L/$name.txt" | tee -a "$S"
}
# gemm_rounds ROUNDS NAME ARGS...: $B/bg (leanmoe_bench_gemms) ROUNDS times with ARGS, each round's
# rows into S and its output into L/NAME_rR.txt; in even rounds the --config list is reversed, so each
# kind's configurations run in the other order.
gemm_rounds() {
  local rounds=$1 name=$2 r i
  shift 2
  local args=("$@")
  for ((r = 1; r <= rounds; ++r)); do
    local run=("${args[@]}")
    for ((i = 0; i + 1 < ${#run[@]}; ++i)); do
      if [ "${run[$i]}" = --config ] && [ $((r % 2)) = 0 ]; then
        run[i + 1]=$(echo "${run[i + 1]}" | tr ',' '\n' | tac | paste -sd,)
      fi
    done
    timeout "$(cap 120)" "$B/bg" "${run[@]}" > "$L/${name}_r$r.txt" 2>&1
    say "$name r$r rc=$? (t=$SECONDS)"
    grep -E '^\| ' "$L/${name}_r$r.txt" | grep -v '^| shape' | tee -a "$S"
  done
}
# ncu_ms NAME BIN ARGS...: one launch of the gather kernel by $B/BIN (leanmoe_bench_gemms ARGS, after a
# warm-up launch) under ncu at base clocks: its gpu__time_duration into S as "ncu NAME ...", the log
# into L/ncu_NAME.txt. Fixed clocks and no power cap: about 1% run to run, against the steady
# state's 2-5% (docs/kernels.md "Where dW1's time goes"). NCU_KERNEL=GemmUniversal times CUTLASS's
# kernel (down, dx) instead.
ncu_ms() {
  local name=$1 bin=$2
  shift 2
  timeout "$(cap 40)" ncu --metrics gpu__time_duration.sum -k "regex:${NCU_KERNEL:-gather_grouped_gemm}" --launch-skip 1 -c 1 \
    "$B/$bin" "$@" --iters 1 --warmup 1 > "$L/ncu_$name.txt" 2>&1
  say "ncu $name rc=$? $(grep -E 'gpu__time_duration' "$L/ncu_$name.txt" | awk '{print $(NF-1), $NF}') (t=$SECONDS)"
}
# ncu_sections NAME BIN ARGS...: as ncu_ms, with ncu's speed-of-light, warp-state, scheduler and
# memory-workload sections (where a kernel's time goes: issue slots, stall reasons, DRAM and L2
# throughput); the report into L/ncu_sections_NAME.txt, its duration, issue and throughput lines into S.
ncu_sections() {
  local name=$1 bin=$2
  shift 2
  timeout "$(cap 90)" ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis -k "regex:${NCU_KERNEL:-gather_grouped_gemm}" --launch-skip 1 -c 1 \
    "$B/$bin" "$@" --iters 1 --warmup 1 > "$L/ncu_sections_$name.txt" 2>&1
  say "ncu_sections $name rc=$? $(grep -E '^ +(Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued Instruction) ' \
    "$L/ncu_sections_$name.txt" | sed 's/  */ /g' | tr '\n' ';') (t=$SECONDS)"
}
# digest NAME BIN ARGS...: $B/BIN (leanmoe_bench_gemms) ARGS --digest; into S the md5 of its rows'
# shape, layout, kind and output-digest columns (not the configuration's text, so that two
# configurations of one kind compare), the output into L/digest_NAME.txt.
digest() {
  local name=$1 bin=$2
  shift 2
  timeout "$(cap 60)" "$B/$bin" "$@" --digest > "$L/digest_$name.txt" 2>&1
  say "digest $name rc=$? $(grep -E '^\| ' "$L/digest_$name.txt" | grep -v '^| shape' | awk -F'|' '{print $2 $3 $4 $6}' | md5sum | cut -c1-12) (t=$SECONDS)"
}
# layer_rounds ROUNDS ROWS NAME... (ROWS comma-separated): `$B/leanmoe bench` of each grid row under
# each named variant's flags (the caller's associative array V: NAME -> flags, "" for the default),
# graph replays at the steady state (bench/steady_iters.py), the variants' order rotated by one per
# round; logs and JSON into L, a line per run into S, then the medians over the rounds (bench/layer_ab.py).
# A variant NAME with its own binary $B/leanmoe_NAME (unpack leanmoe_NAME=...) runs that binary. With
# TRACE_LIB set (dev/kernel_trace's libkernel_trace.so, carried) every run is traced into
# L/trace_rR_ROW_NAME.csv (trace_summaries below reads them).
layer_rounds() {
  local rounds=$1 rows=$2 r c k v warm iters bin
  shift 2
  local names=("$@") traced=()
  for ((r = 1; r <= rounds; ++r)); do
    for c in ${rows//,/ }; do
      read -r warm iters < <(python3 bench/steady_iters.py "$c")
      for ((k = 0; k < ${#names[@]}; ++k)); do
        v=${names[$(((r + k) % ${#names[@]}))]}
        bin=$B/leanmoe; [ -x "$B/leanmoe_$v" ] && bin=$B/leanmoe_$v
        if [ -n "${TRACE_LIB:-}" ]; then
          traced=(env "CUDA_INJECTION64_PATH=$(realpath "$TRACE_LIB")" "KERNEL_TRACE_OUT=$L/trace_r${r}_${c}_$v.csv")
        fi
        # shellcheck disable=SC2086  # the variant's flags split into words
        timeout "$(cap 60)" "${traced[@]}" "$bin" bench --config "$c" --router topk_then_softmax --graph \
          --iters "$iters" --warmup "$warm" ${V[$v]} --json "$L/layer_r${r}_${c}_$v.json" \
          > "$L/layer_r${r}_${c}_$v.txt" 2>&1
        say "r$r $c $v rc=$? $(grep -E "^$c" "$L/layer_r${r}_${c}_$v.txt" | awk '{print $9, $10, $13, $14}') (t=$SECONDS)"
      done
    done
  done
  python3 bench/layer_ab.py "$L" | grep 'median of' | tee -a "$S"
}
# trace_summaries: what layer_rounds traced (TRACE_LIB): per file the side kernels' overrun past dW1
# (--tail) and the six GEMMs' medians (--gemms) into S, the per-kernel tables into L/trace_summary.txt.
trace_summaries() {
  python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --tail --width 50 | sed "s|$L/||" | tee -a "$S"
  python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --gemms | sed "s|$L/||" | tee -a "$S"
  python3 dev/kernel_trace/summary.py "$L"/trace_*.csv --width 90 > "$L/trace_summary.txt" 2>&1
}
# in_logs_subdir DIR CMD...: CMD with L = L/DIR (made there), for runs whose log names would repeat
# (e.g. layer_rounds of the same row in another layout).
in_logs_subdir() {
  local L="$L/$1"
  mkdir -p "$L"
  shift
  "$@"
}
source scripts/device_env.sh
