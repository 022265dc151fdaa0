"""leanmoe.hf.apply (the fused router in place of the whole block) on tiny transformers v5 OLMoE,
Qwen3-MoE, GraniteMoE and Mixtral models. (The experts implementation: test_hf_experts.py.)"""
import copy

import pytest
import torch

import leanmoe
import leanmoe.hf
from conftest import skip_unsupported
from leanmoe.optim import ExpertAdamW, dense_parameters, expert_parameters

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              max_position_embeddings=64, num_experts_per_tok=2, attn_implementation="eager")


def tiny(kind, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    d, n = (128, 64) if device == "cuda" else (64, 32)  # CUDA expert GEMMs: multiples of 64
    if kind == "olmoe":
        cfg = transformers.OlmoeConfig(hidden_size=d, intermediate_size=n, num_experts=8, **COMMON)
        model = transformers.OlmoeForCausalLM(cfg)
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(hidden_size=d, intermediate_size=2 * n, moe_intermediate_size=n,
                                          num_experts=8, norm_topk_prob=True, head_dim=16, **COMMON)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(hidden_size=d, intermediate_size=n, num_local_experts=8, **COMMON)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.GraniteMoeConfig(hidden_size=d, intermediate_size=n, num_local_experts=8, **COMMON)
        model = transformers.GraniteMoeForCausalLM(cfg)
    return model.to(dtype=dtype, device=device)


def batch(device, seed=0, B=2, S=16):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (B, S), generator=g).to(device)
    return dict(input_ids=ids, labels=ids)


KINDS = ["olmoe", "qwen3_moe", "granitemoe", "mixtral"]


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_matches_transformers(kind, dtype, device):
    """Loss and every gradient against the transformers implementation run in fp32 on the same
    weights (bf16 weights are exact in fp32).
    fp32 (CPU only): only summation orders differ: 1e-4 of the largest magnitude.
    bf16 (the CUDA storage type; the CPU backend takes it too): bf16 rounding through two decoder layers can
    move a token to another expert, so transformers' own bf16 run is measured against fp32 too,
    and leanmoe must be as close to fp32 as it: per gradient, cosine >= min(0.99, transformers
    bf16's cosine) - 0.01; loss within max(1e-2 relative, twice transformers bf16's error)."""
    skip_unsupported(device, dtype)
    model = tiny(kind, dtype=dtype, device=device)
    reference = copy.deepcopy(model).float()
    hf_bf16 = copy.deepcopy(model) if dtype == torch.bfloat16 else None
    b = batch(device)
    ref_loss = reference(**b).loss
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    assert leanmoe.hf.apply(model) == 2
    loss = model(**b).loss
    loss.backward()
    if dtype == torch.float32:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=0)
        for n, p in model.named_parameters():
            err = (p.grad - ref_grads[n]).abs().max() / ref_grads[n].abs().max().clamp_min(1e-8)
            assert err < 1e-4, f"{n}: relative error {err:.2e}"
    else:
        hf_loss = hf_bf16(**b).loss
        hf_loss.backward()
        hf_grads = dict(hf_bf16.named_parameters())
        loss_err, hf_loss_err = abs(loss.item() - ref_loss.item()), abs(hf_loss.item() - ref_loss.item())
        assert loss_err <= max(1e-2 * abs(ref_loss.item()), 2 * hf_loss_err), (loss_err, hf_loss_err)
        for n, p in model.named_parameters():
            ours, theirs = cosine(p.grad, ref_grads[n]), cosine(hf_grads[n].grad, ref_grads[n])
            assert ours >= min(0.99, theirs) - 0.01, f"{n}: cosine to fp32 {ours:.4f} (transformers bf16 {theirs:.4f})"
    assert leanmoe.hf.aux_loss(model).dim() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_apply_shares_weights_and_remove_restores(kind, device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = tiny(kind, dtype=dtype, device=device)
    b = batch(device)
    with torch.no_grad():
        before = model(**b).logits
    ptrs = [p.data_ptr() for p in model.parameters()]
    keys = list(model.state_dict())
    leanmoe.hf.apply(model)
    assert [p.data_ptr() for p in model.parameters()] == ptrs and list(model.state_dict()) == keys
    assert leanmoe.hf.is_applied(model)
    with torch.no_grad():
        during = model(**b).logits
    if dtype == torch.float32:
        torch.testing.assert_close(during, before, rtol=1e-4, atol=1e-5)
    else:  # bf16 logits through two layers (see test_matches_transformers): compare directions
        cos = torch.nn.functional.cosine_similarity(during.float().flatten(), before.float().flatten(), dim=0)
        assert cos > 0.99
    assert leanmoe.hf.remove(model) == 2 and not leanmoe.hf.is_applied(model)
    with torch.no_grad():
        after = model(**b).logits
    assert torch.equal(after, before)


def test_activation_checkpointing_under_either_name():
    """enable_activation_checkpointing calls transformers' current name where the model has it and
    the former one on older versions, non-reentrant either way."""
    calls = []

    class Old(torch.nn.Module):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("old", gradient_checkpointing_kwargs))

    class New(Old):
        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
            calls.append(("new", activation_checkpointing_kwargs))

    leanmoe.hf.enable_activation_checkpointing(New())
    leanmoe.hf.enable_activation_checkpointing(Old())
    assert calls == [("new", {"use_reentrant": False}), ("old", {"use_reentrant": False})]


@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_in_backward_bitwise_over_10_steps_olmoe(grad_ckpt, device):
    """In-backward expert AdamW vs the standard path on an HF OLMoE model: every parameter bitwise
    equal after each of 10 steps (dense AdamW with clip_grad_norm_ over dense parameters only).
    With HF gradient checkpointing each block's forward (leanmoe's op included) runs again inside
    backward, before that block's experts are updated, so the recomputation sees the same weights."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    standard = tiny("olmoe", dtype=dtype, device=device)
    inb = copy.deepcopy(standard)
    runs = []
    for model, in_backward in ((standard, False), (inb, True)):
        leanmoe.hf.apply(model)
        if grad_ckpt:
            leanmoe.hf.enable_activation_checkpointing(model)
            model.train()  # transformers checkpoints only in training mode
        experts = ExpertAdamW(expert_parameters(model), lr=1e-3, weight_decay=0.1, in_backward=in_backward)
        dense = torch.optim.AdamW(dense_parameters(model), lr=1e-3)
        runs.append((model, experts, dense))
    for step in range(10):
        for model, experts, dense in runs:
            b = batch(device, seed=step)
            loss = model(**b).loss + 0.01 * leanmoe.hf.aux_loss(model)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(dense_parameters(model), 1.0)
            experts.step()
            dense.step()
            experts.zero_grad()
            dense.zero_grad()
        for (na, pa), (nb, pb) in zip(standard.named_parameters(), inb.named_parameters()):
            assert torch.equal(pa, pb), f"step {step}: {na} differs"
    runs[1][1].release()
