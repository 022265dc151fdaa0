"""Pretraining a small Mixture-of-Experts language model with leanmoe, on real text, at a fixed
token budget: top-K routing, token rounding (nearest, up, down) and in-backward expert updates,
then a table and a plot of the validation losses.

    python examples/train_lm.py --out /tmp/lm                     # CPU: tiny model, about two minutes
    python examples/train_lm.py --device cuda --time-budget 300 --check-inbackward 250 \\
        --check-resume 50 --out results/                          # one H200 (scripts/device_train.sh)
    python examples/train_lm.py --plot-only results/              # the table and plot again, from the JSON

Data. The Python source files of the packages installed for this interpreter (its site-packages:
torch, transformers, numpy, ...; leanmoe's own files excluded): real code that nobody here wrote,
with no download. Each file goes to validation when a hash of its path below site-packages falls
in the lowest --val-permille of the range, else to training, so no file is in both; a training
file whose content equals a validation file (vendored copies) is dropped. Files are taken in hash
order up to --train-mb / --val-mb, a sample spread over all packages.

Tokeniser: a byte-level BPE trained with the `tokenizers` library on the first --bpe-sample-mb of
the training split (--vocab tokens: 256 bytes, one end-of-file token, the rest merges; no
pretrained vocabulary). Why not raw bytes (--tokenizer bytes): Python source takes about
3.4 bytes per token under such a BPE of 8192 tokens (indentation runs, keywords and common names
become single tokens), so at the same token budget and sequence length the model reads 3.4x more
code and sees 3.4x more context per sequence; the embedding and output layer it costs (8192 x d)
are small next to the experts. Raw bytes remain the fallback that needs no trained tokeniser.

Model: a decoder-only transformer, pre-norm (RMSNorm), rotary position embeddings, causal
attention through torch's scaled_dot_product_attention, and a leanmoe.MoE layer (SwiGLU experts,
softmax-then-top-K router, top-K gates renormalised) in every block; the output layer shares the
embedding matrix. Parameters in bf16 on the GPU (fp32 on the CPU). Loss: cross-entropy +
--aux-coef x the load-balancing loss + --z-coef x the router z-loss (both averaged over layers).
Optimiser: leanmoe.optim.ExpertAdamW for the expert tensors, torch AdamW for the rest, one cosine
schedule with linear warm-up; the dense gradients are clipped to a global norm, the expert
gradients are not (docs/SPEC.md §6: with in-backward updates they are applied before the norm is known).

Runs (--runs), each from the same initialisation over the same batches (batch i is a function of
--seed and i alone):
  topk          top-K routing
  in-backward   top-K, expert tensors updated inside backward (Sonar-MoE)
  tr-nearest    token rounding (docs/SPEC.md §5), each expert's count rounded to the nearest tile multiple
  tr-up, tr-down  rounded up / down
  fp8           top-K, the expert GEMMs on e4m3 operands with block scales (leanmoe.MoE precision="fp8":
                the layer keeps its weights' FP8 codes, ExpertAdamW's update rewrites them; d and n
                multiples of 128: not at the cpu preset; not in the default --runs)
Token rounding is a training-time routing: validation always routes with plain top-K (SonicMoE).
Each run logs train loss every step, validation loss every --eval-every steps, tokens/s, step time
(median over the timed steps: a step is forward + backward + optimizer, synchronised) and peak
memory over the timed steps, and writes run_<name>.json; results.md and val_loss.png are made
from those files after every run. At each validation point the training step also records what
routing did (leanmoe.RouterStats over the layers: load spread, pairs token rounding dropped and
added; that step is not timed); a token-rounding run is validated once more at the end with its
own routing (how much of its gap is the train/eval routing mismatch), and results.md says at what
token count top-K reached each token-rounding run's final loss.

Determinism: torch's deterministic algorithms are switched on (flash attention's backward then
runs its deterministic variant), so a run is a function of its seed and flags on one machine.
Checks (exit status 1 when one fails):
  --check-inbackward N  the in-backward run trains beside a standard twin for its first N steps,
                        same batches; all parameters compared bitwise after every step, and the
                        optimizer states after step N
  --check-resume N      the first run saves a checkpoint N steps before its end; a fresh model and
                        optimizers loaded from that file train the last N steps again; final
                        parameters, optimizer state and the N train losses must be bitwise equal
--resume CKPT continues a run from a checkpoint written with --save-every (model, optimizers,
schedule, step, tokeniser and the run's log so far are in the file).
"""
import argparse
import dataclasses
import datetime
import gc
import hashlib
import json
import math
import os
import site
import statistics
import subprocess
import sys
import sysconfig
import time

# cuBLAS reproducibility (required by torch's deterministic mode); must precede cuBLAS's first use.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import leanmoe  # noqa: E402
from leanmoe.optim import expert_parameters  # noqa: E402
from train_common import MoEOptimizers, peak_memory_gib, reset_peak_memory  # noqa: E402

EOT = "<|endoftext|>"
CHECKPOINT_FORMAT = "leanmoe-train_lm-1"
TOKEN_ROUNDING_BAR = 0.02  # nats: token rounding's final validation loss against top-K's (issue 15)
FP8_BAR = 0.02  # nats: the FP8 run's final validation loss against top-K's in bf16 (issue 16)
EVAL_ROUTING = "topk"  # validation routes with plain top-K in every run (docs/SPEC.md §5: rounding is for training)

# Model and data sizes. "h200": 8 layers of fine-grained experts (SonicMoE's spirit: E 64, K 8,
# n 256 = d/3), 32 sequences of 1024 tokens per step (T = 32768 routed tokens per layer).
PRESETS = {
    "cpu": dict(layers=2, d=64, heads=4, n=32, experts=8, topk=2, vocab=1024, seq=64, batch=8, tile=16,
                lr=3e-3, train_mb=1.5, val_mb=0.25, bpe_sample_mb=1.0, val_tokens=8192),
    "h200": dict(layers=8, d=768, heads=12, n=256, experts=64, topk=8, vocab=8192, seq=1024, batch=32, tile=128,
                 lr=1e-3, train_mb=120.0, val_mb=4.0, bpe_sample_mb=8.0, val_tokens=524288),
}


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    label: str
    routing: str = "topk"
    rounding_mode: str = "nearest"
    in_backward: bool = False
    precision: str = "storage"  # leanmoe.MoE's expert GEMMs: the parameters' dtype, or "fp8" (e4m3, block scales)


RUNS = {r.name: r for r in [
    Run("topk", "top-K"),
    Run("in-backward", "top-K, in-backward expert updates", in_backward=True),
    Run("tr-nearest", "token rounding, nearest", "token_rounding", "nearest"),
    Run("tr-up", "token rounding, up", "token_rounding", "up"),
    Run("tr-down", "token rounding, down", "token_rounding", "down"),
    Run("fp8", "top-K, FP8 expert GEMMs", precision="fp8"),
]}
# fp8 needs d and n multiples of 128 (the h200 preset's; not the cpu preset's): asked for by name.
DEFAULT_RUNS = [name for name in RUNS if name != "fp8"]


# ---------------------------------------------------------------------------------------------
# Data: site-packages' Python files, split by path hash, BPE-tokenised
# ---------------------------------------------------------------------------------------------
def site_packages():
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    seen, roots = set(), []
    for p in paths:
        real = os.path.realpath(p)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            roots.append(real)
    return roots


def path_hash(rel):
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")


def python_files():
    """{path below site-packages: absolute path} of every .py file (leanmoe's own excluded)."""
    files = {}
    for root in site_packages():
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            if rel_dir.split(os.sep)[0] == "leanmoe":
                dirnames[:] = []
                continue
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(".py"):
                    files.setdefault(os.path.normpath(os.path.join(rel_dir, f)), os.path.join(dirpath, f))
    return files


def read_split(paths, max_bytes, seen_content, max_file_bytes=512 * 1024):
    """Reads files in order until max_bytes of text; skips unreadable, empty, huge (generated
    tables) and duplicate files (by content)."""
    texts, names, total = [], [], 0
    for rel, path in paths:
        if total >= max_bytes:
            break
        try:
            if os.path.getsize(path) > max_file_bytes:
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if not text.strip() or digest in seen_content:
            continue
        seen_content.add(digest)
        texts.append(text)
        names.append(rel)
        total += len(text.encode())
    return texts, names, total


def train_bpe(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


class ByteTokenizer:
    """Raw UTF-8 bytes, 256 = end of file."""

    def get_vocab_size(self):
        return 257

    def token_to_id(self, token):
        return 256 if token == EOT else None

    def encode_ids(self, texts):
        return [np.frombuffer(t.encode(), dtype=np.uint8).astype(np.int32) for t in texts]


def encode(tok, texts, chunk=512):
    """One int32 array: every text's tokens followed by the end-of-file token."""
    eot = np.array([tok.token_to_id(EOT)], dtype=np.int32)
    parts = []
    for i in range(0, len(texts), chunk):
        batch = texts[i:i + chunk]
        if isinstance(tok, ByteTokenizer):
            ids = tok.encode_ids(batch)
        else:
            enc = tok.encode_batch_fast(batch) if hasattr(tok, "encode_batch_fast") else tok.encode_batch(batch)
            ids = [np.asarray(e.ids, dtype=np.int32) for e in enc]
        for a in ids:
            parts += [a, eot]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def build_corpus(args, tokenizer_json=None):
    """Reads, splits and tokenises the corpus. tokenizer_json: a tokeniser to reuse (resume)."""
    t0 = time.perf_counter()
    files = python_files()
    if not files:
        raise SystemExit(f"train_lm: no Python files found under site-packages ({site_packages()})")
    order = sorted(files, key=path_hash)
    is_val = [path_hash(rel) % 1000 < args.val_permille for rel in order]
    seen = set()
    val_texts, val_names, val_bytes = read_split([(r, files[r]) for r, v in zip(order, is_val) if v],
                                                 args.val_mb * 1e6, seen)
    train_texts, train_names, train_bytes = read_split([(r, files[r]) for r, v in zip(order, is_val) if not v],
                                                       args.train_mb * 1e6, seen)
    if not val_texts or not train_texts:
        raise SystemExit("train_lm: the corpus is too small for a train and a validation split")
    t1 = time.perf_counter()
    if args.tokenizer == "bytes":
        tok, tok_json = ByteTokenizer(), None
    elif tokenizer_json is not None:
        from tokenizers import Tokenizer
        tok, tok_json = Tokenizer.from_str(tokenizer_json), tokenizer_json
    else:
        sample, size = [], 0
        for t in train_texts:
            if size >= args.bpe_sample_mb * 1e6:
                break
            sample.append(t)
            size += len(t.encode())
        tok = train_bpe(sample, args.vocab)
        tok_json = tok.to_str()
    t2 = time.perf_counter()
    train_ids, val_ids = encode(tok, train_texts), encode(tok, val_texts)
    t3 = time.perf_counter()
    packages = {n.split(os.sep)[0] for n in train_names + val_names}
    info = dict(files_found=len(files), packages=len(packages), train_files=len(train_names),
                val_files=len(val_names), train_bytes=train_bytes, val_bytes=val_bytes,
                train_tokens=int(train_ids.size), val_tokens_total=int(val_ids.size),
                bytes_per_token=round(train_bytes / max(1, train_ids.size), 3), tokenizer=args.tokenizer,
                vocab=tok.get_vocab_size(), read_s=round(t1 - t0, 1), tokenizer_s=round(t2 - t1, 1),
                encode_s=round(t3 - t2, 1),
                digest=hashlib.sha256(train_ids.tobytes() + b"|" + val_ids.tobytes()).hexdigest()[:16])
    return train_ids, val_ids, tok_json, info


class Batches:
    """Training batch i: --batch windows of seq+1 tokens at offsets drawn from a generator seeded
    with (seed, i), so any step's batch is known without replaying the ones before (resume).
    Validation: the first val_tokens of the validation split in consecutive windows, always the same."""

    def __init__(self, train_ids, val_ids, seq, batch, seed, device, val_tokens):
        if train_ids.size < seq + 2:
            raise SystemExit(f"train_lm: the training split has {train_ids.size} tokens, fewer than --seq + 2")
        self.train = torch.from_numpy(train_ids).to(device)
        self.seq, self.batch, self.seed, self.device = seq, batch, seed, device
        windows = min(max(1, val_tokens // seq), (val_ids.size - 1) // seq)
        if windows < 1:
            raise SystemExit("train_lm: the validation split is shorter than one sequence; raise --val-mb")
        starts = torch.arange(windows) * seq
        val = torch.from_numpy(val_ids)[starts[:, None] + torch.arange(seq + 1)].to(device).long()
        self.val = [(v[:, :-1], v[:, 1:]) for v in val.split(batch)]
        self.val_tokens = windows * seq

    def get(self, step):
        g = torch.Generator().manual_seed(self.seed * 2**32 + step)
        starts = torch.randint(0, self.train.numel() - self.seq - 1, (self.batch,), generator=g)
        w = self.train[(starts[:, None] + torch.arange(self.seq + 1)).to(self.device)].long()
        return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
class Rotary(nn.Module):
    def __init__(self, head_dim, max_seq, base=10000.0):
        super().__init__()
        inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):  # [B, H, S, head_dim], halves paired (GPT-NeoX layout), in x's dtype (as HF Llama)
        cos, sin = self.cos[:x.shape[-2]].to(x.dtype), self.sin[:x.shape[-2]].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, d, heads, factory):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False, **factory)
        self.proj = nn.Linear(d, d, bias=False, **factory)

    def forward(self, x, rotary):
        B, S, d = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(B, S, d))


class Block(nn.Module):
    def __init__(self, cfg, run, factory):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d, eps=1e-6, **factory)
        self.attn = Attention(cfg.d, cfg.heads, factory)
        self.moe_norm = nn.RMSNorm(cfg.d, eps=1e-6, **factory)
        self.moe = leanmoe.MoE(cfg.d, cfg.n, cfg.experts, cfg.topk, router="softmax_then_topk", norm_topk_prob=True,
                               routing=run.routing, tile=cfg.tile, rounding_mode=run.rounding_mode,
                               inference_routing=EVAL_ROUTING, precision=run.precision, **factory)

    def forward(self, x, rotary):
        x = x + self.attn(self.attn_norm(x), rotary)
        out = self.moe(self.moe_norm(x))
        self.stats = out.stats if self.moe.return_stats else None
        return x + out.output, out.aux_loss, out.z_loss


class MoELM(nn.Module):
    def __init__(self, cfg, run, device, dtype):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.embed = nn.Embedding(cfg.vocab_padded, cfg.d, **factory)
        self.blocks = nn.ModuleList([Block(cfg, run, factory) for _ in range(cfg.layers)])
        self.norm = nn.RMSNorm(cfg.d, eps=1e-6, **factory)
        self.rotary = Rotary(cfg.d // cfg.heads, cfg.seq).to(device)
        # GPT-2's init: N(0, 0.02) for the dense matrices, residual-branch outputs (attention
        # projection, expert down-projection) scaled by 1/sqrt(2 * layers); leanmoe.MoE's own init
        # (N(0, 1/fan_in)) for the router and the experts.
        with torch.no_grad():
            residual_scale = 1 / math.sqrt(2 * cfg.layers)
            self.embed.weight.normal_(0, 0.02)
            for b in self.blocks:
                b.attn.qkv.weight.normal_(0, 0.02)
                b.attn.proj.weight.normal_(0, 0.02 * residual_scale)
                b.moe.down_proj.mul_(residual_scale)

    def forward(self, ids, targets):
        h = self.embed(ids)
        aux = z = 0.0
        for b in self.blocks:
            h, a, zl = b(h, self.rotary)
            aux, z = aux + a, z + zl
        logits = F.linear(self.norm(h), self.embed.weight)  # tied output layer
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return loss, aux / len(self.blocks), z / len(self.blocks)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    layers: int
    d: int
    heads: int
    n: int
    experts: int
    topk: int
    vocab: int
    seq: int
    tile: int

    @property
    def vocab_padded(self):  # a multiple of 64 keeps the output GEMM on fast tiles
        return -(-self.vocab // 64) * 64


def parameter_counts(model, cfg):
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for p in expert_parameters(model))
    active = total - experts + experts * cfg.topk // cfg.experts
    return dict(total=total, experts=experts, active_per_token=active)


def cosine_schedule(warmup, total, min_ratio):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


class Trainer:
    """One model with its optimizers; step() is one training step."""

    def __init__(self, cfg, run, args, device, dtype):
        torch.manual_seed(args.seed)  # the same initialisation for every run
        self.cfg, self.run, self.args, self.device = cfg, run, args, device
        self.model = MoELM(cfg, run, device, dtype)
        self.opt = MoEOptimizers(self.model, args.lr, cosine_schedule(args.warmup, args.steps, args.min_lr_ratio),
                                 in_backward=run.in_backward, weight_decay=args.weight_decay, betas=(0.9, 0.95),
                                 clip=args.clip, fused=device == "cuda")

    def step(self, x, y, routing_stats=False):
        """One training step; with routing_stats also what routing did in each layer (routing_summary)."""
        for b in self.model.blocks:
            b.moe.return_stats = routing_stats
        loss, aux, z = self.model(x, y)
        (loss + self.args.aux_coef * aux + self.args.z_coef * z).backward()
        norm = self.opt.step()
        stats = routing_summary([b.stats for b in self.model.blocks], self.cfg) if routing_stats else None
        return loss.detach(), aux.detach(), norm, stats

    @torch.no_grad()
    def evaluate(self, batches, routing=EVAL_ROUTING, precision=None):
        """Mean validation loss per token. In eval mode leanmoe.MoE routes with its inference_routing:
        `routing` (plain top-K unless asked), whatever the run trains with; its expert GEMMs in the
        run's precision unless `precision` is given."""
        self.model.eval()
        saved = [(b.moe.inference_routing, b.moe.precision, b.moe.fp8_weight_codes) for b in self.model.blocks]
        for b in self.model.blocks:
            b.moe.inference_routing = routing
            if precision:  # weights quantized per call (a layer built in bf16 keeps no codes): the same bits
                b.moe.precision, b.moe.fp8_weight_codes = precision, False
        try:
            losses = [self.model(x, y)[0] for x, y in batches]
        finally:
            self.model.train()
            for b, (r, p, c) in zip(self.model.blocks, saved):
                b.moe.inference_routing, b.moe.precision, b.moe.fp8_weight_codes = r, p, c
        return torch.stack(losses).mean().item()

    def state_dict(self):
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optim"])

    def release(self):
        self.opt.release()


def routing_summary(layer_stats, cfg):
    """What routing did in one step, over the layers (leanmoe.RouterStats of each): the mean top-K
    rows per expert (T*K/E) against the tile, how unequal the experts' loads are, and the share of
    the T*K top-K pairs that token rounding dropped and added. Token rounding moves each expert's
    count by less than a tile, so the perturbation it makes is about tile/2 / (T*K/E) per pair."""
    f = torch.stack([s.topk_counts for s in layer_stats]).double()  # [layers, E]
    r = torch.stack([s.expert_rows for s in layer_stats]).double()
    pairs = layer_stats[0].tokens * cfg.topk
    dropped = torch.stack([s.dropped_pairs for s in layer_stats]).double() / pairs
    added = torch.stack([s.added_pairs for s in layer_stats]).double() / pairs
    empty = torch.stack([s.tokens_without_expert for s in layer_stats]).double() / layer_stats[0].tokens
    return dict(rows_per_expert=pairs / cfg.experts, tile=cfg.tile,
                load_cv=(f.std(dim=1) / f.mean(dim=1)).mean().item(),  # coefficient of variation of f_e
                f_min=int(f.min().item()), f_max=int(f.max().item()),
                experts_below_half_tile=(f < cfg.tile / 2).sum(dim=1).double().mean().item(),
                experts_without_rows=(r == 0).sum(dim=1).double().mean().item(),
                dropped=dropped.mean().item(), added=added.mean().item(),
                dropped_max=dropped.max().item(), added_max=added.max().item(),
                tokens_without_expert=empty.mean().item())


def digest(tensors):
    """sha256 of the tensors' bytes, in order: equal digests mean bitwise equal tensors."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def optimizer_tensors(opt):
    out = []
    for o in (opt.experts, opt.dense):
        for group in o.param_groups:
            for p in group["params"]:
                state = o.state.get(p, {})
                out += [state[k] for k in ("step", "exp_avg", "exp_avg_sq") if k in state]
    return out


def first_difference(a, b):
    """Name of the first parameter that differs bitwise between two models, or None."""
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        if not torch.equal(pa, pb):
            return name
    return None


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def free_memory(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------
def new_record(run, args, cfg, meta):
    return dict(name=run.name, label=run.label, routing=run.routing,
                rounding_mode=run.rounding_mode if run.routing == "token_rounding" else None,
                eval_routing=EVAL_ROUTING, in_backward=run.in_backward, precision=run.precision, steps=args.steps,
                tokens_per_step=args.batch * cfg.seq, train_loss=[], aux_loss=[], grad_norm=[], val=[],
                step_ms=[], checks={}, meta=meta)


class TwinCheck:
    """The in-backward check: a standard twin (same initialisation, ExpertAdamW(in_backward=False))
    takes the same batches for the first `steps` steps; after each, every parameter must be
    bitwise equal, and after the last also the optimizer state."""

    def __init__(self, trainer, steps):
        run = dataclasses.replace(trainer.run, in_backward=False)
        self.twin = Trainer(trainer.cfg, run, trainer.args, trainer.device, trainer.args.dtype)
        self.result = dict(requested=steps, steps=0, passed=None, first_difference=None)
        self._compare(trainer, 0, steps == 0)

    def step(self, x, y):
        if self.twin is not None:
            self.twin.step(x, y)

    def after_step(self, trainer, done):
        if self.twin is not None:
            self._compare(trainer, done, done == self.result["requested"])

    def _compare(self, trainer, done, last):
        diff = first_difference(trainer.model, self.twin.model)
        if diff is None and last:
            pairs = zip(optimizer_tensors(trainer.opt), optimizer_tensors(self.twin.opt))
            if not all(torch.equal(a, b) for a, b in pairs):
                diff = "optimizer state"
        self.result["steps"] = done
        if diff is None and not last:
            return
        self.result.update(passed=diff is None, first_difference=None if diff is None else [done, diff])
        print(f"  [{trainer.run.name}] in-backward vs standard twin: "
              + (f"bitwise equal after every one of {done} steps" if diff is None
                 else f"DIFFER after {done} steps (first: {diff})"), flush=True)
        self.twin.release()
        self.twin = None
        free_memory(trainer.device)


def train_run(run, args, cfg, data, tok_json, meta, *, trainer=None, record=None, start=0, twin_steps=0,
              save_at=(), quiet=False):
    """Trains `run` from step `start` to args.steps; returns the trainer and the run's record.
    twin_steps: the in-backward check over that many steps (TwinCheck)."""
    dev = args.device
    trainer = trainer or Trainer(cfg, run, args, dev, args.dtype)
    record = record or new_record(run, args, cfg, meta)
    record.setdefault("params", parameter_counts(trainer.model, cfg))
    twin = TwinCheck(trainer, twin_steps) if twin_steps else None
    if twin is not None:
        record["checks"]["in_backward_bitwise"] = twin.result
    time_from = max(start, args.time_from)
    wall0 = time.perf_counter()
    for step in range(start, args.steps):
        if step == time_from:
            reset_peak_memory(dev)
        if step in save_at:
            save_checkpoint(checkpoint_path(args, run.name, step), trainer, step, record, tok_json, args)
        if args.eval_every and step % args.eval_every == 0:
            record["val"].append([step, step * record["tokens_per_step"], trainer.evaluate(data.val)])
        x, y = data.get(step)
        if twin is not None:
            twin.step(x, y)
        sync(dev)
        t0 = time.perf_counter()
        stats_step = bool(args.eval_every) and step % args.eval_every == 0
        loss, aux, norm, stats = trainer.step(x, y, routing_stats=stats_step)
        loss = loss.item()
        sync(dev)
        dt = time.perf_counter() - t0
        if step >= time_from and not stats_step:  # a step that reads routing statistics is not timed
            record["step_ms"].append(dt * 1e3)
        if stats is not None:
            record.setdefault("routing_stats", []).append([step, stats])
        aux, norm = aux.item(), norm.item()
        record["train_loss"].append(loss)
        record["aux_loss"].append(aux)
        record["grad_norm"].append(norm)
        if not math.isfinite(loss):  # the other runs still go ahead
            print(f"  [{run.name}] loss {loss} at step {step}: run stopped", flush=True)
            record["diverged_at"] = step
            break
        if twin is not None:
            twin.after_step(trainer, step + 1)
        if not quiet and (step % args.log_every == 0 or step == args.steps - 1):
            ms = statistics.median(record["step_ms"][-args.log_every:] or [dt * 1e3])
            val = record["val"][-1][2] if record["val"] else float("nan")
            print(f"  [{run.name}] step {step:5d}/{args.steps}  loss {loss:.4f}  val {val:.4f}  "
                  f"lr {trainer.opt.lr:.2e}  |g| {norm:.2f}  aux {aux:.3f}  "
                  f"{record['tokens_per_step'] / ms * 1e3:,.0f} tok/s  {ms:.1f} ms/step  "
                  f"peak {peak_memory_gib(dev):.2f} GiB  eta {(args.steps - step - 1) * ms / 1e3:.0f} s", flush=True)
    if args.eval_every and "diverged_at" not in record:
        record["val"].append([args.steps, args.steps * record["tokens_per_step"], trainer.evaluate(data.val)])
        if run.routing != EVAL_ROUTING:  # the same model validated with its training routing: how much of
            # the gap to top-K is the train/eval routing mismatch rather than a worse model
            record["final_val_loss_train_routing"] = trainer.evaluate(data.val, run.routing)
        if "fp8" in args.runs:  # beside an fp8 run, every model validated in the other precision too: is a
            # difference in the trained weights, or in the GEMMs that evaluate them?
            other = "storage" if run.precision == "fp8" else "fp8"
            record["final_val_loss_other_precision"] = [other, trainer.evaluate(data.val, precision=other)]
    times = record["step_ms"]
    record.update(
        final_val_loss=record["val"][-1][2] if record["val"] and "diverged_at" not in record else None,
        tokens=args.steps * record["tokens_per_step"],
        timed_steps=len(times),
        step_ms_median=statistics.median(times) if times else None,
        tokens_per_s=record["tokens_per_step"] / statistics.median(times) * 1e3 if times else None,
        peak_gib=peak_memory_gib(dev),
        wall_s=record.get("wall_s", 0.0) + time.perf_counter() - wall0,
        param_digest=digest(trainer.model.parameters()),
        optimizer_digest=digest(optimizer_tensors(trainer.opt)))
    return trainer, record


def checkpoint_path(args, name, step):
    return os.path.join(args.ckpt_dir, f"{name}-step{step}.pt")


def save_checkpoint(path, trainer, next_step, record, tok_json, args):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    saved_args = {k: v for k, v in vars(args).items() if k != "dtype"}  # plain values only
    torch.save({"format": CHECKPOINT_FORMAT, "next_step": next_step, "run": dataclasses.asdict(trainer.run),
                "args": saved_args, "tokenizer": tok_json, **trainer.state_dict(), "record": record}, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous checkpoint intact


def read_checkpoint(path):
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError) as e:
        raise SystemExit(f"train_lm: --resume {path}: cannot read it ({e})")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"train_lm: --resume {path}: not a train_lm checkpoint")
    return ckpt


def trainer_from_checkpoint(ckpt, args, cfg, meta):
    """A fresh model and optimizers with the checkpoint's state; returns (trainer, record, next step)."""
    trainer = Trainer(cfg, Run(**ckpt["run"]), args, args.device, args.dtype)
    trainer.load_state_dict(ckpt)
    record = ckpt["record"]
    record["meta"] = meta
    return trainer, record, ckpt["next_step"]


def check_resume(run, args, cfg, data, tok_json, meta, done, resume_step):
    """Loads the checkpoint saved at resume_step into a fresh model and optimizers, trains to the
    end and compares with the uninterrupted run `done`."""
    path = checkpoint_path(args, run.name, resume_step)
    trainer, record, start = trainer_from_checkpoint(read_checkpoint(path), args, cfg, meta)
    trainer, resumed = train_run(run, args, cfg, data, tok_json, meta, trainer=trainer, record=record, start=start,
                                 quiet=True)
    trainer.release()
    result = dict(resumed_at=start, steps_after_resume=args.steps - start,
                  params_equal=resumed["param_digest"] == done["param_digest"],
                  optimizer_state_equal=resumed["optimizer_digest"] == done["optimizer_digest"],
                  train_losses_equal=resumed["train_loss"][start:] == done["train_loss"][start:],
                  checkpoint_bytes=os.path.getsize(path))
    result["passed"] = result["params_equal"] and result["optimizer_state_equal"] and result["train_losses_equal"]
    print(f"  [{run.name}] resumed at step {start} from {path}: "
          f"{'bitwise equal' if result['passed'] else 'DIFFERS'} after {args.steps} steps ({result})", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Report: results.md and val_loss.png from the run_<name>.json files
# ---------------------------------------------------------------------------------------------
def load_records(out):
    records = []
    for name in RUNS:
        path = os.path.join(out, f"run_{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                records.append(json.load(f))
    return records


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def difference(r, base, key):
    """r[key] - base[key], or None where either is missing."""
    if base is None or r.get(key) is None or base.get(key) is None:
        return None
    return r[key] - base[key]


def topk_tokens_to_reach(base, loss):
    """Tokens the top-K run needed to reach validation loss `loss` (linear between its validation
    points; None if it never got there). A routing whose final loss top-K reached at a share s of the
    budget costs 1 - s of the tokens: compare that with its step-time gain. Read it with care while
    the curve is steep (a fixed loss gap is then few tokens) or flat (many)."""
    pts = base["val"]
    if loss is None or not pts:
        return None
    for (_, n0, l0), (_, n1, l1) in zip(pts, pts[1:]):
        if l1 <= loss <= l0 and l0 > l1:
            return n0 + (l0 - loss) / (l0 - l1) * (n1 - n0)
    return pts[0][1] if loss >= pts[0][2] else None


def render_table(records):
    meta = records[0]["meta"]
    m, d, a = meta["model"], meta["data"], meta["train"]
    base = next((r for r in records if r["name"] == "topk"), None)
    p = records[0]["params"]
    lines = [
        "# train_lm: a small MoE language model trained with leanmoe",
        "",
        f"- command: `{meta['command']}`",
        f"- commit: {meta['commit']}",
        f"- date: {meta['date']}; device: {meta['device_name']}; torch {meta['torch']}, leanmoe {meta['leanmoe']}",
        f"- data: Python files of site-packages ({d['files_found']} found): train {d['train_files']} files "
        f"({d['train_bytes'] / 1e6:.1f} MB, {d['train_tokens'] / 1e6:.2f} M tokens), validation {d['val_files']} files "
        f"({d['val_bytes'] / 1e6:.1f} MB; {meta['val_tokens'] / 1e3:.0f} k tokens evaluated), split by path hash; "
        f"{d['packages']} packages",
        f"- tokeniser: {d['tokenizer']}" + (f" (byte-level BPE trained here, {d['vocab']} tokens, "
                                             f"{d['bytes_per_token']} bytes per token)" if d["tokenizer"] == "bpe"
                                            else ""),
        f"- model: {m['layers']} layers, d {m['d']}, {m['heads']} heads, RoPE, RMSNorm; leanmoe.MoE in every layer: "
        f"E {m['experts']}, K {m['topk']}, n {m['n']} (SwiGLU), tile {m['tile']}; vocab {m['vocab']}, tied output; "
        f"{p['total'] / 1e6:.1f} M parameters ({p['experts'] / 1e6:.1f} M in experts, "
        f"{p['active_per_token'] / 1e6:.1f} M active per token); {meta['dtype']} parameters",
        f"- training: {a['steps']} steps x {a['batch']} x {m['seq']} tokens = {a['tokens'] / 1e6:.2f} M tokens per "
        f"run; "
        f"AdamW (0.9, 0.95), lr {a['lr']}, warm-up {a['warmup']} steps, cosine to {a['min_lr_ratio']} x, "
        f"weight decay {a['weight_decay']}, dense gradients clipped to {a['clip']} (experts unclipped), "
        f"aux coef {a['aux_coef']}, z coef {a['z_coef']}, seed {a['seed']}"
        + (f"; step count from --time-budget {a['time_budget']} s (calibrated step {a['calibrated_step_ms']:.1f} ms)"
           if a.get("calibrated_step_ms") else ""),
        f"- validation with plain top-K routing for every run; step time = median over steps "
        f"{a['time_from']}..{a['steps'] - 1} (forward + backward + optimizer, synchronised), "
        f"peak = {'max allocated' if meta['device'] == 'cuda' else 'process max RSS'} over those steps",
        "",
        "| run | trains with | final val loss | Δ vs top-K | tokens/s | step ms | step vs top-K | peak GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        dv = difference(r, base, "final_val_loss")
        ratio = None if difference(r, base, "step_ms_median") is None else r["step_ms_median"] / base["step_ms_median"]
        loss = fmt(r["final_val_loss"], ".4f") if "diverged_at" not in r else f"diverged at step {r['diverged_at']}"
        lines.append(f"| {r['name']} | {r['label']} | {loss} | {fmt(dv, '+.4f')} | {fmt(r['tokens_per_s'], ',.0f')} | "
                     f"{fmt(r['step_ms_median'], '.2f')} | {fmt(ratio, '.3f')} | {fmt(r['peak_gib'], '.2f')} |")
    with_stats = [r for r in records if r.get("routing_stats")]
    if with_stats:
        s0 = with_stats[0]["routing_stats"][0][1]
        lines += ["", f"## Routing (training steps, mean over the layers and the {len(with_stats[0]['routing_stats'])} "
                  f"validation steps; T·K/E = {s0['rows_per_expert']:.0f} top-K rows per expert on average, "
                  f"tile {s0['tile']})", "",
                  "| run | load CV | f_e min..max | experts < tile/2 | experts with no rows | pairs dropped | "
                  "pairs added | val loss, own routing |", "|---|---|---|---|---|---|---|---|"]
        for r in with_stats:
            st = [x[1] for x in r["routing_stats"]]
            mean = lambda k: sum(x[k] for x in st) / len(st)  # noqa: E731
            lines.append(f"| {r['name']} | {mean('load_cv'):.2f} | {min(x['f_min'] for x in st)}.."
                         f"{max(x['f_max'] for x in st)} | {mean('experts_below_half_tile'):.1f} | "
                         f"{mean('experts_without_rows'):.1f} | {100 * mean('dropped'):.2f}% | "
                         f"{100 * mean('added'):.2f}% | {fmt(r.get('final_val_loss_train_routing'), '.4f')} |")
    lines += ["", "## Bars and checks", ""]
    for r in records:
        dv = difference(r, base, "final_val_loss")
        fp8 = r.get("precision") == "fp8"
        if (r["routing"] == "token_rounding" or fp8) and dv is not None:
            bar = FP8_BAR if fp8 else TOKEN_ROUNDING_BAR
            ok = abs(dv) <= bar
            speed = ("" if difference(r, base, "step_ms_median") is None else
                     f"; step time {r['step_ms_median']:.2f} ms vs top-K {base['step_ms_median']:.2f} ms "
                     f"(top-K / {r['name']} = {base['step_ms_median'] / r['step_ms_median']:.3f}x)")
            reach = topk_tokens_to_reach(base, r["final_val_loss"])
            reach = ("" if reach is None or not r.get("tokens") else
                     f"; top-K reached that loss at {reach / 1e6:.2f} M tokens, {100 * reach / r['tokens']:.0f}% of "
                     f"the budget")
            lines.append(f"- {r['name']}: |Δ val loss| {abs(dv):.4f} {'<=' if ok else '>'} {bar} nats: "
                         f"{'PASS' if ok else 'FAIL'}{speed}{reach}")
    for r in records:
        other = r.get("final_val_loss_other_precision")
        if other and r["final_val_loss"] is not None:
            lines.append(f"- {r['name']}: the final model validated with its expert GEMMs in {other[0]}: "
                         f"{other[1]:.4f} (in its own precision {r['final_val_loss']:.4f})")
    for r in records:
        c = r["checks"].get("in_backward_bitwise")
        if c:
            lines.append(f"- {r['name']}: parameters bitwise equal to a standard twin's after every one of "
                         f"{c['steps']} steps, optimizer state after the last: "
                         f"{'PASS' if c.get('passed') else 'FAIL (first difference: %s)' % (c['first_difference'],)}")
        c = r["checks"].get("resume")
        if c:
            lines.append(f"- {r['name']}: resumed from its step-{c['resumed_at']} checkpoint in a fresh model and "
                         f"optimizers, {c['steps_after_resume']} steps: parameters, optimizer state and train losses "
                         f"bitwise equal to the uninterrupted run: {'PASS' if c['passed'] else 'FAIL %s' % (c,)}")
    inb = next((r for r in records if r["in_backward"]), None)
    if base is not None and inb is not None:
        same = inb["param_digest"] == base["param_digest"]
        lines.append(f"- in-backward vs top-K, separate runs, final parameters after {inb['steps']} steps: "
                     f"{'bitwise equal (sha256 ' + inb['param_digest'][:16] + ')' if same else 'different'}")
    return "\n".join(lines) + "\n"


def plot(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_lm: matplotlib is not installed; no plot (make it later with --plot-only DIR)", flush=True)
        return False
    meta = records[0]["meta"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, zoom in zip(axes, (False, True)):
        for r in records:
            pts = r["val"][len(r["val"]) // 2:] if zoom else r["val"]
            style = "--" if r["in_backward"] else "-"
            ax.plot([p[1] / 1e6 for p in pts], [p[2] for p in pts], style, marker=".", label=r["label"])
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel("validation loss (nats/token, top-K routing)")
        ax.grid(alpha=0.3)
        ax.set_title("second half" if zoom else "validation loss")
    axes[0].legend()
    m = meta["model"]
    fig.suptitle(f"leanmoe MoE LM: {m['layers']} layers, d {m['d']}, E {m['experts']}, K {m['topk']}, n {m['n']}; "
                 f"{meta['device_name']}; commit {meta['commit'][:12]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(out):
    records = load_records(out)
    if not records:
        raise SystemExit(f"train_lm: no run_*.json in {out}")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(render_table(records))
    plot(records, os.path.join(out, "val_loss.png"))


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def commit_of(args):
    if args.commit:
        return args.commit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    except OSError:  # no git
        head = ""
    return head.strip() or "unknown"


def calibrate(args, cfg, data):
    """Times, on a scratch model, a few steps, a validation pass, the digests and (with
    --check-resume) a checkpoint round trip; returns the step count that fits all runs and checks
    into args.time_budget seconds, and the step time."""
    scratch = argparse.Namespace(**vars(args))
    scratch.steps = 1000
    finish_args(scratch)
    timer = time.perf_counter
    t0 = timer()
    trainer = Trainer(cfg, RUNS["topk"], scratch, args.device, args.dtype)
    build_s = timer() - t0
    times = []
    for i in range(13):
        x, y = data.get(i)
        sync(args.device)
        t = timer()
        trainer.step(x, y)[0].item()
        sync(args.device)
        if i >= 3:  # the first steps pay for lazy initialisation and allocator growth
            times.append(timer() - t)
    t = timer()
    trainer.evaluate(data.val)
    eval_s = timer() - t
    t = timer()
    digest(trainer.model.parameters()), digest(optimizer_tensors(trainer.opt))
    digest_s = timer() - t
    io_s = 0.0
    if args.check_resume:
        t = timer()
        path = checkpoint_path(args, "calibration", 0)
        save_checkpoint(path, trainer, 0, {}, None, args)
        trainer.load_state_dict(read_checkpoint(path))
        os.remove(path)
        io_s = timer() - t
    trainer.release()
    del trainer
    free_memory(args.device)
    step_s = statistics.median(times)
    runs = len(args.runs)
    # --eval-every's default gives 11 validation passes a run; a given --eval-every, one per N steps.
    evals, eval_per_step = (1, eval_s / args.eval_every) if args.eval_every else (11, 0.0)
    per_run = build_s + evals * eval_s + digest_s + 2.0
    fixed = runs * per_run + args.check_inbackward * step_s * 1.05 + 10.0
    if args.check_resume:
        fixed += args.check_resume * step_s + per_run + io_s
    steps = int((args.time_budget * 0.95 - fixed) / (runs * (step_s + eval_per_step))) // 10 * 10
    floor = max(args.check_inbackward, args.check_resume, 20) + 20
    if steps < floor:
        print(f"train_lm: --time-budget {args.time_budget} s allows only {steps} steps at {step_s * 1e3:.1f} ms; "
              f"running {floor}", flush=True)
        steps = floor
    print(f"calibration: {step_s * 1e3:.1f} ms/step, validation pass {eval_s:.2f} s, model build {build_s:.1f} s, "
          f"digests {digest_s:.1f} s, checkpoint round trip {io_s:.1f} s -> {steps} steps per run "
          f"({steps * args.batch * cfg.seq / 1e6:.1f} M tokens)", flush=True)
    return steps, step_s


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--preset", choices=sorted(PRESETS), help="sizes (default: h200 on cuda, cpu on the CPU)")
    for k in ("layers", "d", "heads", "n", "experts", "topk", "vocab", "seq", "batch", "tile", "val_tokens"):
        p.add_argument("--" + k.replace("_", "-"), type=int, help="overrides the preset")
    for k in ("lr", "train_mb", "val_mb", "bpe_sample_mb"):
        p.add_argument("--" + k.replace("_", "-"), type=float, help="overrides the preset")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="parameters (default: cuda bf16, cpu fp32)")
    p.add_argument("--tokenizer", default="bpe", choices=["bpe", "bytes"])
    p.add_argument("--val-permille", type=int, default=20, help="share of files (by path hash) for validation")
    p.add_argument("--steps", type=int, help="steps per run (default 300, or from --time-budget)")
    p.add_argument("--time-budget", type=float, help="seconds for all runs and checks: sets --steps from a "
                   "calibration of the step time (every run still gets the same token budget)")
    p.add_argument("--warmup", type=int, help="warm-up steps (default: a twentieth of --steps)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="global-norm clip of the dense gradients (0: none)")
    p.add_argument("--aux-coef", type=float, default=0.01)
    p.add_argument("--z-coef", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, help="validation every N steps (default: a tenth of --steps)")
    p.add_argument("--log-every", type=int, help="progress line every N steps (default: a twentieth of --steps)")
    p.add_argument("--time-from", type=int, help="first timed step (default: after --check-inbackward, at least 10)")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="comma-separated, of: " + ", ".join(RUNS)
                   + " (default: all but fp8)")
    p.add_argument("--check-inbackward", type=int, default=0, metavar="N")
    p.add_argument("--check-resume", type=int, default=0, metavar="N")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (and at the end) into "
                   "--ckpt-dir")
    p.add_argument("--resume", metavar="CKPT", help="continue the run saved in CKPT, with the flags it was "
                   "started with (--out, --ckpt-dir and --commit may differ)")
    p.add_argument("--out", default="train_lm_out", help="folder for run_<name>.json, results.md, val_loss.png")
    p.add_argument("--ckpt-dir", help="folder for checkpoints (default: OUT/checkpoints)")
    p.add_argument("--plot-only", metavar="DIR", help="only (re)make results.md and val_loss.png from DIR's JSON")
    p.add_argument("--commit", help="commit recorded in the results (default: git rev-parse HEAD)")
    args = p.parse_args(argv)
    if args.plot_only or args.resume:
        return args
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() and leanmoe.cuda_available() else "cpu"
    if args.device == "cuda" and not leanmoe.cuda_available():
        raise SystemExit("train_lm: --device cuda: leanmoe was built without its CUDA backend or sees no GPU")
    preset = PRESETS[args.preset or ("h200" if args.device == "cuda" else "cpu")]
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.device == "cuda" and args.dtype == "float32":
        raise SystemExit("train_lm: argument --dtype: the CUDA backend stores bfloat16 only, got float32")
    args.dtype_name = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.runs = [r for r in args.runs.split(",") if r]
    for r in args.runs:
        if r not in RUNS:
            raise SystemExit(f"train_lm: argument --runs: unknown run '{r}'; valid: {', '.join(RUNS)}")
    if "fp8" in args.runs and (args.dtype_name != "bfloat16" or args.d % 128 or args.n % 128):
        raise SystemExit(f"train_lm: argument --runs: fp8 needs --dtype bfloat16 and --d, --n multiples of 128 "
                         f"(1x128 scale tiles), got {args.dtype_name}, d {args.d}, n {args.n}")
    if args.check_inbackward and "in-backward" not in args.runs:
        raise SystemExit("train_lm: argument --check-inbackward: needs the in-backward run in --runs")
    for k in ("layers", "d", "heads", "n", "experts", "topk", "vocab", "seq", "batch", "tile", "val_tokens", "steps",
              "warmup", "eval_every", "log_every", "lr", "train_mb", "val_mb", "bpe_sample_mb"):
        if getattr(args, k) is not None and not getattr(args, k) > 0:
            raise SystemExit(f"train_lm: argument --{k.replace('_', '-')}: must be > 0, got {getattr(args, k)}")
    for k in ("check_inbackward", "check_resume", "save_every", "time_from"):
        if getattr(args, k) is not None and getattr(args, k) < 0:
            raise SystemExit(f"train_lm: argument --{k.replace('_', '-')}: must be >= 0, got {getattr(args, k)}")
    if not 0 < args.val_permille < 1000:
        raise SystemExit(f"train_lm: argument --val-permille: must be in 1..999, got {args.val_permille}")
    if args.tokenizer == "bpe" and args.vocab < 512:
        raise SystemExit(f"train_lm: argument --vocab: a byte-level BPE needs at least 512 (256 bytes + merges), "
                         f"got {args.vocab}")
    if args.d % args.heads or (args.d // args.heads) % 2:
        raise SystemExit(f"train_lm: argument --d: must be a multiple of --heads ({args.heads}) with an even "
                         f"quotient, got {args.d}")
    args.ckpt_dir = args.ckpt_dir or os.path.join(args.out, "checkpoints")
    return args


def finish_args(args):
    """The defaults that depend on --steps."""
    args.steps = args.steps or 300
    args.warmup = args.warmup or max(1, args.steps // 20)
    args.eval_every = args.eval_every or max(1, args.steps // 10)
    args.log_every = args.log_every or max(1, args.steps // 20)
    if args.time_from is None:
        args.time_from = max(10, args.check_inbackward)
    args.time_from = min(args.time_from, args.steps - 1)
    if args.check_inbackward > args.steps:
        raise SystemExit(f"train_lm: argument --check-inbackward: must be at most --steps ({args.steps}), got "
                         f"{args.check_inbackward}")
    if args.check_resume >= args.steps:
        raise SystemExit(f"train_lm: argument --check-resume: must be below --steps ({args.steps}), got "
                         f"{args.check_resume}")


def main(argv=None):
    args = parse_args(argv)
    if args.plot_only:
        write_report(args.plot_only)
        return 0
    resume = None
    if args.resume:  # the checkpoint's flags, except where the outputs go
        resume = read_checkpoint(args.resume)
        keep = dict(out=args.out, resume=args.resume, commit=args.commit,
                    ckpt_dir=args.ckpt_dir or os.path.join(args.out, "checkpoints"))
        args = argparse.Namespace(**{**resume["args"], **keep})
        args.runs = [resume["run"]["name"]]
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # determinism needs no NaN-filled buffers
    if args.device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # flash attention, whose backward has a deterministic mode
    args.dtype = getattr(torch, args.dtype_name)
    os.makedirs(args.out, exist_ok=True)
    if not resume:  # results.md is made from every run_*.json in --out: drop an earlier invocation's
        for name in RUNS:
            stale = os.path.join(args.out, f"run_{name}.json")
            if os.path.exists(stale):
                os.remove(stale)
    command = "python " + " ".join(sys.argv)
    print(f"train_lm: leanmoe {leanmoe.__version__}, torch {torch.__version__}, device {args.device}", flush=True)

    train_ids, val_ids, tok_json, data_info = build_corpus(args, resume["tokenizer"] if resume else None)
    if resume and resume["record"]["meta"]["data"]["digest"] != data_info["digest"]:
        raise SystemExit(f"train_lm: --resume {args.resume}: the corpus differs from the checkpoint's "
                         "(other packages installed?)")
    print(f"data: {data_info}", flush=True)
    cfg = ModelConfig(args.layers, args.d, args.heads, args.n, args.experts, args.topk, data_info["vocab"],
                      args.seq, args.tile)
    data = Batches(train_ids, val_ids, cfg.seq, args.batch, args.seed, args.device, args.val_tokens)
    calibrated_ms = None
    if args.time_budget and not args.steps and not resume:
        args.steps, step_s = calibrate(args, cfg, data)
        calibrated_ms = step_s * 1e3
    if not resume:
        finish_args(args)
    meta = dict(command=command, commit=commit_of(args),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                device=args.device, device_name=torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
                torch=torch.__version__, leanmoe=leanmoe.__version__, dtype=args.dtype_name, data=data_info,
                val_tokens=data.val_tokens, model=dataclasses.asdict(cfg),
                train=dict(steps=args.steps, batch=args.batch, tokens=args.steps * args.batch * cfg.seq, lr=args.lr,
                           warmup=args.warmup, min_lr_ratio=args.min_lr_ratio, weight_decay=args.weight_decay,
                           clip=args.clip, aux_coef=args.aux_coef, z_coef=args.z_coef, seed=args.seed,
                           time_from=args.time_from, time_budget=args.time_budget,
                           calibrated_step_ms=calibrated_ms if not resume else
                           resume["record"]["meta"]["train"].get("calibrated_step_ms")))
    n = parameter_counts(MoELM(cfg, RUNS["topk"], "meta", args.dtype), cfg)
    print(f"model: {dataclasses.asdict(cfg)}; {n['total'] / 1e6:.1f} M parameters, {n['experts'] / 1e6:.1f} M in "
          f"experts, {n['active_per_token'] / 1e6:.1f} M active per token; {args.steps} steps x "
          f"{args.batch * cfg.seq} tokens per run", flush=True)

    failed = False
    for i, name in enumerate(args.runs):
        run = RUNS[name]
        print(f"== run {name}: {run.label}", flush=True)
        saves = save_steps(args)
        if resume:
            trainer, record, start = trainer_from_checkpoint(resume, args, cfg, meta)
            resume = None  # free the host copy
            trainer, record = train_run(run, args, cfg, data, tok_json, meta, trainer=trainer, record=record,
                                        start=start, save_at=saves)
        else:
            resume_step = args.steps - args.check_resume if args.check_resume and i == 0 else None
            if resume_step is not None:
                saves.add(resume_step)
            trainer, record = train_run(run, args, cfg, data, tok_json, meta, save_at=saves,
                                        twin_steps=args.check_inbackward if run.in_backward else 0)
        if args.save_every:
            save_checkpoint(checkpoint_path(args, name, args.steps), trainer, args.steps, record, tok_json, args)
        trainer.release()
        del trainer
        free_memory(args.device)
        if not args.resume and args.check_resume and i == 0:
            record["checks"]["resume"] = check_resume(run, args, cfg, data, tok_json, meta, record, resume_step)
            free_memory(args.device)
        failed |= any(c.get("passed") is False for c in record["checks"].values())
        with open(os.path.join(args.out, f"run_{name}.json"), "w") as f:
            json.dump(record, f, indent=1)
        print(f"  [{name}] final val loss {fmt(record['final_val_loss'], '.4f')}, "
              f"{fmt(record['tokens_per_s'], ',.0f')} tok/s, {fmt(record['step_ms_median'], '.2f')} ms/step, "
              f"peak {record['peak_gib']:.2f} GiB, {record['wall_s']:.0f} s", flush=True)
        write_report(args.out)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read(), flush=True)
    if failed:
        print("train_lm: a check FAILED", flush=True)
    return 1 if failed else 0


def save_steps(args):
    """The --save-every checkpoints (the final one is written after the run)."""
    return set(range(args.save_every, args.steps, args.save_every)) if args.save_every else set()


if __name__ == "__main__":
    sys.exit(main())
