# dhepi2 (issue 17): the dH and up epilogues' instruction diet, same bits (branch dhepi2, commit in
# $CARRY/commit; docs/kernels.md "dH epilogue: an instruction diet"): fragments through the warp tiles by
# stmatrix/ldmatrix, dH's bounds tests hoisted (none per 8-column block), sigmoid's ex2 without the
# subnormal fix-up. A codegen change, no new configuration: base = branch sass 9f9cae0's binaries.
#   1. smoke ExpertGemms.FewPersistentCtas (a barrier mistake hangs: rc=124 skips the rest)
#   2. GPU tests ExpertGemms.*, ExpertGemmsFp8.* (the gather FP8 up/dH epilogues quantizing: kQuant),
#      CudaBackend* (every activation, bias, layout through the layer)
#   3. memcheck + racecheck on ExpertGemms.FewPersistentCtas (every gather kind, both layouts, 5 CTAs)
#   4. bit identity: leanmoe_bench_gemms --digest (a hash of up's H, A and dH's dH, A', ds partials)
#      base vs new, 7B-n256 and olmoe-1b-7b, HF (the default kernels), HF interleaved and transposed
#      (the general ones). Expected: every digest equal.
#   5. ncu (base clocks) smsp__inst_executed + duration of up and dh at 120B-n2048, base vs new.
#      Expected from the SASS (dev/sass_vs_quack.py --epilogue: dH's epilogue 37.1 -> 26.4 per element,
#      up's 10.2 -> 7.8): dh ~0.89 -> ~0.80 G (QuACK 0.73), up ~1.16 -> ~1.12 G.
#   6. leanmoe_bench_gemms dh,up on 120B-n2048, 30B-n512, olmoe-1b-7b, 7B-n256: warm-up, then two
#      rounds, base and new interleaved per round.
# Expected run time: ~4 min (tests ~90 s, sanitizers ~50 s, digests ~20 s, ncu ~30 s, benches ~50 s);
# hard caps ~15 min. Returns $FINAL/dhepi2_tests.log, dhepi2_sanitizers.log, dhepi2_ncu.csv,
# dhepi2_bench.md (digests at its end).
# Pass: tests all OK, memcheck 0 errors, racecheck 0 hazards, digests all "same"; the summary: dh and
# up instructions and ms, base vs new.
set -uo pipefail
[ -e /usr/local/cuda/lib/libnccl.so.2 ] ||  # as scripts/device_env.sh: the GPU tests link NCCL
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib
B="$W/dhepi2"; mkdir -p "$B"
xz -dc "$CARRY/bins.tar.xz" | tar -C "$B" -xf - && chmod +x "$B"/leanmoe_*
echo "dhepi2 commit $(head -1 "$CARRY/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
T="$B/leanmoe_gpu_tests"; G="$B/leanmoe_bench_gemms"; G0="$B/leanmoe_bench_gemms_base"
LOG="$W/dhepi2_tests.log"; SANLOG="$W/dhepi2_sanitizers.log"; NCU="$W/dhepi2_ncu.csv"; BENCH="$W/dhepi2_bench.md"
DIG="$W/dhepi2_digest.txt"
: > "$LOG"; : > "$SANLOG"; : > "$NCU"; : > "$BENCH"; : > "$DIG"

echo "== dhepi2 smoke (t=${SECONDS})"
timeout 60 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.FewPersistentCtas' >> "$LOG" 2>&1
smoke=$?
echo "smoke rc=$smoke (t=${SECONDS})"
if [ $smoke -ne 124 ]; then
  echo "== dhepi2 tests (t=${SECONDS})"
  timeout 240 "$T" --gtest_brief=1 --gtest_filter='ExpertGemms.*:ExpertGemmsFp8.*:CudaBackend*' >> "$LOG" 2>&1
  echo "tests rc=$? (t=${SECONDS})"

  echo "== dhepi2 sanitizers (t=${SECONDS})"
  for tool in memcheck racecheck; do
    echo "---- $tool" >> "$SANLOG"
    timeout 120 compute-sanitizer --tool $tool --print-limit 20 "$T" --gtest_brief=1 \
      --gtest_filter='ExpertGemms.FewPersistentCtas' >> "$SANLOG" 2>&1
    echo "$tool rc=$? (t=${SECONDS})"
  done

  echo "== dhepi2 digests (t=${SECONDS})"
  for bin in base new; do
    exe=$G; [ $bin = base ] && exe=$G0
    for opts in "--layout hf,transposed" "--layout hf --interleaved"; do
      timeout 60 "$exe" --shape 7B-n256,olmoe-1b-7b --gemms up,dh --iters 1 --warmup 1 --digest $opts 2>&1 |
        grep '^digest' | sed "s/^/$bin /" >> "$DIG"
    done
    echo "digest $bin rc=$? (t=${SECONDS})"
  done

  echo "== dhepi2 ncu (t=${SECONDS})"
  for bin in base new; do
    exe=$G; [ $bin = base ] && exe=$G0
    timeout 90 ncu --metrics smsp__inst_executed.sum,gpu__time_duration.sum -k regex:gather_grouped_gemm \
      --csv --print-units base --print-kernel-base mangled \
      "$exe" --shape 120B-n2048 --gemms up,dh --iters 1 --warmup 1 2>/dev/null |
      grep -E '^"' | sed "s/^/\"$bin\",/" >> "$NCU"
    echo "ncu $bin rc=$? (t=${SECONDS})"
  done

  echo "== dhepi2 benches (t=${SECONDS})"
  SHAPES=120B-n2048,30B-n512,olmoe-1b-7b,7B-n256
  timeout 60 "$G0" --shape 120B-n2048 --gemms dh --iters 300 --warmup 5 > /dev/null 2>&1
  echo "warm-up done (t=${SECONDS})"
  for round in 1 2; do
    for bin in base new; do
      exe=$G; [ $bin = base ] && exe=$G0
      echo "round $round $bin" >> "$BENCH"
      timeout 60 "$exe" --shape $SHAPES --gemms dh,up --iters 20 --warmup 3 >> "$BENCH" 2>&1
      echo "bench round $round $bin rc=$? (t=${SECONDS})"
    done
  done
fi
cat "$DIG" >> "$BENCH"
cp "$LOG" "$SANLOG" "$NCU" "$BENCH" "$FINAL/" 2>/dev/null

echo "== dhepi2 summary (t=${SECONDS})"
grep -E "tests? from .* ran|PASSED|FAILED" "$LOG" | tail -6
grep -B2 -A6 "Failure" "$LOG" | head -30
grep -E "^----|ERROR SUMMARY|RACECHECK SUMMARY" "$SANLOG"
grep -m5 -E "Invalid|Race|Hazard|rror" "$SANLOG" | grep -v SUMMARY
python3 - "$NCU" "$BENCH" "$DIG" <<'PYEOF'
import csv, re, sys, collections
KIND = {'0': 'up', '2': 'dh'}
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
for g in ('up', 'dh'):
    cells = []
    for b in ('base', 'new'):
        i, d = inst.get((b, g)), dur.get((b, g))
        cells.append(f"{b} {i[-1] / 1e9:.3f} G {d[-1] / 1e6:.3f} ms" if i and d else f"{b} -")
    print(f"  {g:4} " + "   ".join(cells))
dig = collections.defaultdict(dict)
for line in open(sys.argv[3]):
    f = line.split()
    if len(f) >= 6 and f[1] == 'digest': dig[' '.join(f[2:5]).rstrip(':')][f[0]] = f[-1]
same = [k for k, v in dig.items() if v.get('base') and v.get('base') == v.get('new')]
diff = [k for k, v in dig.items() if k not in same]
print(f"digests (12 expected: 2 shapes x hf, transposed, hf-interleaved x up, dh): {len(same)} same, "
      f"{len(diff)} different or missing" + (": " + "; ".join(diff) if diff else ""))
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
    for g in ('dh', 'up'):
        b, n = ms.get((sh, g, 'base')), ms.get((sh, g, 'new'))
        if not b or not n: continue
        rel = 100 * (sum(n) / len(n) / (sum(b) / len(b)) - 1)
        print(f"{sh:12} {g:4} {'/'.join(f'{x:.3f}' for x in b):>13} {'/'.join(f'{x:.3f}' for x in n):>13} {rel:+10.1f}%")
PYEOF
