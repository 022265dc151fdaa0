"""leanmoe.moe_routed (routing given by the caller) against a pure-torch reference: every
activation, biases, the interleaved and transposed layouts, sentinel ids; gradients of x, the
routing weights, the expert weights and biases; opcheck, torch.compile and in-backward AdamW."""
import pytest
import torch
import torch.nn.functional as F

import leanmoe
from conftest import skip_unsupported, widths
from leanmoe.functional import ACTIVATIONS, GATED_ACTIVATIONS
from leanmoe.optim import ExpertAdamW
from test_ops import close  # the tolerances of the op tests (their comment says why)


# The activations written out in torch (as transformers' experts compute them), independently of leanmoe's.
def torch_activation(name, h, interleaved, alpha=1.702, limit=7.0, up_offset=1.0):
    if name in GATED_ACTIVATIONS:
        g, u = (h[..., ::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
        if name == "swiglu_clamped" and up_offset == 0:  # DeepSeek-V4's _apply_gate (alpha 1)
            assert alpha == 1.0
            return F.silu(g.clamp(max=limit)) * u.clamp(min=-limit, max=limit)
        if name == "swiglu_clamped":
            g = g.clamp(max=limit)
            return (u.clamp(-limit, limit) + 1) * g * torch.sigmoid(alpha * g)
        if name == "swiglu_softcapped":  # Inkling2's: the gate's cap in alpha, up's in limit
            return torch.tanh(g / alpha) * alpha * torch.sigmoid(g) * (torch.tanh(u / limit) * limit)
        f = {"swiglu": F.silu, "geglu": F.gelu, "geglu_tanh": lambda v: F.gelu(v, approximate="tanh"),
             "reglu": F.relu}[name]
        return f(g) * u
    return {"gelu": F.gelu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "silu": F.silu, "relu": F.relu,
            "relu2": lambda v: F.relu(v) ** 2}[name](h)


def routed_reference(x, ids, weights, w1, w2, b1, b2, activation, interleaved, transposed, limit=7.0, alpha=1.702,
                     up_offset=1.0):
    """fp32 loop over (token, slot) pairs; ids outside [0, E) add nothing."""
    E = w1.shape[0]
    out = torch.zeros_like(x)
    for e in range(E):
        t, k = torch.nonzero(ids == e, as_tuple=True)
        if t.numel() == 0:
            continue
        w1e = w1[e] if transposed else w1[e].t()
        w2e = w2[e] if transposed else w2[e].t()
        h = x[t] @ w1e + (b1[e] if b1 is not None else 0)
        y = torch_activation(activation, h, interleaved, alpha, limit, up_offset) @ w2e + (b2[e] if b2 is not None else 0)
        out = out.index_add(0, t, weights[t, k][:, None] * y)
    return out


def make(T, d, n, E, K, activation, transposed, bias, dtype, device, seed=0, sentinels=False):
    g = torch.Generator().manual_seed(seed)
    W = 2 * n if activation in GATED_ACTIVATIONS else n
    x = torch.randn(T, d, generator=g)
    w1 = torch.randn(E, W, d, generator=g) / d ** 0.5
    w2 = torch.randn(E, d, n, generator=g) / n ** 0.5
    if transposed:
        w1, w2 = w1.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    b1 = torch.randn(E, W, generator=g) * 0.3 if bias else None
    b2 = torch.randn(E, d, generator=g) * 0.3 if bias else None
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]) if T else \
        torch.zeros(0, K, dtype=torch.long)
    if sentinels:
        ids[::3, 0] = -1
        ids[1::5, -1] = E  # an expert-parallel sentinel
    weights = torch.rand(T, K, generator=g) + 0.1
    leaves = [t.to(dtype).to(device).requires_grad_() if t is not None else None for t in (x, w1, w2, b1, b2)]
    return leaves[0], ids.to(device), weights.to(dtype).to(device).requires_grad_(), *leaves[1:]


CASES = [(a, False, False, False) for a in ACTIVATIONS] + [
    ("swiglu_clamped", True, True, True),  # gpt-oss
    ("geglu_tanh", True, False, True),
    ("relu2", False, True, True),  # Nemotron-H-like, with biases
    ("swiglu", False, True, False),
    ("swiglu_clamped", True, False, True),  # gpt-oss's function and biases, not transposed
    ("relu2", False, False, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation,interleaved,transposed,bias", CASES,
                         ids=lambda v: str(v) if not isinstance(v, bool) else ("y" if v else "n"))
def test_matches_reference(activation, interleaved, transposed, bias, dtype, device):
    skip_unsupported(device, dtype)
    (d, n), T, E, K = widths(device), 41, 8, 2
    # fp32: a limit many values cross. bf16: storing H rounds values across a limit (1.5 is exact in
    # bf16), turning the clamp's gradient on or off against the fp32 reference: gpt-oss's own 7.
    limit = 1.5 if activation == "swiglu_clamped" and dtype == torch.float32 else 7.0
    x, ids, wts, w1, w2, b1, b2 = make(T, d, n, E, K, activation, transposed, bias, dtype, device, sentinels=True)
    out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2, activation=activation, act_limit=limit,
                             interleaved=interleaved, transposed=transposed)
    d_out = torch.randn(T, d, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    (out.float() * d_out.float()).sum().backward()
    leaves = [t for t in (x, wts, w1, w2, b1, b2) if t is not None]
    ref_leaves = [t.detach().float().cpu().requires_grad_() for t in leaves]
    rx, rw, rw1, rw2, *rb = ref_leaves
    ref = routed_reference(rx, ids.cpu(), rw, rw1, rw2, rb[0] if bias else None, rb[1] if bias else None, activation,
                           interleaved, transposed, limit)
    (ref * d_out.float().cpu()).sum().backward()
    close(out, ref, dtype, "output")
    for name, got, want in zip(("dx", "d_topk_weights", "d_gate_up_proj", "d_down_proj", "d_gate_up_bias",
                                "d_down_bias"), leaves, ref_leaves):
        close(got.grad, want.grad, dtype, name)
    sentinel = (ids < 0) | (ids >= E)
    assert torch.all(wts.grad[sentinel] == 0), "a sentinel slot's weight must get gradient 0"


@pytest.mark.parametrize("interleaved,transposed,bias", [(False, False, False), (True, True, True)],
                         ids=["deepseek_v4_layout", "interleaved_transposed_biased"])
def test_deepseek_v4_clamped_swiglu_matches_reference(interleaved, transposed, bias, device):
    """silu(min(g, l)) * clamp(u, -l, l): swiglu_clamped with act_alpha 1 and act_up_offset 0, output
    and every gradient against the torch transcription of DeepseekV4Experts._apply_gate."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    skip_unsupported(device, dtype)
    (d, n), T, E, K = widths(device), 41, 8, 2
    limit = 1.5 if dtype == torch.float32 else 7.0  # as test_matches_reference (bf16 H crosses limits)
    x, ids, wts, w1, w2, b1, b2 = make(T, d, n, E, K, "swiglu_clamped", transposed, bias, dtype, device,
                                       sentinels=True)
    out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2, activation="swiglu_clamped", act_alpha=1.0,
                             act_limit=limit, act_up_offset=0.0, interleaved=interleaved, transposed=transposed)
    d_out = torch.randn(T, d, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    (out.float() * d_out.float()).sum().backward()
    leaves = [t for t in (x, wts, w1, w2, b1, b2) if t is not None]
    ref_leaves = [t.detach().float().cpu().requires_grad_() for t in leaves]
    rx, rw, rw1, rw2, *rb = ref_leaves
    ref = routed_reference(rx, ids.cpu(), rw, rw1, rw2, rb[0] if bias else None, rb[1] if bias else None,
                           "swiglu_clamped", interleaved, transposed, limit, alpha=1.0, up_offset=0.0)
    (ref * d_out.float().cpu()).sum().backward()
    close(out, ref, dtype, "output")
    for name, got, want in zip(("dx", "d_topk_weights", "d_gate_up_proj", "d_down_proj", "d_gate_up_bias",
                                "d_down_bias"), leaves, ref_leaves):
        close(got.grad, want.grad, dtype, name)


def test_fp32_weights_with_bf16_storage():
    x, ids, wts, w1, w2, _, _ = make(20, 32, 16, 6, 2, "swiglu", False, False, torch.bfloat16, "cpu")
    w32 = wts.detach().float().requires_grad_()
    out = leanmoe.moe_routed(x, ids, w32, w1, w2)
    out.float().sum().backward()
    assert w32.grad.dtype == torch.float32 and out.dtype == torch.bfloat16


def test_no_tokens():
    x, ids, wts, w1, w2, b1, b2 = make(0, 32, 16, 6, 2, "gelu", False, True, torch.float32, "cpu")
    out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2, activation="gelu")
    assert out.shape == (0, 32)
    out.sum().backward()
    assert torch.all(w1.grad == 0) and torch.all(b2.grad == 0) and x.grad.shape == (0, 32)


def test_saves_only_the_spec_state():
    """docs/SPEC.md §3 with routing given: x, H, the gates and routing arrays; nothing of size T*K*d."""
    T, d, n, E, K = 64, 32, 16, 8, 2
    x, ids, wts, w1, w2, b1, b2 = make(T, d, n, E, K, "swiglu", False, True, torch.float32, "cpu")
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2)
    params = {t.data_ptr() for t in (x, w1, w2, b1, b2)}
    extra = [t for t in saved if t.data_ptr() not in params]
    R = T * K
    expected = R * 2 * n * 4 + R * 4 * 3 + (T + 1) * 4 + (E + 1) * 4 + T * K * 4
    assert sum(t.numel() * t.element_size() for t in extra) == expected


def test_errors_name_the_argument():
    x, ids, wts, w1, w2, _, _ = make(5, 32, 16, 6, 2, "swiglu", False, False, torch.float32, "cpu")
    with pytest.raises(ValueError, match="activation"):
        leanmoe.moe_routed(x, ids, wts, w1, w2, activation="tanh")
    with pytest.raises(ValueError, match="interleaved"):
        leanmoe.moe_routed(x, ids, wts, w1[:, :16], w2, activation="relu", interleaved=True)
    with pytest.raises(ValueError, match="topk_weights"):
        leanmoe.moe_routed(x, ids, wts[:, :1], w1, w2)
    with pytest.raises(ValueError, match="down_proj"):
        leanmoe.moe_routed(x, ids, wts, w1, w2[:, :, :8])
    for bad in (0.5, float("nan")):  # swiglu_clamped's up offset is 0 (DeepSeek-V4) or 1 (gpt-oss)
        with pytest.raises(ValueError, match=r"act_up_offset 0 \(DeepSeek-V4\) or 1 \(gpt-oss\)"):
            leanmoe.moe_routed(x, ids, wts, w1, w2, activation="swiglu_clamped", act_up_offset=bad)
    for alpha, limit in ((0.0, 25.0), (4.0, -1.0), (float("inf"), 25.0), (4.0, float("nan"))):
        with pytest.raises(ValueError, match=r"swiglu_softcapped needs finite caps cfg.act_alpha \(gate\) > 0"):
            leanmoe.moe_routed(x, ids, wts, w1, w2, activation="swiglu_softcapped", act_alpha=alpha, act_limit=limit)


def test_expert_activation_op_matches_torch():
    h = torch.randn(50, 24) * 4
    for a in ACTIVATIONS:
        for interleaved in ([False, True] if a in GATED_ACTIVATIONS else [False]):
            got = torch.ops.leanmoe.expert_activation(h, a, 1.702, 2.0, 1.0, interleaved)
            torch.testing.assert_close(got, torch_activation(a, h, interleaved, limit=2.0), rtol=1e-5, atol=1e-5)
    for interleaved in (False, True):  # DeepSeek-V4's
        got = torch.ops.leanmoe.expert_activation(h, "swiglu_clamped", 1.0, 2.0, 0.0, interleaved)
        want = torch_activation("swiglu_clamped", h, interleaved, alpha=1.0, limit=2.0, up_offset=0.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(bias, device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    d, n = widths(device)
    x, ids, wts, w1, w2, b1, b2 = make(24, d, n, 6, 2, "swiglu", False, bias, dtype, device, sentinels=True)
    fn = ("swiglu", 1.702, 7.0, 1.0, False, False, "storage")
    args = (x, ids.int(), wts, w1, w2, b1, b2, *fn)
    torch.library.opcheck(torch.ops.leanmoe.moe_routed_forward.default, args)
    with torch.no_grad():
        out, *saved = torch.ops.leanmoe.moe_routed_forward(*args)
    back = (torch.randn_like(out), x.detach(), w1.detach(), w2.detach(),
            None if b1 is None else b1.detach(), None if b2 is None else b2.detach(), *saved, *fn, wts.dtype)
    torch.library.opcheck(torch.ops.leanmoe.moe_routed_backward.default, back)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_matches_eager(backend, device):
    d, n = widths(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, ids, wts, w1, w2, _, _ = make(30, d, n, 6, 2, "swiglu", False, False, dtype, device, sentinels=True)
    router = torch.nn.Linear(d, 6, device=device, dtype=dtype)

    def step(inp):  # a model's own router feeding the routed experts
        probs = torch.softmax(router(inp).float(), dim=-1)
        top, idx = torch.topk(probs, 2, dim=-1)
        return leanmoe.moe_routed(inp, idx, top / top.sum(-1, keepdim=True), w1, w2).float().square().mean()

    loss = step(x)
    loss.backward()
    eager = [t.grad.clone() for t in (x, w1, w2, router.weight)]
    for t in (x, w1, w2, router.weight):
        t.grad = None
    loss_c = torch.compile(step, backend=backend, fullgraph=True)(x)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=0)
    for a, t in zip(eager, (x, w1, w2, router.weight)):
        torch.testing.assert_close(t.grad, a, rtol=1e-5, atol=1e-6) if dtype == torch.float32 else \
            torch.testing.assert_close(t.grad, a, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("update", ["torch", "leanmoe"])
@pytest.mark.parametrize("master", [False, True], ids=["plain", "master_weights"])
@pytest.mark.parametrize("bias", [False, True])
def test_in_backward_adamw_bitwise_over_5_steps(bias, master, update, device):
    """In-backward expert AdamW through moe_routed equals the standard path bit for bit (the biases
    are stepped in step() from .grad in both), with either update; with master_weights (bf16) the
    fp32 masters too."""
    dtype = torch.bfloat16 if device == "cuda" or master else torch.float32
    d, n = widths(device)
    runs = []
    for in_backward in (False, True):
        x, ids, wts, w1, w2, b1, b2 = make(40, d, n, 8, 2, "swiglu", False, bias, dtype, device, seed=5)
        params = [torch.nn.Parameter(t.detach()) for t in (w1, w2, b1, b2) if t is not None]
        runs.append((params, ExpertAdamW(params, lr=1e-2, weight_decay=0.1, in_backward=in_backward,
                                         master_weights=master, update=update)))
    for step in range(5):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(40, d, generator=g).to(dtype).to(device)
        ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(40)]).to(device)
        wts = (torch.rand(40, 2, generator=g) + 0.1).to(dtype).to(device)
        for params, opt in runs:
            b1, b2 = (params[2], params[3]) if bias else (None, None)
            leanmoe.moe_routed(x, ids, wts, params[0], params[1], b1, b2).float().square().sum().backward()
            opt.step()
            opt.zero_grad()
        for a, b in zip(runs[0][0], runs[1][0]):
            assert torch.equal(a, b), f"step {step}: differs"
            if master:
                assert torch.equal(runs[0][1].state[a]["master"], runs[1][1].state[b]["master"])
    runs[1][1].release()


@pytest.mark.parametrize("in_backward", [False, True])
def test_double_backward_raises_clearly(in_backward):
    x, ids, wts, w1, w2, b1, b2 = make(12, 32, 16, 6, 2, "swiglu", False, True, torch.float32, "cpu")
    opt = ExpertAdamW([w1, w2, b1, b2], in_backward=True) if in_backward else None
    out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2)
    gx, gw = torch.autograd.grad(out.square().sum(), (x, wts), create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        (gx.sum() + gw.sum()).backward()
    if opt is not None:
        opt.release()


def test_autocast_follows_like_f_linear(monkeypatch):
    """As leanmoe.moe: under torch.autocast(bfloat16) x, the fp32 weights and biases run as bf16
    copies (the routing weights stay fp32, which moe_routed takes), and the fp32 leaves get fp32
    gradients; an in-backward optimizer then takes the standard path with a warning."""
    x, ids, wts, w1, w2, b1, b2 = make(10, 32, 16, 6, 2, "swiglu", False, True, torch.float32, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2)
    assert out.dtype == torch.bfloat16
    want = leanmoe.moe_routed(x.detach().bfloat16(), ids, wts.detach(),
                              *(t.detach().bfloat16() for t in (w1, w2, b1, b2)))
    assert torch.equal(out, want)
    out.float().sum().backward()
    assert all(t.grad.dtype == torch.float32 for t in (x, wts, w1, b2))
    for t in (w1, w2, b1, b2):
        t.grad = None
    opt = ExpertAdamW([w1, w2, b1, b2], in_backward=True)
    monkeypatch.setattr(leanmoe.functional, "_warned", set())  # warned once per process
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning, match="standard path"):
        out = leanmoe.moe_routed(x, ids, wts, w1, w2, b1, b2)
    out.float().sum().backward()
    assert w1.grad is not None  # reaches .grad, step() applies it
    opt.release()


def test_stale_expert_grad_is_refused_before_anything_changes():
    x, ids, wts, w1, w2, _, _ = make(16, 32, 16, 6, 2, "swiglu", False, False, torch.float32, "cpu")
    leanmoe.moe_routed(x, ids, wts, w1, w2).sum().backward()  # before the optimizer existed
    opt = ExpertAdamW([w1, w2], lr=1e-2)
    before = w1.detach().clone()
    with pytest.raises(RuntimeError, match=r"has a \.grad .*zero_grad"):
        leanmoe.moe_routed(x, ids, wts, w1, w2)
    assert torch.equal(w1, before)
    opt.release()
