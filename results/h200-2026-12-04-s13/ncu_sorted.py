"""One split backward (atomics) on the bench's selection as given and with each query's slots sorted
by key beforehand, for ncu (from the repository root): n 1024, 128 heads, L 65536, k 2048. A warm-up
pair first (compiles), then the profiled pair: hytopk_attend_bwd_pds and hytopk_attend_bwd_dkv of
the given order, then of the sorted one (runs 2-3: the second pass ~2 ms faster on sorted slots at
n 8192, the first ~1 ms slower)."""
import sys
sys.path.insert(0, "scripts")
import torch
from bench_attention import mla_inputs
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, L, k = 1024, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
srt = torch.sort(idx, dim=1).values.contiguous()
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
AWB.WRITES = "split"
for _ in range(2):
    for sel in (idx, srt):
        CA.attend_backward(dout, q, kk, vv, sel, out, lse, None, deterministic=False, version=4)
        torch.cuda.synchronize()
print("ncu_sorted: done")
