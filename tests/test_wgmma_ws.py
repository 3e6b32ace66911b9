"""The warp-specialised wgmma core (kernels_cuda/hytopk_wgmma_ws.cuh + wgmma_ws.cu, sm_90a).

CPU: the generated wgmma wrappers are current; the geometry mirror is sane (the compile
check asserts it against the header). GPU (Hopper only): every stage of the core against
the reference bit for bit on exact inputs of the held-out kinds (integers, power-of-two
and negative weights, float32 weights that bf16 cannot hold, ReLU-zero plateaus, empty
and short contexts; H = 64, 32 and padded shapes; bf16 and fp8 e4m3), against each other
bit for bit on random inputs (filter, dense, recovery, replay, threshold, score-only,
and the two-consumer variant), the filter's staging overflow path, the pipeline against
brute force on the core's own table, bad inputs, and no write past the table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import reference as R
from reference import generate as G
from reference.fp8 import Fp8IndexerSource, exact_fp8_source, quantize_indexer
from tests.strategies import stable_seed
from workbench.bf16 import float32_to_bf16_bits
from workbench.geometry import (SMEM_LIMIT, WsGeometry, WsGroupThresholdGeometry, WsReplayGeometry,
                                WsThresholdV2Geometry)


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


# ------------------------------------------------------------------ CPU
def test_generated_wgmma_wrappers_are_current():
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "scripts" / "gen_wgmma_ptx.py"
    spec = importlib.util.spec_from_file_location("gen_wgmma_ptx", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.HEADER.read_text() == gen.render(), "run python scripts/gen_wgmma_ptx.py"


@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("eb,consumers", [(2, 4), (2, 2), (1, 4)])
def test_ws_geometry_fits_and_has_staging(H, eb, consumers):
    g = WsGeometry(H, 128, eb, consumers)
    assert g.smem <= SMEM_LIMIT and g.stage_entries >= 16
    assert g.threads == 128 * (consumers + 1) and g.qpb * H == 256
    assert WsReplayGeometry(H, 128, eb).smem < 64 * 1024


@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("nrows", [256, 128])
def test_ws_group_threshold_geometry(H, nrows):
    """G queries of H heads fill N = G H <= nrows MMA rows (G <= 8); the shared memory fits a block,
    and at the model shapes the N = 128 kernel leaves room for two blocks per SM (228 KiB, 1 KiB
    reserved per block)."""
    g = WsGroupThresholdGeometry(H, 128, 2, nrows)
    assert g.G == min(nrows // H, 8) and g.G * H in (64, 128, 256) and g.threads == 128
    assert g.smem <= SMEM_LIMIT
    if nrows == 128 and H in (32, 64):
        assert 2 * (g.smem + 1024) <= 228 * 1024
    assert g.groups(4096) == -(-4096 // g.G)


@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("mcap", [0, 2048, 4096, 8192])
def test_ws_threshold_v2_geometry(H, mcap):
    """The v2 threshold (wgmma_ws_threshold.cu) fits a block, and two blocks per SM (228 KiB, 1 KiB
    reserved per block) at the model shapes: 4 stages up to 4096 samples at D = 128, 3 at 8192."""
    g = WsThresholdV2Geometry(H, 128, mcap)
    assert g.threads == 160 and g.smem == g.ALIGN_PAD + g.fixed + 4 * mcap <= SMEM_LIMIT
    assert 2 * (g.smem + 1024) <= 228 * 1024
    assert g.stages == (4 if mcap <= 4096 or H < 64 else 3)
    assert g.name.startswith("hytopk_threshold_v2") and WsThresholdV2Geometry(H, 128, mcap, False).name.endswith("_ns_ws")


def _v2_copy_map(D, swizzle):
    """A mirror of the v2 producer's copies of one 64-row tile (wgmma_ws_threshold.cu):
    (copy k, lane) -> (row, 16-byte chunk of the row, byte offset in the tile)."""
    CH = 2 * D // 16
    lines = CH % 8 == 0
    swz = swizzle and lines
    out = {}
    for k in range(64 * CH // 32):
        for lane in range(32):
            if lines:                                     # copy k = (u, kb): row 4 u + lane / 8, block kb
                u, kb, cb = k // (CH // 8), k % (CH // 8), lane & 7
                row = 4 * u + (lane >> 3)
                ch = 8 * kb + cb
                off = (kb * 8192 + row * 128 + ((cb ^ (row & 7)) << 4)) if swz else \
                    ((row >> 3) * CH * 128 + ch * 128 + (row & 7) * 16)
            else:
                e = lane + 32 * k
                row, ch, off = (e // (8 * CH)) * 8 + (e & 7), (e >> 3) % CH, 16 * e
            out[k, lane] = (row, ch, off)
    return out, CH, lines, swz


@pytest.mark.parametrize("D", [16, 48, 64, 128])
@pytest.mark.parametrize("swizzle", [True, False])
def test_ws_threshold_v2_copy_map(D, swizzle):
    """Every 16-byte chunk of the tile's 64 rows is copied once, to where the MMA's operand layout
    has it: the no-swizzle core-matrix layout (chunk c of row r at (r / 8) * 128 CH + 128 c + 16 (r % 8))
    or the 128-byte swizzle (the linear address of row r, chunk c of 64-column block kb, with bits
    4-6 XORed by bits 7-9, as the hardware reads it from a 1024-byte aligned tile); and each quarter
    warp of a copy reads whole 32-byte sectors when rows are whole 128-byte lines (one line each)."""
    cmap, CH, lines, swz = _v2_copy_map(D, swizzle)
    assert sorted((r, c) for r, c, _ in cmap.values()) == [(r, c) for r in range(64) for c in range(CH)]
    assert sorted(o for _, _, o in cmap.values()) == list(range(0, 64 * CH * 16, 16))
    for (r, c, o) in cmap.values():
        if swz:
            linear = (c // 8) * 8192 + r * 128 + (c % 8) * 16
            assert o == linear ^ (((linear >> 7) & 7) << 4)
        else:
            assert o == (r // 8) * CH * 128 + c * 128 + (r % 8) * 16
    if lines:
        for k in range(64 * CH // 32):
            for q in range(4):
                quarter = [cmap[k, lane] for lane in range(8 * q, 8 * q + 8)]
                assert len({r for r, _, _ in quarter}) == 1                      # one row
                chunks = sorted(c for _, c, _ in quarter)
                assert chunks == list(range(chunks[0], chunks[0] + 8)) and chunks[0] % 8 == 0   # one 128-byte line
                if swz:                                                          # 8 distinct bank groups
                    assert len({(o // 16) % 8 for _, _, o in quarter}) == 8


@pytest.mark.parametrize("seed", range(4))
def test_ws_threshold_v2_position_steps(seed):
    """The producer's positions, stepped by quotient and remainder of 64 c / M per tile, are the
    contract's p_j = lo + (j * c) // M for every sampled j (contract M, and M above c)."""
    rng = np.random.default_rng(seed)
    for _ in range(50):
        c = int(rng.choice([rng.integers(1, 5000), rng.integers(1, 2**31 - 1)]))
        M = int(min(c, max(4096, min(8192, c // 128)))) if rng.random() < 0.7 else int(rng.integers(1, 3 * c + 2))
        m = min(M, 8192)
        step_q, step_r = (64 * c) // M, (64 * c) % M
        for lane in (0, 5, 31):
            for h in (0, 1):
                j0 = lane + 32 * h
                quo, rem = (j0 * c) // M, (j0 * c) % M
                for i in range((m + 63) // 64):
                    j = 64 * i + j0
                    if j < m:
                        assert quo == (j * c) // M
                    quo, rem = quo + step_q, rem + step_r
                    if rem >= M:
                        rem, quo = rem - M, quo + 1


# ------------------------------------------------------------------ GPU (Hopper)
from tests.test_wgmma import gpu             # noqa: E402  (Hopper-only: skips with the reason elsewhere)

EXACT_KINDS = ("ints", "pow2_neg_w", "f32_w", "plateau")


def _exact_inputs(kind, n, L, H, D, rng):
    """float32 q, w, keys whose scores are exact in float32 under every summation order."""
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)          # q, keys in [-2, 2], w in {0, 1, 2}
    if kind == "pow2_neg_w":
        w = (rng.choice([-1.0, 1.0], (n, H)) * 2.0 ** rng.integers(-3, 4, (n, H))).astype(np.float32)
    elif kind == "f32_w":                      # odd integers up to 255: float32 holds them, bf16 does not
        w = (2 * rng.integers(-127, 128, (n, H)) + 1).astype(np.float32)
    elif kind == "plateau":                    # most dots <= 0: scores exactly 0 (ties at the ReLU)
        keys = np.abs(keys)
        q = -np.abs(q)
        q[:, :, 0] = rng.integers(0, 2, (n, H)) * 2            # a few positive dots
    return q, w, keys


def _source(kind, q, w, keys, rng, dtype):
    """(device source, host reference function ref(t, a, b))."""
    import cupy as cp
    if dtype == "bf16":
        qb, kb = float32_to_bf16_bits(q), float32_to_bf16_bits(keys)
        wd = w if kind == "f32_w" else float32_to_bf16_bits(w)          # float32 w as given; bf16 w as bits
        src = R.IndexerSource(cp.asarray(qb), cp.asarray(wd), cp.asarray(kb))
        return src, (lambda t, a, b: R.indexer_score_block(q[t], w[t], keys[a:b]))
    s = exact_fp8_source(q, w, keys)
    ks = (2.0 ** rng.integers(-2, 3, keys.shape[0])).astype(np.float32)    # power-of-two key scales: exact
    s = Fp8IndexerSource(s.q, s.w, s.keys, ks)
    return Fp8IndexerSource(*(cp.asarray(x) for x in s)), (lambda t, a, b: s.row(t, a, b))


def _ranges(n, L, k, rng):
    lo, hi = G.layout("random", n, L, k, rng)
    lo, hi = lo.astype(np.int32), hi.astype(np.int32)
    lo[0], hi[0] = 7, 7                                                   # an empty context
    lo[1], hi[1] = 100, 101                                               # one key
    lo[2], hi[2] = L - 5, L                                               # ends at L
    return lo, hi


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", EXACT_KINDS)
@pytest.mark.parametrize("H,D", [(64, 128), (32, 128), (8, 16), (20, 72)])
def test_ws_dense_equals_reference_on_exact_inputs(dtype, kind, H, D):
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, k = 19, 5000, 300
    rng = np.random.default_rng(stable_seed(dtype, kind, H, D))
    q, w, keys = _exact_inputs(kind, n, L, H, D, rng)
    src, ref = _source(kind, q, w, keys, rng, dtype)
    lo, hi = _ranges(n, L, k, rng)
    table = WS.dense_source(src, cp.asarray(lo), cp.asarray(hi)).get()
    want = np.full((n, L), -np.inf, np.float32)
    for t in range(n):
        if lo[t] < hi[t]:
            want[t, lo[t]:hi[t]] = ref(t, lo[t], hi[t])
    np.testing.assert_array_equal(bits(table), bits(want))


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["ints", "plateau"])
def test_ws_stages_equal_reference_selection_on_exact_inputs(dtype, kind):
    """threshold -> filter -> check -> select / recover of the core: the reference's exact top-k
    (heavy ties: the lower position wins) whichever path a query takes."""
    import cupy as cp
    import workbench as wb
    from workbench.families.cupy import wgmma_ws as WS
    from tests.test_cupy_gpu import assert_selection_equal
    n, L, H, D, k = 24, 20000, 64, 128, 300
    rng = np.random.default_rng(7 if kind == "ints" else 8)
    q, w, keys = _exact_inputs(kind, n, L, H, D, rng)
    src, ref = _source(kind, q, w, keys, rng, dtype)
    lo, hi = _ranges(n, L, k, rng)
    table = np.full((n, L), -np.inf, np.float32)
    for t in range(n):
        table[t, lo[t]:hi[t]] = ref(t, lo[t], hi[t])
    want_idx, want_val = R.topk(table, lo, hi, k)
    lo_d, hi_d = cp.asarray(lo), cp.asarray(hi)
    M, r = (cp.asarray(x) for x in R.sample_plan(lo, hi, k, 3.0))
    T = WS.threshold_ws(src, lo_d, hi_d, M, r)
    np.testing.assert_array_equal(R.order_keys(T.get()), R.order_keys(R.stage_threshold(R.TableSource(table), lo, hi, M.get(), r.get())))
    cap = R.default_capacity(k, lo, hi)
    ci, cv, cnt = WS.filter_ws(src, lo_d, hi_d, T, cap)
    ref_ci, ref_cv, ref_cnt = R.stage_filter(R.TableSource(table), lo, hi, T.get(), cap)
    np.testing.assert_array_equal(cnt.get(), ref_cnt)
    rows = cp.arange(n, dtype=cp.int32)
    ri, rv = WS.recover_ws(src, lo_d, hi_d, rows, k)
    assert_selection_equal(ri.get(), rv.get(), want_idx, want_val)
    # the whole pipeline on these stages (bf16 through the backend; the fp8 source stage by stage above)
    if dtype == "bf16" and kind == "ints":
        chosen = {"threshold": "cupy.threshold.wgmma_ws", "filter": "cupy.filter.wgmma_ws", "recover": "cupy.recover.wgmma_ws"}
        for max_failed in (64, 0):
            res = wb.backend("cupy", chosen).hytopk_indexer(src.q, src.w, src.keys, lo_d, hi_d, k, max_failed=max_failed)
            assert_selection_equal(res.idx.get(), res.val.get(), want_idx, want_val)


def _random_source(dtype, n, L, H, D, seed):
    import cupy as cp
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=False)
    if dtype == "bf16":
        w = (w * 3 - 1).astype(np.float32)                                  # float32 weights, some negative
        return R.IndexerSource(cp.asarray(float32_to_bf16_bits(q)), cp.asarray(w),
                               cp.asarray(float32_to_bf16_bits(keys))), rng
    return Fp8IndexerSource(*(cp.asarray(x) for x in quantize_indexer(q, w, keys))), rng


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("H", [64, 32, 8])
def test_ws_stages_agree_bitwise_on_random_inputs(dtype, H):
    """filter, dense, recover, replay, threshold samples and score-only see the same bits (one
    score function), incl. partial tiles and contexts; recover = brute force on the table."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    from tests.test_cupy_gpu import assert_selection_equal, gpu_topk
    n, L, D, k = 37, 9001, 128 if H != 8 else 40, 300
    src, rng = _random_source(dtype, n, L, H, D, 100 + H)
    lo, hi = G.layout("random", n, L, k, rng)
    lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
    dense = WS.dense_source(src, lo_d, hi_d)
    table = dense.get()
    inside = (np.arange(L)[None, :] >= lo[:, None]) & (np.arange(L)[None, :] < hi[:, None])
    assert np.all(bits(table)[~inside] == np.uint32(0xff800000)), "dense wrote a score outside a context"
    assert not np.isnan(table[inside]).any()
    T = np.full(n, np.nan, np.float32)
    for t in range(n):
        row = np.sort(table[t, lo[t]:hi[t]])[::-1]
        if row.size > 200:
            T[t] = row[199]
    tkeys = R.order_keys(T)
    for consumers in ((4, 2) if dtype == "bf16" else (4,)):
        for cap in (256, 12000):                # 12000: every passing key stored (T = NaN rows pass all)
            ci, cv, cnt = (x.get() for x in WS.filter_source(src, lo_d, hi_d, cp.asarray(T), cap, consumers))
            for t in range(n):
                passing = np.flatnonzero(inside[t] & (R.order_keys(table[t]) >= tkeys[t]))
                assert cnt[t] == passing.size, (consumers, cap, t)
                m = min(cap, passing.size)
                pos = ci[t, :m]
                assert np.unique(pos).size == m and np.isin(pos, passing).all()
                np.testing.assert_array_equal(bits(cv[t, :m]), bits(table[t, pos]))
                if passing.size <= cap:
                    np.testing.assert_array_equal(np.sort(pos), passing)
    rows = cp.asarray(rng.permutation(n).astype(np.int32))
    ri, rv = WS.recover_ws(src, lo_d, hi_d, rows, k)
    idx, val = gpu_topk(dense, lo, hi, k)
    assert_selection_equal(ri.get(), rv.get(), idx[rows.get()], val[rows.get()])
    # replay at the selection (with its -1 padding) and at arbitrary positions
    rep = WS.replay_source(src, cp.asarray(idx)).get()
    want = np.where(idx >= 0, table[np.arange(n)[:, None], np.maximum(idx, 0)], -np.inf).astype(np.float32)
    np.testing.assert_array_equal(bits(rep), bits(want))
    pos = rng.integers(0, L, (n, 777)).astype(np.int32)
    pos[:, 5] = -1
    rep = WS.replay_source(src, cp.asarray(pos)).get()
    full = WS.dense_source(src, cp.zeros(n, cp.int32), cp.full(n, L, cp.int32)).get()
    want = np.where(pos >= 0, full[np.arange(n)[:, None], np.maximum(pos, 0)], -np.inf).astype(np.float32)
    np.testing.assert_array_equal(bits(rep), bits(want))
    for consumers in ((4, 2) if dtype == "bf16" else (4,)):
        got = int(WS.score_only_ws(src, lo_d, hi_d, consumers).get()[0])
        want_sum = sum(int(R.order_keys(table[t, lo[t]:hi[t]]).astype(np.uint64).sum()) for t in range(n))
        assert got == want_sum % 2**64, consumers


@gpu
def test_ws_filter_flushes_full_staging_buffers():
    """A threshold that lets (nearly) everything through: every warp's staging buffer fills and
    is flushed many times; the stored candidates are exactly the contexts."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, H, D = 40, 30000, 32, 128
    src, rng = _random_source("bf16", n, L, H, D, 5)
    lo = rng.integers(0, 2000, n).astype(np.int32)
    hi = (lo + rng.integers(0, L - 2000, n)).astype(np.int32)
    T = np.full(n, -np.inf, np.float32)
    ci, cv, cnt = (x.get() for x in WS.filter_ws(src, cp.asarray(lo), cp.asarray(hi), cp.asarray(T), L))
    np.testing.assert_array_equal(cnt, hi - lo)
    for t in range(n):
        np.testing.assert_array_equal(np.sort(ci[t, :cnt[t]]), np.arange(lo[t], hi[t]))


THRESHOLDS = ("threshold_ws", "threshold_ws_fused", "threshold_ws_group", "threshold_ws_group128",
              "threshold_ws_group128_lines", "threshold_ws_v2", "threshold_ws_v2_noswizzle")


@gpu
@pytest.mark.parametrize("fused", THRESHOLDS)
@pytest.mark.parametrize("dtype, H, layout", [("bf16", 64, "causal_tail"), ("bf16", 32, "random"),
                                              ("fp8", 64, "random"), ("bf16", 8, "varlen")])
def test_ws_threshold_is_the_rth_best_sample_of_its_own_scores(fused, dtype, H, layout):
    """T (its bits: the first sample in position order among the r-th best key's ties) equals the
    reference's r-th best sample of the core's own dense table; the fused kernel (samples scored
    and selected in one block per query) and the gather + block select give the same T."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, D, k = 24, 40000, 128, 512
    src, rng = _random_source(dtype, n, L, H, D, 11)
    lo, hi = G.layout(layout, n, L, k, rng)
    lo, hi = lo.astype(np.int32), hi.astype(np.int32)
    lo[0], hi[0] = 9, 9                                                   # empty: T = NaN
    table = WS.dense_source(src, cp.asarray(lo), cp.asarray(hi)).get()
    M, r = R.sample_plan(lo, hi, k, 3.0)
    fn = getattr(WS, fused)
    T = fn(src, cp.asarray(lo), cp.asarray(hi), cp.asarray(M), cp.asarray(r)).get()
    want = R.stage_threshold(R.TableSource(table), lo, hi, M, r)
    np.testing.assert_array_equal(R.order_keys(T), R.order_keys(want))
    sampled = M > 0
    assert T[sampled].view(np.uint32).tobytes() == want[sampled].view(np.uint32).tobytes()


@gpu
@pytest.mark.parametrize("fused", ["threshold_ws_v2", "threshold_ws_v2_noswizzle"])
@pytest.mark.parametrize("H, D, layout", [(64, 64, "causal_tail"), (32, 40, "random"), (16, 128, "causal_tail"),
                                          (64, 128, "random")])
def test_ws_threshold_v2_shapes(fused, H, D, layout):
    """The v2 threshold's three copy paths: rows of whole 128-byte lines in the swizzled tile
    (D = 64: one 64-column block, D = 128: two) or the no-swizzle one, and rows of less (D = 40,
    padded to 48: gather_scores' order); 4096 samples of the long contexts, and one context of
    k + 5 keys (M = c = 705: a partial last tile): T bit for bit the reference's r-th best sample of
    the core's own table."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, k = 40, 70000, 700
    src, rng = _random_source("bf16", n, L, H, D, 5 + D)
    lo, hi = G.layout(layout, n, L, k, rng)
    lo, hi = lo.astype(np.int32), hi.astype(np.int32)
    lo[1] = min(lo[1], L - k - 5)
    hi[1] = lo[1] + k + 5                                                 # M = c: 705 samples, a partial tile
    table = WS.dense_source(src, cp.asarray(lo), cp.asarray(hi)).get()
    M, r = R.sample_plan(lo, hi, k, 3.0)
    T = getattr(WS, fused)(src, cp.asarray(lo), cp.asarray(hi), cp.asarray(M), cp.asarray(r)).get()
    want = R.stage_threshold(R.TableSource(table), lo, hi, M, r)
    sampled = M > 0
    assert T[sampled].view(np.uint32).tobytes() == want[sampled].view(np.uint32).tobytes()
    assert np.isnan(T[~sampled]).all()


@gpu
@pytest.mark.parametrize("fused", THRESHOLDS[1:])
def test_ws_fused_threshold_ties_take_the_first_sample(fused):
    """Plateaus of equal scores (and -0.0 beside +0.0 after the ReLU): T's bits come from the
    first sample in position order among the ties, as the reference's rank order gives."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, H, D, k = 12, 20000, 64, 128, 256
    rng = np.random.default_rng(4)
    q, w, keys = _exact_inputs("plateau", n, L, H, D, rng)
    src, _ = _source("plateau", q, w, keys, rng, "bf16")
    lo, hi = G.layout("random", n, L, k, rng)
    lo, hi = lo.astype(np.int32), hi.astype(np.int32)
    table = WS.dense_source(src, cp.asarray(lo), cp.asarray(hi)).get()
    M, r = R.sample_plan(lo, hi, k, 3.0)
    T = getattr(WS, fused)(src, cp.asarray(lo), cp.asarray(hi), cp.asarray(M), cp.asarray(r)).get()
    want = R.stage_threshold(R.TableSource(table), lo, hi, M, r)
    sampled = M > 0
    assert T[sampled].view(np.uint32).tobytes() == want[sampled].view(np.uint32).tobytes()


def _group_layout(n, L, k, rng):
    """Contexts that stress the grouped threshold's union merge, in blocks of adjacent queries:
    a causal tail (neighbours' positions differ by at most one per step), runs of one shared
    context (identical positions), short contexts of different lengths (M = c: mixed M in a
    group, including c <= k: no samples), empty ones, contexts ending at L, and random ones."""
    lo, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for t in range(n):
        kind = (t // 5) % 6
        if kind == 0:                                             # causal tail
            lo[t], hi[t] = 0, L - n + t + 1
        elif kind == 1:                                           # one shared context per run
            lo[t], hi[t] = 77, L - 3
        elif kind == 2:                                           # short: M = c, differs per query
            lo[t] = rng.integers(0, L - 5000)
            hi[t] = lo[t] + rng.choice([0, 1, k - 1, k, k + 1, 4095, 4096, 4097, 3000 + t])
        elif kind == 3:                                           # ends at L
            lo[t], hi[t] = rng.integers(0, L // 2), L
        else:                                                     # random
            lo[t] = rng.integers(0, L - k - 2)
            hi[t] = rng.integers(lo[t], L + 1)
    return lo.astype(np.int32), hi.astype(np.int32)


@gpu
@pytest.mark.parametrize("fused", THRESHOLDS[2:])
@pytest.mark.parametrize("H, n", [(64, 37), (32, 45), (16, 30), (8, 29)])
@pytest.mark.parametrize("kind", ["ints", "plateau"])
def test_ws_group_threshold_mixed_groups(fused, H, n, kind):
    """The grouped threshold on groups whose queries have unrelated, shared, causal, short
    (mixed M, c <= k) and empty contexts, n not a multiple of G: T bit for bit the reference's
    r-th best sample of the core's own table (exact inputs: the reference's table too)."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    L, D, k = 30000, 128, 256
    rng = np.random.default_rng(H + n)
    q, w, keys = _exact_inputs(kind, n, L, H, D, rng)
    src, _ = _source(kind, q, w, keys, rng, "bf16")
    lo, hi = _group_layout(n, L, k, rng)
    table = WS.dense_source(src, cp.asarray(lo), cp.asarray(hi)).get()
    M, r = R.sample_plan(lo, hi, k, 3.0)
    T = getattr(WS, fused)(src, cp.asarray(lo), cp.asarray(hi), cp.asarray(M), cp.asarray(r)).get()
    want = R.stage_threshold(R.TableSource(table), lo, hi, M, r)
    np.testing.assert_array_equal(R.order_keys(T), R.order_keys(want))
    sampled = M > 0
    assert T[sampled].view(np.uint32).tobytes() == want[sampled].view(np.uint32).tobytes()
    # and the reference's own scores (exact inputs: every summation order gives these bits)
    ref = R.stage_threshold(R.IndexerSource(q, w, keys), lo, hi, M, r)
    np.testing.assert_array_equal(R.order_keys(T), R.order_keys(ref))


@gpu
@pytest.mark.parametrize("fused", ["threshold_ws_group", "threshold_ws_group128_lines", "threshold_ws_v2",
                                   "threshold_ws_v2_noswizzle"])
@pytest.mark.parametrize("m", [1500, 5000])
def test_ws_group_threshold_non_contract_m_falls_back(fused, m):
    """A direct call whose M exceeds c (positions repeat; the grouped kernels hand it to the
    per-query kernel, v2 takes it), or num_samples(L) = 4096 (v2 hands it over too): same T."""
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    n, L, H, D = 9, 5000, 64, 128
    rng = np.random.default_rng(3)
    q, w, keys = _exact_inputs("ints", n, L, H, D, rng)
    src, _ = _source("ints", q, w, keys, rng, "bf16")
    lo = np.arange(n, dtype=np.int32) * 10
    hi = lo + 1000
    M = np.full(n, m, np.int32)
    r = np.full(n, 7, np.int32)
    args = (src, cp.asarray(lo), cp.asarray(hi), cp.asarray(M), cp.asarray(r))
    np.testing.assert_array_equal(getattr(WS, fused)(*args).get().view(np.uint32),
                                  WS.threshold_ws_fused(*args).get().view(np.uint32))


@gpu
@pytest.mark.parametrize("threshold, select", [("wgmma_ws", "radix_bitonic"), ("wgmma_ws_group128", "radix_smem"),
                                               ("wgmma_ws_group", "radix_smem"), ("wgmma_ws_group128_lines", "radix_smem"),
                                               ("wgmma_ws_v2", "radix_bitonic"),
                                               ("wgmma_ws_v2_noswizzle", "radix_smem")])
def test_ws_pipeline_equals_bruteforce_of_its_dense(threshold, select):
    """bf16, n=256, L=32768, H=64, D=128, k=2048, float32 w: the core's threshold + filter +
    recover in the backend's pipeline is exact on the core's own scores (and with the grouped
    thresholds and the shared-memory select of issue 14)."""
    import cupy as cp
    import workbench as wb
    from workbench.families.cupy import wgmma_ws as WS
    from tests.test_cupy_gpu import assert_selection_equal, gpu_topk
    n, L, H, D, k = 256, 32768, 64, 128, 2048
    src, rng = _random_source("bf16", n, L, H, D, 21)
    src = R.IndexerSource(src.q, cp.asarray(float32_to_bf16_bits(src.w.get())), src.keys)   # the backend takes one dtype
    lo, hi = G.layout("causal_tail", n, L, k, rng)
    lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
    chosen = {"threshold": f"cupy.threshold.{threshold}", "filter": "cupy.filter.wgmma_ws",
              "recover": "cupy.recover.wgmma_ws", "dense": "cupy.dense.wgmma_ws", "select": f"cupy.select.{select}"}
    idx, val = gpu_topk(WS.dense_source(src, lo_d, hi_d), lo, hi, k)
    for max_failed in (64, 0):                                           # 0: every query through recovery
        res = wb.backend("cupy", chosen).hytopk_indexer(src.q, src.w, src.keys, lo_d, hi_d, k, max_failed=max_failed)
        assert_selection_equal(res.idx.get(), res.val.get(), idx, val)


@gpu
def test_ws_bad_inputs_name_the_argument():
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    q8 = cp.zeros((2, 4, 32), cp.uint8)
    lo = hi = cp.zeros(2, cp.int32)
    T = cp.zeros(2, cp.float32)
    with pytest.raises(TypeError, match="argument 'w'"):
        WS.filter_ws(Fp8IndexerSource(q8, cp.zeros((2, 4), cp.float64), cp.zeros((9, 32), cp.uint8),
                                      cp.ones(9, cp.float32)), lo, hi, T, 8)
    with pytest.raises(ValueError, match="'kscale'"):
        WS.filter_ws(Fp8IndexerSource(q8, cp.zeros((2, 4), cp.float32), cp.zeros((9, 32), cp.uint8),
                                      cp.ones(8, cp.float32)), lo, hi, T, 8)
    with pytest.raises(TypeError, match="argument 'source'"):
        WS.filter_ws(R.TableSource(cp.zeros((2, 9), cp.float32)), lo, hi, T, 8)
    with pytest.raises(TypeError, match="arguments 'q', 'keys'"):
        WS.filter_ws(R.IndexerSource(cp.zeros((2, 4, 32), cp.float32), cp.zeros((2, 4), cp.float32),
                                     cp.zeros((9, 32), cp.uint16)), lo, hi, T, 8)
    with pytest.raises(ValueError, match="argument 'capacity'"):
        WS.filter_ws(R.IndexerSource(cp.zeros((2, 4, 32), cp.float32), cp.zeros((2, 4), cp.float32),
                                     cp.zeros((9, 32), cp.float32)), lo, hi, T, 0)
    with pytest.raises(ValueError, match="argument 'q'"):
        WS.dense_ws(cp.zeros((2, 0, 32), cp.float32), cp.zeros((2, 0), cp.float32), cp.zeros((9, 32), cp.float32), lo, hi)
    with pytest.raises(ValueError, match="argument 'idx'"):
        WS.replay_ws(cp.zeros((2, 4, 32), cp.float32), cp.zeros((2, 4), cp.float32), cp.zeros((9, 32), cp.float32),
                     cp.zeros((3, 5), cp.int32))


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_ws_dense_never_writes_past_the_table(dtype):
    import cupy as cp
    from workbench.families.cupy import wgmma_ws as WS
    from workbench.families.cupy._launch import launch
    n, L, H, D = 37, 9001, 8, 40
    rng = np.random.default_rng(3)
    q, w, keys = _exact_inputs("ints", n, L, H, D, rng)
    src, _ = _source("ints", q, w, keys, rng, dtype)
    lo, hi = cp.zeros(n, cp.int32), cp.full(n, 100, cp.int32)
    guard = cp.full(n * L + 4096, 12345.0, cp.float32)
    out = guard[:n * L].reshape(n, L)
    x = WS.WsInputs(src)
    runs = x.runs(scan=False)
    launch(x.fn("dense"), (x.geo.groups(n) * runs,), (*x.head_args(), np.int32(n), lo, hi, out, np.int32(runs)),
           x.geo.smem, threads=x.geo.threads)
    assert bool(cp.all(guard[n * L:] == 12345.0)), "dense wrote past the end of the table"
    assert bool(cp.all(cp.isinf(out[:, 100:]))) and bool(cp.all(cp.isfinite(out[:, :100])))


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_ws_threshold_shared_context_fast_path(dtype):
    """Every query with one context (full attention): the samples are one key set, scored once by
    the dense kernel; T equals the r-th best sample of the core's own table, directly (a device
    check finds the shared context) and inside the pipeline (the driver's host ranges say so)."""
    import cupy as cp
    import workbench as wb
    from workbench.families.cupy import wgmma_ws as WS
    from tests.test_cupy_gpu import assert_selection_equal, gpu_topk
    n, L, H, D, k = 40, 30000, 64, 128, 300
    src, rng = _random_source(dtype, n, L, H, D, 12)
    lo, hi = np.full(n, 17, np.int32), np.full(n, L - 3, np.int32)
    lo_d, hi_d = cp.asarray(lo), cp.asarray(hi)
    table = WS.dense_source(src, lo_d, hi_d)
    M, r = R.sample_plan(lo, hi, k, 3.0)
    want = R.stage_threshold(R.TableSource(table.get()), lo, hi, M, r)
    T = WS.threshold_ws(src, lo_d, hi_d, cp.asarray(M), cp.asarray(r)).get()
    np.testing.assert_array_equal(R.order_keys(T), R.order_keys(want))
    from workbench.families.cupy import _scope
    with _scope.call_scope(lo, hi, M):                                  # the pipeline's hint, no sync
        T2 = WS.threshold_ws(src, lo_d, hi_d, cp.asarray(M), cp.asarray(r)).get()
    np.testing.assert_array_equal(R.order_keys(T2), R.order_keys(want))
    if dtype == "bf16":
        src = R.IndexerSource(src.q, cp.asarray(float32_to_bf16_bits(src.w.get())), src.keys)
        table = WS.dense_source(src, lo_d, hi_d)
        idx, val = gpu_topk(table, lo, hi, k)
        chosen = {"threshold": "cupy.threshold.wgmma_ws", "filter": "cupy.filter.wgmma_ws",
                  "recover": "cupy.recover.wgmma_ws"}
        for chunk in (None, 16):                                           # one pass, and passes
            res = wb.backend("cupy", chosen).hytopk_indexer(src.q, src.w, src.keys, lo_d, hi_d, k, query_chunk=chunk)
            assert_selection_equal(res.idx.get(), res.val.get(), idx, val)
