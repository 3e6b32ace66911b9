"""The wgmma core (sm_90a) in bf16 and fp8 e4m3, and the fp8 reference.

CPU: the e4m3 codec (every code, round-to-nearest-even, saturation, against
torch's float8_e4m3fn) and the fp8 reference score. GPU (Hopper only): every
epilogue of the core against the reference bit for bit on exact inputs, against
each other bit for bit on random inputs (one score function per input kind),
the filter's candidates and the recovery's top-k against brute force on the
core's own dense table, and the bf16 wgmma pipeline against that brute force.
"""
from __future__ import annotations

import numpy as np
import pytest

import reference as R
from reference import generate as G
from reference.fp8 import (E4M3_VALUES, Fp8IndexerSource, e4m3_bits_to_float32, exact_fp8_source,
                           float32_to_e4m3_bits, fp8_indexer_scores, fp8_score_block, quantize_indexer)
from workbench.bf16 import float32_to_bf16_bits


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


# ------------------------------------------------------------------ CPU: e4m3 codec, fp8 reference
def test_every_e4m3_code_round_trips():
    codes = np.arange(256, dtype=np.uint8)
    vals = E4M3_VALUES[codes]
    finite = ~np.isnan(vals)
    assert finite.sum() == 254 and np.nanmax(vals) == 448.0 and vals[0x08] == 2.0 ** -6 and vals[0x01] == 2.0 ** -9
    got = float32_to_e4m3_bits(vals[finite])
    want = codes[finite]
    np.testing.assert_array_equal(got[want != 0x80], want[want != 0x80])     # -0.0 keeps its sign bit
    assert got[want == 0x80][0] == 0x80


def test_e4m3_rounding_ties_even_and_saturates():
    x = np.array([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 1000.0, -1000.0, 464.0, np.nan], np.float32)
    got = float32_to_e4m3_bits(x)
    assert list(e4m3_bits_to_float32(got[:7])) == [1.0, 1.25, 0.0, 2.0 ** -8, 448.0, -448.0, 448.0]
    assert got[7] & 0x7F == 0x7F


def test_e4m3_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(100000) * 2.0 ** rng.integers(-12, 9, 100000)).astype(np.float32)
    x = x[np.abs(x) <= 448]
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(float32_to_e4m3_bits(x), want)


def test_bad_codec_dtypes_name_the_argument():
    with pytest.raises(TypeError, match="argument 'x'"):
        float32_to_e4m3_bits(np.zeros(3, np.float64))
    with pytest.raises(TypeError, match="argument 'b'"):
        e4m3_bits_to_float32(np.zeros(3, np.int8))


def test_fp8_reference_is_the_scaled_bf16_formula():
    rng = np.random.default_rng(5)
    q, w, keys = G.indexer_inputs(3, 50, 4, 16, rng, exact=True)
    ks = (2.0 ** rng.integers(-3, 4, 50)).astype(np.float32)
    src = exact_fp8_source(q, w, keys)
    src = Fp8IndexerSource(src.q, src.w, src.keys, ks)
    want = np.stack([R.indexer_score_block(q[t], w[t], keys * ks[:, None]) for t in range(3)])   # exact
    got = np.stack([src.row(t, 0, 50) for t in range(3)])
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(fp8_indexer_scores(src.q, w, src.keys, ks)), bits(got))


def test_quantize_indexer_is_close():
    rng = np.random.default_rng(6)
    q, w, keys = G.indexer_inputs(4, 300, 8, 64, rng, exact=False)
    src = quantize_indexer(q, w, keys)
    deq = e4m3_bits_to_float32(src.keys) * src.kscale[:, None]
    assert np.abs(deq - keys).max() <= 2.0 ** -4 * np.abs(keys).max()
    want = np.stack([R.indexer_score_block(q[t], w[t], keys) for t in range(4)])
    got = np.stack([fp8_score_block(src.q[t], src.w[t], src.keys, src.kscale) for t in range(4)])
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_exact_source_refuses_inexact_inputs():
    with pytest.raises(ValueError, match="arguments 'q', 'keys'"):
        exact_fp8_source(np.full((1, 1, 4), 0.1, np.float32), np.ones((1, 1), np.float32), np.ones((2, 4), np.float32))


# ------------------------------------------------------------------ GPU (Hopper)
def _hopper_reason():
    try:
        import cupy as cp
        if cp.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
        cc = cp.cuda.Device().compute_capability
        return None if cc == "90" else f"wgmma needs sm_90 (Hopper); this GPU is sm_{cc}"
    except Exception as e:
        return f"no usable CUDA GPU ({type(e).__name__}: {e})"


gpu = pytest.mark.skipif(_hopper_reason() is not None, reason=str(_hopper_reason()))


def _inputs(kind, n, L, H, D, seed, exact):
    """(source, float32 dense reference or None) for kind 'bf16' / 'fp8'."""
    import cupy as cp
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=exact)
    if kind == "bf16":
        qb, wb, kb = (float32_to_bf16_bits(x) for x in (q, w, keys))
        src = R.IndexerSource(*(cp.asarray(x) for x in (qb, wb, kb)))
        host = R.IndexerSource(*(x.view(np.uint16) for x in (qb, wb, kb)))
        ref = (lambda t, a, b: R.indexer_score_block(q[t], w[t], keys[a:b])) if exact else None
        return src, host, rng, ref
    if exact:
        s = exact_fp8_source(q, w, keys)
        ks = (2.0 ** rng.integers(-2, 3, L)).astype(np.float32)          # power-of-two: still exact
        s = Fp8IndexerSource(s.q, s.w, s.keys, ks)
    else:
        s = quantize_indexer(q, w, keys)
    src = Fp8IndexerSource(*(cp.asarray(x) for x in s))
    ref = (lambda t, a, b: s.row(t, a, b)) if exact else None
    return src, s, rng, ref


@gpu
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("H,D", [(64, 128), (32, 128), (8, 16), (20, 72)])
def test_wgmma_dense_equals_reference_on_exact_inputs(kind, H, D):
    import cupy as cp
    from workbench.families.cupy import wgmma as WG
    n, L, k = 19, 5000, 300
    src, _, rng, ref = _inputs(kind, n, L, H, D, 10 + H + D, exact=True)
    lo, hi = G.layout("random", n, L, k, rng)
    lo[0], hi[0] = 7, 7                                                   # an empty context
    table = WG.dense_wgmma_source(src, cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))).get()
    want = np.full((n, L), -np.inf, np.float32)
    for t in range(n):
        if lo[t] < hi[t]:
            want[t, lo[t]:hi[t]] = ref(t, lo[t], hi[t])
    np.testing.assert_array_equal(bits(table), bits(want))


@gpu
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("H", [64, 32, 8])
def test_wgmma_epilogues_agree_bitwise_on_random_inputs(kind, H):
    """filter, dense, recover and score-only of the wgmma core see the same bits on
    general inputs (one core), incl. partial tiles and contexts; recover = brute force."""
    import cupy as cp
    from workbench.families.cupy import wgmma as WG
    from tests.test_cupy_gpu import assert_selection_equal, gpu_topk
    n, L, D, k = 37, 9001, 128 if H != 8 else 40, 300
    src, _, rng, _ = _inputs(kind, n, L, H, D, 100 + H, exact=False)
    lo, hi = G.layout("random", n, L, k, rng)
    lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
    dense = WG.dense_wgmma_source(src, lo_d, hi_d)
    table = dense.get()
    inside = (np.arange(L)[None, :] >= lo[:, None]) & (np.arange(L)[None, :] < hi[:, None])
    assert np.all(bits(table)[~inside] == np.uint32(0xff800000)), "dense wrote a score outside a context"
    assert np.isfinite(table[inside]).all()
    T = np.full(n, np.nan, np.float32)
    for t in range(n):
        row = np.sort(table[t, lo[t]:hi[t]])[::-1]
        if row.size > 200:
            T[t] = row[199]
    tkeys = R.order_keys(T)
    cap = 256
    ci, cv, cnt = (x.get() for x in WG.filter_wgmma(src, lo_d, hi_d, cp.asarray(T), cap))
    for t in range(n):
        passing = np.flatnonzero(inside[t] & (R.order_keys(table[t]) >= tkeys[t]))
        assert cnt[t] == passing.size
        m = min(cap, passing.size)
        pos = ci[t, :m]
        assert np.unique(pos).size == m and np.isin(pos, passing).all()
        np.testing.assert_array_equal(bits(cv[t, :m]), bits(table[t, pos]))
        if passing.size <= cap:
            np.testing.assert_array_equal(np.sort(pos), passing)
    rows = cp.asarray(rng.permutation(n).astype(np.int32))
    ri, rv = WG.recover_wgmma(src, lo_d, hi_d, rows, k)
    idx, val = gpu_topk(dense, lo, hi, k)
    order = rows.get()
    assert_selection_equal(ri.get(), rv.get(), idx[order], val[order])
    got = int(WG.score_only_wgmma(src, lo_d, hi_d).get()[0])
    want_sum = sum(int(R.order_keys(table[t, lo[t]:hi[t]]).astype(np.uint64).sum()) for t in range(n))
    assert got == want_sum % 2**64


@gpu
def test_wgmma_fp8_is_close_to_the_float_scores():
    import cupy as cp
    from workbench.families.cupy import wgmma as WG
    n, L, H, D = 8, 3000, 64, 128
    rng = np.random.default_rng(9)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=False)
    s = quantize_indexer(q, w, keys)
    lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    got = WG.dense_wgmma_source(Fp8IndexerSource(*(cp.asarray(x) for x in s)), cp.asarray(lo), cp.asarray(hi)).get()
    want = np.stack([s.row(t, 0, L) for t in range(n)])                  # the fp8 formula in float64
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    exact = np.stack([R.indexer_score_block(q[t], w[t], keys) for t in range(n)])   # quantisation error only
    assert np.abs(got - exact).max() <= 0.1 * np.abs(exact).max()


@gpu
def test_wgmma_pipeline_equals_bruteforce_of_wgmma_dense():
    """bf16, n=256, L=32768, H=64, D=128, k=2048: wgmma filter + wgmma recover (threshold
    from the mma_sync core) is exact on the wgmma core's own scores."""
    import cupy as cp
    import workbench as wb
    from workbench.families.cupy import wgmma as WG
    from tests.test_cupy_gpu import assert_selection_equal, gpu_topk
    n, L, H, D, k = 256, 32768, 64, 128, 2048
    src, _, rng, _ = _inputs("bf16", n, L, H, D, 21, exact=False)
    lo, hi = G.layout("causal_tail", n, L, k, rng)
    lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
    chosen = {"threshold": "cupy.threshold.mma_sync", "filter": "cupy.filter.wgmma",
              "recover": "cupy.recover.wgmma", "dense": "cupy.dense.wgmma"}
    for max_failed in (64, 0):                                           # 0: every query through recovery
        res = wb.backend("cupy", chosen).hytopk_indexer(src.q, src.w, src.keys, lo_d, hi_d, k, max_failed=max_failed)
        idx, val = gpu_topk(WG.dense_wgmma(src.q, src.w, src.keys, lo_d, hi_d), lo, hi, k)
        assert_selection_equal(res.idx.get(), res.val.get(), idx, val)


@gpu
def test_wgmma_bad_inputs_name_the_argument():
    import cupy as cp
    from workbench.families.cupy import wgmma as WG
    q8 = cp.zeros((2, 4, 32), cp.uint8)
    lo = hi = cp.zeros(2, cp.int32)
    with pytest.raises(TypeError, match="argument 'w'"):
        WG.filter_wgmma(Fp8IndexerSource(q8, cp.zeros((2, 4), cp.float64), cp.zeros((9, 32), cp.uint8),
                                         cp.ones(9, cp.float32)), lo, hi, cp.zeros(2, cp.float32), 8)
    with pytest.raises(ValueError, match="'kscale'"):
        WG.filter_wgmma(Fp8IndexerSource(q8, cp.zeros((2, 4), cp.float32), cp.zeros((9, 32), cp.uint8),
                                         cp.ones(8, cp.float32)), lo, hi, cp.zeros(2, cp.float32), 8)
    with pytest.raises(TypeError, match="argument 'source'"):
        WG.filter_wgmma(R.TableSource(cp.zeros((2, 9), cp.float32)), lo, hi, cp.zeros(2, cp.float32), 8)


@gpu
@pytest.mark.parametrize("core", ["mma_sync", "wgmma", "wgmma_fp8"])
def test_dense_never_writes_past_the_table(core):
    """Contexts far from a block's last key run: that run is filled with -inf up to L, not up
    to the end of the tile (regression: the fill ran up to 127 entries past the table)."""
    import cupy as cp
    from workbench.families.cupy import mma_sync as MS
    from workbench.families.cupy import wgmma as WG
    from workbench.families.cupy._launch import chunks, launch
    n, L, H, D = 37, 9001, 8, 40
    src, _, _, _ = _inputs("fp8" if core == "wgmma_fp8" else "bf16", n, L, H, D, 3, exact=True)
    lo, hi = cp.zeros(n, cp.int32), cp.full(n, 100, cp.int32)
    guard = cp.full(n * L + 4096, 12345.0, cp.float32)
    out = guard[:n * L].reshape(n, L)
    if core == "mma_sync":
        x = MS.MmaSyncInputs(src.q, src.w, src.keys)
        launch(x.fn("hytopk_dense_mma_sync"), (x.geo.groups(n), chunks(L, x.geo.block_keys)),
               (*x.head_args(), np.int32(n), lo, hi, out), x.geo.smem)
    else:
        x = WG.WgInputs(src)
        launch(x.fn("dense"), (x.geo.groups(n), chunks(L, x.geo.block_keys)),
               (*x.head_args(), np.int32(n), lo, hi, out), x.geo.smem)
    assert bool(cp.all(guard[n * L:] == 12345.0)), "dense wrote past the end of the table"
    assert bool(cp.all(cp.isinf(out[:, 100:]))) and bool(cp.all(cp.isfinite(out[:, :100])))
