#!/usr/bin/env bash
# Session 12, device call 9 (issue 16): every compiled FP8 config of down and dx beside bf16's default, on
# 7 shapes, two rounds after a ~3 s warm-up (main's leanmoe_bench_gemms, .carry/s12g): the data for the FP8
# down/dx heuristic (call 5 showed its ping-pong pick losing to bf16 at 30B-n1024).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"; source scripts/device_env.sh
xz -dc .carry/s12g/leanmoe_bench_gemms.xz > "$W/b" && chmod +x "$W/b"; echo "main $(cat .carry/s12g/commit)"
SH=7B-n256,7B-n1024,30B-n512,30B-n1024,120B-n2048,olmoe-1b-7b,qwen3-30b-a3b
C1=cutlass:coop:128x128:auto:tma:c1x2; C2=cutlass:coop:128x128:auto:tma:c2; P2=cutlass:pingpong:64x128:auto:tma:c2
timeout 30 "$W/b" --gemms dx --shape 120B-n2048 --iters 300 --warmup 3 > /dev/null 2>&1
for r in 1 2; do
  timeout 60 "$W/b" --gemms down,dx --shape $SH --precision bf16 --iters 20 --warmup 3 > "$FINAL/bf16_$r.txt" 2>&1; echo "bf16 $r rc=$?"
  timeout 90 "$W/b" --gemms down,dx --shape $SH --precision fp8 --iters 20 --warmup 3 \
    --config down=$C1,down=$C2,down=$P2,dx=$C1,dx=$C2,dx=$P2 > "$FINAL/fp8_$r.txt" 2>&1; echo "fp8 $r rc=$?"
done
python3 - "$FINAL" <<'PY' | tee "$FINAL/summary.md"
import sys
F = sys.argv[1]; ms = {}
for p in ("bf16", "fp8"):
    for r in (1, 2):
        for line in open(f"{F}/{p}_{r}.txt"):
            f = [x.strip() for x in line.split('|')[1:-1]]
            if len(f) == 11 and f[7] in ("down", "dx"):
                try: ms.setdefault((f[0], f[7], p if p == "bf16" else f[8].replace("cutlass:", "").replace(":auto:tma", "").replace(":m132", "")), []).append(float(f[9]))
                except ValueError: pass
print("best of 2 rounds, ms; x = bf16 / fp8")
rows = sorted({(s, g) for s, g, _ in ms}, key=lambda k: (k[1], k[0]))
cfgs = sorted({c for _, _, c in ms if c != "bf16"})
print("| shape | GEMM | bf16 | " + " | ".join(cfgs) + " | best x |"); print("|---" * (4 + len(cfgs)) + "|")
for s, g in rows:
    b = min(ms.get((s, g, "bf16"), [float('nan')])); v = [min(ms.get((s, g, c), [float('nan')])) for c in cfgs]
    print(f"| {s} | {g} | {b:.3f} | " + " | ".join(f"{x:.3f}" for x in v) + f" | {b / min(v):.2f} |")
PY
