"""The FP8 codes that leanmoe.MoE(precision="fp8") keeps of its expert weights, and how they stay
current (docs/DESIGN.md "The weights' codes given"; python/README.md "FP8"). transformers experts
modules under experts_implementation="leanmoe_fp8" keep them the same way (leanmoe.hf; "owners"
below are either).

A layer keeps, for gate_up_proj [E, 2n, d] and down_proj [E, d, n], four buffers each (not in
state_dict: they are a function of the weights): ``<weight>_fp8`` (e4m3 codes, the weight's shape),
``<weight>_fp8_scales`` [E, R/128, C/128], ``<weight>_fp8_t`` (the codes transposed, [E, C, R]) and
``<weight>_fp8_scales_t``, together the bf16 weights' bytes. The layer hands them to the operators
(cfg.fp8_weights_given), so no forward or backward quantizes a weight; leanmoe.optim.ExpertAdamW
rewrites them in its update pass (leanmoe::optim::update_tensor, the fused update of the C++
ExpertOptimizer::set_fp8_copy: no separate quantization per step).

Stale codes would be a silent wrong result (the CUDA backend reads them as they are), so before
each use the layer checks that each weight is the one its codes were written from: the same
storage (the storage itself, not only its address; dtype, device), the same version counter (torch
bumps it with every in-place op: load_state_dict, edits under torch.no_grad(), the foreach and
for-loop optimizers), the same code buffers, and no step of another torch optimizer over the weight
since (a global optimizer post-hook counts it in _WRITES: torch's fused Adam/AdamW kernels do not
bump the version counter). Otherwise the codes are written again (leanmoe::optim::write_fp8_copy).
Not seen: writes through ``weight.data`` (a tensor with its own version counter) or outside torch:
call ``layer.refresh_fp8_codes()`` after them.
"""
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from ._ops import FP8_BLOCK, ops

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")
CODE_BUFFERS = ("fp8", "fp8_scales", "fp8_t", "fp8_scales_t")
# A transformers experts module (leanmoe.hf) holds these in its __dict__ instead of leanmoe.MoE's
# attributes: its two weights' names (gate_up_proj or up_proj, down_proj), the precision of its
# last call (its experts implementation can change between calls) and whether it keeps codes.
HF_NAMES, HF_PRECISION, HF_KEEPS = "_leanmoe_fp8_names", "_leanmoe_precision", "_leanmoe_fp8_weight_codes"


def weight_names(owner):
    return owner.__dict__.get(HF_NAMES, EXPERT_WEIGHTS)


def _precision(owner):
    return owner.__dict__.get(HF_PRECISION) or owner.precision


def _keeps_codes(owner):
    keeps = owner.__dict__.get(HF_KEEPS)
    return owner.fp8_weight_codes if keeps is None else keeps

# expert weight of a precision="fp8" leanmoe.MoE -> (weakref to the layer, the weight's name).
_OWNERS = WeakIdKeyDictionary()
_generation = 0  # bumped whenever _OWNERS gains a weight (invalidates _OWNED_BY)
_OWNED_BY = weakref.WeakKeyDictionary()  # torch optimizer -> (signature, its weights in _OWNERS)
# expert weight -> its in-place writes torch's version counter misses (ExpertAdamW's update, torch's
# fused AdamW), part of every layer's stamp: a weight shared by several layers (tied) is registered
# to one, whose codes the update rewrites; the others see the count move and write theirs again.
_WRITES = WeakIdKeyDictionary()
_hook = None


def register(layer) -> None:
    """Records layer's expert weights as those of an FP8 layer (at construction and every eager
    forward, so deep copies and replaced parameters are found): ExpertAdamW steps them with the
    leanmoe update and rewrites their codes; another optimizer's step clears their stamps."""
    global _generation, _hook
    for name in weight_names(layer):
        p = getattr(layer, name)
        owner = _OWNERS.get(p)
        if owner is None or owner[0]() is not layer or owner[1] != name:
            _OWNERS[p] = (weakref.ref(layer), name)
            _generation += 1
    if _hook is None:
        _hook = register_optimizer_step_post_hook(_after_optimizer_step)


def _owner(p):
    entry = _OWNERS.get(p)
    layer = entry[0]() if entry is not None else None
    if layer is None or getattr(layer, entry[1], None) is not p:
        return None, None
    return layer, entry[1]


def update_kernel(p) -> str:
    """'leanmoe' for an expert weight of a precision="fp8" leanmoe.MoE (the fused update that writes
    its codes; the same arithmetic with and without codes kept, so both train alike, bit for bit),
    else 'torch' (torch.optim.AdamW(fused=True)'s kernel)."""
    layer, _ = _owner(p)
    return "leanmoe" if layer is not None and _precision(layer) == "fp8" else "torch"


def _applies(layer) -> bool:
    """Whether the layer keeps codes now: fp8 with fp8_weight_codes, bf16 contiguous weights with
    both matrix dims multiples of 128 (else the per-call path runs and states the rule it breaks)."""
    if _precision(layer) != "fp8" or not _keeps_codes(layer):
        return False
    for name in weight_names(layer):
        p = getattr(layer, name)
        if (p.dtype != torch.bfloat16 or p.dim() != 3 or p.shape[1] % FP8_BLOCK or p.shape[2] % FP8_BLOCK
                or not p.is_contiguous() or p.device.type not in ("cpu", "cuda")):
            return False
    return True


def _buffers(layer, name, p):
    """The weight's four code buffers, (re)allocated when missing or not matching the weight (after
    .to(), .half(), a new parameter); a reallocation makes the codes stale."""
    E, R, C = p.shape
    B = FP8_BLOCK
    shapes = ((E, R, C), (E, R // B, C // B), (E, C, R), (E, C // B, R // B))
    out = []
    for suffix, shape in zip(CODE_BUFFERS, shapes):
        key = f"{name}_{suffix}"
        b = getattr(layer, key, None)  # leanmoe.MoE's buffers; a transformers module's plain attributes
        dtype = torch.float8_e4m3fn if suffix in ("fp8", "fp8_t") else torch.float32
        if b is None or b.dtype != dtype or tuple(b.shape) != shape or b.device != p.device or not b.is_contiguous():
            b = torch.empty(shape, dtype=dtype, device=p.device)
            setattr(layer, key, b)
        out.append(b)
    return out


def free(owner) -> None:
    """Drops a transformers experts module's code tensors (plain attributes, unlike leanmoe.MoE's
    buffers) and what they were written from."""
    for name in weight_names(owner):
        for suffix in CODE_BUFFERS:
            owner.__dict__.pop(f"{name}_{suffix}", None)
    owner._fp8_stamps = Stamps()


class Stamps(dict):
    """An owner's stamps (weight name -> what its codes were written from, _stamp). They hold weak
    references, which cannot be pickled; a pickled or copied owner gets none, so its codes are
    written again at its first call."""

    def __reduce__(self):
        return Stamps, ()


def storage_identity(t):
    """The tensor's storage by identity: a weak reference (torch keeps one Python object per live
    storage, so the reference dies with it) and the data pointer. An address alone is not enough:
    a storage freed and another allocated at the same address (weights converted to float and back,
    code buffers reallocated after that) compared equal, and codes never written were used."""
    return weakref.ref(t.untyped_storage()), t.data_ptr()


def _stamp(p, buffers):
    # weakref equality: live references compare as their referents (the storage objects, by identity),
    # a dead one equals only itself, so a freed storage never matches a new one.
    return (storage_identity(p), p._version, _WRITES.get(p, 0), p.dtype, p.device,
            tuple(storage_identity(b) for b in buffers))


def _written(p):
    if p in _OWNERS:
        _WRITES[p] = _WRITES.get(p, 0) + 1


def _current(layer, name):
    """The weight's codes, written again first when they are not those of its current values."""
    p = getattr(layer, name)
    buffers = _buffers(layer, name, p)
    if layer._fp8_stamps.get(name) != _stamp(p, buffers):
        with torch.no_grad():
            ops.fp8_weight_codes_(p.detach(), buffers)
        layer._fp8_stamps[name] = _stamp(p, buffers)
    return buffers


def codes_for_call(layer):
    """The 8 tensors of fp8_weights for one eager call of the layer (current), or None: the layer
    keeps no codes, or under torch.compile (the checks read storage and version counters, which a
    traced graph cannot; compiled calls quantize the weights per call, the same bits). Registers
    the layer's weights first, codes kept or not, so that a deep copy's or a new Parameter's update
    is the fp8 layers' (update_kernel)."""
    if torch.compiler.is_compiling():
        return None
    register(layer)
    if not _applies(layer):
        return None
    return [b for name in weight_names(layer) for b in _current(layer, name)]


def refresh(layer) -> None:
    """Writes the codes of the layer's current weights now (after a write torch does not see)."""
    layer._fp8_stamps.clear()
    if _applies(layer):
        for name in weight_names(layer):
            _current(layer, name)


def codes_for_update(p):
    """The 4 code buffers ExpertAdamW's update of p rewrites, or None (p keeps no codes)."""
    layer, name = _owner(p)
    if layer is None or not _applies(layer):
        return None
    return _buffers(layer, name, p)


def updated(p, codes) -> None:
    """After ExpertAdamW updated p in place (which bumps no version counter): with `codes` (what
    codes_for_update gave) the update rewrote them, so they are current; without, they are stale,
    as are those of every other layer sharing p."""
    _written(p)
    layer, name = _owner(p)
    if layer is not None and codes is not None:
        layer._fp8_stamps[name] = _stamp(p, codes)


def _after_optimizer_step(optimizer, args, kwargs):
    """Global post-hook of every torch optimizer's step: the FP8 layers' weights it stepped have
    stale codes (ExpertAdamW excepted: it rewrites them in its pass)."""
    if not _OWNERS or getattr(optimizer, "_writes_fp8_codes", False):
        return
    groups = optimizer.param_groups
    signature = (_generation, tuple((id(g["params"]), len(g["params"])) for g in groups))
    cached = _OWNED_BY.get(optimizer)
    if cached is None or cached[0] != signature:
        cached = (signature, [p for g in groups for p in g["params"] if p in _OWNERS])
        _OWNED_BY[optimizer] = cached
    for p in cached[1]:
        if p.grad is not None:  # torch's optimizers skip a weight without .grad (in-backward updated)
            _written(p)
