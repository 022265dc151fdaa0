"""leanmoe::moe_forward / moe_backward against the pure-torch reference (tests/reference.py)."""
import pytest
import torch

import leanmoe
from conftest import skip_unsupported, widths
from reference import moe_reference

# Tolerances. fp32: the op and the reference accumulate the same fp32 products in a different order
# (OpenBLAS / tensor-core tiles vs torch), relative error ~ sqrt(d)·2^-24 ≈ 1e-6; 1e-4 of the
# largest magnitude leaves room for the GPU's TF32-free fp32 GEMMs and for cancellation in sums.
# bf16: storage rounds H, A, Y, the output and every gradient to 8 bits of mantissa (2^-8 ≈ 4e-3
# relative per rounding, a few roundings in series), so 3e-2 of the largest magnitude.
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def close(actual, expected, dtype, what):
    actual, expected = actual.float().cpu(), expected.float().cpu()
    scale = expected.abs().max().clamp_min(1e-6)
    err = (actual - expected).abs().max() / scale
    assert err <= TOL[dtype], f"{what}: max error {err:.3e} of max |value| {scale:.3e} (tol {TOL[dtype]})"


def make_layer(T, d, n, E, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, d, generator=g)
    wr = torch.randn(E, d, generator=g) / d ** 0.5
    w1 = torch.randn(E, 2 * n, d, generator=g) / d ** 0.5
    w2 = torch.randn(E, d, n, generator=g) / n ** 0.5
    return [t.to(dtype).to(device).requires_grad_() for t in (x, wr, w1, w2)]


CONFIGS = [
    dict(router="softmax_then_topk", norm_topk_prob=False),
    dict(router="softmax_then_topk", norm_topk_prob=True),
    dict(router="topk_then_softmax"),
    dict(routing="token_rounding", tile=8, rounding_mode="nearest"),
    dict(routing="token_rounding", tile=8, rounding_mode="up", norm_topk_prob=True),
    dict(routing="token_rounding", tile=8, rounding_mode="down"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_forward_and_gradients_match_reference(cfg, dtype, device):
    skip_unsupported(device, dtype)
    (d, n), T, E, K = widths(device), 45, 8, 2
    x, wr, w1, w2 = make_layer(T, d, n, E, dtype, device)
    c_aux, c_z = 0.3, 0.05
    out, aux, zl = leanmoe.moe(x, wr, w1, w2, K, **cfg)
    g = torch.Generator().manual_seed(1)
    d_out = torch.randn(T, d, generator=g).to(dtype).to(device)
    (out.float() * d_out.float()).sum().add(c_aux * aux + c_z * zl).backward()
    grads = [t.grad for t in (x, wr, w1, w2)]

    # The reference runs in fp32 from the same (possibly bf16-rounded) values.
    rx, rwr, rw1, rw2 = [t.detach().float().cpu().requires_grad_() for t in (x, wr, w1, w2)]
    r_out, r_aux, r_z, keep = moe_reference(rx, rwr, rw1, rw2, K, **cfg)
    (r_out * d_out.float().cpu()).sum().add(c_aux * r_aux + c_z * r_z).backward()

    close(out, r_out, dtype, "output")
    close(aux, r_aux, dtype, "aux_loss")
    close(zl, r_z, dtype, "z_loss")
    for name, got, ref in zip(("dx", "d_router", "d_gate_up_proj", "d_down_proj"), grads,
                              (rx.grad, rwr.grad, rw1.grad, rw2.grad)):
        close(got, ref, dtype, name)


@pytest.mark.parametrize("mode", ["nearest", "up", "down"])
def test_token_rounding_counts(mode, device):
    """Every expert's row count is the reference's: its top-K count rounded to a tile multiple."""
    (d, n), T, E, K, tile = widths(device), 70, 6, 2, 8
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, wr, w1, w2 = make_layer(T, d, n, E, dtype, device, seed=3)
    cfg = dict(routing="token_rounding", tile=tile, rounding_mode=mode)
    saved = torch.ops.leanmoe.moe_forward(x, wr, w1, w2, K, "softmax_then_topk", False, "token_rounding", tile, mode,
                                          "storage")
    expert_offsets = saved[7].cpu()
    counts = expert_offsets[1:] - expert_offsets[:-1]
    *_, keep = moe_reference(*(t.detach().float().cpu() for t in (x, wr, w1, w2)), K, **cfg)
    assert counts.tolist() == keep.sum(0).tolist()
    assert all(c % tile == 0 for c in counts.tolist())
    # Saved state: exactly the docs/SPEC.md §3 arrays, sized R_max.
    R = leanmoe.max_routed_rows(T, E, K, "token_rounding", tile, mode)
    assert saved[2].shape == (R, 2 * n) and saved[3].shape == (R,) and saved[8].shape == (T, K)


def test_topk_rows_are_a_permutation(device):
    (d, n), T, E, K = widths(device), 33, 5, 3
    x, wr, w1, w2 = make_layer(T, d, n, E, torch.bfloat16 if device == "cuda" else torch.float32, device)
    _, _, h, row_gate, row_token, token_rows, token_offsets, expert_offsets, topk = torch.ops.leanmoe.moe_forward(
        x, wr, w1, w2, K, "softmax_then_topk", False, "topk", 128, "nearest", "storage")
    assert int(expert_offsets[-1]) == T * K
    assert torch.equal(torch.sort(token_rows.cpu().long()).values, torch.arange(T * K))
    assert torch.equal(torch.bincount(row_token.cpu().long(), minlength=T), torch.full((T,), K))


def test_errors_name_the_argument():
    x = torch.randn(4, 16)
    wr, w1, w2 = torch.randn(4, 16), torch.randn(4, 16, 16), torch.randn(4, 16, 5)
    with pytest.raises(ValueError, match="down_proj"):
        leanmoe.moe(x, wr, w1, w2, 2)
    with pytest.raises(ValueError, match="routing"):
        leanmoe.moe(x, wr, w1, torch.randn(4, 16, 8), 2, routing="bogus")
    with pytest.raises((ValueError, RuntimeError), match="dtype"):
        leanmoe.moe(x.double(), wr.double(), w1.double(), torch.randn(4, 16, 8).double(), 2)


def test_module_layout_and_losses():
    m = leanmoe.MoE(32, 16, 6, 2, router="softmax_then_topk", routing="topk")
    assert m.router.weight.shape == (6, 32)
    assert m.gate_up_proj.shape == (6, 32, 32) and m.down_proj.shape == (6, 32, 16)
    x = torch.randn(2, 5, 32)
    out = m(x)
    assert out.output.shape == x.shape and out.aux_loss.dim() == 0 and out.z_loss.dim() == 0
    ref, aux, zl, _ = moe_reference(x.view(-1, 32), m.router.weight, m.gate_up_proj, m.down_proj, 2)
    close(out.output.view(-1, 32), ref, torch.float32, "module output")


def test_autograd_saves_only_the_spec_state(device):
    """docs/SPEC.md §3: autograd keeps x, H, the gates and the routing arrays (plus references to the
    weights, which are parameters); nothing of size T*K*d (no A, Y or gathered X)."""
    (d, n), T, E, K = widths(device), 64, 8, 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, wr, w1, w2 = make_layer(T, d, n, E, dtype, device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        leanmoe.moe(x, wr, w1, w2, K)
    params = {t.data_ptr() for t in (x, wr, w1, w2)}
    extra = [t for t in saved if t.data_ptr() not in params]
    es = dtype.itemsize
    R = T * K
    expected = R * 2 * n * es + R * 4 * 3 + (T + 1) * 4 + (E + 1) * 4 + T * K * 4  # H, gate/token/rows, offsets, topk
    # Exactly these bytes: any extra activation (A, Y, gathered X: R*n or R*d elements) would show.
    assert sum(t.numel() * t.element_size() for t in extra) == expected
