#!/usr/bin/env bash
# Session 10, device call 3 (one H200, at most 10 minutes), leanmoe main (commit in .carry/s10a):
#   1. is CUTLASS's down GEMM slow at n = 256 because of its per-group tensormap updates? The same
#      rows (T·K = 196608, d 1536, n 256) split over E = 4, 16, 128 experts (K = 1), per-kernel
#      times under ncu; 7B-n256 (K = 8, E = 128) beside it (issue 17);
#   2. the python front built there; the HF training step at gpt-oss-20b widths (4 layers, 4 x 2048
#      tokens), experts_implementation grouped_mm vs leanmoe vs leanmoe + in-backward (issue 13);
#   3. train_lm seed 1: top-K, token rounding up and down at the 25.9 M-token budget (issue 15).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
R="$PWD"; FINAL="${OUT:-/tmp/leanmoe-out}"; mkdir -p "$FINAL"
W="$(mktemp -d)"
trap 'tar czf "$FINAL/logs.tar.gz" -C "$W" . 2>/dev/null' EXIT
source scripts/device_env.sh
B=/tmp/s10a; mkdir -p $B
for f in leanmoe libleanmoe.a; do xz -dc .carry/s10a/$f.xz > $B/$f; done; chmod +x $B/leanmoe
commit="$(cat .carry/s10a/commit)"; echo "commit $commit"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$W/gpu.txt"
(CMAKE_BUILD_PARALLEL_LEVEL=14 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
   ./python -Ccmake.define.LEANMOE_CORE_LIBRARY=$B/libleanmoe.a -Ccmake.define.LEANMOE_BLAS_LIBRARY=/tmp/blas/libopenblas.so.0 \
   >"$W/python_build.log" 2>&1; echo "rc=$?" >>"$W/python_build.log") &
pybuild=$!
NCU=(ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base)
echo "== 1. down/dx vs experts per row (t=${SECONDS})"
for e in 4 16 128; do
  timeout 40 "${NCU[@]}" $B/leanmoe bench --T 196608 --d 1536 --n 256 --E $e --K 1 --router topk_then_softmax \
    --iters 1 --warmup 1 >"$W/ncu_E$e.csv" 2>"$W/ncu_E$e.err"; echo "E=$e rc=$?"
done
timeout 40 "${NCU[@]}" $B/leanmoe bench --config 7B-n256 --router topk_then_softmax --iters 1 --warmup 1 \
  >"$W/ncu_7B.csv" 2>"$W/ncu_7B.err"; echo "7B rc=$?"
for f in "$W"/ncu_*.csv; do python3 dev/ncu_kernel_times.py "$f" | grep -E "==|cutlass::device_kernel" ; done
(cd "$W" && tar czf "$FINAL/ncu.tgz" ncu_*.csv)
wait $pybuild; echo "== python front (t=${SECONDS}): $(tail -1 "$W/python_build.log")"
grep -q "rc=0" "$W/python_build.log" || { tail -20 "$W/python_build.log"; exit 1; }
echo "== 2. HF step gpt-oss-20b (t=${SECONDS})"
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 220 python3 bench/hf_step_bench.py --models gpt_oss_20b --modes g,l,i \
  --layers 4 --batch 4 --seq 2048 --steps 3 --out "$W/hf" --commit "$commit" >"$W/hf.log" 2>&1; echo "hf rc=$?"
tail -12 "$W/hf.log"; cp "$W"/hf/hf_step.md "$FINAL/hf_step_gpt_oss.md" 2>/dev/null; cp "$W"/hf/hf_step.json "$FINAL/hf_step_gpt_oss.json" 2>/dev/null
echo "== 3. train_lm seed 1 (t=${SECONDS})"
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout $((585 - SECONDS)) python3 examples/train_lm.py --device cuda --batch 32 \
  --train-mb 120 --steps 790 --runs topk,tr-up,tr-down --seed 1 --out "$W/seed1" --ckpt-dir /tmp/ck1 --commit "$commit" \
  >"$W/seed1.log" 2>&1; echo "train rc=$?"
grep -E "final val loss|PASS|FAIL" "$W/seed1.log" | tail -8; cp "$W/seed1/results.md" "$FINAL/train_seed1.md" 2>/dev/null
echo "done (t=${SECONDS})"
