"""CPU memory timeline of one bench/hf_step_bench.py training step, at reduced widths.

Why: on the H200 (bench/results/archive/2026-12-03-h200-s6) mode (i) (in-backward ExpertAdamW) had the same
peak as (l) (standard AdamW). This tool shows where a step's peak lies and whether any expert-sized
gradient outlives its update, from the CPU allocator's events under torch.profiler(profile_memory=True)
(every allocation, including those inside leanmoe's C++ ops: their workspaces come from torch's
allocator).

--scale s divides every width of the published config (hidden, intermediate, vocab, heads, LoRA
ranks; head_dim and the expert count E and K kept) by s; with the tokens per step also divided by s
(e.g. 4 x 2048 -> 4 x 256 for s = 8), every memory term of the step -- T x vocab logits, E x n x d
expert weights and gradients, T x d and T x K x n activations, vocab x d embeddings -- shrinks by
s^2, so the timeline times s^2 models the full-size step (up to attention's per-head terms).

    python3 dev/hf_step_memory.py --model qwen3_30b --modes l,i --layers 4 --batch 4 --seq 256 --scale 8

Prints per mode: the allocated bytes (above the weights and optimizer state resident before the step)
at the end of each phase and each phase's peak, the operator at the step's peak, the live expert
gradient bytes there, and every expert-sized allocation's lifetime (allocating and freeing operator).
"""
import argparse
import json
import os
import sys
import tempfile
import types

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import hf_step_bench as bench  # noqa: E402
from leanmoe.optim import ExpertAdamW, expert_parameters  # noqa: E402

WIDTHS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "vocab_size", "num_attention_heads",
          "num_key_value_heads", "kv_lora_rank", "q_lora_rank")
GIB = 2**30


def scaled_shape(model_key, scale):
    shape = dict(bench.MODELS[model_key]["full"])
    for key in WIDTHS:
        if shape.get(key):
            shape[key] = max(1, shape[key] // scale)
    return shape


def trace_of(fn):
    with tempfile.TemporaryDirectory() as d:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]


def timeline(events):
    """(memory events [(ts, bytes, addr, total)], cpu ops [(ts, end, name)], marks {name: ts})."""
    mem = sorted((e["ts"], e["args"]["Bytes"], e["args"]["Addr"], e["args"]["Total Allocated"])
                 for e in events if e.get("name") == "[memory]")
    ops = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "cpu_op" and "dur" in e]
    marks = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("mark:"):
            marks.setdefault(e["name"][5:], e["ts"])
    return mem, ops, marks


FACTORIES = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::zeros_like",
             "aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::resize_")


def op_at(ops, ts):
    """The innermost operator running at ts, above the allocating factory (aten::empty, ...)."""
    inside = sorted((o for o in ops if o[0] <= ts <= o[1]), key=lambda o: o[1] - o[0])
    names = [o[2] for o in inside if o[2] not in FACTORIES] or [o[2] for o in inside]
    return names[0] if names else "(outside any operator: Python, e.g. zero_grad)"


def analyse(mode, model, step, ids):
    marks_seen = []
    experts = [p for p in expert_parameters(model) if p.dim() == 3]

    def mark(phase):  # the phase, and how many expert weights hold a .grad at its end
        marks_seen.append((phase, sum(p.grad is not None for p in experts)))
        with record_function("mark:" + phase):
            pass

    events = trace_of(lambda: step(ids, mark))
    mem, ops, marks = timeline(events)
    base = 0  # the profiler counts from its start: totals are bytes above what was resident before
    order = [p for p in bench.PHASES if p in marks]
    bounds, start = {}, mem[0][0] if mem else 0
    for p in order:
        bounds[p] = (start, marks[p])
        start = marks[p]
    rows = []
    for p in order:
        lo, hi = bounds[p]
        window = [m for m in mem if lo <= m[0] <= hi]
        before = [m for m in mem if m[0] <= hi]
        rows.append((p, max((m[3] for m in window), default=0) - base, (before[-1][3] if before else 0) - base))
    peak_ev = max(mem, key=lambda m: m[3])
    peak_phase = next((p for p in order if bounds[p][0] <= peak_ev[0] <= bounds[p][1]), "?")

    # Expert-sized allocations: the bytes of one layer's gate_up_proj (or up_proj) or down_proj.
    sizes = {p.numel() * p.element_size() for p in experts}
    live = {}
    lifetimes = []
    for ts, nbytes, addr, _ in mem:
        if nbytes > 0 and nbytes in sizes:
            live[addr] = (ts, nbytes)
        elif nbytes < 0 and addr in live:
            t0, n = live.pop(addr)
            lifetimes.append((n, op_at(ops, t0), op_at(ops, ts), t0, ts))
    for addr, (t0, n) in live.items():
        lifetimes.append((n, op_at(ops, t0), "(alive at the step's end)", t0, None))
    # Gradients only: a forward-saved activation can have an expert weight's byte size (OLMoE at
    # widths / 8: T*K x n bf16 = E x d x n bf16 = 4 MiB); the allocating operator tells them apart.
    at_peak = sum(n for n, op0, _, t0, t1 in lifetimes
                  if "forward" not in op0 and t0 <= peak_ev[0] and (t1 is None or t1 > peak_ev[0]))
    return dict(mode=mode, rows=rows, peak=peak_ev[3] - base, peak_phase=peak_phase, peak_op=op_at(ops, peak_ev[0]),
                expert_bytes_at_peak=at_peak, lifetimes=lifetimes, marks=marks_seen,
                expert_grad_bytes=sum(p.numel() * p.element_size() for p in experts))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3_30b", choices=list(bench.MODELS))
    p.add_argument("--modes", default="l,i")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--scale", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = p.parse_args()
    bench.MODELS[a.model]["full"] = scaled_shape(a.model, a.scale)
    args = types.SimpleNamespace(device="cpu", tiny=False, layers=a.layers, seq=a.seq, batch=a.batch, aux_coef=0.0,
                                 grad_ckpt=False)
    dtype = getattr(torch, a.dtype)
    s2 = a.scale**2
    print(f"{a.model} at widths / {a.scale}: {bench.MODELS[a.model]['full']}; {a.layers} layers, "
          f"{a.batch} x {a.seq} tokens; x{s2} models the full size\n")
    for mode in a.modes.split(","):
        model, _ = bench.build(a.model, mode, args, dtype)
        optimizers, clipped = bench.make_optimizers(model, mode, args)
        gen = torch.Generator().manual_seed(1234)
        ids = [torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=gen) for _ in range(2)]

        def step(x, mark=None):
            return bench.train_step(model, mode, args, optimizers, clipped, x, mark)

        step(ids[0])  # warm-up: the optimizer state exists after it
        resident = sum(t.numel() * t.element_size() for t in model.parameters())
        resident += sum(v.numel() * v.element_size() for opt in optimizers for st in opt.state.values()
                        for v in st.values() if isinstance(v, torch.Tensor))
        r = analyse(mode, model, step, ids[1])
        print(f"[{mode}] {bench.MODES[mode]}")
        print(f"  resident (weights + optimizer state) {resident / GIB:.4f} GiB (x{s2}: {resident * s2 / GIB:.2f})")
        print(f"  {'phase':<16} {'peak above resident':>22} {'at its end':>14}   (x{s2}: peak, end) GiB")
        for phase, peak, end in r["rows"]:
            print(f"  {phase:<16} {peak / GIB:>18.4f} GiB {end / GIB:>10.4f} GiB   "
                  f"({peak * s2 / GIB:6.2f}, {end * s2 / GIB:6.2f})")
        print(f"  step peak {r['peak'] / GIB:.4f} GiB above resident (x{s2}: resident + peak = "
              f"{(resident + r['peak']) * s2 / GIB:.2f} GiB) in phase {r['peak_phase']}, operator {r['peak_op']}; "
              f"expert-gradient-sized tensors made in backward alive there: {r['expert_bytes_at_peak']} bytes")
        print(f"  expert weight gradients of the model: {r['expert_grad_bytes'] / GIB:.4f} GiB "
              f"(x{s2}: {r['expert_grad_bytes'] * s2 / GIB:.2f})")
        print(f"  expert-sized allocations ({len(r['lifetimes'])}): bytes, allocated in -> freed in")
        for n, op0, op1, t0, t1 in sorted(r["lifetimes"], key=lambda x: x[3]):
            print(f"    {n:>10}  {op0} -> {op1}")
        print(f"  (phase, expert weights holding a .grad at its end): {r['marks']}\n", flush=True)
        for opt in optimizers:
            if isinstance(opt, ExpertAdamW):
                opt.release()
        del model, optimizers, clipped


if __name__ == "__main__":
    main()
