"""Does a precision path bias the layer's gradients (issue 16: train_lm's fp8 run trains lower than
bf16 on the H200)? One leanmoe.MoE layer, bf16 weights and input; its output and gradients in
bf16 ("storage") and in FP8 on --device, against the same values widened to fp32 on the CPU (the
fp32 reference). Per tensor: the relative error |g - ref| / |ref|, the norm ratio |g| / |ref| and
the projection <g, ref> / |ref|^2 (1 for an unbiased path; rounding noise leaves it at 1, a
systematic scale error does not). A path whose noise is larger is expected (FP8); a projection off 1
beyond the noise, or bf16 further from the reference than FP8, is a defect.

    python dev/fp8_grad_bias.py --device cuda --T 32768 --d 768 --n 256 --E 64 --K 8   # train_lm's h200 layer
    OMP_NUM_THREADS=1 python dev/fp8_grad_bias.py --device cpu --T 512 --d 128 --n 128 --E 8 --K 2
"""
import argparse

import torch

import leanmoe


def layer_grads(layer, x, d_out, coefs):
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out.output.float() * d_out.float()).sum().add(coefs[0] * out.aux_loss + coefs[1] * out.z_loss).backward()
    grads = {"out": out.output.detach(), "dx": x.grad, "d_router": layer.router.weight.grad,
             "d_gate_up": layer.gate_up_proj.grad, "d_down": layer.down_proj.grad}
    return {k: v.detach().float().cpu() for k, v in grads.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    for k, v in (("T", 32768), ("d", 768), ("n", 256), ("E", 64), ("K", 8), ("seed", 0)):
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--trials", type=int, default=3, help="fresh random inputs per trial")
    a = p.parse_args()
    coefs = (0.01, 0.001)
    print(f"layer T {a.T} d {a.d} n {a.n} E {a.E} K {a.K}, softmax_then_topk, norm_topk_prob, on {a.device}; "
          f"rel err | norm ratio | projection on the fp32 reference", flush=True)
    for trial in range(a.trials):
        torch.manual_seed(a.seed + trial)
        ref_layer = leanmoe.MoE(a.d, a.n, a.E, a.K, norm_topk_prob=True, dtype=torch.bfloat16)
        x = torch.randn(a.T, a.d).to(torch.bfloat16)
        d_out = (torch.randn(a.T, a.d) / a.T ** 0.5).to(torch.bfloat16)
        state = {k: v.clone() for k, v in ref_layer.state_dict().items()}
        ref = leanmoe.MoE(a.d, a.n, a.E, a.K, norm_topk_prob=True, dtype=torch.float32)
        ref.load_state_dict({k: v.float() for k, v in state.items()})
        want = layer_grads(ref, x.float(), d_out.float(), coefs)
        got = {}
        for precision in ("storage", "fp8"):
            layer = leanmoe.MoE(a.d, a.n, a.E, a.K, norm_topk_prob=True, precision=precision, device=a.device,
                                dtype=torch.bfloat16)
            layer.load_state_dict(state)
            got[precision] = layer_grads(layer, x.to(a.device), d_out.to(a.device), coefs)
        for k, r in want.items():
            cells = []
            for precision in ("storage", "fp8"):
                g = got[precision][k]
                rel = ((g - r).norm() / r.norm()).item()
                name = "bf16" if precision == "storage" else "fp8"
                cells.append(f"{name} {rel:.4f} | {(g.norm() / r.norm()).item():.4f} | "
                             f"{((g * r).sum() / (r * r).sum()).item():.4f}")
            print(f"trial {trial} {k:10s} " + "    ".join(cells), flush=True)


if __name__ == "__main__":
    main()
