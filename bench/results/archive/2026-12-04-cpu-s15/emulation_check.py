# dev/fp8_train_probe.py's e4m3 round trip (the q-* variants) against the library's weight codes (leanmoe::optim
# write_fp8_copy through ops.fp8_weight_codes_), on weights spanning 2^-20..2^7 across blocks (run from the repository root).
import sys, torch
sys.argv = ["x", "--out", "/tmp/x"]
sys.path.insert(0, "dev")
import fp8_train_probe as P
from leanmoe._ops import ops
torch.manual_seed(0)
E, R, C = 3, 256, 384
w = (torch.randn(E, R, C) * torch.logspace(-6, 2, C)[None, None, :]).to(torch.bfloat16)  # wide ranges across blocks
bufs = [torch.empty(E, R, C, dtype=torch.float8_e4m3fn), torch.empty(E, R // 128, C // 128),
        torch.empty(E, C, R, dtype=torch.float8_e4m3fn), torch.empty(E, C // 128, R // 128)]
ops.fp8_weight_codes_(w, bufs)
lib = (bufs[0].float().reshape(E, R // 128, 128, C // 128, 128) * bufs[1][:, :, None, :, None]).reshape(E, R, C)
mine = P.fp8_round_trip(w, 128).float()
print("weights (128x128) bitwise equal to the library's codes*scales:", torch.equal(lib, mine),
      "max diff", (lib - mine).abs().max().item())
