"""Fine-tuning an OLMoE-architecture model (transformers v5) with leanmoe: standard training vs
in-backward expert updates. Random init and random tokens (no download), so it runs anywhere:

    python examples/finetune_olmoe.py                                  # CPU, tiny config
    python examples/finetune_olmoe.py --device cuda --shape olmoe-1b-7b --batch 4 --seq 2048
    python examples/finetune_olmoe.py --device cuda --shape olmoe-1b-7b --batch 4 --seq 2048 --grad-ckpt
    python examples/finetune_olmoe.py --device cuda --shape olmoe-1b-7b --batch 4 --seq 2048 --precision fp8

Prints loss per step, tokens/s (after the first step) and peak memory for each mode.
"""
import argparse
import gc
import time

import torch
import transformers

import leanmoe
import leanmoe.hf
from leanmoe.optim import expert_parameters
from train_common import MoEOptimizers, peak_memory_gib, reset_peak_memory

MODES = ("standard", "in_backward")
SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, num_experts=8, num_experts_per_tok=2),
    # allenai/OLMoE-1B-7B: 16 layers, d=2048, 64 experts of n=1024, top-8, 6.9 B parameters.
    "olmoe-1b-7b": dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8),
}


def build(shape, dtype, device, seed, grad_ckpt=False, precision="storage"):
    cfg = transformers.OlmoeConfig(max_position_embeddings=4096, attn_implementation="sdpa", **SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.OlmoeForCausalLM._from_config(cfg, dtype=dtype)
    leanmoe.hf.apply(model, precision=precision)
    if grad_ckpt:
        # Works with in-backward updates (python/tests/test_hf.py checks bitwise equality with it on).
        leanmoe.hf.enable_activation_checkpointing(model)
    model.train()
    return model


def train(model, mode, args):
    # Dense gradients clipped to norm 1, expert gradients unclipped (train_common.py says why).
    opt = MoEOptimizers(model, args.lr, lambda s: min(1.0, (s + 1) / 4), in_backward=mode == "in_backward",
                        weight_decay=0.1, clip=1.0, fused=args.device == "cuda")
    reset_peak_memory(args.device)
    if args.device == "cuda":
        print(f"  [{mode}] memory at start {torch.cuda.memory_allocated() / 2**30:.2f} GiB (the model)", flush=True)
    vocab = model.config.vocab_size
    tokens, elapsed = 0, 0.0
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 + step)
        ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(args.device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss + args.aux_coef * leanmoe.hf.aux_loss(model)
        loss.backward()
        opt.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        if step > 0:  # the first step pays for allocator warm-up and lazy initialisation
            elapsed += time.perf_counter() - start
            tokens += ids.numel()
        print(f"  [{mode}] step {step:3d}  loss {loss.item():.4f}", flush=True)
    rate = tokens / elapsed if elapsed > 0 else float("nan")
    print(f"  [{mode}] tokens/s {rate:,.0f}   peak memory {peak_memory_gib(args.device):.2f} GiB", flush=True)
    opt.release()
    return loss.item(), rate


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="default: bf16 on cuda and with --precision fp8, else fp32")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--modes", default="standard,in_backward", help="comma-separated, of: " + ", ".join(MODES))
    p.add_argument("--grad-ckpt", action="store_true", help="HF gradient checkpointing (activations recomputed per block)")
    p.add_argument("--precision", default="storage", choices=["storage", "fp8"],
                   help="fp8: the expert GEMMs in blockwise FP8 (needs bfloat16; d, n multiples of 128)")
    args = p.parse_args()
    for k in ("steps", "batch", "seq"):
        if getattr(args, k) <= 0:
            p.error(f"argument --{k}: must be > 0, got {getattr(args, k)}")
    args.modes = args.modes.split(",")
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"argument --modes: comma-separated, of: {', '.join(MODES)}; got '{','.join(args.modes)}'")
    if args.device == "cuda" and not leanmoe.cuda_available():
        p.error("argument --device: cuda: leanmoe was built without its CUDA backend or sees no GPU")
    if args.dtype == "float32" and (args.device == "cuda" or args.precision == "fp8"):
        p.error("argument --dtype: float32 needs --device cpu and --precision storage (bf16 storage otherwise)")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" or args.precision == "fp8" else "float32"))
    print(f"leanmoe {leanmoe.__version__}, torch {torch.__version__}, device {args.device}, shape {args.shape}, "
          f"dtype {dtype}, precision {args.precision}, batch {args.batch} x {args.seq}", flush=True)
    results = {}
    for mode in args.modes:
        model = build(args.shape, dtype, args.device, seed=0, grad_ckpt=args.grad_ckpt, precision=args.precision)
        n_exp = sum(p.numel() for p in expert_parameters(model))
        n_all = sum(p.numel() for p in model.parameters())
        print(f"{mode}: {n_all / 1e6:.1f} M parameters, {n_exp / 1e6:.1f} M in experts", flush=True)
        results[mode] = train(model, mode, args)
        # The optimizers and LR schedulers reference each other: collect them now, so the next
        # mode's peak memory does not include this mode's leftovers.
        del model
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if len(results) == len(MODES):
        (ls, rs), (li, ri) = results["standard"], results["in_backward"]
        print(f"final loss standard {ls:.4f} vs in-backward {li:.4f}; speed ratio {ri / rs:.2f}x", flush=True)


if __name__ == "__main__":
    main()
