"""experts_implementation="leanmoe" on tiny random-init transformers models (2 layers, width 64,
8 experts) of every listed MoE family the installed transformers has: logits, loss (with the
model's own load-balancing loss, output_router_logits=True where the family has one) and every
parameter gradient against experts_implementation="eager" on the same weights; three training
steps; in-backward ExpertAdamW bitwise equal to the standard optimizer. A family missing from the
installed transformers is skipped."""
import copy

import pytest
import torch

import leanmoe
import leanmoe.hf
from conftest import skip_unsupported, widths
from hf_common import experts_modules, rel, run
from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.integrations.moe")

COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64)

# family -> (config class, model class, config kwargs). The CUDA expert GEMMs take d and n in
# multiples of 64: on cuda the families with n = 32 run with n = 64 (expert_widths).
FAMILIES = {
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                       norm_topk_prob=True, head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(intermediate_size=32, num_local_experts=8,
                                                            num_experts_per_tok=2)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         dict(intermediate_size=32, shared_intermediate_size=48, num_local_experts=8,
                              num_experts_per_tok=2)),
    # Sigmoid router with a correction bias, group-limited top-K, a shared expert, routed scaling.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=32, n_routed_experts=8,
                         n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0,
                         kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                         routed_scaling_factor=2.5, norm_topk_prob=True)),
    # Biases, transposed and interleaved weights, the clamped SwiGLU (n = 64: runs on cuda too).
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, head_dim=16, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention"])),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(intermediate_size=64, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
                      num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0, head_dim=16,
                      partial_rotary_factor=0.5)),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(intermediate_size=32, num_local_experts=8,
                                                         num_experts_per_tok=2)),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(intermediate_size=64, moe_intermediate_size=32, moe_num_experts=8, moe_k=2,
                          moe_num_shared_experts=1, moe_layer_start_index=0, moe_layer_interval=1, head_dim=16)),
    # Non-gated experts (up_proj [E, n, d]) with ReLU^2; one attention layer, one MoE layer.
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(hybrid_override_pattern="*E", intermediate_size=64, moe_intermediate_size=32,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        moe_shared_expert_intermediate_size=32, n_group=1, topk_group=1, head_dim=16,
                        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1)),
}


def expert_widths(family, width):
    """Config overrides setting every expert width of the family (n, and the dense MLP's where the
    family names both intermediate_size and moe_intermediate_size) to width."""
    return {k: width for k in ("intermediate_size", "moe_intermediate_size") if k in FAMILIES[family][2]}


def build(family, dtype=torch.float32, device="cpu", seed=0, **overrides):
    config_name, model_name, kwargs = FAMILIES[family]
    if not hasattr(transformers, config_name) or not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    try:  # a transformers release may rename a config argument of a family: skip it, saying so
        config = getattr(transformers, config_name)(**{**COMMON, **kwargs, **overrides})
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)._from_config(config, attn_implementation="eager",
                                                               experts_implementation="eager")
    except (TypeError, ValueError) as e:
        pytest.skip(f"transformers {transformers.__version__} builds no tiny {model_name} from these arguments: {e}")
    if hasattr(config, "output_router_logits") and not _returns_router_logits(model):
        # transformers 5.17's GraniteMoe: its load-balancing loss is then the int 0 and its forward with
        # labels fails (`aux_loss.to`) under every experts implementation, eager's included.
        pytest.skip(f"transformers {transformers.__version__}'s {model_name} returns no router logits")
    return model.to(dtype=dtype, device=device)


def _returns_router_logits(model):
    """Whether the model hands back its router logits when asked (what `run` asks for)."""
    training = model.training
    with torch.random.fork_rng(), torch.no_grad():
        model.eval()
        out = model(input_ids=torch.zeros(1, 4, dtype=torch.long), output_router_logits=True)
    model.train(training)
    return bool(getattr(out, "router_logits", None))


def batch(device, seed=0, B=2, S=16):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (B, S), generator=g).to(device)
    return dict(input_ids=ids, labels=ids)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_loss_and_every_gradient_match_eager_fp32(family):
    """fp32: only summation orders differ (norm-wise relative 1e-5 on logits, loss and every gradient)."""
    eager = build(family)
    ours = copy.deepcopy(eager)
    ours.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
    assert ours.config._experts_implementation == "leanmoe"
    b = batch("cpu")
    eager.train(), ours.train()
    out_e, out_o = run(eager, b), run(ours, b)
    assert all(leanmoe.hf.EXPERTS_IMPLEMENTATION == m.config._experts_implementation for m in experts_modules(ours))
    assert all("_leanmoe_experts_spec" in m.__dict__ for m in experts_modules(ours)), "leanmoe did not run"
    assert rel(out_o.logits, out_e.logits) < 1e-5
    assert rel(out_o.loss, out_e.loss) < 1e-5
    if getattr(out_e, "aux_loss", None) is not None:
        assert rel(out_o.aux_loss, out_e.aux_loss) < 1e-5
    grads_e = dict(eager.named_parameters())
    for name, p in ours.named_parameters():
        ge = grads_e[name].grad
        if ge is None:
            assert p.grad is None or p.grad.abs().max() == 0, f"{name}: a gradient eager does not have"
            continue
        assert p.grad is not None, f"{name}: no gradient"
        assert rel(p.grad, ge) < 1e-5, f"{name}: relative error {rel(p.grad, ge):.2e}"


@pytest.mark.parametrize("family", ["olmoe", "mixtral", "deepseek_v3", "gpt_oss", "nemotron_h"])
def test_bf16_as_close_to_fp32_as_eager_bf16(family, device):
    """bf16: both implementations round differently; leanmoe must be as close to the fp32 run as
    transformers' own bf16 run is (loss within max(1e-2 relative, 2x eager's error); logits and
    gradients norm-wise within max(2e-2, 2x eager's error))."""
    skip_unsupported(device, torch.bfloat16)
    fp32 = build(family, device=device, **(expert_widths(family, 64) if device == "cuda" else {}))
    eager = copy.deepcopy(fp32).to(torch.bfloat16)
    ours = copy.deepcopy(eager)
    ours.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
    b = batch(device)
    for m in (fp32, eager, ours):
        m.train()
    out_f, out_e, out_o = run(fp32, b), run(eager, b), run(ours, b)
    assert rel(out_o.loss, out_f.loss) <= max(1e-2, 2 * rel(out_e.loss, out_f.loss))
    assert rel(out_o.logits, out_f.logits) <= max(2e-2, 2 * rel(out_e.logits, out_f.logits))
    ref = dict(fp32.named_parameters())
    theirs = dict(eager.named_parameters())
    for name, p in ours.named_parameters():
        if ref[name].grad is None:
            continue
        bound = max(2e-2, 2 * rel(theirs[name].grad, ref[name].grad))
        assert rel(p.grad, ref[name].grad) <= bound, f"{name}: {rel(p.grad, ref[name].grad):.3e} > {bound:.3e}"


def train(model, experts_opt, steps=3):
    dense = torch.optim.AdamW(dense_parameters(model), lr=1e-3)
    losses = []
    for step in range(steps):
        out = run(model, batch("cpu", seed=step), seed=step)
        losses.append(out.loss.item())
        torch.nn.utils.clip_grad_norm_(dense_parameters(model), 1.0)
        experts_opt.step()
        dense.step()
        experts_opt.zero_grad()
        dense.zero_grad()
    return losses


@pytest.mark.parametrize("family", list(FAMILIES))
def test_three_training_steps_and_in_backward_updates(family):
    """Three steps of leanmoe (standard ExpertAdamW) follow eager's losses (fp32, 1e-4 relative);
    with in-backward ExpertAdamW every parameter is bitwise equal to the standard run after each."""
    base = build(family)
    eager, standard, inb = base, copy.deepcopy(base), copy.deepcopy(base)
    for m in (standard, inb):
        m.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
    for m in (eager, standard, inb):
        m.train()
    assert len(expert_parameters(base)) >= 2  # gate_up (or up) and down of each MoE layer (and biases)
    runs = {}
    for name, model, in_backward in (("eager", eager, False), ("standard", standard, False), ("inb", inb, True)):
        opt = ExpertAdamW(expert_parameters(model), lr=1e-3, weight_decay=0.1, in_backward=in_backward)
        runs[name] = train(model, opt)
        if in_backward:
            opt.release()
    for a, b in zip(runs["standard"], runs["eager"]):
        assert abs(a - b) <= 1e-4 * abs(b), (runs["standard"], runs["eager"])
    assert runs["inb"] == runs["standard"]
    for (na, pa), (_, pb) in zip(standard.named_parameters(), inb.named_parameters()):
        assert torch.equal(pa, pb), f"{na} differs between the standard and the in-backward run"


def allocations_of_backward(model, b):
    """Forward + backward under torch.profiler(profile_memory=True) on the CPU, whose allocator
    reports every allocation (leanmoe's C++ workspaces included: they come from torch's allocator).
    Returns (bytes allocated when backward ends minus when it starts, [(bytes, alloc ts, free ts or
    None)] of the allocations made during backward, backward's end ts)."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function
    with tempfile.TemporaryDirectory() as d:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = model(**b).loss
            with record_function("backward_window"):
                loss.backward()
            del loss
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    window = next(e for e in events if e.get("name") == "backward_window")
    lo, hi = window["ts"], window["ts"] + window["dur"]
    mem = sorted((e["ts"], e["args"]["Bytes"], e["args"]["Addr"], e["args"]["Total Allocated"])
                 for e in events if e.get("name") == "[memory]")
    total_at = lambda t: ([m[3] for m in mem if m[0] <= t] or [0])[-1]  # noqa: E731
    live, allocations = {}, []
    for ts, nbytes, addr, _ in mem:
        if nbytes > 0:
            live[addr] = (nbytes, ts)
        elif addr in live:
            n, t0 = live.pop(addr)
            allocations.append((n, t0, ts))
    allocations += [(n, t0, None) for n, t0 in live.values()]
    return total_at(hi) - total_at(lo), [a for a in allocations if lo <= a[1] <= hi], hi


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "nemotron_h"])
def test_in_backward_holds_no_expert_gradient(family):
    """With in-backward ExpertAdamW on the experts implementation, no expert weight gets a .grad,
    no expert-sized tensor made in backward outlives it, at most one layer's gradient buffer exists
    at a time, and backward ends holding exactly the expert weight gradients' bytes less than the
    standard optimizer does (the same run with in_backward=False: the control that this can fail)."""
    b = batch("cpu")
    held = {}
    for in_backward in (False, True):
        model = build(family)
        model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
        model.train()
        weights = [p for p in expert_parameters(model) if p.dim() == 3]
        opt = ExpertAdamW(expert_parameters(model), lr=1e-3, in_backward=in_backward)
        dense = torch.optim.AdamW(dense_parameters(model), lr=1e-3)
        for _ in range(2):  # two steps: the optimizer state exists before the measured backward
            model(**b).loss.backward()
            opt.step(), dense.step()
            opt.zero_grad(), dense.zero_grad()
        grown, allocations, end = allocations_of_backward(model, b)
        sizes = {p.numel() * p.element_size() for p in weights}
        expert_sized = [a for a in allocations if a[0] in sizes]
        outliving = [a for a in expert_sized if a[2] is None or a[2] > end]
        grads = [p.grad is not None for p in weights]
        if in_backward:
            assert not any(grads), f"{family}: expert weights with a .grad in-backward"
            assert not outliving, f"{family}: expert-sized tensors alive after backward: {outliving}"
            assert expert_sized, f"{family}: no in-backward gradient buffer seen (the profiler missed it)"
            largest = max(sizes)
            for n, t0, t1 in expert_sized:
                together = sum(m for m, s0, s1 in expert_sized if s0 <= t0 < s1)
                assert together <= largest, f"{family}: {together} bytes of expert-sized buffers at once"
            opt.release()
        else:  # the control: the standard path holds every expert gradient after backward
            assert all(grads) and len(outliving) == len(weights), (family, grads, outliving)
        held[in_backward] = grown
    assert held[False] - held[True] == sum(p.numel() * p.element_size() for p in weights), held


def test_register_and_switch_back():
    assert leanmoe.hf.register()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    assert "leanmoe" in ALL_EXPERTS_FUNCTIONS and "leanmoe_fp8" in ALL_EXPERTS_FUNCTIONS
    model = build("mixtral")
    b = batch("cpu")
    with torch.no_grad():
        before = model(**b).logits
        model.set_experts_implementation("leanmoe")
        during = model(**b).logits
        model.set_experts_implementation("eager")
        after = model(**b).logits
    assert rel(during, before) < 1e-5 and torch.equal(after, before)


def test_prepare_then_fullgraph_compile():
    """prepare() recognises every experts module eagerly; the experts then compile with fullgraph."""
    model = build("qwen3_moe")
    model.set_experts_implementation("leanmoe")
    assert leanmoe.hf.prepare(model) == 2
    experts = experts_modules(model)[0]
    g = torch.Generator().manual_seed(0)
    x, idx, w = torch.randn(20, 64, generator=g), torch.randint(0, 8, (20, 2), generator=g), torch.rand(20, 2)
    compiled = torch.compile(lambda *a: experts(*a), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, idx, w), experts(x, idx, w), rtol=1e-6, atol=1e-7)


def test_unsupported_features_name_the_model():
    model = build("olmoe")
    experts = experts_modules(model)[0]
    experts.act_fn = torch.nn.Tanh()  # an activation leanmoe does not have
    model.set_experts_implementation("leanmoe")
    with pytest.raises(NotImplementedError, match=r"OlmoeExperts.*activation.*Tanh"):
        model(**batch("cpu"))
    experts.has_post_expert_norm = True  # the flag without the norm module
    with pytest.raises(NotImplementedError, match=r"OlmoeExperts.*has_post_expert_norm.*no callable post_expert_norm"):
        leanmoe.hf.experts_spec(experts)


def test_an_unset_clamp_limit_is_plain_swiglu():
    """Step3p7's and Ling's experts keep limit=None on layers without a SwiGLU clamp."""
    experts = experts_modules(build("olmoe"))[0]
    experts.limit, experts.alpha = None, None
    assert leanmoe.hf.experts_spec(experts).activation == "swiglu"


def test_specs_of_the_families():
    """What leanmoe recognises for each family's experts (layout flags and activation)."""
    expected = {"gpt_oss": ("swiglu_clamped", True, True, True, True),
                "nemotron_h": ("relu2", False, False, False, False),
                "mixtral": ("swiglu", False, False, True, False)}
    for family, (activation, interleaved, transposed, gated, bias) in expected.items():
        try:
            model = build(family)
        except pytest.skip.Exception:
            continue
        spec = leanmoe.hf.experts_spec(experts_modules(model)[0])
        assert (spec.activation, spec.interleaved, spec.transposed, spec.gated, spec.bias) == \
            (activation, interleaved, transposed, gated, bias), (family, spec)


# ---- experts_implementation="leanmoe_fp8" and apply(precision="fp8") (docs/DESIGN.md "FP8") ----
FP8_FAMILIES = ["olmoe", "deepseek_v3", "gpt_oss", "nemotron_h"]  # plain, sigmoid router, every layout flag, ungated


def build_fp8(family, seed=0, width=128, device="cpu"):
    """The family's tiny model in bfloat16 with d and every expert's n = width (FP8 takes multiples of 128)."""
    return build(family, dtype=torch.bfloat16, seed=seed, device=device, hidden_size=width,
                 **expert_widths(family, width))


def test_fp8_experts_match_the_torch_emulation(device):
    """The experts module under "leanmoe_fp8" is test_fp8's torch emulation of the FP8 layer (x rows
    in 1x128 tiles, weights in 128x128 blocks, e4m3 by torch's float8_e4m3fn) on the model's own
    weights and routing: within 1e-2 (bit for bit in test_fp8's measurement), and as far from the
    bf16 experts as e4m3 predicts (0.01..0.12, not 0: the FP8 path ran)."""
    from test_fp8 import emulated_fp8_forward
    experts = experts_modules(build_fp8("olmoe", device=device))[0]
    g = torch.Generator().manual_seed(1)
    T, E, K = 37, experts.num_experts, 2
    x = torch.randn(T, 128, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = (torch.rand(T, K, generator=g) + 0.1).bfloat16()
    with torch.no_grad():
        args = (x.to(device), ids.to(device), weights.to(device))
        fp8 = leanmoe.hf.experts_forward_fp8(experts, *args).cpu()
        bf16 = leanmoe.hf.experts_forward(experts, *args).cpu()
        want = emulated_fp8_forward(x, ids, weights, experts.gate_up_proj.cpu(), experts.down_proj.cpu())
    assert rel(fp8, want) < 1e-2
    assert 0.01 < rel(fp8, bf16) < 0.12


@pytest.mark.parametrize("family", FP8_FAMILIES)
def test_fp8_model_near_fp32_and_in_backward_bitwise(family, device):
    """A whole model under "leanmoe_fp8" against the same weights in fp32 (eager): logits and every
    gradient within 0.12 / 0.15 norm-wise, or twice the bf16 "leanmoe" run's own error where that is
    larger. e4m3 moves one layer's output by ~6% (test_fp8); these 2-layer models' logits by 0.007
    (olmoe) to 0.04 (gpt_oss), their gradients by up to 0.12; bf16 alone moves deepseek_v3's by 0.17
    / 0.86 (its group-limited routing flips between dtypes at this size). The FP8 path must show
    (logits unlike bf16's). Then three training steps: in-backward ExpertAdamW bitwise equal to the
    standard optimizer's (on the CPU)."""
    base = build_fp8(family, device=device)
    fp32, bf16, fp8 = copy.deepcopy(base).float(), copy.deepcopy(base), copy.deepcopy(base)
    bf16.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
    fp8.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    assert fp8.config._experts_implementation == "leanmoe_fp8"
    b = batch(device)
    outs = {}
    for name, m in (("fp32", fp32), ("bf16", bf16), ("fp8", fp8)):
        m.train()
        outs[name] = run(m, b)
    assert all("_leanmoe_experts_spec" in m.__dict__ for m in experts_modules(fp8)), "leanmoe did not run"
    assert not torch.equal(outs["fp8"].logits, outs["bf16"].logits)
    bound = max(0.12, 2 * rel(outs["bf16"].logits, outs["fp32"].logits))
    assert rel(outs["fp8"].logits, outs["fp32"].logits) <= bound
    ref, theirs = dict(fp32.named_parameters()), dict(bf16.named_parameters())
    for name, p in fp8.named_parameters():
        if ref[name].grad is None:
            continue
        bound = max(0.15, 2 * rel(theirs[name].grad, ref[name].grad))
        assert rel(p.grad, ref[name].grad) <= bound, f"{name}: {rel(p.grad, ref[name].grad):.3e} > {bound:.3e}"
    if device != "cpu":
        return
    models, runs = {}, {}
    for in_backward in (False, True):
        models[in_backward] = m = copy.deepcopy(base)
        m.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
        m.train()
        opt = ExpertAdamW(expert_parameters(m), lr=1e-3, weight_decay=0.1, in_backward=in_backward)
        runs[in_backward] = train(m, opt)
        if in_backward:
            opt.release()
    assert runs[True] == runs[False]
    for (na, pa), (_, pb) in zip(models[False].named_parameters(), models[True].named_parameters()):
        assert torch.equal(pa, pb), f"{na} differs between the standard and the in-backward run"


@pytest.mark.parametrize("in_backward", [False, True])
@pytest.mark.parametrize("family", ["olmoe", "gpt_oss", "nemotron_h"])  # [gate; up]; transposed, interleaved, biases; up_proj
def test_fp8_codes_kept_equal_quantized_per_call(family, in_backward, device, monkeypatch):
    """Each experts module keeps its weights' FP8 codes (leanmoe.MoE's scheme, python/leanmoe/_fp8_codes.py):
    written once at the first call, then only by ExpertAdamW's update; over three training steps the
    model with codes equals the same model quantizing per call (fp8_weight_codes(model, False)) bit for
    bit, and the codes are the quantization of the current weights after every step (on the CPU, which
    quantizes per GEMM whatever it is given, that check is the one that can fail)."""
    from test_fp8 import CountQuantizations, assert_codes_current
    counter = CountQuantizations(leanmoe._fp8_codes.ops)
    monkeypatch.setattr(leanmoe._fp8_codes, "ops", counter)
    base = build_fp8(family, device=device)
    kept, per_call = copy.deepcopy(base), copy.deepcopy(base)
    for m in (kept, per_call):
        m.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
        m.train()
    assert leanmoe.hf.fp8_weight_codes(per_call, False) == len(experts_modules(per_call))
    opts = [(ExpertAdamW(expert_parameters(m), lr=1e-2, weight_decay=0.1, in_backward=in_backward),
             torch.optim.AdamW(dense_parameters(m), lr=1e-3)) for m in (kept, per_call)]
    names = ("gate_up_proj" if family != "nemotron_h" else "up_proj", "down_proj")
    for step in range(3):
        losses = []
        for m, (experts, dense) in zip((kept, per_call), opts):
            losses.append(run(m, batch(device, seed=step), seed=step).loss)
            experts.step(), dense.step()
            experts.zero_grad(), dense.zero_grad()
        assert torch.equal(losses[0], losses[1]), f"step {step}"
        for (name, a), b in zip(kept.named_parameters(), per_call.parameters()):
            assert torch.equal(a, b), f"step {step}: {name} differs"
        for m in experts_modules(kept):
            assert_codes_current(m, f"{family} step {step}", names)
    # The first call wrote each weight's codes (2 per experts module); from then on only the update did.
    assert counter.calls == 2 * len(experts_modules(kept))
    assert not any(f"{n}_fp8" in m.__dict__ for m in experts_modules(per_call) for n in names)
    # The update that writes codes steps them (in both modes: the same bits as without codes).
    assert all(opts[0][0]._kernel(p) == "leanmoe" for p in expert_parameters(kept) if p.dim() == 3)
    kept.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION)
    run(kept, batch(device))  # a bf16 call: torch's update again, the codes stay until freed
    assert all(opts[0][0]._kernel(p) == "torch" for p in expert_parameters(kept))
    assert leanmoe.hf.fp8_weight_codes(kept, False) == len(experts_modules(kept))
    assert not any(f"{n}_fp8" in m.__dict__ for m in experts_modules(kept) for n in names)
    for experts, _ in opts:
        experts.release()


def test_fp8_codes_follow_writes_torch_sees_and_refresh():
    """A weight changed in place (load_state_dict, an edit under no_grad) gets new codes before the
    next call; a write through .data needs refresh_fp8_codes(model), as leanmoe.MoE's refresh does."""
    from test_fp8 import assert_codes_current
    model = build_fp8("olmoe")
    model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    b = batch("cpu")
    with torch.no_grad():
        model(**b)
        experts = experts_modules(model)[0]
        experts.gate_up_proj.mul_(2)
        model(**b)
    assert_codes_current(experts, "after an in-place edit")
    experts.down_proj.data.mul_(-1)
    leanmoe.hf.refresh_fp8_codes(model)
    assert_codes_current(experts, "after refresh_fp8_codes")


def test_fp8_codes_after_a_step_in_another_experts_implementation():
    """A model switched to "leanmoe" for a step (ExpertAdamW then steps its experts with torch's kernel,
    writing no codes) and back to "leanmoe_fp8": the codes are written again from the new weights."""
    from test_fp8 import assert_codes_current
    model = build_fp8("olmoe")
    model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    model.train()
    opt = ExpertAdamW(expert_parameters(model), lr=1e-2, in_backward=False)
    b = batch("cpu")
    for implementation in (leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8, leanmoe.hf.EXPERTS_IMPLEMENTATION):
        model.set_experts_implementation(implementation)
        run(model, b)
        opt.step()
        opt.zero_grad()
    model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    with torch.no_grad():
        model(**b)
    for experts in experts_modules(model):
        assert_codes_current(experts, "back in fp8 after a step in bf16")


def test_fp8_experts_compile_fullgraph():
    """Under torch.compile the FP8 experts quantize per call (no codes): the same output as eager with codes."""
    model = build_fp8("olmoe")
    model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    assert leanmoe.hf.prepare(model) == 2
    experts = experts_modules(model)[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 128, generator=g).bfloat16()
    idx, w = torch.randint(0, 8, (20, 2), generator=g), torch.rand(20, 2).bfloat16()
    eager = leanmoe.hf.experts_forward_fp8(experts, x, idx, w)
    assert "gate_up_proj_fp8" in experts.__dict__  # the eager call kept codes
    compiled = torch.compile(lambda *a: leanmoe.hf.experts_forward_fp8(experts, *a), backend="aot_eager",
                             fullgraph=True)
    assert torch.equal(compiled(x, idx, w), eager)


def test_fp8_rules_name_the_model():
    b = batch("cpu")
    model = build_fp8("olmoe").float()
    model.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    with pytest.raises(NotImplementedError, match=r"'leanmoe_fp8'.*OlmoeExperts.*bfloat16.*got torch.float32"):
        model(**b)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast to bf16 runs the fp32 model in FP8
        assert torch.isfinite(model(**b).logits).all()
    narrow = build("olmoe", dtype=torch.bfloat16)  # d = 64
    narrow.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    with pytest.raises(NotImplementedError, match=r"OlmoeExperts.*d \(hidden size\) = 64 must be a multiple of 128"):
        narrow(**b)
    thin = build_fp8("olmoe", width=256)
    for m in experts_modules(thin):  # n = 64 on d = 256: the down projection's K
        m.gate_up_proj.data, m.down_proj.data = m.gate_up_proj.data[:, :128], m.down_proj.data[:, :, :64]
    thin.set_experts_implementation(leanmoe.hf.EXPERTS_IMPLEMENTATION_FP8)
    with pytest.raises(NotImplementedError, match=r"n \(expert intermediate size\) = 64 must be a multiple of 128"):
        thin(**b)


def test_apply_fp8():
    """apply(model, precision="fp8"): the fused block's expert GEMMs in FP8 (near bf16's, not equal)."""
    outs = {}
    for precision in ("storage", "fp8"):
        model = build_fp8("olmoe")
        assert leanmoe.hf.apply(model, precision=precision) == 2
        model.train()
        outs[precision] = run(model, batch("cpu"))
    assert not torch.equal(outs["fp8"].logits, outs["storage"].logits)
    assert rel(outs["fp8"].logits, outs["storage"].logits) < 0.12
    with pytest.raises(ValueError, match=r"leanmoe.hf.apply: argument 'precision'"):
        leanmoe.hf.apply(build_fp8("olmoe"), precision="fp4")


def test_apply_fp8_rules_name_the_block():
    """apply(precision="fp8") states FP8's rules as the experts implementation does, naming the block:
    widths at apply() (a layer that can never run), the dtype at the forward (the model may be cast
    after apply(); autocast to bf16 runs an fp32 model)."""
    with pytest.raises(ValueError, match=r"leanmoe.hf.apply: block 'model.layers.0.mlp'.*d \(hidden size\) = 64 "
                                         r"must be a multiple of 128"):
        leanmoe.hf.apply(build("olmoe", dtype=torch.bfloat16), precision="fp8")
    # A refused model is left as it was: the check of every block comes before any change (here
    # the second block's experts are narrowed, so the first block passes and the second is refused).
    mixed = build_fp8("olmoe")
    experts = experts_modules(mixed)[1]
    experts.gate_up_proj.data, experts.down_proj.data = experts.gate_up_proj.data[:, :128], experts.down_proj.data[..., :64]
    with pytest.raises(ValueError, match=r"block 'model.layers.1.mlp'.*n \(expert intermediate size\) = 64"):
        leanmoe.hf.apply(mixed, precision="fp8")
    assert not leanmoe.hf.is_applied(mixed)
    model = build_fp8("olmoe").float()
    assert leanmoe.hf.apply(model, precision="fp8") == 2
    b = batch("cpu")
    with pytest.raises(ValueError, match=r"block 'model.layers.0.mlp' \(OlmoeSparseMoeBlock\).*bfloat16.*got "
                                         r"torch.float32"):
        model(**b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(**b).logits).all()


# ---- DeepSeek-V4's clamped SwiGLU: silu(min(g, l)) * clamp(up, -l, l), leanmoe's swiglu_clamped with
# alpha 1 and up offset 0. The families (transformers 5.25) and the attribute their experts keep the
# limit in (from the config's swiglu_limit).
CLAMPED_SWIGLU_FAMILIES = {"deepseek_v4": "limit", "glm5_next": "swiglu_limit", "hy_v4": "swiglu_limit",
                           "hy_v4_vl": "swiglu_limit"}


def _sweep_family(name):
    import hf_family_sweep
    family = next((f for f in hf_family_sweep.discover() if f.name == name), None)
    if family is None or family.model_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name} experts")
    return hf_family_sweep, family


def _family_model_matching_eager(family):
    """The family's tiny model (hf_family_sweep's) after its check: logits, loss, every gradient as
    eager's; returned with the "leanmoe" experts implementation set."""
    sweep, f = _sweep_family(family)
    outcome, detail = sweep.check(f)
    if outcome in ("not constructible", "not located"):
        pytest.skip(f"{family}: {outcome}: {detail}")
    assert outcome == "match", detail
    model = sweep.build(f)
    model.set_experts_implementation("leanmoe")
    return model


@pytest.mark.parametrize("family", list(CLAMPED_SWIGLU_FAMILIES))
def test_clamped_swiglu_family_matches_eager(family):
    """The family matches eager, and the spec leanmoe recognised: swiglu_clamped, alpha 1, the
    config's swiglu_limit, up offset 0."""
    model = _family_model_matching_eager(family)
    experts = experts_modules(model)[0]
    spec = leanmoe.hf.experts_spec(experts)
    limit = float(getattr(experts, CLAMPED_SWIGLU_FAMILIES[family]))
    assert limit == float(getattr(model.config, "swiglu_limit", None) or
                          getattr(model.config.get_text_config(), "swiglu_limit"))
    assert (spec.activation, spec.act_alpha, spec.act_limit, spec.act_up_offset) == ("swiglu_clamped", 1.0, limit, 0.0)
    assert (spec.interleaved, spec.transposed, spec.gated, spec.bias) == (False, False, True, False)


def _experts_alone_match_eager(family, set_constants, bound):
    """The family's experts module alone, fp32 on the CPU, with `set_constants(module)` applied to the
    eager and the leanmoe copy and its weights scaled so that pre-activations are ~N(0, 4) (more than
    a fifth of them beyond `bound`, where a clamp or soft cap acts): output and the gradients of x,
    the routing weights and both expert weights as the eager experts'. Returns leanmoe's module."""
    sweep, f = _sweep_family(family)
    try:
        eager_model = sweep.build(f)
    except Exception as e:  # noqa: BLE001 (transformers' side)
        pytest.skip(f"{family}: not constructible: {type(e).__name__}: {e}")
    ours_model = copy.deepcopy(eager_model)
    ours_model.set_experts_implementation("leanmoe")
    eager, ours = experts_modules(eager_model)[0], experts_modules(ours_model)[0]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in (eager, ours):
            set_constants(m)
        d = eager.gate_up_proj.shape[-1]
        eager.gate_up_proj.copy_(torch.randn(eager.gate_up_proj.shape, generator=g) * 2 / d ** 0.5)
        eager.down_proj.copy_(torch.randn(eager.down_proj.shape, generator=g) / eager.down_proj.shape[-1] ** 0.5)
        ours.gate_up_proj.copy_(eager.gate_up_proj)
        ours.down_proj.copy_(eager.down_proj)
    E = eager.gate_up_proj.shape[0]
    x = torch.randn(40, d, generator=g)
    idx = torch.randint(0, E, (40, 2), generator=g)
    w = torch.rand(40, 2, generator=g)
    h = x @ eager.gate_up_proj[0].T
    assert (h.abs() > bound).float().mean() > 0.2
    results = []
    for m in (eager, ours):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        m.zero_grad()
        out = m(xi, idx, wi)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
        results.append((out, xi.grad, wi.grad, m.gate_up_proj.grad, m.down_proj.grad))
    assert "_leanmoe_experts_spec" in ours.__dict__
    for name, a, b in zip(("out", "dx", "d_topk_weights", "d_gate_up_proj", "d_down_proj"), *results):
        assert rel(b, a) < 1e-5, f"{family}: {name}: relative error {rel(b, a):.2e}"
    return ours


@pytest.mark.parametrize("family", list(CLAMPED_SWIGLU_FAMILIES))
def test_clamped_swiglu_experts_with_the_clamps_acting(family):
    """Both clamps acting (limit 1.5 set on the module): the experts alone as eager's."""
    ours = _experts_alone_match_eager(family, lambda m: setattr(m, CLAMPED_SWIGLU_FAMILIES[family], 1.5), 1.5)
    assert ours.__dict__["_leanmoe_experts_spec"].act_limit == 1.5


# ---- Inkling2's soft-capped SwiGLU, c_g tanh(g / c_g) sigmoid(g) c_u tanh(u / c_u) (transformers
# 5.25), leanmoe's swiglu_softcapped with the caps of act_fn.gate_softcap and act_fn.up_softcap.
SOFTCAPPED_SWIGLU_FAMILIES = ["inkling2", "inkling2_loop"]


@pytest.mark.parametrize("family", SOFTCAPPED_SWIGLU_FAMILIES)
def test_softcapped_swiglu_family_matches_eager(family):
    """The family matches eager, and the spec: swiglu_softcapped with the config's mlp_gate_softcap
    and mlp_up_softcap."""
    model = _family_model_matching_eager(family)
    spec = leanmoe.hf.experts_spec(experts_modules(model)[0])
    config = model.config.get_text_config()
    assert (spec.activation, spec.act_alpha, spec.act_limit) == \
        ("swiglu_softcapped", float(config.mlp_gate_softcap), float(config.mlp_up_softcap))
    assert (spec.interleaved, spec.transposed, spec.gated, spec.bias) == (False, False, True, False)


@pytest.mark.parametrize("family", SOFTCAPPED_SWIGLU_FAMILIES)
def test_softcapped_swiglu_experts_with_the_caps_acting(family):
    """Caps 1 (gate) and 1.5 (up) set on the module, far from linear on pre-activations ~N(0, 4):
    the experts alone as eager's, and leanmoe took the caps set."""
    def set_caps(m):
        m.act_fn.gate_softcap.softcap, m.act_fn.up_softcap.softcap = 1.0, 1.5
    ours = _experts_alone_match_eager(family, set_caps, 1.5)
    spec = ours.__dict__["_leanmoe_experts_spec"]
    assert (spec.activation, spec.act_alpha, spec.act_limit) == ("swiglu_softcapped", 1.0, 1.5)


# ---- A norm on each expert's output before its routing weight (has_post_expert_norm; MuseSpark's
# experts in transformers 5.25): leanmoe runs the T*K (token, slot) rows as tokens of their own and
# the module's own norm on their outputs.
def test_post_expert_norm_family_matches_eager():
    model = _family_model_matching_eager("muse_spark")
    assert leanmoe.hf.experts_spec(experts_modules(model)[0]).post_norm


def _post_norm_reference(m, x, idx, w):
    """MuseSpark's experts loop (transformers 5.25) on OLMoE's SwiGLU experts: each expert's output
    through m.post_expert_norm, then times its routing weight; ids outside [0, E) add nothing."""
    out = torch.zeros_like(x)
    for e in range(m.gate_up_proj.shape[0]):
        t, k = torch.nonzero(idx == e, as_tuple=True)
        gate, up = torch.nn.functional.linear(x[t], m.gate_up_proj[e]).chunk(2, dim=-1)
        y = m.post_expert_norm(torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, m.down_proj[e]))
        out = out.index_add(0, t, y * w[t, k, None])
    return out


def test_post_expert_norm_as_transformers_computes_it(device):
    """OLMoE's experts given an RMSNorm (random weight) after each expert: output and the gradients of
    x, the routing weights, both expert weights and the norm's weight as MuseSpark's loop computes
    them, with "no expert" slots (id E) and T = 0. The CUDA backend stores bf16 (d = 128, n = 64):
    within 3e-2 of the fp32 reference there (bf16 operands and outputs, ~1e-2 each)."""
    torch.manual_seed(0)
    d, n = widths(device)
    ref = experts_modules(build("olmoe", hidden_size=d, intermediate_size=n))[0]
    E = ref.gate_up_proj.shape[0]
    ref.has_post_expert_norm = True
    ref.post_expert_norm = torch.nn.RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        ref.post_expert_norm.weight.copy_(torch.rand(d) + 0.5)
    dtype, tol = (torch.bfloat16, 3e-2) if device == "cuda" else (torch.float32, 1e-5)
    ours = copy.deepcopy(ref).to(device, dtype)
    assert leanmoe.hf.experts_spec(ours).post_norm
    g = torch.Generator().manual_seed(4)
    for T in (37, 0):
        x = torch.randn(T, d, generator=g)
        idx = torch.randint(0, E, (T, 2), generator=g)
        idx[::5, 1] = E  # "no expert": adds nothing, no gradient
        w = torch.rand(T, 2, generator=g)
        dout = torch.randn(T, d, generator=g)
        results = []
        for m, run_experts in ((ref, _post_norm_reference), (ours, leanmoe.hf.experts_forward)):
            dev, dt = m.gate_up_proj.device, m.gate_up_proj.dtype
            # Leaves of their own: on the CPU .to() would return x and w themselves, and the two runs'
            # gradients would add up in one tensor (and a later .to(cuda) would make a non-leaf).
            xi, wi = x.to(dev, dt).clone().requires_grad_(), w.to(dev).clone().requires_grad_()
            m.zero_grad(set_to_none=False)
            out = run_experts(m, xi, idx.to(dev), wi)
            out.backward(dout.to(dev, dt))
            grads = (xi.grad, wi.grad, m.gate_up_proj.grad, m.down_proj.grad, m.post_expert_norm.weight.grad)
            results.append([t.detach().float().cpu().clone() for t in (out, *grads)])
        for name, a, b in zip(("out", "dx", "d_topk_weights", "d_gate_up_proj", "d_down_proj", "d_norm_weight"),
                              *results):
            if T == 0:
                assert b.shape == a.shape and not b.abs().sum(), name
            else:
                assert rel(b, a) < tol, f"{name}: relative error {rel(b, a):.2e}"
        if T:
            assert not results[1][2][::5, 1].abs().sum()  # the "no expert" slots' weights get no gradient
