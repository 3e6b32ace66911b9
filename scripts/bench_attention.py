"""Sparse attention over the selected keys (kernels_cuda/attend.cu) on the GPU, one run, side by side:

  forward   MLA 128 heads, d_qk 576 / d_v 512, k 2048, 8192 queries, bf16: effective TFLOP/s
            2 n H k (d_qk + d_v) / t over the bf16 GEMM rate (`one`, `pair`, and `wgmma2*`:
            attend_wgmma2.cu, s: swizzled tile, c: 2-CTA cluster, `wgmma3`: attend_wgmma3.cu, sm_90a),
            and `flashmla`, FlashMLA's sm90 sparse prefill (the kernel behind the issue's 0.8 target),
            where scripts/external/build_flashmla.sh has built it (workbench/harness/flashmla.py)
  forward_kv wgmma2s, wgmma3 and flashmla at kv lengths 8192 / 32768 / 131072 (the forward
            section's is 65536): how much of the forward's time is the gathers missing L2
  Timing of the forward sections (forward, forward_kv, heads): every variant of a group and the bf16
  GEMM in alternating rounds (`alternate`), so vs_gemm is against a GEMM timed among them.
  heads     8 and 16 heads per query: `pair` (two adjacent queries per block over the union of
            their selections; the union build timed apart too, every union kernel) vs `one`, and
            their _acc2 kernels (two logit accumulators), pair_nk64 (64-key tiles at 16 heads), and
            on wgmma wgmma2sp / wgmma3p (a pair per block; versions 2 and 3) vs wgmma2s and wgmma3
            (one query); the pair kernels' time includes the union build; best_pair_vs_best_one:
            the fastest two-query kernel against the fastest one-query kernel
  backward  deterministic, atomic and deterministic_v2 (attend.cu's mma.sync backward), wgmma and
            wgmma_atomic (attend_wgmma_bwd.cu, sm_90a: version 4; wgmma_atomic_vec: 16-byte atomics
            instead of float-by-float ones; *_staged, *_split: the other dK/dV paths), effective TFLOP/s
            2 n H k (3 d_qk + 2 d_v) / t (the logits are recomputed), and its ratio to the forward rate
            (one's, and the op's forward: wgmma3)
  backward16 the same rows at 16 heads (a tensor-parallel shard: where the op switches backwards)
  baseline  dsa.py's gather + einsum vs torch.ops.hytopk.sparse_attention, forward + backward, time
            and peak memory (MHA layout of the DSA layer and the MLA layout, where the gather fits)
  step      the DSA sparse stage at dsv32-128k-like sizes with selection replay: select once, then
            attention forward + backward on the saved idx (breakdown per part)

    python scripts/bench_attention.py --json results/bench_attention.json [--quick]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import workbench.torch  # noqa: E402,F401  (registers torch.ops.hytopk)
from workbench.families.cupy import attend as CA  # noqa: E402
from workbench.families.cupy import attend_wgmma_bwd as AWB  # noqa: E402
from workbench.harness import flashmla  # noqa: E402
from workbench.torch.dsa import gather_einsum  # noqa: E402


def timed(fn, reps=5, warmup=1):
    """Median / min ms of fn() over reps (CUDA events on torch's stream), after warm-up (compiles)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return {"median_ms": float(np.median(times)), "min_ms": float(np.min(times)), "reps": reps}


ROUNDS, CALLS, WARM_S = 9, 5, 0.3


def alternate(fns, rounds=ROUNDS, calls=CALLS, warm_s=WARM_S):
    """Time several callables in alternating rounds: each compiled and run for warm_s first, then
    `rounds` rounds, each timing `calls` calls of every callable in turn (CUDA events on torch's
    stream). The figure is the median over rounds of the per-call mean, so clock ramps and compile
    pauses fall on every callable alike (back-to-back rows of one kernel differed by 5-10 %, the
    first row of a process slowest: results/h200-2026-12-02-s5). A callable that raises gets an
    {"error": ...} row and leaves the rounds."""
    rows, live = {}, {}
    for name, f in fns.items():
        try:
            f()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < warm_s:
                f()
                torch.cuda.synchronize()
            live[name] = f
        except Exception as e:                     # a failing variant must not lose the others' rows
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name}: FAILED {type(e).__name__}: {e}", flush=True)
    per = {name: [] for name in live}
    for _ in range(rounds):
        for name, f in live.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                f()
            b.record()
            b.synchronize()
            per[name].append(a.elapsed_time(b) / calls)
    for name, v in per.items():
        rows[name] = {"median_ms": float(np.median(v)), "min_ms": float(np.min(v)), "max_ms": float(np.max(v)),
                      "rounds": rounds, "calls": calls, "timing": "alternating"}
    return rows


GEMM_N = 8192
GEMM = "bf16_gemm"          # the GEMM's row in each alternating forward group


def gemm_fn():
    x = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.mm(x, y)


def gemm_tflops():
    return rate(2 * GEMM_N ** 3, timed(gemm_fn(), reps=10, warmup=3))


def selection(n, L, k, share=0.9, seed=0):
    """idx [n, k] int32: adjacent queries (2p, 2p+1) share about `share` of their keys, as
    neighbouring queries' top-k do (keys drawn at random, a few duplicates)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.randint(0, L, (n, k), device="cuda", generator=g, dtype=torch.int32)
    odd = idx[1::2]
    odd.copy_(idx[0::2][: odd.shape[0]])
    redo = torch.rand(odd.shape, device="cuda", generator=g) > share
    odd[redo] = torch.randint(0, L, (int(redo.sum()),), device="cuda", generator=g, dtype=torch.int32)
    return idx


def mla_inputs(n, H, L, k, seed=0, dqk=576, dv=512):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(n, H, dqk, device="cuda", generator=g).bfloat16()
    kv = torch.randn(L, dqk, device="cuda", generator=g).bfloat16()
    return q, kv, selection(n, L, k, seed=seed)


def fwd_flops(n, H, k, dqk=576, dv=512):
    return 2 * n * H * k * (dqk + dv)


def bwd_flops(n, H, k, dqk=576, dv=512):
    return 2 * n * H * k * (3 * dqk + 2 * dv)


def rate(flops, t):
    return flops / (t["median_ms"] * 1e-3) / 1e12


CHECK_QUERIES = 32      # every timed forward is also checked against the float32 torch path on these


def max_error(q, kk, vv, idx, out):
    """Largest |kernel - torch float32 path| over the first CHECK_QUERIES queries (bf16 out)."""
    from workbench.torch.attention import torch_forward
    c = min(CHECK_QUERIES, q.shape[0])
    ref, _ = torch_forward(q[:c], kk, vv, idx[:c], 576 ** -0.5)
    if isinstance(out, torch.Tensor):                # flashmla: a torch bf16 tensor
        got = out[:c].float()
    else:                                            # ours: bf16 bits in a CuPy array
        got = torch.from_dlpack(out[:c].view("int16")).view(torch.bfloat16).float()
    return float((got - ref).abs().max())


def _forward_fn(name, q, kk, vv, idx):
    """The forward of variant `name` (bf16 out): one / pair and their _acc2 / pair_nk64 kernels
    (attend.cu), wgmma2 / wgmma2c / wgmma2s / wgmma2sc (attend_wgmma2.cu), wgmma3 / wgmma3p
    (attend_wgmma3.cu), or flashmla (FlashMLA's sm90 sparse prefill, an external baseline:
    workbench/harness/flashmla.py)."""
    if name == "flashmla":
        kv2 = kk[:, 0, :]
        flashmla.check_args(q, kv2, idx)             # (H a multiple of 64, ...): fails before the rounds
        return lambda: flashmla.sparse_prefill(q, kv2, idx, 576 ** -0.5)
    if name in ("wgmma3", "wgmma3p"):                # version 3: producer warpgroup, per-warpgroup tiles, chained max
        from workbench.families.cupy import attend_wgmma3 as AW3
        qpt = 2 if name == "wgmma3p" else 1
        return lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=qpt)
    if name.startswith("wgmma2"):                    # version 2 (attend_wgmma2.cu): c the 2-CTA cluster, s the swizzled tile
        from workbench.families.cupy import attend_wgmma2 as AW2
        cluster, swz, qpt = name.endswith("c"), name.startswith("wgmma2s"), 2 if name == "wgmma2sp" else 1
        return lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, cluster=cluster, swz=swz, qpt=qpt)
    kw = dict(qpt=1 if name.startswith("one") else 2, acc=2 if name.endswith("_acc2") else 1, wide="nk64" in name)
    return lambda: CA.attend_forward(q, kk, vv, idx, None, **kw)


ONE_QUERY = ("one", "one_acc2", "wgmma2s", "wgmma3")             # one query per block (tile)
TWO_QUERIES = ("pair", "pair_acc2", "pair_nk64", "wgmma2sp", "wgmma3p")   # two adjacent queries per block


def forward_rows(n, H, L, k, variants=("one", "pair")):
    """Every variant and the bf16 GEMM timed in alternating rounds (`alternate`); vs_gemm is against
    that GEMM (row bf16_gemm). Each output is checked against the float32 torch path."""
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    rows, fns = {}, {GEMM: gemm_fn()}
    for name in variants:
        if name == "flashmla" and not flashmla.available():
            continue                               # the external baseline is optional
        try:
            fns[name] = _forward_fn(name, q, kk, vv, idx)
        except Exception as e:
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  fwd H={H:<3} n={n} L={L} {name:<8} FAILED {type(e).__name__}: {e}", flush=True)
    rows.update(alternate(fns))
    gemm = rate(2 * GEMM_N ** 3, rows[GEMM]) if "median_ms" in rows.get(GEMM, {}) else None
    if gemm:
        rows[GEMM]["tflops"] = gemm
    for name in variants:
        t = rows.get(name, {})
        if "median_ms" not in t:
            continue
        err = max_error(q, kk, vv, idx, fns[name]()[0])
        t.update(tflops=rate(fwd_flops(n, H, k), t), vs_gemm=rate(fwd_flops(n, H, k), t) / gemm if gemm else None,
                 max_abs_error_vs_torch_f32=err)
        print(f"  fwd H={H:<3} n={n} L={L} {name:<8} {t['median_ms']:8.3f} ms  {t['tflops']:6.1f} TFLOP/s "
              f"({t['vs_gemm'] or float('nan'):.2f} of the alternating GEMM, {gemm or float('nan'):.0f})  max err {err:.2e}",
              flush=True)
    for a, b in (("wgmma3", "flashmla"), ("wgmma2s", "flashmla")):   # ours against the external baseline
        if "median_ms" in rows.get(a, {}) and "median_ms" in rows.get(b, {}):
            rows[f"{a}_vs_{b}"] = rows[b]["median_ms"] / rows[a]["median_ms"]
            print(f"  {a} vs {b}: {rows[f'{a}_vs_{b}']:.2f}x (above 1: ours faster)", flush=True)
    if "median_ms" in rows.get("wgmma2s", {}) and "median_ms" in rows.get("one", {}):
        rows["wgmma2s_vs_one"] = rows["one"]["median_ms"] / rows["wgmma2s"]["median_ms"]
        print(f"  wgmma2s vs one: {rows['wgmma2s_vs_one']:.2f}x", flush=True)
    if "median_ms" in rows.get("pair", {}):
        import cupy as cp
        ic = cp.from_dlpack(idx)
        rows["pair_union_only"] = timed(lambda: CA.pair_union(ic, L))                      # the default (bits)
        rows["pair_union_reg_only"] = timed(lambda: CA.pair_union(ic, L, kernel="reg"))     # the register sort
        rows["pair_union_smem_only"] = timed(lambda: CA.pair_union(ic, L, kernel="smem"))   # the first kernel
        for a, b in (("pair_acc2", "one"), ("pair_acc2", "one_acc2"), ("pair_nk64", "one"), ("wgmma2sp", "wgmma2s"),
                     ("wgmma2sp", "one"), ("wgmma3p", "wgmma3"), ("wgmma3p", "wgmma2sp")):
            if "median_ms" in rows.get(a, {}) and "median_ms" in rows.get(b, {}):
                rows[f"{a}_vs_{b}"] = rows[b]["median_ms"] / rows[a]["median_ms"]
                print(f"  {a} vs {b}: {rows[f'{a}_vs_{b}']:.2f}x", flush=True)
        best = {kind: min(((rows[name]["median_ms"], name) for name in names if "median_ms" in rows.get(name, {})),
                          default=None)
                for kind, names in (("one", ONE_QUERY), ("pair", TWO_QUERIES))}
        if best["one"] and best["pair"] and H <= 32:    # the fastest two-query kernel vs the fastest one-query
            # kernel (where the op pairs queries: at 128 heads only the mma.sync pair runs, to no purpose)
            rows["best_pair_vs_best_one"] = {"ratio": best["one"][0] / best["pair"][0], "pair": best["pair"][1],
                                             "one": best["one"][1]}
            print(f"  best pair ({best['pair'][1]}) vs best one ({best['one'][1]}): "
                  f"{rows['best_pair_vs_best_one']['ratio']:.2f}x", flush=True)
        if "median_ms" in rows.get("one", {}):
            rows["pair_vs_one"] = rows["one"]["median_ms"] / rows["pair"]["median_ms"]
            print(f"  pair vs one: {rows['pair_vs_one']:.2f}x (union build {rows['pair_union_only']['median_ms']:.3f} ms"
                  " inside pair)", flush=True)
    return rows


def backward_rows(n, H, L, k, fwd_rate, op_rate=None):
    """vs_forward: against `one`'s forward rate (the same mma.sync core); vs_op_forward: against the
    op's forward (wgmma3 at these shapes, the fastest forward), the issue's comparison."""
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    rows = {}
    variants = [("deterministic", dict(deterministic=True)), ("atomic", dict(deterministic=False)),
                ("deterministic_v2", dict(deterministic=True, version=2))]
    if torch.cuda.get_device_capability() == (9, 0):    # attend_wgmma_bwd.cu (sm_90a)
        variants += [("wgmma", dict(deterministic=True, version=4)), ("wgmma_atomic", dict(deterministic=False, version=4)),
                     ("wgmma_atomic_vec", dict(deterministic=False, version=4)),
                     ("wgmma_staged", dict(deterministic=True, version=4)),
                     ("wgmma_atomic_staged", dict(deterministic=False, version=4)),
                     ("wgmma_split", dict(deterministic=True, version=4)),
                     ("wgmma_atomic_split", dict(deterministic=False, version=4)),
                     ("wgmma_split3", dict(deterministic=True, version=4)),
                     ("wgmma_atomic_split3", dict(deterministic=False, version=4))]
    writes_default = AWB.WRITES
    for name, kw in variants:
        AWB.VEC_WRITES = True if name == "wgmma_atomic_vec" else None
        # wgmma*: dK/dV written by the consumers (direct); *_staged: by the producer warpgroup; *_split: a
        # second pass over all the heads (AWB.WRITES; the op's default, "auto"), at two head blocks the dq
        # pass's three passes in one launch over ring slots (AWB.RING); *_split3: the three launches
        AWB.WRITES = "staged" if name.endswith("_staged") else "split" if name.endswith(("_split", "_split3")) else "direct"
        AWB.RING = False if name.endswith("_split3") else None
        try:
            t = timed(lambda: CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, **kw), reps=3)
        finally:
            AWB.VEC_WRITES, AWB.WRITES, AWB.RING = None, writes_default, None
        r = rate(bwd_flops(n, H, k), t)
        rows[name] = dict(t, tflops=r, vs_forward=r / fwd_rate if fwd_rate else None,
                          vs_op_forward=r / op_rate if op_rate else None)
        vs, vo = rows[name]["vs_forward"], rows[name]["vs_op_forward"]
        print(f"  bwd H={H} n={n} {name:<16} {t['median_ms']:8.3f} ms  {r:6.1f} TFLOP/s "
              + (f"({vs:.2f} of one's forward rate)" if vs else "")
              + (f" ({vo:.2f} of the op's forward, wgmma3)" if vo else ""), flush=True)
    return rows


def _fwd_bwd(fn):
    def run():
        out = fn()
        out.float().sum().backward()
    return run


def baseline_rows(n, H, d, L, k, mla):
    """gather + einsum (dsa.py) vs the op, forward + backward; peak memory above the inputs."""
    g = torch.Generator(device="cuda").manual_seed(2)
    idx = selection(n, L, k, seed=2)
    q = torch.randn(n, H, 576 if mla else d, device="cuda", generator=g).bfloat16().requires_grad_()
    if mla:
        kv = torch.randn(L, 576, device="cuda", generator=g).bfloat16().requires_grad_()
        ours = lambda: torch.ops.hytopk.sparse_attention(q, kv, None, idx, 512, None, True)[0]
        # the layer's gather needs per-head K/V: MLA's shared row expanded to every head
        base = lambda: gather_einsum(q, kv[:, None, :].expand(L, H, 576), kv[:, None, :512].expand(L, H, 512), idx)[0]
    else:
        K = torch.randn(L, H, d, device="cuda", generator=g).bfloat16().requires_grad_()
        V = torch.randn(L, H, d, device="cuda", generator=g).bfloat16().requires_grad_()
        ours = lambda: torch.ops.hytopk.sparse_attention(q, K, V, idx, -1, None, True)[0]
        base = lambda: gather_einsum(q, K, V, idx)[0]
    rows = {}
    for name, fn in (("hytopk", ours), ("gather_einsum", base)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        try:
            t = timed(_fwd_bwd(fn), reps=3)
        except torch.OutOfMemoryError as e:
            rows[name] = {"error": f"out of memory: {e}"}
            continue
        t["peak_mem_above_inputs_gb"] = (torch.cuda.max_memory_allocated() - before) / 1e9
        rows[name] = t
        print(f"  {'mla' if mla else 'mha'} n={n} H={H} {name:<13} fwd+bwd {t['median_ms']:9.3f} ms  "
              f"peak +{t['peak_mem_above_inputs_gb']:.2f} GB", flush=True)
    if "median_ms" in rows.get("gather_einsum", {}) and "median_ms" in rows.get("hytopk", {}):
        rows["speedup"] = rows["gather_einsum"]["median_ms"] / rows["hytopk"]["median_ms"]
        print(f"  speedup vs gather+einsum: {rows['speedup']:.1f}x", flush=True)
    return rows


def step_rows(n, L, k, H, index_heads=64, index_dim=128):
    """DSA sparse stage with replay: HyTopK select once (no grad), attention fwd + bwd on the saved idx."""
    g = torch.Generator(device="cuda").manual_seed(3)
    iq = torch.randn(n, index_heads, index_dim, device="cuda", generator=g).bfloat16()
    iw = torch.rand(n, index_heads, device="cuda", generator=g)
    ik = torch.randn(L, index_dim, device="cuda", generator=g).bfloat16()
    hi = torch.arange(L - n + 1, L + 1, device="cuda", dtype=torch.int32)
    lo = torch.zeros_like(hi)
    q = torch.randn(n, H, 576, device="cuda", generator=g).bfloat16().requires_grad_()
    kv = torch.randn(L, 576, device="cuda", generator=g).bfloat16().requires_grad_()
    sel = lambda: torch.ops.hytopk.select(iq, iw, ik, lo, hi, k, None, 3.0, 64)
    idx, _ = sel()
    rows = {"select": timed(sel, reps=3)}
    fwd = lambda: torch.ops.hytopk.sparse_attention(q, kv, None, idx, 512, None, True)
    rows["attention_forward"] = timed(fwd, reps=3)
    rows["attention_forward_backward"] = timed(_fwd_bwd(lambda: fwd()[0]), reps=3)
    rows["total_ms"] = rows["select"]["median_ms"] + rows["attention_forward_backward"]["median_ms"]
    print(f"  step n={n} L={L}: select {rows['select']['median_ms']:.2f} ms, attention fwd "
          f"{rows['attention_forward']['median_ms']:.2f} ms, fwd+bwd {rows['attention_forward_backward']['median_ms']:.2f}"
          f" ms, total {rows['total_ms']:.2f} ms", flush=True)
    return rows


def _version(pkg):
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: forward,forward_kv,heads,backward,backward16,baseline,step")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    n = 1024 if args.quick else 8192
    L, k = 65536, 2048
    gemm = gemm_tflops()
    props = torch.cuda.get_device_properties(0)
    res = {"gpu": props.name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
           "cupy": _version("cupy") or _version("cupy-cuda12x") or _version("cupy-cuda13x"),
           "cuda": torch.version.cuda, "bf16_gemm_tflops": gemm, "n": n, "L": L, "k": k,
           "flashmla": flashmla.build_info() if flashmla.available() else None,
           "timing": f"forward rows: alternating rounds ({ROUNDS} x {CALLS} calls, median of round means) with the GEMM; "
                     "backward / baseline / step: sequential (median of reps after a warm-up)",
           "flops": {"forward": "2 n H k (d_qk + d_v)", "backward": "2 n H k (3 d_qk + 2 d_v)"}}
    print(f"GPU {props.name}  bf16 GEMM {gemm:.0f} TFLOP/s", flush=True)
    sections = [
        ("forward", lambda: forward_rows(n, 128, L, k, ("one", "pair", "wgmma2", "wgmma2s", "wgmma2c", "wgmma2sc",
                                                         "wgmma3", "flashmla"))),
        # the kv length: 8192 rows (9 MiB) stay in L2, 131072 (151 MiB) mostly miss it; FlashMLA's sparse
        # prefill figures span s_kv 8192 .. 131072 at 128 heads, k 2048
        ("forward_kv", lambda: {str(lk): forward_rows(n, 128, lk, k, ("wgmma2s", "wgmma3", "flashmla"))
                                for lk in (8192, 32768, 131072)}),
        ("heads", lambda: {str(H): forward_rows(n, H, L, k, ("one", "pair", "one_acc2", "pair_acc2", "pair_nk64",
                                                             "wgmma2s", "wgmma3", "wgmma2sp", "wgmma3p"))
                           for H in (8, 16)}),
        ("backward", lambda: backward_rows(n, 128, L, k, res.get("forward", {}).get("one", {}).get("tflops"),
                                           res.get("forward", {}).get("wgmma3", {}).get("tflops"))),
        ("backward16", lambda: backward_rows(n, 16, L, k, None, None)),   # where the op's wgmma backward starts
        ("baseline", lambda: {"mha": baseline_rows(256 if args.quick else 1024, 16, 128, 16384, k, mla=False),
                              "mla": baseline_rows(64 if args.quick else 256, 16, 576, 16384, k, mla=True)}),
        ("step", lambda: step_rows(512 if args.quick else 2048, 131072, k, 128)),
    ]
    for name, fn in sections:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:                     # one failing section must not lose the others
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name}: FAILED {type(e).__name__}: {e}", flush=True)
        res.setdefault("section_s", {})[name] = time.perf_counter() - t0
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
