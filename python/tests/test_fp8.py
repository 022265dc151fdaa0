"""precision="fp8" (docs/DESIGN.md "FP8") through the PyTorch front: leanmoe.moe_routed against the FP8
layer emulated in torch (torch.float8_e4m3fn for the rounding, power-of-two scales per 1x128 tile
and 128x128 block), leanmoe.MoE in fp8 against itself in bf16 (the difference e4m3 predicts, not
zero), gradients, the argument rules (widths, storage dtype), and the CUDA backend against the CPU's.

The weights' codes kept by the layer and rewritten by ExpertAdamW (python/leanmoe/_fp8_codes.py):
after every step, load, edit or other optimizer the codes equal a torch quantization of the current
weights bit for bit, and the layer with codes equals the layer quantizing per call bit for bit on
outputs and every gradient (on the GPU, which reads the codes; the CPU backend quantizes per GEMM
whatever it is given, so there the codes' own check is what can fail)."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

import leanmoe
from leanmoe import _fp8_codes
from leanmoe.optim import ExpertAdamW


def rel(a, b):
    """Norm-wise relative difference ||a - b|| / ||b||, in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fp8_round_trip(v, tile_rows):
    """v [rows, cols] as the quantized GEMM operand reads it: tiles of tile_rows x 128, scale = the
    smallest power of two s >= 2^-126 with amax <= 448 s (amax over non-NaN values), value =
    e4m3(v / s) * s with round-to-nearest-even (torch's float8_e4m3fn cast; |v / s| <= 448)."""
    rows, cols = v.shape
    t = v.float().reshape(rows // tile_rows, tile_rows, cols // 128, 128)
    amax = t.abs().nan_to_num(0.0).amax(dim=(1, 3), keepdim=True).double()
    k = torch.ceil(torch.log2(amax / 448)).clamp(min=-126)  # exact in double: amax / 448 is never off a power
    scale = torch.exp2(k).float()
    return ((t / scale).to(torch.float8_e4m3fn).float() * scale).reshape(rows, cols)


def emulated_fp8_forward(x, ids, weights, w1, w2):
    """The FP8 routed layer in torch (SwiGLU, [gate; up], no biases), rounding where DESIGN.md says:
    H and A from q(x) q(W1)^T in fp32, A = bf16(silu(g) u), Y = bf16(q(A) q(W2)^T), out = bf16(sum gate Y)."""
    E = w1.shape[0]
    xq = fp8_round_trip(x, 1)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(E):
        t, k = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        h = xq[t] @ fp8_round_trip(w1[e], 128).t()
        g, u = h.chunk(2, dim=-1)
        a = (F.silu(g) * u).bfloat16()
        y = (fp8_round_trip(a, 1) @ fp8_round_trip(w2[e], 128).t()).bfloat16()
        out = out.index_add(0, t, weights[t, k].float()[:, None] * y.float())
    return out.bfloat16()


def routed_inputs(T, d, n, E, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, d, generator=g).bfloat16()
    w1 = (torch.randn(E, 2 * n, d, generator=g) / d ** 0.5).bfloat16()
    w2 = (torch.randn(E, d, n, generator=g) / n ** 0.5).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = (torch.rand(T, K, generator=g) + 0.1).bfloat16()
    return x, ids, weights, w1, w2


def test_routed_fp8_matches_torch_emulation():
    # T = 37: not a multiple of anything; d = 256: two scale tiles per row of x and per row of W1's blocks.
    x, ids, weights, w1, w2 = routed_inputs(37, 256, 128, 4, 2)
    got = leanmoe.moe_routed(x, ids, weights, w1, w2, precision="fp8")
    want = emulated_fp8_forward(x, ids, weights, w1, w2)
    # Both quantize the same bf16 values the same way; they could differ where an fp32 sum order
    # moves A or Y across a bf16 boundary (and that A across an e4m3 one): measured 0 (bit for bit).
    assert rel(got, want) < 1e-2
    bf16 = leanmoe.moe_routed(x, ids, weights, w1, w2)
    # e4m3 rounds each operand by 2.7% RMS, a GEMM of two by 3.8%, the layer's output ~6%
    # (tests/test_fp8.cpp, DiffersFromBf16AsE4m3Predicts): far from both 0 and a misplaced scale.
    assert 0.01 < rel(got, bf16) < 0.12


def test_module_fp8_forward_backward_differs_from_bf16_as_predicted():
    torch.manual_seed(0)
    layer = leanmoe.MoE(256, 128, 8, 2, router="topk_then_softmax", dtype=torch.bfloat16)
    fp8 = leanmoe.MoE(256, 128, 8, 2, router="topk_then_softmax", precision="fp8", dtype=torch.bfloat16)
    fp8.load_state_dict(layer.state_dict())
    assert "precision=fp8" in repr(fp8)
    x = torch.randn(100, 256, dtype=torch.bfloat16)
    d_out = torch.randn(100, 256, dtype=torch.bfloat16)
    results = []
    for m in (layer, fp8):
        xi = x.clone().requires_grad_()
        out = m(xi)
        (out.output.float() * d_out.float()).sum().backward()
        results.append((out.output, xi.grad, m.gate_up_proj.grad, m.down_proj.grad, m.router.weight.grad))
    for name, a, b in zip(("out", "dx", "d_gate_up", "d_down", "d_router"), results[1], results[0]):
        assert torch.isfinite(a).all(), name
        assert 0.01 < rel(a, b) < 0.12, f"{name}: {rel(a, b)}"


def test_fp8_arguments():
    w = dict(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'precision'"):
        leanmoe.MoE(128, 128, 4, 2, precision="fp9")
    x, ids, weights, w1, w2 = routed_inputs(8, 128, 128, 4, 2)
    with pytest.raises(ValueError, match="argument 'precision'"):
        leanmoe.moe_routed(x, ids, weights, w1, w2, precision="e4m3")
    with pytest.raises(ValueError, match=r"cfg\.d must be a multiple of 128 with cfg\.precision = fp8"):
        leanmoe.moe(torch.randn(5, 192, **w), torch.randn(4, 192, **w), torch.randn(4, 256, 192, **w),
                    torch.randn(4, 192, 128, **w), 2, precision="fp8")
    # The layer's widths are fixed at construction: a layer that could never run is refused there.
    with pytest.raises(ValueError, match=r"leanmoe.MoE: argument 'd': must be a multiple of 128 with "
                                         r"precision='fp8'.*got 192"):
        leanmoe.MoE(192, 128, 4, 2, precision="fp8", **w)
    with pytest.raises(ValueError, match=r"leanmoe.MoE: argument 'n': must be a multiple of 128 with "
                                         r"precision='fp8'.*got 64"):
        leanmoe.MoE(128, 64, 4, 2, precision="fp8")
    with pytest.raises(ValueError, match=r"cfg\.n must be a multiple of 128 with cfg\.precision = fp8"):
        leanmoe.moe_routed(x, ids, weights, w1[:, :128].contiguous(), w2[:, :, :64].contiguous(), precision="fp8")
    # A tensor not in bf16 is named, x included (fp32 activations into a bf16 layer: the storage
    # dtype, x's, is then f32, and "fp8 needs bf16 storage" alone misled).
    with pytest.raises(ValueError, match=r"leanmoe.moe: argument 'x': precision='fp8' needs bfloat16 tensors.*"
                                         r"got torch.float32"):
        leanmoe.MoE(128, 128, 4, 2, precision="fp8", dtype=torch.float32)(torch.randn(5, 128))
    bf16 = leanmoe.MoE(128, 128, 4, 2, precision="fp8", **w)
    with pytest.raises(ValueError, match=r"leanmoe.moe: argument 'x': precision='fp8' needs bfloat16"):
        bf16(torch.randn(5, 128))
    with pytest.raises(ValueError, match=r"leanmoe.moe_routed: argument 'down_proj': precision='fp8' needs bfloat16"):
        leanmoe.moe_routed(x, ids, weights, w1, w2.float(), precision="fp8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_fp8_on_cuda_matches_cpu():
    """The CUDA backend's FP8 layer against the CPU backend's on the same weights and input: the same
    quantization, so only summation order (and the codes it flips) differs: 3e-2 norm-wise, while FP8
    against bf16 is 5-7% off (tests/gpu/test_cuda_backend_fp8.cpp)."""
    if not leanmoe.cuda_available():
        pytest.skip("leanmoe built without its CUDA backend")
    torch.manual_seed(0)
    cpu = leanmoe.MoE(128, 128, 4, 2, precision="fp8", dtype=torch.bfloat16)
    gpu = leanmoe.MoE(128, 128, 4, 2, precision="fp8", device="cuda", dtype=torch.bfloat16)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(37, 128, dtype=torch.bfloat16)
    assert rel(gpu(x.cuda()).output.cpu(), cpu(x).output) < 3e-2


# ---- the weights' codes kept by the layer --------------------------------------------------------

def quantize_blocks(w):
    """w [E, R, C] as leanmoe quantizes a weight (128 x 128 blocks, the rule of fp8_round_trip):
    (e4m3 codes as uint8 [E, R, C], scales [E, R/128, C/128])."""
    E, R, C = w.shape
    t = w.float().reshape(E, R // 128, 128, C // 128, 128)
    amax = t.abs().nan_to_num(0.0).amax(dim=(2, 4), keepdim=True).double()
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)).clamp(min=-126)).float()
    codes = (t / scale).to(torch.float8_e4m3fn).view(torch.uint8).reshape(E, R, C)
    return codes, scale.reshape(E, R // 128, C // 128)


def assert_codes_current(layer, what, names=("gate_up_proj", "down_proj")):
    """The layer's code buffers are the quantization of its current weights, transposed copies included."""
    for name in names:
        w = getattr(layer, name).detach().cpu()
        codes, scales = quantize_blocks(w)
        got = [getattr(layer, f"{name}_{s}").cpu() for s in ("fp8", "fp8_scales", "fp8_t", "fp8_scales_t")]
        assert torch.equal(got[0].view(torch.uint8), codes), f"{what}: {name} codes"
        assert torch.equal(got[1], scales), f"{what}: {name} scales"
        assert torch.equal(got[2].view(torch.uint8), codes.transpose(1, 2)), f"{what}: {name} codes_t"
        assert torch.equal(got[3], scales.transpose(1, 2)), f"{what}: {name} scales_t"


class CountQuantizations:
    """Stands in for torch.ops.leanmoe in _fp8_codes: counts the separate weight quantizations."""

    def __init__(self, ops):
        self.ops, self.calls = ops, 0

    def fp8_weight_codes_(self, *args):
        self.calls += 1
        return self.ops.fp8_weight_codes_(*args)


def fp8_twins(device, **kwargs):
    """Two fp8 layers with equal weights: codes kept, and quantized per call."""
    torch.manual_seed(0)
    f = dict(device=device, dtype=torch.bfloat16)
    kept = leanmoe.MoE(256, 128, 4, 2, precision="fp8", **f, **kwargs)
    per_call = leanmoe.MoE(256, 128, 4, 2, precision="fp8", fp8_weight_codes=False, **f, **kwargs)
    per_call.load_state_dict(kept.state_dict())
    return kept, per_call


def run_step(layer, x, d_out):
    """Forward and backward of one step: (output, aux_loss, dx, d_router, d_gate_up_proj, d_down_proj)."""
    xi = x.clone().requires_grad_()
    out = layer(xi)
    ((out.output.float() * d_out).sum() + 0.1 * out.aux_loss + 0.01 * out.z_loss).backward()
    grads = tuple(None if g is None else g.clone()
                  for g in (xi.grad, layer.router.weight.grad, layer.gate_up_proj.grad, layer.down_proj.grad))
    return (out.output, out.aux_loss) + grads


def assert_same(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        assert (x is None) == (y is None), f"{what}: item {i}"
        assert x is None or torch.equal(x, y), f"{what}: item {i} differs"


@pytest.mark.parametrize("in_backward", [False, True])
def test_codes_kept_equal_quantized_per_call_over_training(in_backward, device, monkeypatch):
    counter = CountQuantizations(_fp8_codes.ops)
    monkeypatch.setattr(_fp8_codes, "ops", counter)
    kept, per_call = fp8_twins(device, routing="token_rounding", tile=16)
    opts = [(ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, weight_decay=0.1, in_backward=in_backward),
             torch.optim.AdamW([m.router.weight], lr=1e-2)) for m in (kept, per_call)]
    try:
        for step in range(4):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(70, 256, generator=g).bfloat16().to(device)
            d_out = torch.randn(70, 256, generator=g).to(device)
            results = [run_step(m, x, d_out) for m in (kept, per_call)]
            assert_same(results[0], results[1], f"step {step}: outputs and gradients")
            if in_backward:  # the expert weights were updated inside backward, their codes with them
                assert results[0][4] is None
                assert_codes_current(kept, f"step {step}, after backward")
            for experts, dense in opts:
                experts.step()
                dense.step()
                experts.zero_grad()
                dense.zero_grad()
            for a, b in zip(kept.parameters(), per_call.parameters()):
                assert torch.equal(a, b), f"step {step}: weights differ after the update"
            assert_codes_current(kept, f"step {step}, after the step")
        # The first call wrote each weight's codes; from then on only the optimizer's update did.
        assert counter.calls == 2
        assert all(getattr(per_call, f"{n}_fp8") is None for n in ("gate_up_proj", "down_proj"))
    finally:
        for experts, _ in opts:
            experts.release()


def test_in_backward_equals_standard_for_fp8_layers(device):
    """Both modes run the leanmoe update on an fp8 layer's weights: the same bits."""
    layers = fp8_twins(device)[0], None
    layers = layers[0], copy.deepcopy(layers[0])
    opts = [ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=mode) for m, mode in
            zip(layers, (False, True))]
    for step in range(3):
        x = torch.randn(40, 256, generator=torch.Generator().manual_seed(step)).bfloat16().to(device)
        for m, opt in zip(layers, opts):
            m(x).output.float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(layers[0].parameters(), layers[1].parameters()):
        assert torch.equal(a, b)
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(opts[0].state[layers[0].gate_up_proj][key], opts[1].state[layers[1].gate_up_proj][key])
    assert opts[0].state[layers[0].gate_up_proj]["step"].device.type == "cpu"
    # The moments like a bf16 layer's (torch's fused AdamW keeps them in the parameter's dtype).
    assert opts[0].state[layers[0].gate_up_proj]["exp_avg"].dtype == torch.bfloat16
    assert_codes_current(layers[1], "in-backward")
    opts[1].release()


def test_leanmoe_update_is_adamw():
    """The fp8 layers' update (leanmoe::optim::update_tensor) is AdamW with these hyper-parameters:
    torch.optim.AdamW over fp32 copies agrees to fp32 rounding after 3 steps."""
    torch.manual_seed(0)
    m = leanmoe.MoE(128, 128, 2, 1, precision="fp8", dtype=torch.bfloat16)
    w = [p.detach().float().clone().requires_grad_() for p in (m.gate_up_proj, m.down_proj)]
    ours = ExpertAdamW([m.gate_up_proj, m.down_proj], lr=3e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3,
                       in_backward=False, master_weights=True)
    theirs = torch.optim.AdamW(w, lr=3e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3)
    for _ in range(3):
        for p, q in zip((m.gate_up_proj, m.down_proj), w):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.float()
        ours.step()
        theirs.step()
    for p, q in zip((m.gate_up_proj, m.down_proj), w):
        torch.testing.assert_close(ours.state[p]["master"], q.detach(), rtol=1e-5, atol=1e-6)
    assert_codes_current(m, "after master-weight steps")


def test_fp8_layer_state_is_a_bf16_layers(device):
    """Without master weights an fp8 layer's moments are bf16 like a bf16 layer's (torch's fused AdamW
    keeps them in the parameter's dtype), and its update (leanmoe's, computing in fp32 and rounding
    the moments on store) tracks torch's fused AdamW over the same bf16 weights to bf16 rounding: the
    same formula, rounded differently (docs/optim.md). The state moves between precisions as is."""
    torch.manual_seed(0)
    fp8 = leanmoe.MoE(256, 128, 4, 2, precision="fp8", device=device, dtype=torch.bfloat16)
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = ExpertAdamW([fp8.gate_up_proj, fp8.down_proj], in_backward=False, **hyper)
    w = [p.detach().clone().requires_grad_() for p in (fp8.gate_up_proj, fp8.down_proj)]
    theirs = torch.optim.AdamW(w, fused=True, **hyper)
    for step in range(3):
        for p, q in zip((fp8.gate_up_proj, fp8.down_proj), w):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step)).to(p)
            q.grad = p.grad.clone()
        ours.step()
        theirs.step()
    def close(a, b, what):  # a bf16 value rounded the other way (one ulp) keeps that absolute error
        b = b.float()       # when it later shrinks: bound by the tensor's largest value's ulp, 2^-8
        torch.testing.assert_close(a.float(), b, rtol=2 ** -7, atol=2 ** -7 * b.abs().max().item(), msg=what)

    for p, q in zip((fp8.gate_up_proj, fp8.down_proj), w):
        mine, torch_state = ours.state[p], theirs.state[q]
        for key in ("exp_avg", "exp_avg_sq"):
            assert mine[key].dtype == torch_state[key].dtype == torch.bfloat16, key
            close(mine[key], torch_state[key], key)
        close(p.detach(), q.detach(), "weights")
    assert_codes_current(fp8, "after bf16-moment steps")
    # The fp8 layer's state dict loads into an optimizer over the layer's weights unchanged in dtype.
    again = ExpertAdamW([fp8.gate_up_proj, fp8.down_proj], in_backward=False, **hyper)
    again.load_state_dict(ours.state_dict())
    assert all(again.state[p][k].dtype == torch.bfloat16 for p in (fp8.gate_up_proj, fp8.down_proj)
               for k in ("exp_avg", "exp_avg_sq"))


def test_a_new_storage_at_a_freed_ones_address_is_not_the_same():
    """The codes' stamp tells a storage from a later one the allocator placed at the freed one's
    address (once, a weight converted to float and back and its reallocated code buffers matched the
    old stamp by address, and code buffers never written were used)."""
    held = []
    for _ in range(16):  # a freed 1 KB CPU block is mostly handed out again within a few allocations
        old = torch.empty(256)
        address, stamp = old.data_ptr(), _fp8_codes._stamp(old, [old])
        assert _fp8_codes._stamp(old, [old]) == stamp
        del old
        for _ in range(64):
            held.append(torch.empty(256))
            if held[-1].data_ptr() == address:
                assert _fp8_codes._stamp(held[-1], [held[-1]]) != stamp
                return
    pytest.skip("the allocator gave no freed address back")


def test_a_layer_keeping_codes_pickles_and_copies(device):
    """torch.save of the whole layer (and deepcopy) after a call: the copy writes its own codes at its
    first call and computes what the layer does (the stamps hold weak references, not pickled)."""
    torch.manual_seed(0)
    layer = leanmoe.MoE(256, 128, 4, 2, precision="fp8", device=device, dtype=torch.bfloat16)
    x = torch.randn(50, 256, device=device, dtype=torch.bfloat16)
    want = layer(x).output
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    for other in (torch.load(buf, weights_only=False), copy.deepcopy(layer)):
        assert not other._fp8_stamps
        assert torch.equal(other(x).output, want)
        assert_codes_current(other, "copy")


@pytest.mark.parametrize("change", ["load_state_dict", "no_grad edit", "torch fused AdamW", "torch AdamW",
                                    "to float and back", "new parameter"])
def test_changed_weights_get_their_codes_again(change, device):
    """Any change of the weights outside ExpertAdamW's update is found before the next call: the codes
    are written again (else the GPU would compute with the old weights, silently)."""
    kept, per_call = fp8_twins(device)
    x = torch.randn(50, 256, device=device, dtype=torch.bfloat16)
    kept(x)
    assert_codes_current(kept, "first call")
    with torch.no_grad():
        if change == "load_state_dict":
            other = leanmoe.MoE(256, 128, 4, 2, device=device, dtype=torch.bfloat16)
            kept.load_state_dict(other.state_dict())
        elif change == "no_grad edit":
            kept.gate_up_proj[1] *= 3
            kept.down_proj.add_(0.01)
        elif change == "new parameter":
            kept.down_proj = torch.nn.Parameter(kept.down_proj.detach() * 2)
    if change.startswith("torch"):
        opt = torch.optim.AdamW([kept.gate_up_proj, kept.down_proj], lr=0.1, fused=change == "torch fused AdamW",
                                foreach=False if change == "torch AdamW" else None)
        kept(x).output.float().sum().backward()
        opt.step()
    elif change == "to float and back":
        kept.float()
        with torch.no_grad():
            kept.gate_up_proj.mul_(0.5)  # in fp32: a write the version counter of the bf16 tensor never saw
        kept.bfloat16()
    per_call.load_state_dict(kept.state_dict())
    names = [f"{w}_{s}" for w in ("gate_up_proj", "down_proj") for s in ("fp8", "fp8_scales")]
    stale = [getattr(kept, n).view(torch.uint8).clone() for n in names]
    with torch.no_grad():
        a, b = kept(x), per_call(x)
    assert torch.equal(a.output, b.output)
    assert_codes_current(kept, change)
    assert any(not torch.equal(s, getattr(kept, n).view(torch.uint8)) for s, n in zip(stale, names)), \
        "the change moved no code nor scale: a vacuous test"


@pytest.mark.parametrize("codes", [True, False])
def test_copies_and_new_parameters_take_the_fp8_update(codes, device):
    """A deep copy of an fp8 layer, and one whose expert weight was replaced by a new Parameter, step
    with the fp8 layers' update (ExpertAdamW's leanmoe update) as the original does, with or without
    the codes kept: the same weights bit for bit."""
    torch.manual_seed(0)
    a = leanmoe.MoE(256, 128, 4, 2, precision="fp8", fp8_weight_codes=codes, device=device, dtype=torch.bfloat16)
    b, c = copy.deepcopy(a), copy.deepcopy(a)
    c.down_proj = torch.nn.Parameter(c.down_proj.detach().clone())
    opts = [ExpertAdamW([m.gate_up_proj, m.down_proj], lr=1e-2, in_backward=mode)
            for m, mode in ((a, False), (b, False), (c, True))]
    for step in range(3):
        x = torch.randn(40, 256, generator=torch.Generator().manual_seed(step)).bfloat16().to(device)
        for m, opt in zip((a, b, c), opts):
            m(x).output.float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    for m, what in ((b, "deep copy"), (c, "new Parameter")):
        for name in ("gate_up_proj", "down_proj"):
            assert torch.equal(getattr(m, name), getattr(a, name)), f"{what}: {name}"
    opts[2].release()


@pytest.mark.parametrize("optimizer", ["ExpertAdamW", "torch fused AdamW"])
def test_tied_expert_weights_keep_every_layers_codes(optimizer, device):
    """Two fp8 layers sharing their expert weights (tied): after an update both layers' codes are
    those of the new weights (the update writes one layer's codes; the other's must be rewritten)."""
    torch.manual_seed(0)
    f = dict(precision="fp8", device=device, dtype=torch.bfloat16)
    a, b = leanmoe.MoE(256, 128, 4, 2, **f), leanmoe.MoE(256, 128, 4, 2, **f)
    b.gate_up_proj, b.down_proj = a.gate_up_proj, a.down_proj
    params = [a.gate_up_proj, a.down_proj]
    opt = (ExpertAdamW(params, lr=1e-2, in_backward=False) if optimizer == "ExpertAdamW" else
           torch.optim.AdamW(params, lr=1e-2, fused=True))
    x = torch.randn(40, 256, device=device, dtype=torch.bfloat16)
    for step in range(2):
        (a(x).output.float().square().mean() + b(x).output.float().square().mean()).backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            a(x), b(x)
        assert_codes_current(a, f"step {step}: layer a")
        assert_codes_current(b, f"step {step}: layer b")


def test_precision_switched_after_construction(device):
    """examples/train_lm.py validates a layer in the other precision by setting layer.precision: a
    storage-built layer then runs FP8 as an fp8-built one (codes kept), an unknown precision is
    refused, and an fp8 layer stepped while in storage precision has current codes when back in fp8."""
    torch.manual_seed(0)
    f = dict(device=device, dtype=torch.bfloat16)
    built = leanmoe.MoE(256, 128, 4, 2, precision="fp8", **f)
    switched = leanmoe.MoE(256, 128, 4, 2, **f)
    switched.load_state_dict(built.state_dict())
    switched.precision = "fp8"
    x = torch.randn(40, 256, **f)
    with torch.no_grad():
        assert torch.equal(switched(x).output, built(x).output)
    assert_codes_current(switched, "switched to fp8")
    with pytest.raises(ValueError, match="leanmoe.MoE: argument 'precision'"):
        switched.precision = "fp9"
    opt = ExpertAdamW([built.gate_up_proj, built.down_proj], lr=1e-2, in_backward=False)
    built.precision = "storage"
    built(x).output.float().sum().backward()
    opt.step()
    built.precision = "fp8"
    with torch.no_grad():
        built(x)
    assert_codes_current(built, "fp8 again after a step in storage precision")


def test_an_optimizer_that_skipped_the_weights_leaves_their_codes(device, monkeypatch):
    """A torch optimizer over every parameter (experts included) beside the in-backward ExpertAdamW: its
    step skips the expert weights (no .grad), so their codes stay current and no call quantizes them
    again (a quantization pass per call is what the codes save: 3.7 ms at 120B-n2048 on the GPU)."""
    counter = CountQuantizations(_fp8_codes.ops)
    monkeypatch.setattr(_fp8_codes, "ops", counter)
    kept, _ = fp8_twins(device)
    experts = ExpertAdamW([kept.gate_up_proj, kept.down_proj], lr=1e-2, in_backward=True)
    everything = torch.optim.AdamW(kept.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(40, 256, generator=torch.Generator().manual_seed(step)).bfloat16().to(device)
        kept(x).output.float().square().mean().backward()
        experts.step()
        everything.step()
        everything.zero_grad()
    assert_codes_current(kept, "after three steps")
    assert counter.calls == 2  # the first call's, one per weight
    experts.release()


def test_writes_through_data_need_refresh(device):
    """A write through .data bypasses the version counter: the codes stay stale (on the GPU the layer
    would compute with the old weights) until refresh_fp8_codes(). Shows the codes check can fail."""
    kept, per_call = fp8_twins(device)
    x = torch.randn(50, 256, device=device, dtype=torch.bfloat16)
    kept(x)
    kept.gate_up_proj.data.mul_(3)
    kept(x)
    with pytest.raises(AssertionError, match="gate_up_proj codes"):
        assert_codes_current(kept, ".data write")
    kept.refresh_fp8_codes()
    assert_codes_current(kept, "after refresh_fp8_codes")
    per_call.load_state_dict(kept.state_dict())
    with torch.no_grad():
        assert torch.equal(kept(x).output, per_call(x).output)


def test_codes_are_buffers_not_state_and_a_resume_is_bitwise(device):
    kept, _ = fp8_twins(device)
    assert [k for k in kept.state_dict()] == ["gate_up_proj", "down_proj", "router.weight"]
    straight, resumed = kept, copy.deepcopy(kept)

    def train(m, opt, steps, start):
        for s in range(start, start + steps):
            x = torch.randn(40, 256, generator=torch.Generator().manual_seed(s)).bfloat16().to(device)
            m(x).output.float().square().mean().backward()
            opt.step()
            opt.zero_grad()

    opt_a = ExpertAdamW([straight.gate_up_proj, straight.down_proj], lr=1e-2, in_backward=True)
    train(straight, opt_a, 4, 0)
    opt_b = ExpertAdamW([resumed.gate_up_proj, resumed.down_proj], lr=1e-2, in_backward=True)
    train(resumed, opt_b, 2, 0)
    buf = io.BytesIO()
    torch.save({"model": resumed.state_dict(), "optim": opt_b.state_dict()}, buf)
    opt_b.release()
    buf.seek(0)
    ckpt = torch.load(buf)
    fresh = leanmoe.MoE(256, 128, 4, 2, precision="fp8", device=device, dtype=torch.bfloat16)
    fresh.load_state_dict(ckpt["model"])
    opt_c = ExpertAdamW([fresh.gate_up_proj, fresh.down_proj], lr=1e-2, in_backward=True)
    opt_c.load_state_dict(ckpt["optim"])
    assert opt_c.state[fresh.down_proj]["exp_avg"].dtype == torch.bfloat16  # the weights' dtype, as saved
    train(fresh, opt_c, 2, 2)
    for a, b in zip(straight.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    assert_codes_current(fresh, "resumed")
    opt_a.release()
    opt_c.release()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_of_an_fp8_layer(backend, device):
    """Compiled (fullgraph), the layer quantizes per call (the staleness checks cannot be traced): the
    same bits as the eager call with codes, on the output and every gradient."""
    kept, _ = fp8_twins(device)
    x = torch.randn(3, 20, 256, device=device, dtype=torch.bfloat16)
    d_out = torch.randn(3, 20, 256, device=device)

    def loss(m, t):
        out = m(t)
        return out.output, (out.output.float() * d_out).sum() + 0.1 * out.aux_loss

    results = []
    for f in (loss, torch.compile(loss, backend=backend, fullgraph=True)):
        xi = x.clone().requires_grad_()
        out, total = f(kept, xi)
        total.backward()
        results.append([out, xi.grad] + [p.grad.clone() for p in kept.parameters()])
        kept.zero_grad()
    for i, (a, b) in enumerate(zip(*results)):
        assert torch.equal(a, b), f"item {i}"


def test_opcheck_with_codes():
    torch.manual_seed(0)
    m = leanmoe.MoE(256, 128, 4, 2, precision="fp8", dtype=torch.bfloat16)
    x = torch.randn(30, 256, dtype=torch.bfloat16)
    codes = _fp8_codes.codes_for_call(m)
    config = (2, "softmax_then_topk", False, "topk", 128, "nearest", "fp8")
    args = (x, m.router.weight.detach(), m.gate_up_proj.detach(), m.down_proj.detach(), *config, codes)
    # test_schema runs float ops on every argument, which float8_e4m3fn tensors do not have.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.leanmoe.moe_forward.default, args, test_utils=utils)
    p = m.down_proj.detach().clone()
    step_args = (p, torch.randn_like(p), torch.zeros_like(p, dtype=torch.float32),
                 torch.zeros_like(p, dtype=torch.float32), torch.zeros(()), 1e-3, 0.9, 0.999, 0.01, 1e-8, None,
                 "leanmoe")
    torch.library.opcheck(torch.ops.leanmoe.adamw_step_.default, step_args)
    torch.library.opcheck(torch.ops.leanmoe.adamw_step_.default, (*step_args, [t.clone() for t in codes[4:]]),
                          test_utils=utils)


def test_code_arguments_are_checked():
    torch.manual_seed(0)
    m = leanmoe.MoE(256, 128, 4, 2, precision="fp8", dtype=torch.bfloat16)
    codes = _fp8_codes.codes_for_call(m)
    p = m.down_proj.detach().clone()
    state = (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
    hyper = (1e-3, 0.9, 0.999, 0.01, 1e-8)
    step = torch.ops.leanmoe.adamw_step_
    with pytest.raises(ValueError, match=r"fp8_copy\[0\] \(codes\)'.*Float8_e4m3fn tensor of shape \[4, 256, 128\]"):
        step(p, torch.randn_like(p), *state, torch.zeros(()), *hyper, None, "leanmoe", codes[:4])
    with pytest.raises(ValueError, match="4 tensors"):
        step(p, torch.randn_like(p), *state, torch.zeros(()), *hyper, None, "leanmoe", codes[4:7])
    with pytest.raises(ValueError, match="written by update='leanmoe' only"):
        step(p, torch.randn_like(p), *state, torch.zeros(()), *hyper, None, "torch", codes[4:])
    with pytest.raises(ValueError, match="argument 'update'"):
        step(p, torch.randn_like(p), *state, torch.zeros(()), *hyper, None, "adam")
    with pytest.raises(ValueError, match="argument 'step'.*CPU float32 scalar"):
        step(p, torch.randn_like(p), *state, torch.zeros((), dtype=torch.float64), *hyper, None, "leanmoe")
    # The moments' dtype is exp_avg's (bf16 here): an exp_avg_sq of another dtype is named.
    with pytest.raises(ValueError, match="state.exp_avg_sq'.*bf16 tensor.*got f32"):
        step(p, torch.randn_like(p), p.clone(), state[1], torch.zeros(()), *hyper, None, "leanmoe")
    with pytest.raises(ValueError, match="argument 'weight'.*bfloat16"):
        torch.ops.leanmoe.fp8_weight_codes_(p.float(), codes[4:])
    # Codes of the wrong layout for the layer: the API names the tensor.
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    swapped = codes[4:] + codes[:4]
    with pytest.raises(ValueError, match=r"w\.fp8\.gate_up_proj\.codes"):
        torch.ops.leanmoe.moe_forward(x, m.router.weight, m.gate_up_proj, m.down_proj, 2, "softmax_then_topk", False,
                                      "topk", 128, "nearest", "fp8", swapped)
    with pytest.raises(ValueError, match="fp8_weights_given needs cfg.precision = fp8"):
        torch.ops.leanmoe.moe_forward(x, m.router.weight, m.gate_up_proj, m.down_proj, 2, "softmax_then_topk", False,
                                      "topk", 128, "nearest", "storage", codes)
