"""The split atomics with the second pass of a query chunk on a side stream under the next chunk's
first pass (from the repository root; OUT=dir). The second pass through the TMA's bulk reductions is
bound by the reductions' traffic (L2 / HBM), the first by its MMAs: do they share the GPU better
than the earlier 8-byte second pass did (47.2 against 46.9 ms: results/h200-2026-12-03-s10 run 3)?
The overlapped launcher lives here only (as the removed SPLIT_OVERLAP of commit 8604ff8, with the
bulk second pass). Alternating rounds, 128 heads, n 8192, L 65536, k 2048."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench import instantiations as INST
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
_split, SIDE = AWB._split, {}


def overlapped(chunks):
    def split(b, nhb, deterministic, scratch_bytes, do, lse_, delta, dq, dk):
        assert not deterministic
        hpad, nt = nhb * 64, -(-b.kk // 64)
        per_query = hpad * nt * 64 * 2 * 2
        smem, threads = INST.attend_wgmma_bwd_smem("split"), INST.ATTEND_WGMMA_BWD_THREADS
        dsmem = INST.attend_wgmma_bwd_dkv_smem()
        first = AWB._fn(INST.attend_wgmma_bwd_name(False, writes="split"), "split")
        second = AWB._fn(INST.attend_wgmma_bwd_dkv_name(True, hpad), roles=INST.ATTEND_WGMMA_BWD_DKV_ROLES,
                         smem=dsmem, threads=INST.ATTEND_WGMMA_BWD_DKV_THREADS)
        head = (b.q, b.k, np.int64(b.k_stride), b.idx, np.int32(b.kk), np.int32(b.n))
        tail = (np.int64(b.L), np.int32(b.Hq), np.int32(nhb), np.float32(b.scale), b.scale_log2, do, lse_, delta, dq)
        chunk = max(1, min(b.n, (scratch_bytes or CA._scratch_v2()) // per_query // 2, -(-b.n // chunks)))
        bufs = [cp.empty(chunk * per_query // 2, cp.uint16) for _ in range(2)]
        main = cp.cuda.get_current_stream()
        side = SIDE.setdefault(0, cp.cuda.Stream(non_blocking=True))
        start = cp.cuda.Event(disable_timing=True)
        start.record(main)
        side.wait_event(start)
        freed = [None, None]
        for i, t0 in enumerate(range(0, b.n, chunk)):
            c, j = min(chunk, b.n - t0), i & 1
            if freed[j] is not None:
                main.wait_event(freed[j])
            first((c * nhb,), (threads,), head + (np.int32(t0),) + tail + (bufs[j],), shared_mem=smem)
            done = cp.cuda.Event(disable_timing=True)
            done.record(main)
            side.wait_event(done)
            with side:
                second((c * 3,), (INST.ATTEND_WGMMA_BWD_DKV_THREADS,), (b.q, do, bufs[j], b.idx, np.int32(b.kk),
                       np.int32(t0), np.int64(b.L), np.int32(b.Hq), dk), shared_mem=dsmem)
            freed[j] = cp.cuda.Event(disable_timing=True)
            freed[j].record(side)
        end = cp.cuda.Event(disable_timing=True)
        end.record(side)
        main.wait_event(end)
    return split


def bwd(writes, chunks=None):
    def f():
        AWB.WRITES = writes
        if chunks:
            AWB._split = overlapped(chunks)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            AWB.WRITES, AWB._split = "auto", _split
    return f


ref = [cp.asarray(x) for x in bwd("split")()[:2]]
check = {}
for c in (8, 16):
    got = [cp.asarray(x) for x in bwd("split", c)()[:2]]
    check[f"overlap{c}_dq_bit_identical"] = bool(cp.array_equal(ref[0], got[0]))
    check[f"overlap{c}_dk_max_abs_diff"] = float(cp.abs(ref[1] - got[1]).max())
check["dk_max_abs"] = float(cp.abs(ref[1]).max())
print("check", check, flush=True)
fns = {"split bulk": bwd("split"), "split bulk, overlapped, 8 chunks": bwd("split", 8),
       "split bulk, overlapped, 16 chunks": bwd("split", 16), "staged": bwd("staged"),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name != "forward wgmma3":
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_dkv_overlap.json").write_text(json.dumps(res, indent=1))
