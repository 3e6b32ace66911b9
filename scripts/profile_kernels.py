"""One launch of each kernel that an open issue's target depends on, for `ncu` (counters, stall
reasons). Cases: table (issue 21: the v2 threshold, streaming filter, shared-memory select and
fused kernel at 4096 x 131072 float32, k = 2048; table_runs: the same with the samples in runs), attend_wgmma2 / 2c / 2s / 2sc (the sm_90a forward, 128 heads: c the 2-CTA
cluster, s the swizzled key tile), attend_wgmma3 (version 3: producer warpgroup, per-warpgroup tiles),
attend_flashmla (FlashMLA's sm90 sparse prefill on attend_wgmma3's inputs, where built), attend_wgmma3_pair16 (wgmma3 and wgmma3p at 16 heads), attend_wgmma_bwd (the wgmma MLA backward, attend_backward version 4, atomics then part rows), attend_wgmma_bwd_dq_pass (the same with a dq pass),
table_cluster (issue 21: hytopk_table_cluster, table_v2.FUSED_CLUSTER = 1, same table), pipeline (issue 14: the threshold and select of
the dsv32-128k preset), attend (issue 18: the forward at 128 heads MLA, one and pair at 8 heads).

    ncu --clock-control none -k regex:"select|fused|threshold|attend" --section SpeedOfLight \\
        python scripts/profile_kernels.py table pipeline attend
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def table():
    import cupy as cp
    import torch
    from workbench.families.cupy import table as tab
    n, L, k = 4096, 131072, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn((n, L), device="cuda", dtype=torch.float32, generator=g)
    lo_h, hi_h = [0] * n, [L] * n
    import numpy as np
    plan = tab.TableHyTopK(n, L, np.array(lo_h), np.array(hi_h), k, kernels="v2")
    plan(scores)
    lo = torch.zeros(n, dtype=torch.int32, device="cuda")
    hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
    tab.fused_hytopk(scores, lo, hi, k, count=cp.empty(n, cp.int32), host_check=False, design="v2")
    cp.cuda.Device().synchronize()


def table_runs():
    """The table case with the samples in runs (table_v2.py sampling "runs"): staged, fused, and fused
    with table_topk's plan (the op's)."""
    import cupy as cp
    import numpy as np
    import torch
    from workbench.families.cupy import table as tab
    n, L, k = 4096, 131072, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn((n, L), device="cuda", dtype=torch.float32, generator=g)
    plan = tab.TableHyTopK(n, L, np.zeros(n, np.int64), np.full(n, L), k, sampling="runs")
    plan(scores)
    lo = torch.zeros(n, dtype=torch.int32, device="cuda")
    hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
    tab.fused_hytopk(scores, lo, hi, k, count=cp.empty(n, cp.int32), host_check=False, design="v2", sampling="runs")
    tab.table_topk(scores, lo, hi, k, host_check=False)          # the op's plan (TOPK_OVERSAMPLE, _MIN_RANK, _COARSE)
    cp.cuda.Device().synchronize()


def table_cluster():
    import cupy as cp
    import torch
    from workbench.families.cupy import table as tab
    from workbench.families.cupy import table_v2 as v2
    n, L, k = 4096, 131072, 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn((n, L), device="cuda", dtype=torch.float32, generator=g)
    lo = torch.zeros(n, dtype=torch.int32, device="cuda")
    hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
    v2.FUSED_CLUSTER = 1
    tab.fused_hytopk(scores, lo, hi, k, count=cp.empty(n, cp.int32), host_check=False, design="v2")
    cp.cuda.Device().synchronize()


def pipeline():
    import numpy as np
    import torch
    import workbench
    from reference import dtypes as DT
    from workbench.harness.presets import get as get_preset, make_inputs
    p = get_preset("dsv32-128k")
    q, w, keys, lo, hi = make_inputs(p)
    qt = torch.from_numpy(q).cuda().to(torch.bfloat16)
    kt = torch.from_numpy(keys).cuda().to(torch.bfloat16)
    wt_ = torch.from_numpy(w).cuda()
    lot, hit = torch.from_numpy(lo.astype(np.int32)).cuda(), torch.from_numpy(hi.astype(np.int32)).cuda()
    b = workbench.backend("cupy")
    st = b.stages_for_kind("bf16")
    plan1 = b.plan(lot, hit, p.k, L=p.L, query_chunk=p.n)
    src = b._source(*b._indexer_args(qt, wt_, kt, None, DT.check_indexer_dtypes(qt, wt_, kt)))
    T = st.threshold(src, plan1.lo_d, plan1.hi_d, plan1.M_d, plan1.r_d)
    from workbench import registry                  # issue 14's v2 thresholds and the grouped A/B (whole-line copies)
    for name in ("cupy.threshold.wgmma_ws_v2", "cupy.threshold.wgmma_ws_v2_noswizzle",
                 "cupy.threshold.wgmma_ws_group128", "cupy.threshold.wgmma_ws_group128_lines"):
        T2 = registry.get(name)(src, plan1.lo_d, plan1.hi_d, plan1.M_d, plan1.r_d)
        print(f"profile_kernels: {name} T bits equal: {bool((T2.view(np.uint32) == T.view(np.uint32)).all())}", flush=True)
    ci, cv, cnt = st.filter(src, plan1.lo_d, plan1.hi_d, T, plan1.capacity)
    st.select(ci, cv, cnt, p.k)
    torch.cuda.synchronize()


def attend():
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.families.cupy import attend as CA
    for H, n, variants in ((128, 1024, (1,)), (8, 8192, (1, 2))):
        q, kv, idx = mla_inputs(n, H, 65536, 2048)
        kk, vv = kv[:, None, :], kv[:, None, :512]
        for qpt in variants:
            CA.attend_forward(q, kk, vv, idx, None, qpt=qpt)
    torch.cuda.synchronize()


def attend_wgmma2(cluster=False, swz=False):
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.families.cupy import attend_wgmma2 as AW2
    q, kv, idx = mla_inputs(1024, 128, 65536, 2048)
    AW2.attend_forward_wgmma2(q, kv[:, None, :], kv[:, None, :512], idx, None, cluster=cluster, swz=swz)
    torch.cuda.synchronize()


def attend_wgmma3():
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.families.cupy import attend_wgmma3 as AW3
    q, kv, idx = mla_inputs(1024, 128, 65536, 2048)
    AW3.attend_forward_wgmma3(q, kv[:, None, :], kv[:, None, :512], idx, None)
    torch.cuda.synchronize()


def attend_wgmma3_pair16():
    """16 heads (a tensor-parallel shard), 2048 queries: version 3 one query per block (wgmma3) and a
    query pair per block (wgmma3p, union build included), for the pair's per-block cost."""
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.families.cupy import attend_wgmma3 as AW3
    q, kv, idx = mla_inputs(2048, 16, 65536, 2048)
    for qpt in (1, 2):
        AW3.attend_forward_wgmma3(q, kv[:, None, :], kv[:, None, :512], idx, None, qpt=qpt)
    torch.cuda.synchronize()


def attend_flashmla():
    """FlashMLA's sm90 sparse prefill (the external baseline, workbench/harness/flashmla.py) on
    attend_wgmma3's inputs: ncu side by side with our version 3."""
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.harness import flashmla
    q, kv, idx = mla_inputs(1024, 128, 65536, 2048)
    flashmla.sparse_prefill(q, kv, idx, 576 ** -0.5)
    torch.cuda.synchronize()


def attend_wgmma_bwd():
    """The wgmma MLA backward (attend_backward version 4, atomics and part rows), 128 heads, n 1024."""
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import mla_inputs
    from workbench.families.cupy import attend as CA
    q, kv, idx = mla_inputs(1024, 128, 65536, 2048)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(1024, 128, 512, device="cuda").bfloat16()
    for det in (False, True):
        CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
    torch.cuda.synchronize()


def attend_wgmma_bwd_dq_pass():
    """The split backward with a dq pass (first pass without dq, Q / dO in registers; a third for dq)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    AWB.DQ_PASS = True
    try:
        attend_wgmma_bwd()
    finally:
        AWB.DQ_PASS = None


def attend_wgmma2c():
    attend_wgmma2(cluster=True)


def attend_wgmma2s():
    attend_wgmma2(swz=True)


def attend_wgmma2sc():
    attend_wgmma2(cluster=True, swz=True)


if __name__ == "__main__":
    for case in sys.argv[1:] or ("table", "pipeline", "attend"):
        globals()[case]()
        print(f"profile_kernels: {case} done", flush=True)
