"""One training step of leanmoe.MoE through PyTorch on the GPU (issue 16): forward + backward of the
layer + leanmoe.optim.ExpertAdamW's step, bf16 against FP8 with the weights quantized per call
(fp8_weight_codes=False) and FP8 with the codes kept by the layer and rewritten by the optimizer's
update (the default).

    PYTHONPATH=<leanmoe build> python3 bench/torch_fp8_step.py [--configs olmoe-1b-7b,120B-n2048]
        [--mode standard|in_backward|both] [--warmup-s 3] [--measure-s 2] [--device cuda]

(--configs tiny --device cpu: a smoke run of the script itself, host timers.)

Per configuration (T, d, n, E, K as tools/configs.cpp) and variant: a fresh layer (N(0, 1/fan_in)
weights, bf16), x [T, d] ~ N(0, 1), a fixed output gradient; then steps for --warmup-s seconds (the
H200 boosts for ~2 s at the start of a run), then steps for --measure-s seconds timed with CUDA
events: fwd+bwd (forward and backward), step (ExpertAdamW.step: the whole update in the standard
mode; in the in-backward mode the updates run inside backward and step only ends the step), total.
Medians. The bf16 layer's expert weights are stepped by torch's fused AdamW kernel, the FP8 layers'
by leanmoe's fused update (with codes kept it also writes them), both with bf16 moments, so 'step'
differs between bf16 and FP8 by the kernel and the codes it writes; fwd+bwd compares the layers.
"""
import argparse
import statistics
import time

import torch

import leanmoe
from leanmoe.optim import ExpertAdamW

CONFIGS = {  # name: (T, d, n, E, K), tools/configs.cpp
    "olmoe-1b-7b": (32768, 2048, 1024, 64, 8),
    "qwen3-30b-a3b": (32768, 2048, 768, 128, 8),
    "120B-n2048": (32768, 4096, 2048, 64, 4),
    "tiny": (256, 256, 128, 4, 2),
}
VARIANTS = (("bf16", dict(precision="storage")), ("fp8 per call", dict(precision="fp8", fp8_weight_codes=False)),
            ("fp8 codes", dict(precision="fp8")))


class Marks:
    """Time marks on the device's stream: CUDA events, or the host clock on the CPU."""

    def __init__(self, device, count):
        self.cuda = device == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(count)] if self.cuda else [0.0] * count

    def mark(self, i):
        if self.cuda:
            self.events[i].record()
        else:
            self.events[i] = time.perf_counter()

    def ms(self, i, j):
        if self.cuda:
            return self.events[i].elapsed_time(self.events[j])
        return (self.events[j] - self.events[i]) * 1e3


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(cfg, variant, in_backward, warmup_s, measure_s, device):
    T, d, n, E, K = CONFIGS[cfg]
    torch.manual_seed(0)
    layer = leanmoe.MoE(d, n, E, K, router="topk_then_softmax", device=device, dtype=torch.bfloat16, **variant)
    layer.router.weight.requires_grad_(False)  # the expert layer and its optimizer only
    opt = ExpertAdamW([layer.gate_up_proj, layer.down_proj], lr=1e-5, weight_decay=0.0, in_backward=in_backward)
    x = torch.randn(T, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(T, d, device=device, dtype=torch.bfloat16)
    marks = Marks(device, 3)
    times = []

    def step(record):
        marks.mark(0)
        out = layer(x).output
        torch.autograd.backward([out], [g])
        marks.mark(1)
        opt.step()
        opt.zero_grad(set_to_none=True)
        x.grad = None
        marks.mark(2)
        sync(device)
        if record:
            times.append((marks.ms(0, 1), marks.ms(1, 2)))

    for phase_s, record in ((warmup_s, False), (measure_s, True)):
        sync(device)
        start = time.perf_counter()
        while time.perf_counter() - start < phase_s or (record and len(times) < 5):
            step(record)
    opt.release()
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times), len(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="olmoe-1b-7b,120B-n2048")
    p.add_argument("--mode", choices=["standard", "in_backward", "both"], default="both")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--measure-s", type=float, default=2.0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    modes = ["standard", "in_backward"] if args.mode == "both" else [args.mode]
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (host timers)"
    print(f"device: {name}, torch {torch.__version__}, warm-up {args.warmup_s} s, measured {args.measure_s} s")
    rows = []
    for cfg in args.configs.split(","):
        for mode in modes:
            base = None
            for name, variant in VARIANTS:
                fb, st, iters = run(cfg, variant, mode == "in_backward", args.warmup_s, args.measure_s, args.device)
                if args.device == "cuda":
                    torch.cuda.empty_cache()  # the variant's layer, state and codes are gone
                base = base or (fb, fb + st)
                rows.append(f"| {cfg} | {mode} | {name} | {fb:.2f} | {st:.2f} | {fb + st:.2f} | "
                            f"{base[0] / fb:.3f} | {base[1] / (fb + st):.3f} | {iters} |")
                print(rows[-1], flush=True)
    print("\n| config | mode | variant | fwd+bwd ms | step ms | total ms | fwd+bwd speedup vs bf16 | "
          "total speedup vs bf16 | steps timed |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
