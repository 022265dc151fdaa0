#!/usr/bin/env bash
# leanmoe beside SonicMoE on the H200, in one device call: `leanmoe bench --grid --router
# topk_then_softmax --graph` (eager and CUDA-graph replays), SonicMoE's sonic_bench.py with GRAPH=1 on
# the rows in CONFIGS, then optionally the PyTorch anchor, then bench/compare.py's side-by-side table.
#
# Prepare here: `bash scripts/prepare_carry.sh vs-sonic` (it prints the carry list: .carry/vs,
# .carry/sonicmoe; the leanmoe binary has OpenBLAS linked in). Run there from the repository root: `bash bench/vs_sonic.sh`.
# When the two exceed the 64 MiB carry together (they do: 65.3 MiB with SonicMoE's 53.7), it prints two
# calls for one warm machine instead: SETUP=1 carrying .carry/sonicmoe, then the run carrying .carry/vs
# with SONIC_CARRY=/tmp/sonic_carry (bench/README.md has the FP8 grid's commands and device time).
# Environment:
#   CONFIGS   grid rows SonicMoE runs, comma-separated (default: all 16). SonicMoE compiles its kernels
#             on first use (fresh machine: ~6.5 min for the first shape, 5-61 s per further shape), so
#             the grid takes two calls on a warm machine; the end of the output names the rows left.
#   ANCHOR    1 (default): also the PyTorch anchor (whole grid, ~1 min), after SonicMoE, which then
#             leaves it 90 s; 0: not.
#   DEADLINE  seconds from the start by which everything is written (default 570, under the 10-minute
#             call); SonicMoE gets what leanmoe leaves, minus the anchor's time and a reserve for the end.
#             A SonicMoE stopped at its budget keeps what it compiled in the cache (session 6: a fresh
#             machine compiled for 430 s without finishing its first row; the next call on the warm
#             machine ran the whole grid in 370 s).
#   ITERS, WARM  timed and warm-up iterations of both (default 10 and 3, sonic_bench.py's defaults).
#   STEADY    1: time each row at the GPU's steady state instead, alternating the two layers: per row and
#             round, leanmoe then SonicMoE (round 2 SonicMoE first), each in its own process with
#             warm-up and timed iterations from the row's FLOPs (about 3 s of warm-up and 1.5 s timed at
#             450 TFLOP/s: bench/steady_iters.py), both eager and as graph replays. Why: an idle H200
#             runs at 1980 MHz until its averaged power reaches the 700 W cap after ~1.8 s, so a short loop
#             on a small row is up to 10% faster than the same loop a second later (docs/kernels.md "The
#             power ramp"), and whichever layer runs first gets the boost. ROUNDS (default 2) rounds;
#             writes side_by_side_rN.md, rN_leanmoe.json, rN_sonic.json per round (ANCHOR is not run).
#   FP8       with STEADY=1, 1: a third process per row and round, leanmoe in FP8 with the weights' codes
#             given (`leanmoe bench --precision fp8 --fp8-weights given --graph`, what the PyTorch module
#             does; issue 16), with the same iterations. The order rotates by one per row and per round:
#             round r, row i (from 0) runs the three cyclically from layer (r - 1 + i) mod 3 of (leanmoe
#             bf16, leanmoe FP8, SonicMoE). So no layer always runs first after the idle gap a process
#             start leaves (SonicMoE's import and first call: 8-30 s without GPU work): across rows each
#             starts a row equally often, and a row's first layer changes from round to round (ROUNDS=3:
#             each layer first once on every row). Rows whose d or n is not a multiple of 128 run no FP8
#             (said in the output; compare.py lists them as not applicable) and rotate the other two by
#             (r - 1 + i) mod 2. Writes
#             rN_leanmoe_fp8.json per round beside rN_leanmoe.json and rN_sonic.json, and the rounds'
#             tables joined in side_by_side.md (3 JSON a round: ROUNDS <= 2 keeps to the 8 files).
#   TRACE     with STEADY=1, the path of dev/kernel_trace's libkernel_trace.so (carried, with libcupti.so.13
#             beside it): every timed process runs under it (CUDA_INJECTION64_PATH), and each round's
#             trace_summary.txt (in logs.tar.gz, and printed) lists per kernel its time, SM clock and
#             power over the last 3 s of the process, the steady state (dev/kernel_trace/README.md).
#             The tracing's own cost falls on both layers alike; time without it for the tables.
#   SETUP     1: no leanmoe: install SonicMoE into $VS_TMP/site (default /tmp), copy sonic_bench.py to
#             $VS_TMP/sonic_carry, and run it once (one iteration) on CONFIGS so its kernels are compiled
#             and cached; returns quack_cache.tar.xz when anything was compiled. The next call on the warm
#             machine carries .carry/vs alone and sets SONIC_CARRY=/tmp/sonic_carry (no wheels needed when
#             the install is there).
# Writes to $OUT (at most 8 files come back): side_by_side.md, leanmoe.json, sonic.json, baseline.json,
# logs.tar.gz and, when SonicMoE compiled anything new, quack_cache.tar.xz (split into .partN files when
# it exceeds 15 MiB): keep it in .carry/ for the next call (scripts/prepare_carry.sh picks it up).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
START=$SECONDS
FINAL="${OUT:-/tmp/vs-sonic-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
V="${VS_CARRY:-.carry/vs}"; S="${SONIC_CARRY:-.carry/sonicmoe}"
TMPD="${VS_TMP:-/tmp}"  # where SonicMoE's install, its kernel cache and the leanmoe binary go (a warm machine keeps them)
DEADLINE="${DEADLINE:-570}"; ITERS="${ITERS:-10}"; WARM="${WARM:-3}"; ANCHOR="${ANCHOR:-1}"; FP8="${FP8:-0}"
ALL=1.4B-n256,1.4B-n512,1.4B-n1024,7B-n256,7B-n512,7B-n1024,30B-n256,30B-n512,30B-n1024,120B-n512,120B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b,granite-3.1-3b-a800m,gpt-oss-20b
CONFIGS="${CONFIGS:-$ALL}"
SMI=""
finish() {
  [ -n "$SMI" ] && kill "$SMI" 2>/dev/null
  for f in side_by_side.md leanmoe.json sonic.json baseline.json quack_cache.tar.xz quack_cache.tar.xz.part0 \
           quack_cache.tar.xz.part1 quack_cache.tar.xz.part2; do
    [ -f "$W/$f" ] && cp "$W/$f" "$FINAL/"
  done
  tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude='quack_cache.tar.xz*' --exclude=a . 2>/dev/null
}
trap finish EXIT
left() { echo $((DEADLINE - (SECONDS - START))); }
upto() { local l; l=$(left); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }  # a step's time limit: at most $1 s
SETUP="${SETUP:-0}"
needed=("$S/sonic_bench.py")
[ -d "$TMPD/site/sonicmoe" ] || needed+=("$S/lb.tar.xz")  # SonicMoE's install (a warm machine keeps it)
[ "$SETUP" = 1 ] || needed=("$V/leanmoe.xz" "$V/commit" "${needed[@]}")
for f in "${needed[@]}"; do
  [ -f "$f" ] || { echo "vs_sonic: $f is missing: run bash scripts/prepare_carry.sh vs-sonic and carry what it lists" >&2; exit 1; }
done
source scripts/device_env.sh  # NCCL on LD_LIBRARY_PATH
if [ "$SETUP" != 1 ]; then
  mkdir -p "$TMPD/vs_bin" && xz -dc "$V/leanmoe.xz" >"$TMPD/vs_bin/leanmoe" && chmod +x "$TMPD/vs_bin/leanmoe"
  commit="$(cat "$V/commit")"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -l 1 \
  >"$W/smi_log.csv" 2>&1 &
SMI=$!
[ "$SETUP" = 1 ] || "$TMPD/vs_bin/leanmoe" version

install_sonic() {  # into $TMPD/site, unless a warm machine kept the install of its last call
  [ -d "$TMPD/site/sonicmoe" ] && return
  if ! { mkdir -p "$TMPD/site" && tar xJf "$S/lb.tar.xz" -C "$TMPD/site" &&
         python3 -m pip install -q --no-index --no-deps --no-compile --target "$TMPD/site" "$S"/*.whl; } >"$W/install.log" 2>&1
  then echo "vs_sonic: SonicMoE install failed"; cat "$W/install.log"; fi
}
use_cache() {  # SonicMoE's compiled kernels: a warm machine keeps them; else the carried ones
  export PYTHONPATH="$TMPD/site:$TMPD/site/nvidia_cutlass_dsl/python_packages" QUACK_CACHE_DIR="$TMPD/quack_cache" QUACK_CACHE_AUTOTUNING=1
  if [ ! -d "$TMPD/quack_cache" ]; then
    if [ -f "$V/quack_cache.tar.xz" ]; then tar xJf "$V/quack_cache.tar.xz" -C "$TMPD"
    elif [ -f "$V/quack_cache.tgz" ]; then tar xzf "$V/quack_cache.tgz" -C "$TMPD"
    fi
  fi
  mkdir -p "$TMPD/quack_cache"
}
cache_files() { find "$TMPD/quack_cache" -type f | wc -l; }
pack_cache() {  # $1: the cache's file count before: when SonicMoE compiled anything, the cache goes back
  local after; after="$(cache_files)"
  [ "$after" != "$1" ] || return 0
  echo "== packing the quack cache ($after files, $(du -sh "$TMPD/quack_cache" | cut -f1))"
  tar cf - -C "$TMPD" quack_cache | XZ_OPT="-T0 -6" timeout 60 xz >"$W/quack_cache.tar.xz" || rm -f "$W/quack_cache.tar.xz"
  if [ -f "$W/quack_cache.tar.xz" ] && [ "$(stat -c %s "$W/quack_cache.tar.xz")" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15M -d -a 1 "$W/quack_cache.tar.xz" "$W/quack_cache.tar.xz.part" && rm "$W/quack_cache.tar.xz"
    [ -f "$W/quack_cache.tar.xz.part3" ] && { echo "vs_sonic: the cache is over 45 MiB: not returned"; rm -f "$W"/quack_cache.tar.xz.part*; }
  fi
  ls -la "$W"/quack_cache.tar.xz* 2>/dev/null
}

if [ "$SETUP" = 1 ]; then
  echo "== SonicMoE install (t=$((SECONDS - START)) s)"
  install_sonic; use_cache
  mkdir -p "$TMPD/sonic_carry" && cp "$S/sonic_bench.py" "$TMPD/sonic_carry/"
  before="$(cache_files)"; budget=$(( $(left) - 75 ))  # packing the cache, copying the files
  echo "== SonicMoE compiling $CONFIGS, one iteration each (t=$((SECONDS - START)) s, budget $budget s; quack cache: $before files)"
  mkdir -p "$W/setup"
  GRAPH=1 CONFIGS="$CONFIGS" WARM=0 ITERS=1 ROUTER=topk_then_softmax OUT="$W/setup" PYTHONUNBUFFERED=1 \
    timeout "$(( budget > 1 ? budget : 1 ))" python3 "$S/sonic_bench.py" >"$W/setup.log" 2>&1
  echo "sonic rc=$?"
  python3 - "$W/setup/sonic.json" "$CONFIGS" <<'PY'
import json, sys
try: rows = json.load(open(sys.argv[1]))["rows"]
except Exception: rows = []
done = {r["cfg"]: r for r in rows if "error" not in r}
print("compiled (first call s): " + (", ".join(f"{c} {r.get('first_call_s')}" for c, r in done.items()) or "none"))
print("failed: " + (", ".join(f"{r['cfg']}: {r['error'][:100]}" for r in rows if "error" in r) or "none"))
print("not reached: " + (",".join(c for c in sys.argv[2].split(",") if c and c not in done) or "none"))
PY
  pack_cache "$before"
  echo "== done in $((SECONDS - START)) s; on this warm machine next: SONIC_CARRY=$TMPD/sonic_carry STEADY=1 ... bash bench/vs_sonic.sh"
  exit 0
fi

trace_env() {  # $1: a trace file's stem -> the environment that traces the process (TRACE set), or nothing
  [ -n "${TRACE:-}" ] && echo "CUDA_INJECTION64_PATH=$(realpath "$TRACE") KERNEL_TRACE_OUT=$W/r$round/trace_$1.csv"
}
if [ "${STEADY:-0}" = 1 ]; then
  [ "$FP8" = 1 ] && [ "${ROUNDS:-2}" -gt 2 ] &&
    echo "vs_sonic: FP8=1 ROUNDS=${ROUNDS} returns $((3 * ROUNDS + 2)) files; only 8 come back from a device call (ROUNDS <= 2)"
  install_sonic; use_cache
  for round in $(seq 1 "${ROUNDS:-2}"); do
    mkdir -p "$W/r$round"; row=0; fp8_rows=""
    for c in ${CONFIGS//,/ }; do
      read -r warm iters < <(python3 bench/steady_iters.py "$c")
      run_lm() {
        echo "round $round $c leanmoe --warmup $warm --iters $iters (t=$((SECONDS - START)) s)"
        env $(trace_env "leanmoe_$c") timeout "$(upto 120)" "$TMPD/vs_bin/leanmoe" bench --config "$c" \
          --router topk_then_softmax --graph --iters "$iters" --warmup "$warm" --json "$W/r$round/leanmoe_$c.json" \
          >>"$W/r$round/leanmoe.txt" 2>&1
        echo "rc=$?"
      }
      run_fp8() {  # the weights' codes given, as the PyTorch module passes them
        echo "round $round $c leanmoe fp8 --warmup $warm --iters $iters (t=$((SECONDS - START)) s)"
        env $(trace_env "fp8_$c") timeout "$(upto 120)" "$TMPD/vs_bin/leanmoe" bench --config "$c" \
          --router topk_then_softmax --graph --precision fp8 --fp8-weights given --iters "$iters" --warmup "$warm" \
          --json "$W/r$round/fp8_$c.json" >>"$W/r$round/leanmoe_fp8.txt" 2>&1
        echo "rc=$?"
      }
      run_sonic() {
        echo "round $round $c sonic WARM=$warm ITERS=$iters (t=$((SECONDS - START)) s)"; mkdir -p "$W/r$round/s_$c"
        env $(trace_env "sonic_$c") GRAPH=1 CONFIGS="$c" WARM="$warm" ITERS="$iters" ROUTER=topk_then_softmax \
          OUT="$W/r$round/s_$c" PYTHONUNBUFFERED=1 timeout "$(upto 300)" python3 "$S/sonic_bench.py" >>"$W/r$round/sonic.log" 2>&1
        echo "rc=$?"
      }
      if [ "$FP8" = 1 ]; then  # round r, row i (from 0): the order starts at layer (r - 1 + i) mod its count
        order=(run_lm run_fp8 run_sonic)
        read -r _ d n _ _ < <(python3 bench/steady_iters.py --shape "$c")
        if [ $((d % 128)) != 0 ] || [ $((n % 128)) != 0 ]; then
          echo "round $round $c leanmoe fp8: not applicable (d or n not a multiple of 128)"; order=(run_lm run_sonic)
        else fp8_rows+="$c,"
        fi
        for k in "${!order[@]}"; do "${order[$(((round - 1 + row + k) % ${#order[@]}))]}"; done
      elif [ $((round % 2)) = 1 ]; then run_lm; run_sonic; else run_sonic; run_lm; fi
      row=$((row + 1))
    done
    python3 - "$W/r$round" "$CONFIGS" "$fp8_rows" <<'PY'
import glob, json, os, sys
d, configs, fp8_rows = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")


def load(path):
    """A row's JSON, or None where its process left none readable (killed at DEADLINE: an empty file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        print(f"{os.path.basename(d)}: {os.path.relpath(path, d)} unreadable (the process cut?): not merged")
        return None


def merge(pattern, key, name):
    """The round's per-row JSON of one layer as one file (rN_name.json); the rows measured."""
    runs = [j for j in map(load, sorted(glob.glob(os.path.join(d, pattern)))) if j is not None]
    if runs:
        out = dict(runs[0]); out[key] = [r for j in runs for r in j[key]]
        if "command" in out:
            out["command"] = "per row: " + "; ".join(j["command"] for j in runs)
        json.dump(out, open(os.path.join(os.path.dirname(d), os.path.basename(d) + name), "w"), indent=1)
    return {r.get("config", r.get("cfg")) for j in runs for r in j[key] if "error" not in r}


done = {"leanmoe": (merge("leanmoe_*.json", "results", "_leanmoe.json"), configs),
        "leanmoe fp8": (merge("fp8_*.json", "results", "_leanmoe_fp8.json"), fp8_rows),
        "SonicMoE": (merge("s_*/sonic.json", "rows", "_sonic.json"), configs)}
missing = {k: [c for c in want if c and c not in got] for k, (got, want) in done.items()}
left = [c for c in configs if any(c in m for m in missing.values())]
if left:  # cut at DEADLINE, or failed
    print(f"{os.path.basename(d)}: not measured: " + "; ".join(f"{k} {','.join(m)}" for k, m in missing.items() if m))
open(os.path.join(d, "left"), "w").write(",".join(left))
PY
    if [ -n "${TRACE:-}" ] && ls "$W/r$round"/trace_*.csv >/dev/null 2>&1; then
      python3 dev/kernel_trace/summary.py "$W/r$round"/trace_*.csv --width 90 >"$W/r$round/trace_summary.txt" 2>&1
      python3 dev/kernel_trace/summary.py "$W/r$round"/trace_*.csv --gemms >>"$W/r$round/trace_summary.txt" 2>&1
      python3 dev/kernel_trace/summary.py "$W/r$round"/trace_*.csv --tail --width 60 >>"$W/r$round/trace_summary.txt" 2>&1
      cat "$W/r$round/trace_summary.txt"
    fi
    args=(--leanmoe "$W/r${round}_leanmoe.json" --commit "$commit" --out "$W/side_by_side_r$round.md"
          --command "STEADY=1$([ "$FP8" = 1 ] && echo " FP8=1") CONFIGS=$CONFIGS bash bench/vs_sonic.sh (round $round of ${ROUNDS:-2}; iterations: bench/steady_iters.py)")
    [ -f "$W/r${round}_sonic.json" ] && args+=(--sonic "$W/r${round}_sonic.json")
    [ -f "$W/r${round}_leanmoe_fp8.json" ] && args+=(--leanmoe-fp8 "$W/r${round}_leanmoe_fp8.json")
    [ -f "$W/r${round}_leanmoe.json" ] && python3 bench/compare.py "${args[@]}" &&
      sed -n '/CUDA-graph replays/,/^## Against SonicMoE, eager/p' "$W/side_by_side_r$round.md"
    if [ "$FP8" = 1 ]; then  # 3 JSON a round: the rounds' tables go back as one file (at most 8 come back)
      cp "$W/r${round}_leanmoe.json" "$W/r${round}_sonic.json" "$W/r${round}_leanmoe_fp8.json" "$FINAL/" 2>/dev/null
      [ -f "$W/side_by_side_r$round.md" ] && { [ "$round" = 1 ] || echo; cat "$W/side_by_side_r$round.md"; } >>"$W/side_by_side.md"
    else
      cp "$W/side_by_side_r$round.md" "$W/r${round}_leanmoe.json" "$W/r${round}_sonic.json" "$FINAL/" 2>/dev/null
    fi
  done
  echo "== done in $((SECONDS - START)) s"
  rest="$(python3 -c "import sys; left = set(','.join(open(f).read() for f in sys.argv[2:]).split(','))
print(','.join(c for c in sys.argv[1].split(',') if c and c in left))" "$CONFIGS" "$W"/r*/left)"
  [ -z "$rest" ] || echo "rows left for the next call: $rest (CONFIGS=$rest)"
  exit 0
fi

LM_CMD="leanmoe bench --grid --router topk_then_softmax --graph --iters $ITERS --warmup $WARM --json leanmoe.json"
echo "== leanmoe grid (t=$((SECONDS - START)) s)"
timeout "$(upto 240)" "$TMPD/vs_bin/leanmoe" bench --grid --router topk_then_softmax --graph \
  --iters "$ITERS" --warmup "$WARM" --json "$W/leanmoe.json" >"$W/leanmoe.txt" 2>"$W/leanmoe.err"
echo "leanmoe rc=$?"; cat "$W/leanmoe.txt"; tail -3 "$W/leanmoe.err"

CMD="$LM_CMD"

echo "== SonicMoE (t=$((SECONDS - START)) s): $CONFIGS"
install_sonic; use_cache
cache_before="$(cache_files)"
echo "quack cache: $cache_before files"
reserve=$(( ANCHOR == 1 ? 75 + 90 : 75 ))  # compare.py, packing the cache, copying the files (+ the anchor)
budget=$(( $(left) - reserve ))
if [ "$budget" -gt 30 ]; then
  GRAPH=1 CONFIGS="$CONFIGS" ITERS="$ITERS" WARM="$WARM" ROUTER=topk_then_softmax OUT="$W" PYTHONUNBUFFERED=1 \
    timeout "$budget" python3 "$S/sonic_bench.py" >"$W/sonic.log" 2>&1
  rc=$?
  echo "sonic rc=$rc$([ $rc = 124 ] && echo ": stopped at its time budget of $budget s; the rows done are in sonic.json")"
  grep '^{' "$W/sonic.log" | cut -c1-200
else
  echo "vs_sonic: no time left for SonicMoE ($budget s)"
fi
CMD="$CMD; GRAPH=1 CONFIGS=$CONFIGS python3 sonic_bench.py"

if [ "$ANCHOR" = 1 ] && [ "$(left)" -gt 100 ]; then  # after SonicMoE: its compiling needs the time more
  echo "== PyTorch anchor (t=$((SECONDS - START)) s)"
  mkdir -p "$W/a"
  NO_LOOP=1 OUT="$W/a" PYTHONUNBUFFERED=1 timeout "$(upto $(( $(left) - 70 )))" python3 "$V/torch_moe_baseline.py" \
    >"$W/baseline.log" 2>&1
  echo "anchor rc=$?"; tail -1 "$W/baseline.log"
  [ -f "$W/a/baseline.json" ] && cp "$W/a/baseline.json" "$W/baseline.json" && CMD="$CMD; NO_LOOP=1 python3 torch_moe_baseline.py"
elif [ "$ANCHOR" = 1 ]; then
  echo "vs_sonic: no time left for the anchor ($(left) s)"
fi
CMD="$CMD (bench/vs_sonic.sh)"

done_rows="$(python3 -c "import json,sys
try: rows = json.load(open('$W/sonic.json'))['rows']
except Exception: rows = []
print(','.join(r['cfg'] for r in rows if 'error' not in r))")"
rest="$(python3 -c "d=set('$done_rows'.split(',')); print(','.join(c for c in '$CONFIGS'.split(',') if c and c not in d))")"

echo "== side-by-side (t=$((SECONDS - START)) s)"
args=(--leanmoe "$W/leanmoe.json" --commit "$commit" --command "$CMD" --out "$W/side_by_side.md")
[ -f "$W/baseline.json" ] && args+=(--anchor "$W/baseline.json")
[ -f "$W/sonic.json" ] && args+=(--sonic "$W/sonic.json")
if [ -f "$W/leanmoe.json" ]; then python3 bench/compare.py "${args[@]}" && sed -n '/CUDA-graph replays/,/^## Against SonicMoE, eager/p' "$W/side_by_side.md"
else echo "vs_sonic: leanmoe wrote no JSON"; fi

pack_cache "$cache_before"
echo "== done in $((SECONDS - START)) s; SonicMoE rows measured: ${done_rows:-none}"
echo "rows left for the next call: ${rest:-none}${rest:+ (CONFIGS=$rest ANCHOR=0 bash bench/vs_sonic.sh)}"
