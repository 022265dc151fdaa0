# One batch of train_lm (CPU test size: d = n = 128, 2 layers, seed 0), the same initialisation: the
# gradients of the bf16 and the fp8 model against the same weights in fp32 (run from the repository root).
# One batch, same init: the expert, router and embedding gradients of the bf16 / fp8 model vs the same weights in fp32.
import sys, os, importlib.util, torch
sys.path.insert(0, 'examples')
spec = importlib.util.spec_from_file_location("train_lm", "examples/train_lm.py"); tl = importlib.util.module_from_spec(spec); sys.modules["train_lm"]=tl; spec.loader.exec_module(tl)
args = tl.parse_args(["--device","cpu","--dtype","bfloat16","--d","128","--n","128","--heads","4","--runs","topk,fp8"]); tl.finish_args(args)
tr_ids, va_ids, tok, info = tl.build_corpus(args)
cfg = tl.ModelConfig(args.layers,args.d,args.heads,args.n,args.experts,args.topk,info["vocab"],args.seq,args.tile)
data = tl.Batches(tr_ids, va_ids, cfg.seq, args.batch, 0, "cpu", args.val_tokens)
def model(run, dtype):
    torch.manual_seed(0); return tl.MoELM(cfg, tl.RUNS[run], "cpu", dtype)
mb, m8 = model("topk", torch.bfloat16), model("fp8", torch.bfloat16)
print("init equal:", all(torch.equal(a,b) for a,b in zip(mb.parameters(), m8.parameters())))
mf = model("topk", torch.float32); mf.load_state_dict({k: v.float() for k, v in mb.state_dict().items()})
x, y = data.get(0)
gs = {}
for name, m in (("bf16", mb), ("fp8", m8), ("fp32", mf)):
    loss, aux, z = m(x, y); (loss + 0.01*aux + 0.001*z).backward()
    gs[name] = {k: p.grad.float().clone() for k, p in m.named_parameters()}
    print(name, "loss", loss.item())
for k in gs["fp32"]:
    if any(s in k for s in ("gate_up", "down_proj", "router", "embed", "blocks.0.attn.qkv")):
        ref = gs["fp32"][k]
        rel = lambda g: ((g-ref).norm()/ref.norm()).item()
        cos = lambda g: torch.nn.functional.cosine_similarity(g.flatten(), ref.flatten(), dim=0).item()
        ratio = lambda g: (g.norm()/ref.norm()).item()
        print(f"{k:32s} rel err bf16 {rel(gs['bf16'][k]):.4f} fp8 {rel(gs['fp8'][k]):.4f}  norm ratio bf16 {ratio(gs['bf16'][k]):.4f} fp8 {ratio(gs['fp8'][k]):.4f}")
