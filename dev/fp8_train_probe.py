"""Why does train_lm's fp8 run train lower than top-K in bf16 (issue 16)? Trains the same model over
the same batches in variants that each change one thing, several seeds in one process, and prints
the validation and (windowed) training losses beside the bf16 run's.

Variants (all bf16 parameters unless said):
  bf16        train_lm's topk run
  fp8         train_lm's fp8 run (leanmoe.MoE precision="fp8": e4m3 operands in up, down, dH, dX)
  bf16-lmupd  bf16, expert weights stepped by leanmoe's fused AdamW (ExpertAdamW(update="leanmoe")), the
              update an fp8 layer's weights always take: the fp8 run without the quantization, and a
              rounding-level perturbation of bf16 (the paired-difference noise floor)
  bf16-master, fp8-master  bf16 / fp8 with fp32 master copies of the expert weights (ExpertAdamW
              master_weights=True, leanmoe's update): no expert update is rounded away by bf16 storage;
              if FP8's gradient noise helped by dithering that rounding, the gap closes here
  fp32moe     bf16 model, the MoE layers' weights and GEMMs in fp32 (initialised as bf16, then widened)
  fp32        every parameter fp32 (train_lm --dtype float32)
  q-x, q-w, q-do, q-xwdo  bf16 layer fed e4m3 round trips with straight-through gradients (src/fp8.h's
              rule in torch): the layer input x (1x128 tiles), the expert weights (128x128 blocks), the
              output gradient dO (1x128), or all three; emulations, not the fp8 layer
  noise-w     bf16 layer whose expert weights get, per call, zero-mean noise of e4m3's relative RMS
              (2^-4 / sqrt(3) of each value) with straight-through gradients

    OMP_NUM_THREADS=1 python dev/fp8_train_probe.py --variants bf16,fp8 --seeds 0,1 --out /tmp/p \\
        -- --steps 300 --d 128 --n 128 --heads 4        # train_lm flags after --
    python dev/fp8_train_probe.py --out /tmp/p --summarize  # the table again, from the JSON files

On the GPU (--device cuda; bf16 storage only, so not fp32moe / fp32) the emulations run on the bf16
CUDA kernels: q-xwdo there against fp8 separates the quantization's effect from the FP8 kernels'.
"""
import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

import leanmoe

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)
spec = importlib.util.spec_from_file_location("train_lm", os.path.join(EXAMPLES, "train_lm.py"))
tl = importlib.util.module_from_spec(spec)
sys.modules["train_lm"] = tl
spec.loader.exec_module(tl)
import train_common  # noqa: E402  (after train_lm put examples/ on the path)
from fp8_dw_numerics import scale_pow2  # noqa: E402  (dev/, this script's folder: one emulated scale rule)

ORIG_MOE, ORIG_ADAMW = leanmoe.MoE, train_common.ExpertAdamW


# ---- e4m3 round trip with power-of-two tile scales (src/fp8.h), in torch ----
def fp8_round_trip(v, tile_rows):
    """v [..., R, C] (C, and R when tile_rows > 1, multiples of 128) -> its e4m3 value with one
    power-of-two scale per tile_rows x 128 tile: s = 2^k, the smallest with amax <= 448 s, k >= -126."""
    *lead, R, C = v.shape
    f = v.float().reshape(*lead, R // tile_rows, tile_rows, C // 128, 128)
    s = scale_pow2(f.abs().amax(dim=(-3, -1), keepdim=True))
    q = (f / s).to(torch.float8_e4m3fn).float() * s
    return q.reshape(v.shape).to(v.dtype)


class _STE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v, fn):
        return fn(v)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GradQuant(torch.autograd.Function):  # identity forward, e4m3 rows (1x128) of the gradient
    @staticmethod
    def forward(ctx, v):
        return v.view_as(v)

    @staticmethod
    def backward(ctx, g):
        return fp8_round_trip(g.reshape(-1, g.shape[-1]), 1).view_as(g)


def e4m3_noise(w):
    # e4m3 rounding error of a normal value: uniform in +-2^-4 relative (3 mantissa bits): RMS 2^-4/sqrt(3)
    return w + w * (torch.rand_like(w, dtype=torch.float32) * 2 - 1).to(w.dtype) * 2.0 ** -4


def emulating_moe(q_x=False, q_w=False, q_do=False, noise_w=False):
    class EmulatedMoE(ORIG_MOE):
        def forward(self, x):
            from leanmoe.functional import moe, routing_for_call
            w1, w2 = self.gate_up_proj, self.down_proj
            if q_w:
                w1 = _STE.apply(w1, functools.partial(fp8_round_trip, tile_rows=128))
                w2 = _STE.apply(w2, functools.partial(fp8_round_trip, tile_rows=128))
            if noise_w:
                w1, w2 = _STE.apply(w1, e4m3_noise), _STE.apply(w2, e4m3_noise)
            if q_x:
                x = _STE.apply(x, lambda v: fp8_round_trip(v.reshape(-1, v.shape[-1]), 1).view_as(v))
            out = moe(x, self.router.weight, w1, w2, self.K, router=self.router_convention,
                      norm_topk_prob=self.norm_topk_prob, routing=routing_for_call(self.routing, self.inference_routing,
                                                                                 self.training),
                      tile=self.tile, rounding_mode=self.rounding_mode, return_stats=self.return_stats)
            if q_do:
                out = out._replace(output=_GradQuant.apply(out.output))
            return out
    return EmulatedMoE


class Fp32MoE(ORIG_MOE):
    """Built (and initialised) in the model's dtype, then widened to fp32; computes in fp32."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.float()

    def forward(self, x):
        out = super().forward(x.float())
        return out._replace(output=out.output.to(x.dtype))


def variant_setup(name, args):
    """(run, dtype) for a variant; patches train_lm's leanmoe.MoE and train_common's ExpertAdamW."""
    tl.leanmoe.MoE, train_common.ExpertAdamW = ORIG_MOE, ORIG_ADAMW
    dtype, run = torch.bfloat16, tl.RUNS["topk"]
    if name == "fp8":
        run = tl.RUNS["fp8"]
    elif name == "bf16-lmupd":
        train_common.ExpertAdamW = functools.partial(ORIG_ADAMW, update="leanmoe")
    elif name in ("bf16-master", "fp8-master"):
        run = tl.RUNS["fp8" if name == "fp8-master" else "topk"]
        train_common.ExpertAdamW = functools.partial(ORIG_ADAMW, master_weights=True, update="leanmoe")
    elif name == "fp32moe":
        tl.leanmoe.MoE = Fp32MoE
    elif name == "fp32":
        dtype = torch.float32
    elif name in ("q-x", "q-w", "q-do", "q-xwdo", "noise-w"):
        tl.leanmoe.MoE = emulating_moe(q_x=name in ("q-x", "q-xwdo"), q_w=name in ("q-w", "q-xwdo"),
                                       q_do=name in ("q-do", "q-xwdo"), noise_w=name == "noise-w")
    elif name != "bf16":
        raise SystemExit(f"fp8_train_probe: unknown variant {name}")
    args.dtype, args.dtype_name = dtype, str(dtype).split(".")[-1]
    return run


def window_means(losses, edges):
    return [statistics.mean(losses[a:b]) for a, b in zip(edges, edges[1:])]


def summarize(folder):
    """Per variant: the final validation loss minus bf16's of the same seed, each seed, mean and sd;
    and the same at the first validation after step 0."""
    runs = {}
    for f in sorted(os.listdir(folder)):
        if f.startswith("seed") and f.endswith(".json"):
            with open(os.path.join(folder, f)) as fh:
                r = json.load(fh)
            runs[(r["seed"], r["variant"])] = r
    seeds = sorted({s for s, _ in runs})
    order = ["bf16", "fp8", "bf16-lmupd", "bf16-master", "fp8-master", "fp32moe", "fp32", "q-x", "q-w", "q-do",
             "q-xwdo", "noise-w"]
    variants = sorted({v for _, v in runs}, key=order.index)
    print(f"{folder}: final validation loss, and minus bf16's (same seed); 'early': at step "
          f"{next(iter(runs.values()))['val'][1][0]}")
    print("| variant | " + " | ".join(f"seed {s}" for s in seeds) + " | mean Δ final | sd | mean Δ early |")
    print("|---|" + "---:|" * (len(seeds) + 3))
    for v in variants:
        cells, finals, earlies = [], [], []
        for s in seeds:
            r, b = runs.get((s, v)), runs.get((s, "bf16"))
            if r is None or b is None:
                cells.append("" if r is None else f"{r['final_val_loss']:.4f}")
                continue
            df, de = r["final_val_loss"] - b["final_val_loss"], r["val"][1][2] - b["val"][1][2]
            finals.append(df)
            earlies.append(de)
            cells.append(f"{r['final_val_loss']:.4f}" + ("" if v == "bf16" else f" ({df:+.3f})"))
        sd = statistics.stdev(finals) if len(finals) > 1 else float("nan")
        stats = ("", "", "") if v == "bf16" or not finals else (f"{statistics.mean(finals):+.4f}", f"{sd:.4f}",
                                                 f"{statistics.mean(earlies):+.4f}")
        print(f"| {v} | " + " | ".join(cells) + " | " + " | ".join(stats) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="bf16,fp8,bf16-lmupd")
    p.add_argument("--seeds", default="0")
    p.add_argument("--out", required=True)
    p.add_argument("--summarize", action="store_true", help="only the table of --out's runs")
    p.add_argument("rest", nargs="*", help="train_lm flags (after --)")
    a = p.parse_args()
    if a.summarize:
        summarize(a.out)
        return
    args = tl.parse_args(["--dtype", "bfloat16", "--runs", "topk", *a.rest])
    tl.finish_args(args)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    if args.device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # as train_lm: flash attention's deterministic backward
    os.makedirs(a.out, exist_ok=True)
    train_ids, val_ids, tok_json, info = tl.build_corpus(args)
    cfg = tl.ModelConfig(args.layers, args.d, args.heads, args.n, args.experts, args.topk, info["vocab"], args.seq,
                         args.tile)
    S = args.steps
    edges = sorted({0, 10, S // 10, S // 4, S // 2, S})
    print(f"probe: {args.device}, {vars(cfg)}, {S} steps x {args.batch * cfg.seq} tokens, lr {args.lr}, "
          f"corpus {info['digest']}; "
          f"train-loss windows {edges}", flush=True)
    results = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        args.seed = seed
        data = tl.Batches(train_ids, val_ids, cfg.seq, args.batch, seed, args.device, args.val_tokens)
        for name in a.variants.split(","):
            run = variant_setup(name, args)
            t0 = time.perf_counter()
            trainer, rec = tl.train_run(run, args, cfg, data, tok_json, {}, quiet=True)
            trainer.release()
            del trainer
            tl.free_memory(args.device)
            rec = dict(variant=name, seed=seed, val=rec["val"], train_loss=rec["train_loss"],
                       aux_loss=rec["aux_loss"], grad_norm=rec["grad_norm"], final_val_loss=rec["final_val_loss"],
                       wall_s=time.perf_counter() - t0)
            results[(seed, name)] = rec
            with open(os.path.join(a.out, f"seed{seed}_{name}.json"), "w") as f:
                json.dump(rec, f)
            base = results.get((seed, "bf16"))
            vals = " ".join(f"{v[2]:.4f}" for v in rec["val"])
            line = f"seed {seed} {name:10s} final {rec['final_val_loss']:.4f}  val {vals}"
            if base is not None and name != "bf16":
                dv = " ".join(f"{v[2] - b[2]:+.3f}" for v, b in zip(rec["val"], base["val"]))
                dt = " ".join(f"{x - y:+.3f}" for x, y in zip(window_means(rec["train_loss"], edges),
                                                              window_means(base["train_loss"], edges)))
                line += f"\n    d_val vs bf16 {dv}\n    d_train (windows) {dt}"
            print(line + f"  ({rec['wall_s']:.0f} s)", flush=True)
    summarize(a.out)


if __name__ == "__main__":
    main()
