#!/usr/bin/env bash
# Session 12, device call 5 (issue 16): (a) branch fp8merge (fp8layer + fp8gather merged; .carry/fp8m:
# leanmoe, leanmoe_gpu_tests, leanmoe_bench_gemms, commit): the FP8 GEMM tests (up/dH gather, down/dx
# CUTLASS), the CUDA layer in FP8 against the CPU backend's FP8, the bf16 GEMM/backend tests, memcheck
# on the FP8 layer; the four FP8 GEMMs against bf16 (leanmoe_bench_gemms --precision bf16,fp8, two
# rounds after a 3 s warm-up); the layer in FP8 against bf16 (leanmoe bench --precision, graph replays,
# steady-state iteration counts). (b) branch fp8optim's fragment (.carry/fp8optim): the optimizer's
# update writing the FP8 weights.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" --exclude=bin --exclude=fp8optim/fp8optim . 2>/dev/null' EXIT
source scripts/device_env.sh
mkdir -p "$W/bin"
for f in leanmoe leanmoe_gpu_tests leanmoe_bench_gemms; do xz -dc .carry/fp8m/$f.xz > "$W/bin/$f" && chmod +x "$W/bin/$f"; done
echo "fp8merge $(cat .carry/fp8m/commit)"
T="$W/bin/leanmoe_gpu_tests"
echo "== (a) smoke (t=${SECONDS})"
timeout 60 "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.SwiGLUDefaultPath:ExpertGemmsFp8.DownRagged:CudaBackendFp8.MatchesCpuFp8' > "$W/smoke.log" 2>&1
echo "smoke rc=$?"; grep -E "PASSED|FAILED|fp8 layer vs cpu|Failure|exception" "$W/smoke.log" | head -20
echo "== tests (t=${SECONDS})"
timeout 200 "$T" --gtest_brief=1 --gtest_filter='ExpertGemmsFp8.*:CudaBackendFp8.*:CudaBackend.*:ExpertGemms.*:GemmConfig.*:GemmHeuristics.*:Fp8Quantize*' > "$W/tests.log" 2>&1 &
P1=$!
timeout 200 compute-sanitizer --tool memcheck --print-limit 10 "$T" --gtest_brief=1 \
  --gtest_filter='CudaBackendFp8.MatchesCpuFp8:ExpertGemmsFp8.NoTokens:ExpertGemmsFp8.OneExpertTakesAllRows' > "$W/memcheck.log" 2>&1 &
P2=$!
wait $P1; R1=$?; wait $P2; R2=$?
echo "tests rc=$R1 memcheck rc=$R2 (t=${SECONDS})"
{ grep -E "tests ran|PASSED|FAILED|fp8 layer vs cpu" "$W/tests.log"; grep -B3 -A12 "Failure" "$W/tests.log" | head -60
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$W/memcheck.log"; } | tee "$FINAL/fp8m_tests.txt"
echo "== GEMMs bf16 vs fp8 (t=${SECONDS})"
SH=7B-n1024,30B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b
timeout 40 "$W/bin/leanmoe_bench_gemms" --gemms up --shape 120B-n2048 --iters 300 --warmup 3 > /dev/null 2>&1  # ~3 s: past the power ramp
for r in 1 2; do
  timeout 90 "$W/bin/leanmoe_bench_gemms" --gemms up,down,dh,dx --shape $SH --precision bf16,fp8 --iters 20 --warmup 3 \
    > "$W/gemms_$r.txt" 2>&1; echo "round $r rc=$? (t=${SECONDS})"
done
python3 - "$W" > "$FINAL/fp8m_gemms.md" <<'PY'
import sys
W = sys.argv[1]
ms = {}
for r in (1, 2):
    for line in open(f"{W}/gemms_{r}.txt"):
        f = [x.strip() for x in line.split('|')[1:-1]]
        if len(f) == 11 and f[7] in ('up', 'down', 'dh', 'dx'):
            try: ms.setdefault((f[0], f[7], f[1].endswith('fp8')), []).append((float(f[9]), f[8]))
            except ValueError: pass
print("best of 2 rounds, ms; x = bf16 / fp8; TFLOP/s bf16-equivalent")
print("| shape | GEMM | bf16 ms | fp8 ms | x | fp8 kernel |")
print("|---|---|---|---|---|---|")
tot = [0.0, 0.0]
for (s, g, f8), v in ms.items():
    if f8: continue
    b = min(v)[0]; q = ms.get((s, g, True))
    if not q: print(f"| {s} | {g} | {b:.3f} | - | - | |"); continue
    qb, qk = min(q)
    tot[0] += b; tot[1] += qb
    print(f"| {s} | {g} | {b:.3f} | {qb:.3f} | {b / qb:.2f} | {qk} |")
if tot[1]: print(f"| sum | | {tot[0]:.3f} | {tot[1]:.3f} | {tot[0] / tot[1]:.2f} | |")
PY
cat "$FINAL/fp8m_gemms.md"
echo "== layer bf16 vs fp8 (t=${SECONDS})"
for c in 120B-n2048 30B-n1024 olmoe-1b-7b qwen3-30b-a3b; do
  read -r warm iters < <(python3 bench/steady_iters.py "$c")
  for p in storage fp8; do
    timeout 60 "$W/bin/leanmoe" bench --config $c --router topk_then_softmax --graph --precision $p --warmup $warm \
      --iters $iters --json "$W/layer_${c}_$p.json" > "$W/layer_${c}_$p.txt" 2>&1; echo "$c $p rc=$? (t=${SECONDS})"
  done
done
python3 - "$W" > "$FINAL/fp8m_layer.md" <<'PY'
import glob, json, sys
W = sys.argv[1]
print("graph replays, ms (eager in brackets); x = bf16 time / fp8 time")
print("| row | bf16 fwd | fp8 fwd | fwd x | bf16 bwd | fp8 bwd | bwd x | fwd+bwd x | fp8 fwd+bwd TFLOP/s (bf16-equiv.) |")
print("|---|---|---|---|---|---|---|---|---|")
for c in ("120B-n2048", "30B-n1024", "olmoe-1b-7b", "qwen3-30b-a3b"):
    try:
        b = json.load(open(f"{W}/layer_{c}_storage.json"))["results"][0]; q = json.load(open(f"{W}/layer_{c}_fp8.json"))["results"][0]
    except Exception as e:
        print(f"| {c} | {e!r} |"); continue
    fb, bb, fq, bq = b["fwd_graph_ms"], b["bwd_graph_ms"], q["fwd_graph_ms"], q["bwd_graph_ms"]
    tf = (b["fwd_flops"] + b["bwd_flops"]) / ((fq + bq) * 1e9)
    print(f"| {c} | {fb:.3f} ({b['fwd_ms']:.3f}) | {fq:.3f} ({q['fwd_ms']:.3f}) | {fb / fq:.2f} | {bb:.3f} ({b['bwd_ms']:.3f}) | "
          f"{bq:.3f} ({q['bwd_ms']:.3f}) | {bb / bq:.2f} | {(fb + bb) / (fq + bq):.2f} | {tf:.0f} |")
PY
cat "$FINAL/fp8m_layer.md"
if [ -d .carry/fp8optim ]; then
  echo "== (b) fp8optim (t=${SECONDS})"; mkdir -p "$W/fp8optim"
  CARRY=.carry/fp8optim W="$W/fp8optim" FINAL="$FINAL" timeout $((580 - SECONDS)) \
    bash bench/results/archive/2026-12-04-h200-s12/fp8optim.device.sh > "$W/fp8optim.log" 2>&1; echo "rc=$?"; tail -25 "$W/fp8optim.log"
fi
echo "done (t=${SECONDS})"
