"""One training step of HF transformers v5 MoE models: transformers' experts vs leanmoe.

Modes (same model shape, random init, bf16 parameters, random tokens, no downloads):
  a  transformers' experts (grouped_mm when the installed version offers it) + fused torch AdamW
     over every parameter + clip_grad_norm_(all parameters, 1.0)
  b  leanmoe.hf.apply under the MoE blocks + the same optimizer and clipping (expert grads in .grad)
  c  leanmoe.hf.apply + in-backward expert updates (leanmoe.optim.ExpertAdamW) + fused torch AdamW over
     the dense parameters, clip_grad_norm_(dense parameters, 1.0) (expert grads never land in .grad)
The experts implementation (routing by the model's own router; every model with decorated experts):
  g  experts_implementation="grouped_mm" + fused AdamW over every parameter + global clip
  l  experts_implementation="leanmoe" + the same optimizer and clipping
  i  experts_implementation="leanmoe" + in-backward ExpertAdamW + fused AdamW over the dense
     parameters + dense clip
  f  (i) with experts_implementation="leanmoe_fp8": the expert GEMMs in blockwise FP8, the weights'
     codes kept by each experts module and rewritten by ExpertAdamW (d and n multiples of 128:
     olmoe, qwen3_30b, moonlight; gpt-oss-20b's d = 2880 is refused)
Bars (issue 13): (l) faster than (g) on every model; (i) holds the expert gradients nowhere: the
bytes allocated at the end of backward are lower in (i) than in (l) by the expert weight gradients
(>= 0.9x; all of them: (l) holds them all there, (i) none). The step's peak is reported per phase
(forward, head_backward = loss + LM head backward, layers_backward, optimizer = clip + step +
zero_grad): at 4 layers x 4 x 2048 tokens it lies in head_backward in both modes (the fp32
[T, vocab] log-softmax kept for backward, its gradient and its input's gradient: 3 x 4.6 GiB for
Qwen3's vocab 151936; docs/optim.md), where no expert gradient exists yet, so (i) cannot lower it
there; it drops by the expert gradients only where expert gradients dominate (more layers, fewer
tokens: e.g. --layers 16 --batch 1). For issue 13's table:

    python3 bench/hf_step_bench.py --models qwen3_30b,gpt_oss_20b,moonlight,olmoe --modes g,l,i \
        --layers 4 --batch 4 --seq 2048 --out results/

Step = forward + loss (+ aux_coef * load-balancing loss; default 0, see --aux-coef) + backward + clip + optimizer step(s) + zero_grad.
Per model and mode: a fresh model, 1 warm-up step (allocates the optimizer state), then --steps
timed steps; time = median of synchronize-bracketed wall times; peak = max_memory_allocated over
the timed steps, and per phase of PHASES (train_step marks each phase's end; PhaseMemory reads
max_memory_allocated and resets it there); after backward = memory_allocated at the end of
backward (largest over the timed steps). Bar (the issue): (c) peak <= 0.81 x (a) peak, and (c)
step time < (a).

    python3 bench/hf_step_bench.py --device cpu --tiny                       # smoke test
    python3 bench/hf_step_bench.py --out results/                            # H200, both models
"""
import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import transformers

import leanmoe
import leanmoe.hf
from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters

# Shapes of the published configs (random init here). OLMoE-1B-7B: allenai/OLMoE-1B-7B-0924;
# Granite: ibm-granite/granite-3.1-3b-a800m-base (muP-style multipliers and tied embeddings included,
# they change the arithmetic a little, not the shapes).
MODELS = {
    "olmoe": dict(
        cls="OlmoeForCausalLM", cfg="OlmoeConfig", name="OLMoE-1B-7B",
        full=dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                  tie_word_embeddings=False),
        tiny=dict(vocab_size=512, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
                  tie_word_embeddings=False)),
    "granite": dict(
        cls="GraniteMoeForCausalLM", cfg="GraniteMoeConfig", name="Granite-3.1-3B-A800M",
        full=dict(vocab_size=49155, hidden_size=1536, intermediate_size=512, num_hidden_layers=32,
                  num_attention_heads=24, num_key_value_heads=8, num_local_experts=40, num_experts_per_tok=8,
                  tie_word_embeddings=True, embedding_multiplier=12.0, logits_scaling=6.0,
                  residual_multiplier=0.22, attention_multiplier=0.015625),
        tiny=dict(vocab_size=512, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                  tie_word_embeddings=True, embedding_multiplier=12.0, logits_scaling=6.0,
                  residual_multiplier=0.22, attention_multiplier=0.0625)),
}

# Real widths of published configs (depth set by --layers; random init). Qwen3-30B-A3B:
# Qwen/Qwen3-30B-A3B; gpt-oss-20b: openai/gpt-oss-20b; Moonlight-16B-A3B (the DeepSeek-V3
# architecture: sigmoid router with correction bias, shared experts, MLA): moonshotai/Moonlight-16B-A3B.
MODELS.update({
    "qwen3_30b": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", name="Qwen3-30B-A3B",
        full=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                  num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                  num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False),
        tiny=dict(vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                  num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False)),
    "gpt_oss_20b": dict(
        cls="GptOssForCausalLM", cfg="GptOssConfig", name="gpt-oss-20b", attn="eager",  # sinks: no sdpa
        full=dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                  num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                  num_experts_per_tok=4, sliding_window=128, tie_word_embeddings=False),
        tiny=dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=8,
                  num_experts_per_tok=2, sliding_window=64, tie_word_embeddings=False)),
    "moonlight": dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", name="Moonlight-16B-A3B (DeepSeek-V3 arch.)",
        full=dict(vocab_size=163840, hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
                  num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
                  n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1, first_k_dense_replace=1,
                  q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  routed_scaling_factor=2.446, norm_topk_prob=True, tie_word_embeddings=False),
        tiny=dict(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                  n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
                  q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                  routed_scaling_factor=2.446, norm_topk_prob=True, tie_word_embeddings=False)),
})

MODES = {
    "a": "HF experts + fused AdamW + global clip",
    "b": "leanmoe.hf.apply blocks + fused AdamW + global clip",
    "c": "leanmoe.hf.apply + in-backward expert AdamW + dense clip",
    "g": "experts_implementation=grouped_mm + fused AdamW + global clip",
    "l": "experts_implementation=leanmoe + fused AdamW + global clip",
    "i": "experts_implementation=leanmoe + in-backward expert AdamW + dense clip",
    "f": "experts_implementation=leanmoe_fp8 (codes kept) + in-backward expert AdamW + dense clip",
}
EXPERTS_IMPLEMENTATION = {"g": "grouped_mm", "l": "leanmoe", "i": "leanmoe", "f": "leanmoe_fp8"}
IN_BACKWARD_MODES = ("c", "i", "f")
SAVING_BAR = 0.9  # (l) - (i) allocated after backward >= 0.9 x the expert weight gradients

MEMORY_BAR = 0.81  # (c) peak must be at least 19% below (a)


def build(model_key, mode, args, dtype):
    """A fresh model directly on the device (no CPU init). Returns (model, experts implementation)."""
    spec = MODELS[model_key]
    shape = dict(spec["tiny" if args.tiny else "full"])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
        if spec["cfg"] == "GptOssConfig":  # its attention alternates sliding and full layers
            shape["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(args.layers)]
    cfg = getattr(transformers, spec["cfg"])(
        max_position_embeddings=max(4096, args.seq), attn_implementation=spec.get("attn", "sdpa"),
        # (a), (g), (l), (i): transformers computes and adds its load-balancing loss itself (the
        # experts implementation keeps the model's router); (b)/(c): leanmoe computes it in its
        # forward and we add it.
        output_router_logits=(mode not in ("b", "c") and args.aux_coef > 0), router_aux_loss_coef=args.aux_coef,
        **shape)
    cls = getattr(transformers, spec["cls"])
    torch.manual_seed(0)
    with torch.device(args.device):
        try:
            model = cls._from_config(cfg, dtype=dtype, experts_implementation=EXPERTS_IMPLEMENTATION.get(mode, "grouped_mm"))
        except (TypeError, ValueError, ImportError) as e:  # older transformers, or no grouped_mm here
            print(f"  [{mode}] experts_implementation='grouped_mm' refused ({type(e).__name__}: {e}); "
                  "using the default", flush=True)
            model = cls._from_config(cfg, dtype=dtype)
    impl = getattr(model.config, "_experts_implementation", None) or "default (no experts_implementation seam)"
    if mode in EXPERTS_IMPLEMENTATION and impl != EXPERTS_IMPLEMENTATION[mode]:
        raise RuntimeError(f"experts_implementation={EXPERTS_IMPLEMENTATION[mode]!r} did not take (got {impl!r})")
    if mode in ("b", "c"):
        blocks = leanmoe.hf.apply(model)
        impl = f"leanmoe ({blocks} blocks)"
    if args.grad_ckpt:  # same for every mode: the dense blocks recompute their activations in backward
        leanmoe.hf.enable_activation_checkpointing(model)
    model.train()
    return model, impl


def make_optimizers(model, mode, args):
    """Returns (optimizers, parameters to clip)."""
    hyper = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if mode not in IN_BACKWARD_MODES:
        params = list(model.parameters())
        return [torch.optim.AdamW(params, fused=True, **hyper)], params
    dense = dense_parameters(model)
    experts = ExpertAdamW(expert_parameters(model), in_backward=True, **hyper)
    return [experts, torch.optim.AdamW(dense, fused=True, **hyper)], dense


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


# The step's phases, in order; train_step calls mark(phase) at the end of each.
PHASES = (
    "forward",          # forward + loss: the [T, vocab] logits, their fp32 copy and log-softmax
    "head_backward",    # backward of the loss and the LM head, until the gradient reaches the final
                        # hidden states: the [T, vocab] gradients, and no expert gradient yet
    "layers_backward",  # the rest of backward (the decoder layers): where expert gradients exist
    "optimizer",        # clip + optimizer step(s) + zero_grad
)


def train_step(model, mode, args, optimizers, clipped, ids, mark=None):
    """One training step of `mode`; returns the loss. mark(phase) runs at the end of each of PHASES
    (the end of head_backward: a hook on the LM head's input, when its gradient is complete)."""
    def head_pre_hook(module, inputs):
        if torch.is_grad_enabled() and inputs[0].requires_grad:
            inputs[0].register_hook(lambda grad: mark("head_backward"))

    handle = model.get_output_embeddings().register_forward_pre_hook(head_pre_hook) if mark else None
    try:
        loss = model(input_ids=ids, labels=ids).loss
        if mode in ("b", "c") and args.aux_coef > 0:
            loss = loss + args.aux_coef * leanmoe.hf.aux_loss(model)
    finally:
        if handle is not None:
            handle.remove()
    if mark:
        mark("forward")
    loss.backward()
    if mark:
        mark("layers_backward")
    torch.nn.utils.clip_grad_norm_(clipped, 1.0)
    for opt in optimizers:
        opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    if mark:
        mark("optimizer")
    return loss.detach()


class PhaseMemory:
    """train_step's mark on CUDA: per phase of PHASES, the peak of allocated bytes within it
    (max_memory_allocated since the previous mark, then reset) and the bytes allocated at its end;
    over several steps the largest of each, in GiB. The readers are arguments for a test."""

    def __init__(self, allocated=torch.cuda.memory_allocated, peak=torch.cuda.max_memory_allocated,
                 reset=torch.cuda.reset_peak_memory_stats):
        self._allocated, self._peak, self._reset = allocated, peak, reset
        self.peak, self.end = {}, {}

    def __call__(self, phase):
        self.peak[phase] = max(self.peak.get(phase, 0.0), self._peak() / 2**30)
        self.end[phase] = max(self.end.get(phase, 0.0), self._allocated() / 2**30)
        self._reset()

    def step_peak(self):
        return max(self.peak.values())

    def peak_phase(self):
        return max(self.peak, key=self.peak.get)


def run_mode(model_key, mode, args, dtype):
    cuda = args.device == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, impl = build(model_key, mode, args, dtype)
    n_all = sum(p.numel() for p in model.parameters())
    n_exp = sum(p.numel() for p in expert_parameters(model))
    print(f"  [{mode}] {MODES[mode]}; experts: {impl}; {n_all / 1e9:.3f} B params ({n_exp / 1e9:.3f} B in experts)",
          flush=True)
    optimizers, clipped = make_optimizers(model, mode, args)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1234)
    batches = [torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(args.device)
               for _ in range(args.warmup + args.steps)]

    def step(ids, mark=None):
        return train_step(model, mode, args, optimizers, clipped, ids, mark)

    memory = PhaseMemory() if cuda else None

    times, losses = [], []
    resident = None
    mallocs = None  # cudaMalloc / cudaFree calls of the caching allocator during the timed steps
    for i, ids in enumerate(batches):
        if i == args.warmup:  # optimizer state exists now; the peak of the timed steps starts here
            sync(args.device)
            if cuda:
                resident = torch.cuda.memory_allocated() / 2**30
                torch.cuda.reset_peak_memory_stats()
                stats = torch.cuda.memory_stats()
                mallocs = (stats.get("num_device_alloc", 0), stats.get("num_device_free", 0))
        sync(args.device)
        start = time.perf_counter()
        loss = step(ids, memory if i >= args.warmup else None)
        sync(args.device)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
        losses.append(float(loss))
    peak = memory.step_peak() if cuda else None  # the phases partition the timed steps
    if cuda:
        stats = torch.cuda.memory_stats()
        mallocs = dict(cuda_malloc=stats.get("num_device_alloc", 0) - mallocs[0],
                       cuda_free=stats.get("num_device_free", 0) - mallocs[1])
    profile = profile_step(model_key, mode, args, step, batches[-1]) if args.profile else None
    # Bytes of the expert weight gradients (the 3-D tensors; in-backward steps the small biases in
    # step()): all of them are alive at the end of a standard backward and none in-backward; at
    # most one layer's buffer (dW1's size, which dW2 shares) exists at any moment in-backward.
    weights = [p.numel() for p in expert_parameters(model) if p.dim() == 3]
    per_layer = [p.numel() for n, p in model.named_parameters() if n.endswith(("gate_up_proj", "up_proj"))
                 and p.dim() == 3]
    expert_grad = sum(weights) * dtype.itemsize / 2**30
    saved_grad = (sum(weights) - max(per_layer, default=0)) * dtype.itemsize / 2**30
    result = dict(mode=mode, description=MODES[mode], experts=impl, params=n_all, expert_params=n_exp,
                  expert_grad_gib=expert_grad, expert_grad_gib_not_held=saved_grad,
                  phase_peak_gib=memory.peak if cuda else None, phase_end_gib=memory.end if cuda else None,
                  peak_phase=memory.peak_phase() if cuda else None,
                  after_backward_gib=memory.end.get("layers_backward") if cuda else None,
                  step_s=statistics.median(times), step_times_s=times, peak_gib=peak, resident_gib=resident,
                  losses=losses, tokens_per_s=args.batch * args.seq / statistics.median(times),
                  allocator_calls=mallocs, profile=profile)
    mem = (f"peak {peak:.2f} GiB in {result['peak_phase']} (resident {resident:.2f} GiB; phase peaks "
           + ", ".join(f"{k} {v:.2f}" for k, v in memory.peak.items())
           + f"; allocated after backward {result['after_backward_gib']:.2f})" if cuda else "peak n/a on cpu")
    print(f"  [{mode}] step {result['step_s'] * 1e3:.1f} ms (median of {len(times)}: "
          f"{' '.join(f'{t * 1e3:.1f}' for t in times)}), {mem}, allocator {mallocs}, "
          f"losses {' '.join(f'{l:.4f}' for l in losses)}", flush=True)
    for opt in optimizers:
        if isinstance(opt, ExpertAdamW):
            opt.release()
    del model, optimizers, clipped, batches, step
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def profile_step(model_key, mode, args, step, ids):
    """One extra step (not timed) under torch.profiler: where the time goes, per operator, and how
    busy the GPU was (busy < wall: the host does not keep it fed). Writes two tables to
    --profile/<model>_<mode>.txt; returns the summary."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    sync(args.device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step(ids)
        sync(args.device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) if args.device == "cuda" else 0.0
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"))
    syncs = {k: sum(e.count for e in events if e.key == k)
             for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMalloc", "cudaFree", "aten::item",
                       "aten::_local_scalar_dense")}
    os.makedirs(args.profile, exist_ok=True)
    path = os.path.join(args.profile, f"{model_key}_{mode}.txt")
    with open(path, "w") as f:
        f.write(f"{MODELS[model_key]['name']} mode {mode}: wall {wall * 1e3:.1f} ms (profiled), GPU busy "
                f"{gpu_us / 1e3:.1f} ms, kernel launches {launches}, {syncs}\n\n")
        if args.device == "cuda":
            f.write(events.table(sort_by="self_device_time_total", row_limit=40) + "\n\n")
        f.write(events.table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
    print(f"  [{mode}] profile: wall {wall * 1e3:.1f} ms, GPU busy {gpu_us / 1e3:.1f} ms, {launches} launches, "
          f"{syncs} -> {path}", flush=True)
    return dict(wall_ms=wall * 1e3, gpu_busy_ms=gpu_us / 1e3, launches=launches, **syncs)


def verdict_experts(res):
    """Issue 13's bars for the experts implementation, or None without (l); the time bar needs (g),
    the memory bar (i)."""
    g, l, i = res.get("g"), res.get("l"), res.get("i")
    if not l or "error" in l:
        return None
    has_g = bool(g) and "error" not in g
    out = dict(time_ratio=l["step_s"] / g["step_s"] if has_g else None,
               time_pass=l["step_s"] < g["step_s"] if has_g else None)
    if i and "error" not in i and l["peak_gib"] is not None:
        end_saving = l["after_backward_gib"] - i["after_backward_gib"]
        out.update(saving_gib=l["peak_gib"] - i["peak_gib"], peak_phase=l["peak_phase"],
                   layers_saving_gib=l["phase_peak_gib"]["layers_backward"] - i["phase_peak_gib"]["layers_backward"],
                   end_saving_gib=end_saving, expected_gib=i["expert_grad_gib"],
                   saving_pass=end_saving >= SAVING_BAR * i["expert_grad_gib"], inb_time_ratio=i["step_s"] / l["step_s"])
    return out


def verdict(res):
    """(c)/(a) ratios and PASS/FAIL against the bar, or None when a mode is missing."""
    if "a" not in res and "c" not in res:
        return verdict_experts(res)
    a, c = res.get("a"), res.get("c")
    if not a or not c or "error" in a or "error" in c:
        return None
    time_ratio = c["step_s"] / a["step_s"]
    mem_ratio = c["peak_gib"] / a["peak_gib"] if a["peak_gib"] else None
    mem_ok = None if mem_ratio is None else mem_ratio <= MEMORY_BAR  # None: no peak on the CPU
    time_ok = time_ratio < 1.0
    return dict(mem_ratio=mem_ratio, time_ratio=time_ratio, mem_pass=mem_ok, time_pass=time_ok,
                passed=bool(mem_ok) and time_ok)


def merge_rounds(prev, r, args):
    """One mode's result over --repeat rounds: every round's timed steps pooled, the median of all of
    them, the largest peak; each round kept under 'rounds'."""
    if prev is None or "error" in prev or "error" in r:
        return r if prev is None or "error" in r else prev
    rounds = prev.get("rounds", [prev]) + [r]
    times = [t for x in rounds for t in x["step_times_s"]]
    merged = dict(r, step_times_s=times, step_s=statistics.median(times),
                  tokens_per_s=args.batch * args.seq / statistics.median(times), rounds=rounds)
    if r["peak_gib"] is not None:
        merged["peak_gib"] = max(x["peak_gib"] for x in rounds)
        merged["after_backward_gib"] = max(x["after_backward_gib"] for x in rounds)
        for key in ("phase_peak_gib", "phase_end_gib"):
            merged[key] = {k: max(x[key][k] for x in rounds) for k in r[key]}
        merged["peak_phase"] = max(merged["phase_peak_gib"], key=merged["phase_peak_gib"].get)
    return merged


def commit_of(args):
    if args.commit:
        return args.commit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.check_output(["git", "-C", here, "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pass_fail(ok):
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def markdown(meta, results, args):
    lines = [f"# HF training step: transformers experts vs leanmoe ({meta['gpu']})", "",
             f"- command: `{meta['command']}`", f"- commit: {meta['commit']}", f"- GPU: {meta['gpu']}",
             f"- date: {meta['date']}",
             f"- torch {meta['torch']}, transformers {meta['transformers']}, leanmoe {meta['leanmoe']}",
             f"- batch {args.batch} x {args.seq}, {meta['dtype']} parameters, random init and tokens, "
             f"{args.warmup} warm-up + {args.steps} timed steps (median"
             f"{f' over {args.repeat} interleaved rounds' if args.repeat > 1 else ''}), aux-loss coef {args.aux_coef}"
             f"{', gradient checkpointing (non-reentrant) in every mode' if args.grad_ckpt else ''}",
             "- step = forward + loss + backward + clip_grad_norm_(1.0) + optimizer step(s) + zero_grad; "
             "peak = torch.cuda.max_memory_allocated over the timed steps (and per phase: forward, head_backward "
             "= loss + LM head backward, layers_backward = the rest of backward, optimizer = clip + step + "
             "zero_grad); after backward = allocated at the end of backward; resident = allocated after warm-up "
             "(weights + optimizer state)",
             "- modes: " + "; ".join(f"({k}) {v}" for k, v in MODES.items()), ""]
    lines += ["| model | mode | experts | step ms | tokens/s | peak GiB | peak in | after backward GiB | resident GiB "
              "| last loss |",
              "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for model_key, res in results.items():
        for mode, r in res.items():
            if mode == "verdict":
                continue
            name = MODELS[model_key]["name"]
            if "error" in r:
                lines.append(f"| {name} | {mode} | | {r['error']} | | | | | | |")
                continue
            lines.append(f"| {name} | {mode} | {r['experts']} | {r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | "
                         f"{fmt(r['peak_gib'], '.2f')} | {r.get('peak_phase') or 'n/a'} | "
                         f"{fmt(r.get('after_backward_gib'), '.2f')} | {fmt(r['resident_gib'], '.2f')} | "
                         f"{r['losses'][-1]:.4f} |")
    apply_rows = [k for k, res in results.items() if "a" in res or "c" in res]
    expert_rows = [k for k, res in results.items() if k not in apply_rows]
    if apply_rows:
        lines += ["", f"Bar: (c) peak <= {MEMORY_BAR:.2f} x (a) peak and (c) step time < (a).", "",
                  "| model | peak (c)/(a) | time (c)/(a) | time (b)/(a) | memory | time | result |",
                  "|---|---:|---:|---:|---|---|---|"]
    for model_key in apply_rows:
        res = results[model_key]
        v = res.get("verdict")
        name = MODELS[model_key]["name"]
        if v is None:
            lines.append(f"| {name} | n/a | n/a | n/a | | | INCOMPLETE |")
            continue
        b = res.get("b")
        tb = fmt(b["step_s"] / res["a"]["step_s"] if b and "error" not in b else None, ".3f")
        lines.append(f"| {name} | {fmt(v['mem_ratio'], '.3f')} | {v['time_ratio']:.3f} | {tb} | "
                     f"{pass_fail(v['mem_pass'])} | {pass_fail(v['time_pass'])} | "
                     f"{pass_fail(v['passed'] if v['mem_pass'] is not None else None)} |")
    if expert_rows:
        lines += ["", f"Bars: (l) step time < (g); (l) - (i) allocated at the end of backward >= {SAVING_BAR} x the "
                  "expert weight gradients (standard AdamW holds all of them there, in-backward none). The step's "
                  "peak moves only when it lies where expert gradients exist (layers_backward or optimizer): "
                  "in the forward or the loss/LM-head backward ([T, vocab] fp32 logits and their gradient) none "
                  "exists in either mode.", "",
                  "| model | time (l)/(g) | time (i)/(l) | (l) peak in | peak saving GiB | layers-backward peak saving "
                  "GiB | after-backward saving GiB | expert grads GiB | time | memory |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for model_key in expert_rows:
        v = results[model_key].get("verdict")
        name = MODELS[model_key]["name"]
        if v is None:
            lines.append(f"| {name} | n/a | n/a | | n/a | n/a | n/a | n/a | INCOMPLETE | |")
            continue
        lines.append(f"| {name} | {fmt(v['time_ratio'], '.3f')} | {fmt(v.get('inb_time_ratio'), '.3f')} | "
                     f"{v.get('peak_phase') or 'n/a'} | {fmt(v.get('saving_gib'), '.2f')} | "
                     f"{fmt(v.get('layers_saving_gib'), '.2f')} | {fmt(v.get('end_saving_gib'), '.2f')} | "
                     f"{fmt(v.get('expected_gib'), '.2f')} | {pass_fail(v['time_pass'])} | "
                     f"{pass_fail(v.get('saving_pass'))} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="2-layer small-width shapes (smoke test)")
    p.add_argument("--models", default="olmoe,granite", help="of: " + ",".join(MODELS))
    p.add_argument("--modes", default="a,b,c")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=0, help="number of decoder layers (0: the model's own)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    # Default 0: with transformers 5.17 (the H200's), GraniteMoe under experts_implementation=
    # "grouped_mm" records no router logits, so mode (a)'s forward adds the int 0 as aux loss and
    # crashes (AttributeError: 'int' object has no attribute 'to'); LM loss only keeps a, b, c equal.
    p.add_argument("--aux-coef", type=float, default=0.0)
    p.add_argument("--grad-ckpt", action="store_true",
                   help="HF gradient checkpointing (non-reentrant) in every mode: activations recomputed per block")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--repeat", type=int, default=1,
                   help="run the mode list this many times, interleaved (a b c a b c ...), a fresh model each "
                        "time; a mode's time is the median over all its timed steps (guards against drift)")
    p.add_argument("--profile", default=None,
                   help="directory: one extra, untimed step per mode under torch.profiler (operator tables, "
                        "GPU busy time, launches, synchronisations and cudaMalloc calls)")
    p.add_argument("--out", default=None, help="directory for hf_step.md and hf_step.json")
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (the warm-up step allocates the optimizer state)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device visible (use --device cpu --tiny for a smoke test)")
    dtype = getattr(torch, args.dtype)
    meta = dict(command="python3 " + " ".join(sys.argv), commit=commit_of(args),
                gpu=torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                torch=torch.__version__, transformers=transformers.__version__, leanmoe=leanmoe.__version__,
                dtype=args.dtype, batch=args.batch, seq=args.seq, steps=args.steps, warmup=args.warmup,
                tiny=args.tiny, aux_coef=args.aux_coef, grad_ckpt=args.grad_ckpt, repeat=args.repeat,
                layers=args.layers)
    print(f"{meta['gpu']}; torch {meta['torch']}, transformers {meta['transformers']}, leanmoe {meta['leanmoe']}; "
          f"batch {args.batch} x {args.seq}, {args.dtype}{', tiny shapes' if args.tiny else ''}", flush=True)
    results = {}
    wall = time.perf_counter()
    for model_key in args.models.split(","):
        print(f"{MODELS[model_key]['name']}{' (tiny)' if args.tiny else ''}:", flush=True)
        res = {}
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                try:
                    r = run_mode(model_key, mode, args, dtype)
                except torch.OutOfMemoryError as e:
                    print(f"  [{mode}] out of memory: {str(e).splitlines()[0]}", flush=True)
                    r = dict(mode=mode, error="OOM")
                except (NotImplementedError, ValueError, RuntimeError) as e:  # e.g. a feature not on this backend yet
                    print(f"  [{mode}] not run: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                    r = dict(mode=mode, error=f"{type(e).__name__}: {str(e).splitlines()[0]}"[:300])
                # Outside the except block: its traceback pins the failed mode's frame (model, optimizers).
                gc.collect()
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                res[mode] = merge_rounds(res.get(mode), r, args)
        res["verdict"] = verdict(res)
        results[model_key] = res
    print(f"total {time.perf_counter() - wall:.1f} s\n", flush=True)
    table = markdown(meta, results, args)
    print(table, flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hf_step.md"), "w") as f:
            f.write(table)
        with open(os.path.join(args.out, "hf_step.json"), "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=2)
        print(f"wrote {args.out}/hf_step.md and hf_step.json", flush=True)


if __name__ == "__main__":
    main()
