# sass (issue 17): the gather kernel's consumer mainloop with its wgmma descriptors built once and
# advanced in uniform registers (cwg broadcast from lane 0), one release arrive per warp, unsigned
# stage counters (branch sass, commit in $CARRY/commit; docs/kernels.md "The backward kinds in SASS
# beside QuACK's"). A codegen change, no new configuration: base = main c3d7d1f's binaries.
#   1. smoke ExpertGemms.FewPersistentCtas (a barrier mistake hangs: rc=124 skips the rest)
#   2. GPU tests ExpertGemms.*, ExpertGemmsFp8.EveryCompiledConfig, GemmConfig.*, GemmHeuristics.*
#   3. memcheck + racecheck on ExpertGemms.FewPersistentCtas (every gather kind, both layouts, 5 CTAs)
#   4. ncu (clocks at base, as s11) smsp__inst_executed + duration of up, dh, dw2, dw1 at 120B-n2048,
#      base vs new. Expected from the SASS: dw1 1.96 -> ~1.27 G, dw2 0.79 -> ~0.61, dh 1.05 -> ~0.89,
#      up 1.54 -> ~1.16 (QuACK 0.88 / 0.59 / 0.73 / 1.12).
#   5. leanmoe_bench_gemms up,dh,dw2,dw1 on 120B-n2048, 30B-n512, 7B-n256: warm-up, then two rounds,
#      base and new interleaved per round.
# Expected run time: ~4 min (tests ~70 s, sanitizers ~50 s, ncu ~50 s, benches ~70 s); hard caps ~16 min.
# Returns $FINAL/sass_tests.log, $FINAL/sass_sanitizers.log, $FINAL/sass_ncu.csv, $FINAL/sass_bench.md.
# Pass: tests all OK, memcheck 0 errors, racecheck 0 hazards; the summary: instructions and ms per GEMM.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/sass"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "sass commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
T="$B/leanmoe_gpu_tests"; G="$B/leanmoe_bench_gemms"; G0="$B/leanmoe_bench_gemms_base"
LOG="$W/sass_tests.log"; SANLOG="$W/sass_sanitizers.log"; NCU="$W/sass_ncu.csv"; BENCH="$W/sass_bench.md"
: > "$LOG"; : > "$SANLOG"; : > "$NCU"; : > "$BENCH"

echo "== sass smoke (t=${SECONDS})"
timeout 60 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.FewPersistentCtas' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"
if [ $smoke -ne 124 ]; then
  echo "== sass tests (t=${SECONDS})"
  timeout 200 "$T" --gtest_brief=1 \
    --gtest_filter='ExpertGemms.*:ExpertGemmsFp8.EveryCompiledConfig:GemmConfig.*:GemmHeuristics.*' >> "$LOG" 2>&1
  echo "tests rc=$? (t=${SECONDS})"

  echo "== sass sanitizers (t=${SECONDS})"
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$SANLOG"
    timeout 120 compute-sanitizer --tool $tool --print-limit 20 "$T" --gtest_brief=1 \
      --gtest_filter='ExpertGemms.FewPersistentCtas' >> "$SANLOG" 2>&1
    echo "$tool rc=$? (t=${SECONDS})"
  done

  echo "== sass ncu (t=${SECONDS})"
  for bin in base new; do
    exe=$G; [ $bin = base ] && exe=$G0
    timeout 90 ncu --metrics smsp__inst_executed.sum,gpu__time_duration.sum -k regex:gather_grouped_gemm \
      --csv --print-units base --print-kernel-base mangled \
      "$exe" --shape 120B-n2048 --gemms up,dh,dw2,dw1 --iters 1 --warmup 1 2>/dev/null |
      grep -E '^"' | sed "s/^/\"$bin\",/" >> "$NCU"
    echo "ncu $bin rc=$? (t=${SECONDS})"
  done

  echo "== sass benches (t=${SECONDS})"
  SHAPES=120B-n2048,30B-n512,7B-n256
  timeout 60 "$G0" --shape 120B-n2048 --gemms dw1,dw2 --iters 300 --warmup 5 > /dev/null 2>&1
  echo "warm-up done (t=${SECONDS})"
  for round in 1 2; do
    for bin in base new; do
      exe=$G; [ $bin = base ] && exe=$G0
      echo "round $round $bin" >> "$BENCH"
      timeout 60 "$exe" --shape $SHAPES --gemms up,dh,dw2,dw1 --iters 20 --warmup 3 >> "$BENCH" 2>&1
      echo "bench round $round $bin rc=$? (t=${SECONDS})"
    done
  done
fi
cp "$LOG" "$SANLOG" "$NCU" "$BENCH" "$FINAL/" 2>/dev/null

echo "== sass summary (t=${SECONDS})"
grep -E "tests? from .* ran|PASSED|FAILED" "$LOG" | tail -4
grep -B2 -A6 "Failure" "$LOG" | head -30
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$SANLOG"
grep -m5 -E "Invalid|Race|Hazard|rror" "$SANLOG" | grep -v SUMMARY
python3 - "$NCU" "$BENCH" <<'EOF'
import csv, re, sys, collections
KIND = {'0': 'up', '2': 'dh', '3': 'dw2', '5': 'dw1'}
inst, dur = collections.defaultdict(list), collections.defaultdict(list)
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 4 or row[0] not in ('base', 'new'): continue
    name = next((c for c in row if 'gather_grouped_gemm' in c), '')
    m = re.search(r'GemmKind\)?E?(\d)', name)
    if not m or m.group(1) not in KIND: continue
    val = row[-1].replace(',', '')
    try: v = float(val)
    except ValueError: continue
    key = (row[0], KIND[m.group(1)])
    if 'inst_executed' in ','.join(row): inst[key].append(v)
    elif 'duration' in ','.join(row): dur[key].append(v)
print("ncu, 120B-n2048, base clocks (last launch): instructions G, ms")
for g in ('up', 'dh', 'dw2', 'dw1'):
    cells = []
    for b in ('base', 'new'):
        i, d = inst.get((b, g)), dur.get((b, g))
        cells.append(f"{b} {i[-1] / 1e9:.3f} G {d[-1] / 1e6:.3f} ms" if i and d else f"{b} -")
    print(f"  {g:4} " + "   ".join(cells))
ms = collections.defaultdict(list)
bin_ = None
for line in open(sys.argv[2]):
    m = re.match(r'round \d (base|new)', line)
    if m: bin_ = m.group(1); continue
    f = [x.strip() for x in line.split('|')]
    if len(f) < 12 or f[1] in ('shape', '') or f[1].startswith('-'): continue
    try: t = float(f[10])
    except ValueError: continue
    ms[(f[1], f[8], bin_)].append(t)
print(f"{'shape':12} {'gemm':4} {'base r1/r2':>13} {'new r1/r2':>13} {'new vs base':>11}")
for sh in dict.fromkeys(k[0] for k in ms):
    for g in ('up', 'dh', 'dw2', 'dw1'):
        b, n = ms.get((sh, g, 'base')), ms.get((sh, g, 'new'))
        if not b or not n: continue
        rel = 100 * (sum(n) / len(n) / (sum(b) / len(b)) - 1)
        print(f"{sh:12} {g:4} {'/'.join(f'{x:.3f}' for x in b):>13} {'/'.join(f'{x:.3f}' for x in n):>13} {rel:+10.1f}%")
EOF
