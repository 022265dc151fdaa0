# Device fragment, branch fp8train (issue 16): why train_lm's fp8 run ends 0.04 nats below bf16 on the H200.
# Run from the root of a checkout of fp8train, with the PyTorch front of that commit importable
# (PYTHONPATH=$SITE: built as in bench/results/archive/2026-12-04-h200-s13/call2.sh, i.e. pip install ./python
# against the carried libleanmoe.a; the library is main's, fp8train changes only dev/ and docs).
# $W scratch, $FINAL the files that come back. Expected time: grad bias ~1 min; the training runs
# 18 x (790 steps, ~150 s alone) spread over the visible GPUs, at most 3 at once per GPU:
# ~28 GPU-minutes, so ~8 min on nvidia-h200-x4; on one GPU split it into three calls,
# VARIANTS="bf16,bf16-lmupd", "fp8,q-xwdo", "bf16-master,fp8-master" (each call's $FINAL/probe.tgz
# holds its JSON files; unpack all into one folder and run
# `python3 dev/fp8_train_probe.py --out FOLDER --summarize` for the table; bf16 must be among them).
# Order of importance if time is short: bf16,bf16-lmupd (the noise floor; bf16 should repeat s13's
# topk losses 2.4577 / 2.4935 / 2.4989 to the digit), then fp8,q-xwdo, then the master pair.
set -uo pipefail
SITE="${SITE:-/tmp/site}"
VARIANTS="${VARIANTS:-bf16,bf16-lmupd,fp8,q-xwdo,bf16-master,fp8-master}"
SEEDS="${SEEDS:-0 1 2}"
mkdir -p "$W/probe" "$FINAL"
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
# 1. Is either CUDA path's layer biased against an fp32 reference (train_lm's h200 layer, 3 inputs)?
timeout 300 python3 dev/fp8_grad_bias.py --device cuda --T 32768 --d 768 --n 256 --E 64 --K 8 \
  > "$FINAL/grad_bias.txt" 2>&1; echo "grad bias rc=$?"
# 2. train_lm's h200 preset, 790 steps, each (seed, variant) its own process (same batches per seed).
ngpu=$(nvidia-smi -L | wc -l); i=0; pids=()
for s in $SEEDS; do
  for v in ${VARIANTS//,/ }; do
    gpu=$((i % ngpu))
    CUDA_VISIBLE_DEVICES=$gpu timeout 1500 python3 dev/fp8_train_probe.py --variants "$v" --seeds "$s" \
      --out "$W/probe" -- --device cuda --steps 790 > "$W/probe/log_s${s}_$v.txt" 2>&1 &
    pids+=($!); i=$((i + 1))
    if (( i % (3 * ngpu) == 0 )); then for p in "${pids[@]}"; do wait "$p"; done; pids=(); fi
  done
done
for p in "${pids[@]}"; do wait "$p"; done
tar czf "$FINAL/probe.tgz" -C "$W" probe
python3 dev/fp8_train_probe.py --out "$W/probe" --summarize | tee "$FINAL/summary.txt"
grep -h "^trial" "$FINAL/grad_bias.txt" | sort -k3,3 -s | head -15
