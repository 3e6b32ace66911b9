"""Issue 21 on a GPU: the table kernels of kernels_cuda/table_topk.cu bit for bit against the
reference (and, at full size, against the exact pure-torch top-k) on the adversarial families,
float32 and bf16 tables, varlen / causal / empty contexts, k > c, k = 512 and 2048, capacity
overflow, the >cap-ties path, unaligned tables; repeatability; the torch op on streams and in
a CUDA graph; bad arguments. Skips without a GPU (the CPU side: tests/test_table_topk.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import reference as R
from reference import generate as G
from tests.strategies import stable_seed
from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits

from strategies import selection_cases

from tests._cupy_gpu import GPU_MARKS, cp  # noqa: E402  (skips the module without CuPy)

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def tab():
    from workbench.families.cupy import table
    return table


def same(i, v, ri, rv):
    i, v = cp.asnumpy(i), cp.asnumpy(v)
    return np.array_equal(i, ri) and np.array_equal(v.view(np.uint32), np.asarray(rv, np.float32).view(np.uint32))


def bf16_table(s):
    """(bf16 bits, the float32 table it stands for)."""
    bits = float32_to_bf16_bits(np.ascontiguousarray(s, np.float32), np)
    return bits, bf16_bits_to_float32(bits)


FAMILIES = G.SCORE_FAMILIES
LAYOUTS = G.LAYOUTS


METHODS = [dict(method="radix"), dict(method="radix", hist_atomics="plain"), dict(method="fused"),
           dict(method="fused", hist_atomics="plain"), dict(method="fused_v2"),
           dict(method="fused_v2", sampling="runs"), dict(method="fused_v2", sampling="contract")]


@settings(max_examples=40)
@given(selection_cases(max_n=6, max_L=5000, max_k=80))
def test_table_topk_matches_reference(tab, case):
    ri, rv = R.topk(case.scores, case.lo, case.hi, case.k)
    bits, wide = bf16_table(case.scores)
    wi, wv = R.topk(wide, case.lo, case.hi, case.k)
    for kw in METHODS:
        assert same(*tab.table_topk(case.scores, case.lo, case.hi, case.k, **kw), ri, rv), kw
        assert same(*tab.table_topk(bits, case.lo, case.hi, case.k, **kw), wi, wv), kw


@pytest.mark.parametrize("design", ["v1", "v2"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_hytopk_counts_are_the_contracts(tab, family, dtype, design):
    """The fused kernel's sample plan and threshold are CONTRACT.md §3.1-3.5's: its candidate
    counts equal the reference's, and its selection is exact whichever path each row took
    (small k: most rows collect; aliasing and plateaus: under/overflow into the fallback)."""
    rng = np.random.default_rng(stable_seed(family, dtype))
    n, L = 6, 40000
    for k, lay in ((64, "full"), (512, "causal_tail"), (2048, "varlen"), (300, "edge")):
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        wide = s
        if dtype == "bfloat16":
            s, wide = bf16_table(s)
        count = cp.zeros(n, cp.int32)
        assert same(*tab.fused_hytopk(s, lo, hi, k, count=count, design=design), *R.topk(wide, lo, hi, k)), (k, lay)
        ref = R.hytopk(wide, lo, hi, k)
        assert np.array_equal(cp.asnumpy(count), ref.count), (k, lay)


def _table_cases(family, dtype, tag, shapes):
    """(layout, n, L, k, lo, hi, table, the table widened to float32, its exact top-k) for each
    (layout, (n, L, k)) of shapes: a score family's table, bf16 bits where dtype says so."""
    rng = np.random.default_rng(stable_seed(family, dtype, tag))
    for lay, (n, L, k) in shapes:
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        wide = s
        if dtype == "bfloat16":
            s, wide = bf16_table(s)
        yield lay, n, L, k, lo, hi, s, wide, R.topk(wide, lo, hi, k)


def _runs_reference(wide, lo, hi, k, run, capacity=None, oversample=3.0, min_rank=0, coarse=0):
    """(T, count, failed) of HyTopK with the samples in runs (reference.run_sample_positions)."""
    M, r = R.sample_plan(lo, hi, k, oversample, min_rank)
    T = R.stage_threshold(R.TableSource(wide), lo, hi, M, r, run, coarse)
    _, _, above = R.stage_filter(R.TableSource(wide), lo, hi, T, 1)
    count = np.where(M > 0, above, np.asarray(hi, np.int64) - np.asarray(lo, np.int64)).astype(np.int32)
    cap = R.resolve_capacity(capacity, k, np.asarray(lo, np.int64), np.asarray(hi, np.int64), 3.0)
    return T, count, R.stage_check(count, lo, hi, k, cap)[0]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_run_sampling_thresholds_counts_and_top_k(tab, family, dtype):
    """sampling="runs" (the contract's M and r, the samples in 64-byte runs where c >= 4 M): the
    fused kernel's counts and the staged plan's thresholds, counts and failed rows equal the
    reference's (run_sample_positions), and both give the exact top-k (rows whose run samples
    alias the scores fall back, exact)."""
    run = 32 if dtype == "bfloat16" else 16
    shapes = (("full", (4, 140000, 2048)), ("varlen", (6, 40000, 512)), ("edge", (6, 40000, 300)),
              ("causal_tail", (5, 20011, 64)))
    for lay, n, L, k, lo, hi, s, wide, exact in _table_cases(family, dtype, "runs", shapes):
        T, want, failed = _runs_reference(wide, lo, hi, k, run)
        count = cp.zeros(n, cp.int32)
        assert same(*tab.fused_hytopk(s, lo, hi, k, count=count, design="v2", sampling="runs"), *exact), (k, lay)
        assert np.array_equal(cp.asnumpy(count), want), (k, lay)
        plan = tab.TableHyTopK(n, L, lo, hi, k, sampling="runs")
        assert same(*plan(cp.asarray(s)), *exact), (k, lay)
        st = plan.stats()
        sampled = R.sample_plan(lo, hi, k, 3.0)[0] > 0
        assert np.array_equal(R.order_keys(st["threshold"])[sampled], R.order_keys(T)[sampled]), (k, lay)
        assert np.array_equal(st["count"], want) and np.array_equal(st["failed"], failed), (k, lay)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_topk_plan_min_rank_counts_and_top_k(tab, family, dtype):
    """table_topk's plan (oversample TOPK_OVERSAMPLE, min_rank TOPK_MIN_RANK, coarse TOPK_COARSE, runs):
    the fused kernel's counts equal the reference's (sample_plan with min_rank: r raised to
    min(M, min_rank), which k = 64 and 300 reach; stage_threshold with coarse: reference.coarse_key),
    also without coarse; the top-k is exact, and table_topk's default gives the same top-k."""
    run = 32 if dtype == "bfloat16" else 16
    os_, mr, co = tab.TOPK_OVERSAMPLE, tab.TOPK_MIN_RANK, tab.TOPK_COARSE
    shapes = (("full", (4, 140000, 2048)), ("full", (4, 140000, 64)), ("varlen", (6, 40000, 300)),
              ("causal_tail", (5, 20011, 64)))
    for lay, n, L, k, lo, hi, s, wide, exact in _table_cases(family, dtype, "min_rank", shapes):
        if k == 64:
            M, r = R.sample_plan(lo, hi, k, os_, mr)
            assert (r[M > 0] >= np.minimum(M[M > 0], mr)).all() and (r > R.sample_plan(lo, hi, k, os_)[1]).any()
        for coarse in (co, 0):
            _, want, _ = _runs_reference(wide, lo, hi, k, run, oversample=os_, min_rank=mr, coarse=coarse)
            count = cp.zeros(n, cp.int32)
            got = tab.fused_hytopk(s, lo, hi, k, count=count, design="v2", sampling="runs", oversample=os_,
                                   min_rank=mr, coarse=coarse)
            assert same(*got, *exact), (k, lay, coarse)
            assert np.array_equal(cp.asnumpy(count), want), (k, lay, coarse)
        assert same(*tab.table_topk(s, lo, hi, k), *exact), (k, lay)


def test_fused_hytopk_plan_arguments(tab):
    s = cp.zeros((2, 4096), cp.float32)
    for bad in (-1, 1.5, True, 2**31):
        with pytest.raises(ValueError, match="min_rank"):
            tab.fused_hytopk(s, [0, 0], [4096, 4096], 64, design="v2", sampling="runs", min_rank=bad)
    with pytest.raises(ValueError, match="min_rank"):
        tab.fused_hytopk(s, [0, 0], [4096, 4096], 64, design="v1", min_rank=8)
    for bad in (-1, 2.0, False, 2**31):
        with pytest.raises(ValueError, match="coarse"):
            tab.fused_hytopk(s, [0, 0], [4096, 4096], 64, design="v2", sampling="runs", coarse=bad)
    with pytest.raises(ValueError, match="coarse"):
        tab.fused_hytopk(s, [0, 0], [4096, 4096], 64, design="v1", coarse=8)


@pytest.mark.parametrize("z", [3.0, -1.0])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_hytopk_one_read_is_the_fused_kernel(tab, family, dtype, z):
    """table_v2.FUSED_ONE_READ = 1 (hytopk_table_fused1 at (1024, 1)): the exact top-k and the
    contract's counts whichever path each row took (z = -1: the one-read plan forced on every row
    with M >= 128; z = 3: the shipped plan), on rows long enough for the pre-sample to matter."""
    from workbench.families.cupy import table_v2 as v2
    rng = np.random.default_rng(stable_seed(family, dtype, "one"))
    n, L = 6, 131072
    saved = v2.FUSED_ONE_READ, v2.FUSED_ONE_READ_Z, v2.FUSED_THREADS, v2.FUSED_MIN_BLOCKS
    v2.FUSED_ONE_READ, v2.FUSED_ONE_READ_Z, v2.FUSED_THREADS, v2.FUSED_MIN_BLOCKS = 1, z, 1024, 1
    try:
        for k, lay in ((64, "full"), (2048, "full"), (512, "causal_tail"), (2048, "varlen"), (300, "edge")):
            lo, hi = G.layout(lay, n, L, k, rng)
            s = G.score_table(family, n, L, k, rng, lo, hi)
            wide = s
            if dtype == "bfloat16":
                s, wide = bf16_table(s)
            count = cp.zeros(n, cp.int32)
            assert same(*tab.fused_hytopk(s, lo, hi, k, count=count, design="v2"), *R.topk(wide, lo, hi, k)), (k, lay)
            assert np.array_equal(cp.asnumpy(count), R.hytopk(wide, lo, hi, k).count), (k, lay)
    finally:
        v2.FUSED_ONE_READ, v2.FUSED_ONE_READ_Z, v2.FUSED_THREADS, v2.FUSED_MIN_BLOCKS = saved


class cluster_kernel:
    """``with cluster_kernel(C, share, grid):`` fused_v2 runs hytopk_table_cluster
    (table_v2.FUSED_CLUSTER = 1) at C blocks per cluster for both dtypes, each row's select shared by
    the cluster or not (None: the shipped configuration), on `grid` clusters (0: one per C SMs); the
    launches of the block are recorded (rec.names())."""

    def __init__(self, C=None, share=None, grid=0):
        from workbench.families.cupy import table_v2 as v2
        self.v2, self.C, self.share, self.grid = v2, C, share, grid

    def __enter__(self):
        from workbench.families.cupy import _launch
        v2 = self.v2
        self.saved = v2.FUSED_CLUSTER, dict(v2.CLUSTER_SIZE), v2.CLUSTER_GRID, v2.CLUSTER_SHARE
        v2.FUSED_CLUSTER, v2.CLUSTER_GRID = 1, self.grid
        if self.share is not None:
            v2.CLUSTER_SHARE = self.share
        if self.C is not None:
            v2.CLUSTER_SIZE = {key: self.C for key in v2.CLUSTER_SIZE}
        self.ctx = _launch.record_launches()
        return self.ctx.__enter__()

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)
        self.v2.FUSED_CLUSTER, self.v2.CLUSTER_SIZE, self.v2.CLUSTER_GRID, self.v2.CLUSTER_SHARE = self.saved
        return False


def launched_cluster(rec) -> bool:
    return any("hytopk_table_cluster" in name for name in rec.names())


@pytest.mark.parametrize("C,share,grid", [(None, None, 0), (4, 1, 3), (8, 0, 1), (4, 0, 2), (8, 1, 40)])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_hytopk_cluster_is_exact_with_the_contracts_counts(tab, family, dtype, C, share, grid):
    """table_v2.FUSED_CLUSTER = 1 (hytopk_table_cluster): the exact top-k and the contract's counts
    whichever path each row took (collected, listed for the radix kernel), on 128K-key rows and
    short ones, full / causal / varlen / edge contexts, both cluster sizes, the select shared by the
    cluster or in the leader alone, a grid of one to three clusters (each cluster many rows: the
    double buffer and every leader in turn) or one cluster per row (each row its cluster's last)."""
    from workbench import instantiations as INST
    from workbench.families.cupy import table_v2 as v2
    cxx = INST.TABLE_BF16 if dtype == "bfloat16" else INST.TABLE
    rng = np.random.default_rng(stable_seed(family, dtype, "cluster"))
    for n, L, k, lay in ((6, 131072, 2048, "full"), (9, 131072, 512, "causal_tail"), (7, 131071, 2048, "varlen"),
                         (11, 40000, 300, "edge"), (5, 5003, 64, "random")):
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        wide = s
        if dtype == "bfloat16":
            s, wide = bf16_table(s)
        count = cp.zeros(n, cp.int32)
        with cluster_kernel(C, share, grid) as rec:
            i, v = tab.fused_hytopk(s, lo, hi, k, count=count, design="v2")
        # rows that do not fit C blocks' shared memory (float32 128K keys at C = 4) take the fused kernel
        fits = v2.cluster_geometry(L, cxx, k, C) is not None
        assert launched_cluster(rec) == fits, (L, k, lay, fits)
        assert same(i, v, *R.topk(wide, lo, hi, k)), (L, k, lay)
        assert np.array_equal(cp.asnumpy(count), R.hytopk(wide, lo, hi, k).count), (L, k, lay)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_hytopk_cluster_listed_rows_and_unaligned_tables(tab, dtype):
    """The cluster kernel's listed rows (an all-equal row and a plateau overflow its cap; a row of
    NaNs; c <= k and empty rows stay with it) and tables whose base is not 16-byte aligned (every
    slice by ordinary loads), rows ending at the table's end."""
    rng = np.random.default_rng(3)
    n, L, k = 6, 65537, 2048
    for off in (0, 1, 3):
        s = rng.standard_normal((n, L)).astype(np.float32)
        s[1] = 0.5
        s[2, ::3] = 0.0
        s[2, 1::3] = 0.0
        s[3] = np.nan
        lo, hi = np.array([0, 3, 1, 0, 100, 7]), np.array([L, L, L - 1, L, 100 + k - 1, 7])
        wide = s
        if dtype == "bfloat16":
            s, wide = bf16_table(s)
        # base pointer `off` elements past the allocation's (256-byte aligned) start
        table = cp.asarray(np.concatenate([np.zeros(off, s.dtype), s.ravel()]))[off:].reshape(n, L)
        count = cp.zeros(n, cp.int32)
        with cluster_kernel() as rec:
            i, v = tab.fused_hytopk(table, lo, hi, k, count=count, design="v2")
        assert launched_cluster(rec), off
        assert same(i, v, *R.topk(wide, lo, hi, k)), off
        assert np.array_equal(cp.asnumpy(count), R.hytopk(wide, lo, hi, k).count), off


def test_fused_hytopk_cluster_keeps_the_fused_kernel_for_long_rows(tab):
    """Rows longer than a cluster's shared memory (1M keys) stay with hytopk_table_fused."""
    rng = np.random.default_rng(4)
    n, L, k = 2, 1 << 20, 2048
    s = rng.standard_normal((n, L)).astype(np.float32)
    lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    with cluster_kernel() as rec:
        i, v = tab.fused_hytopk(s, lo, hi, k, design="v2")
    assert not launched_cluster(rec)
    assert same(i, v, *R.topk(s, lo, hi, k))


@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("family", FAMILIES)
def test_table_topk_large_k_every_family(tab, family, k):
    rng = np.random.default_rng(stable_seed(family, k))
    n, L = 8, 3 * k + 1001                    # rows not a multiple of 4 or 8 long: unaligned row starts
    for lay in LAYOUTS:
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        bits, wide = bf16_table(s)
        for kw in METHODS:
            assert same(*tab.table_topk(s, lo, hi, k, **kw), *R.topk(s, lo, hi, k)), (lay, kw)
            assert same(*tab.table_topk(bits, lo, hi, k, **kw), *R.topk(wide, lo, hi, k)), (lay, kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_more_ties_at_the_kth_key_than_fit_in_shared_memory(tab, dtype):
    """A ReLU plateau of 60000 zeros (> the collect capacity) around the k-th key: the in-order
    tie scan with its position select; also an all-equal row and a row of NaNs."""
    n, L, k = 4, 60000, 2048
    s = np.zeros((n, L), np.float32)
    rng = np.random.default_rng(1)
    s[0, rng.choice(L, 1000, replace=False)] = 1.0 + rng.random(1000).astype(np.float32)
    s[1] = 3.0
    s[2] = np.nan
    s[3, ::2] = -0.0
    lo, hi = np.array([0, 17, 5, 0]), np.array([L, L, L - 3, L])
    if dtype == "bfloat16":
        s, wide = bf16_table(s)
    else:
        wide = s
    for kw in METHODS:
        assert same(*tab.table_topk(s, lo, hi, k, **kw), *R.topk(wide, lo, hi, k)), kw


def test_unaligned_table_base_and_edges(tab):
    rng = np.random.default_rng(2)
    n, L, k = 5, 4099, 300
    flat = cp.asarray(rng.standard_normal(n * L + 3).astype(np.float32))
    for off in (0, 1, 2, 3):                  # base pointer 4 * off bytes past 16-byte alignment
        s = flat[off:off + n * L].reshape(n, L)
        lo, hi = np.array([0, 1, 2, 3, 4097]), np.array([L, L - 1, 4001, 7, L])
        for kw in METHODS:
            assert same(*tab.table_topk(s, lo, hi, k, **kw), *R.topk(cp.asnumpy(s), lo, hi, k)), (off, kw)


def _check_filter(filt, s, lo, hi, T, capacity, scores=None):
    """filt's candidates against stage_filter: the same set (any order) where they fit; on
    overflow the true count and `capacity` distinct true candidates."""
    src = s if scores is None else scores           # what the kernel reads (bf16 bits) / what it stands for
    ci, cv, cnt = (cp.asnumpy(x) for x in filt(R.TableSource(cp.asarray(src)), lo, hi, T, capacity))
    ri, rv, rc = R.stage_filter(R.TableSource(s), lo, hi, T, capacity)
    assert np.array_equal(cnt, rc)
    for t in range(len(lo)):
        m = min(int(rc[t]), capacity)
        got = sorted(zip(ci[t, :m].tolist(), cv[t, :m].view(np.uint32).tolist()))
        if rc[t] <= capacity:
            want = sorted(zip(ri[t, :m].tolist(), rv[t, :m].view(np.uint32).tolist()))
            assert got == want, t
        else:                          # overflow: capacity distinct true candidates
            pos = np.array([p for p, _ in got])
            assert len(set(pos.tolist())) == capacity and ((pos >= lo[t]) & (pos < hi[t])).all()
            tkey = R.order_keys(np.array([T[t]], np.float32))[0]
            assert (R.order_keys(s[t, pos]) >= tkey).all()
            assert np.array_equal(s[t, pos].view(np.uint32), np.array([b for _, b in got], np.uint32))
        assert (ci[t, m:] == -1).all(), t  # nothing written at or past the count / capacity


def _filters():
    from workbench.families.cupy.table import filter_table_stream
    from workbench.families.cupy.table_v2 import filter_table_v2
    return {"v1": filter_table_stream, "v2": filter_table_v2}


@pytest.mark.parametrize("design", ["v1", "v2"])
def test_filter_stage_matches_reference_including_overflow(tab, design):
    filter_table_stream = _filters()[design]
    rng = np.random.default_rng(4)
    for family, lay in [("gaussian", "full"), ("relu_plateau", "causal_tail"), ("alias_between_samples", "varlen"),
                        ("specials", "edge")]:
        n, L, k = 6, 9000, 64
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        M, r = R.sample_plan(lo, hi, k, 3.0)
        T = R.stage_threshold(R.TableSource(s), lo, hi, M, r)
        for capacity in (k, 500, L):
            _check_filter(filter_table_stream, s, lo, hi, T, capacity)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("design", ["v1", "v2"])
def test_filter_stage_long_rows_pieces_and_every_threshold_kind(tab, design, dtype):
    """Rows of several pieces (v2: 32768 float32 / 49152 bf16 elements each) with contexts
    starting and ending inside 16-byte vectors, an unaligned table base, and thresholds of every
    kind the range test distinguishes: positive, +0, -0, negative, subnormal, +inf, -inf, NaN;
    plateaus larger than the filter's shared-memory stage (its global spill path) and capacity
    overflow."""
    filt = _filters()[design]
    rng = np.random.default_rng(41)
    n, L = 12, 100003                        # odd L: row starts fall anywhere in a vector
    s = rng.standard_normal((n, L)).astype(np.float32)
    s[:, ::5] = 0.0
    s[:, 1::7] = -0.0
    s[:, 2::11] = np.nan
    s[:, 3::13] = -np.inf
    s[:, 4::17] = np.inf
    s[:, 6::19] = np.float32(1e-45)
    s[:, 8::23] = np.float32(-1e-45)
    s[3, 1000:60000] = 2.5                    # a plateau of 59000 at the threshold: > one piece's stage
    lo = np.array([0, 1, 3, 7, 0, 5, 32767, 32768, 0, 2, 65000, 100002], np.int32)
    hi = np.array([L, L - 1, 70001, L, 9, L - 3, 65537, 98304, L, 40000, 100000, L], np.int32)
    T = np.array([0.5, 0.0, -0.0, 2.5, np.nan, -1.0, 1e-45, -1e-45, np.inf, -np.inf, 1.5, np.nan], np.float32)
    wide, kernel_scores = s, None
    if dtype == "bfloat16":
        kernel_scores, wide = bf16_table(s)
    for capacity in (64, 5000, L):
        _check_filter(filt, wide, lo, hi, T, capacity, scores=kernel_scores)
    if dtype == "float32":
        for off in (1, 2, 3):                 # base pointer 4 * off bytes past 16-byte alignment
            buf = cp.zeros(n * L + 4, cp.float32)
            buf[off:off + n * L] = cp.asarray(s.ravel())
            _check_filter(filt, s, lo, hi, T, 5000, scores=buf[off:off + n * L].reshape(n, L))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_threshold_v2_keys_are_the_contracts(tab, dtype):
    """cupy.threshold.table_v2 gives the key of stage_threshold's T (its value is the key's
    canonical score: only the key matters, CONTRACT.md §3.4) on every family, with 4096 samples
    whose stride aliases the scores (M = 8192: the full-size test's plans)."""
    from workbench.families.cupy.table_v2 import threshold_table_v2
    rng = np.random.default_rng(42)
    for family in FAMILIES:
        for lay, (n, L, k) in (("varlen", (4, 140000, 2048)), ("edge", (6, 40000, 300)), ("causal_tail", (5, 9001, 64))):
            lo, hi = G.layout(lay, n, L, k, rng)
            s = G.score_table(family, n, L, k, rng, lo, hi)
            wide = s
            if dtype == "bfloat16":
                s, wide = bf16_table(s)
            M, r = R.sample_plan(lo, hi, k, 3.0)
            want = R.order_keys(R.stage_threshold(R.TableSource(wide), lo, hi, M, r))
            got = R.order_keys(cp.asnumpy(threshold_table_v2(R.TableSource(cp.asarray(s)), lo, hi, M, r)))
            assert np.array_equal(got, want), (family, lay)


def test_select_smem_matches_reference_in_and_past_shared_memory(tab):
    """cupy.select.smem on rows whose candidates fit its shared memory and on rows past it
    (capacity 20000 > its 8192: the global-memory path), with ties, NaN and -0."""
    from workbench.families.cupy.table_v2 import select_smem
    rng = np.random.default_rng(43)
    n, capacity, k = 6, 20000, 2048
    ci = np.full((n, capacity), -1, np.int32)
    cv = np.full((n, capacity), -np.inf, np.float32)
    count = np.array([0, 100, 2048, 8192, 8193, 20000], np.int32)
    for t, m in enumerate(count):
        ci[t, :m] = rng.permutation(50000)[:m]
        cv[t, :m] = rng.integers(-3, 4, m).astype(np.float32)
        cv[t, :m:9] = np.nan
        cv[t, 1:m:7] = -0.0
    i, v = select_smem(cp.asarray(ci), cp.asarray(cv), cp.asarray(count), k)
    ri, rv = R.stage_select(ci, cv, count, k)
    assert same(i, v, ri, rv)


@pytest.mark.parametrize("family,lay", [("gaussian", "full"), ("relu_plateau", "causal_tail"),
                                        ("alias_on_samples", "varlen"), ("alias_between_samples", "edge"),
                                        ("ties_at_kth", "random"), ("specials", "full"), ("equal", "varlen")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernels", ["v1", "v2"])
def test_table_hytopk_plan_matches_reference(tab, family, lay, dtype, kernels):
    rng = np.random.default_rng(stable_seed(family, lay))
    n, L, k = 16, 40000, 512
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    wide = s
    if dtype == "bfloat16":
        s, wide = bf16_table(s)
    for capacity in (None, k):                # k: most rows fail and are recovered on the device
        plan = tab.TableHyTopK(n, L, lo, hi, k, capacity=capacity, kernels=kernels)
        assert same(*plan(cp.asarray(s)), *R.topk(wide, lo, hi, k))
        ref = R.hytopk(wide, lo, hi, k, capacity=capacity)
        st = plan.stats()
        assert np.array_equal(st["count"], ref.count) and np.array_equal(st["failed"], ref.failed)


@pytest.mark.parametrize("chunks", [2, 3, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_table_hytopk_v2_overlapped_equals_the_sequential_path(tab, dtype, chunks):
    """table_v2.STAGED_CHUNKS (threshold / filter / select in row chunks on three streams): the same
    idx, values, counts and failed rows as the sequential v2 path and the reference, chunks that do not
    divide the rows, rows recovered on the device (capacity k), and inside a torch.cuda.graph."""
    torch = pytest.importorskip("torch")
    from workbench.families.cupy import _launch
    from workbench.families.cupy import table_v2 as v2

    def as_torch(x):                          # float32, or bf16 bits -> a torch bfloat16 table
        x = np.ascontiguousarray(x)
        t = torch.from_numpy(x.view(np.int16) if x.dtype == np.uint16 else x).cuda()
        return t.view(torch.bfloat16) if x.dtype == np.uint16 else t

    rng = np.random.default_rng(chunks)
    n, L, k = 37, 30000, 512
    lo, hi = G.layout("varlen", n, L, k, rng)
    s = G.score_table("relu_plateau", n, L, k, rng, lo, hi)
    wide = s
    if dtype == "bfloat16":
        s, wide = bf16_table(s)
    for capacity in (None, k):
        seq = tab.TableHyTopK(n, L, lo, hi, k, capacity=capacity, kernels="v2")
        i0, v0 = (x.copy() for x in seq(cp.asarray(s)))
        st0 = seq.stats()
        plan = tab.TableHyTopK(n, L, lo, hi, k, capacity=capacity, kernels="v2")
        saved = v2.STAGED_CHUNKS
        v2.STAGED_CHUNKS = chunks
        try:
            with _launch.record_launches() as rec:
                i, v = plan(cp.asarray(s))
            assert sum("hytopk_table_threshold" in name for name in rec.names()) == chunks
            assert same(i, v, *R.topk(wide, lo, hi, k))
            assert bool((i == i0).all()) and bool((v.view(cp.uint32) == v0.view(cp.uint32)).all())
            st = plan.stats()
            assert np.array_equal(st["count"], st0["count"]) and np.array_equal(st["failed"], st0["failed"])
            table = as_torch(s)
            plan(table)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                gi, gv = plan(table)
            table.copy_(as_torch(s[::-1]))
            graph.replay()
            torch.cuda.synchronize()
            ri, rv = R.topk(np.ascontiguousarray(wide[::-1]), lo, hi, k)
            assert same(gi, gv, ri, rv)
        finally:
            v2.STAGED_CHUNKS = saved


def test_backend_defaults_use_the_table_variants():
    import workbench
    b = workbench.backend("cupy")
    assert b.stages.filter.name == "cupy.filter.auto" and b.stages.recover.name == "cupy.recover.auto"
    rng = np.random.default_rng(5)
    n, L, k = 12, 20000, 2048
    lo, hi = G.layout("varlen", n, L, k, rng)
    s = G.score_table("ties_at_kth", n, L, k, rng, lo, hi)
    ri, rv = R.topk(s, lo, hi, k)
    lo_d, hi_d = cp.asarray(lo), cp.asarray(hi)
    assert same(*b.topk(cp.asarray(s), lo_d, hi_d, k), ri, rv)
    res = b.hytopk(cp.asarray(s), lo_d, hi_d, k)
    assert same(res.idx, res.val, ri, rv)


def test_recover_stage_on_a_subset_of_rows(tab):
    from workbench.families.cupy.table import recover_table_radix
    rng = np.random.default_rng(6)
    n, L, k = 10, 7000, 128
    lo, hi = G.layout("random", n, L, k, rng)
    s = G.score_table("clustered", n, L, k, rng, lo, hi)
    rows = np.array([7, 0, 3, 3], np.int32)
    i, v = recover_table_radix(R.TableSource(cp.asarray(s)), lo, hi, rows, k)
    ri, rv = R.stage_recover(R.TableSource(s), lo, hi, rows, k)
    assert same(i, v, ri, rv)


def test_repeatable_bit_for_bit(tab):
    rng = np.random.default_rng(7)
    n, L, k = 64, 50000, 2048
    lo, hi = G.layout("causal_tail", n, L, k, rng)
    s = cp.asarray(G.score_table("ties_at_kth", n, L, k, rng, lo, hi))
    first = [cp.asnumpy(x) for x in tab.table_topk(s, lo, hi, k)]
    plans = [tab.TableHyTopK(n, L, lo, hi, k, kernels=kern) for kern in ("v1", "v2")]
    hy = [cp.asnumpy(x).copy() for x in plans[0](s)]
    for _ in range(20):
        for kw in METHODS:
            again = [cp.asnumpy(x) for x in tab.table_topk(s, lo, hi, k, **kw)]
            assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(first, again))
        for plan in plans:
            again = [cp.asnumpy(x) for x in plan(s)]
            assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(hy, again))


@pytest.mark.parametrize("n,L", [(512, 131072), (32, 1048576)])
def test_full_size_rows_match_exact_torch_topk(tab, n, L):
    torch = pytest.importorskip("torch")
    from workbench.torch.table_topk import exact_topk_torch
    k = 2048
    g = torch.Generator(device="cuda").manual_seed(0)
    s = torch.randn((n, L), device="cuda", generator=g)
    s[:, ::97] = 0.0
    lo = torch.zeros(n, dtype=torch.int32, device="cuda")
    hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
    hi[n // 2:] = torch.arange(L - n // 2, L, device="cuda", dtype=torch.int32)[: n - n // 2]
    ti, tv = exact_topk_torch(s, lo, hi, k, chunk=16)
    for table in (s, s.bfloat16()):
        if table.dtype == torch.bfloat16:
            ti, tv = exact_topk_torch(table, lo, hi, k, chunk=16)
        for kw in METHODS:
            i, v = tab.table_topk(table, lo, hi, k, **kw)
            assert torch.equal(torch.from_dlpack(i), ti) and torch.equal(torch.from_dlpack(v).view(torch.int32),
                                                                         tv.view(torch.int32)), kw
        for kernels, sampling in (("v1", "contract"), ("v2", "contract"), ("v2", "runs")):
            plan = tab.TableHyTopK(n, L, lo.cpu().numpy(), hi.cpu().numpy(), k, kernels=kernels, sampling=sampling)
            i, v = plan(table)
            assert torch.equal(torch.from_dlpack(i), ti), (kernels, sampling)


def test_torch_op_on_side_stream_and_in_a_cuda_graph():
    torch = pytest.importorskip("torch")
    import workbench.torch as wt
    rng = np.random.default_rng(8)
    n, L, k = 8, 9000, 512
    lo, hi = G.layout("varlen", n, L, k, rng)
    s_h = G.score_table("specials", n, L, k, rng, lo, hi)
    ri, rv = R.topk(s_h, lo, hi, k)
    s = torch.from_numpy(s_h).cuda()
    lo_t, hi_t = torch.from_numpy(lo).cuda(), torch.from_numpy(hi).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        i, v = wt.topk(s, lo_t, hi_t, k)
    torch.cuda.current_stream().wait_stream(side)
    assert np.array_equal(i.cpu().numpy(), ri) and np.array_equal(v.cpu().numpy().view(np.uint32), rv.view(np.uint32))
    wt.topk(s, lo_t, hi_t, k)                 # warm-up (compiles) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gi, gv = wt.topk(s, lo_t, hi_t, k)
    s.copy_(torch.from_numpy(s_h[::-1].copy()).cuda())
    graph.replay()
    torch.cuda.synchronize()
    ri2, rv2 = R.topk(s_h[::-1].copy(), lo, hi, k)
    assert np.array_equal(gi.cpu().numpy(), ri2) and np.array_equal(gv.cpu().numpy().view(np.uint32), rv2.view(np.uint32))
    bi, bv = wt.topk(s.bfloat16(), lo_t, hi_t, k)
    wi, wv = R.topk(s.bfloat16().float().cpu().numpy(), lo, hi, k)
    assert np.array_equal(bi.cpu().numpy(), wi)


def test_ranges_ok_kernel_is_the_contexts_check(tab):
    """hytopk_table_ranges_ok (the torch op's device-side check of int32 contexts, one kernel where the
    same check in torch ops took seven): 1 exactly when 0 <= lo <= hi <= L on every row, for grids of
    one partial and several strided passes of its 1024 threads; a bad row anywhere gives 0."""
    L = 1000
    rng = np.random.default_rng(3)
    ok = cp.full(1, 7, cp.uint8)
    for n in (1, 5, 1024, 3001):
        lo = rng.integers(0, L + 1, n).astype(np.int32)
        hi = np.minimum(L, lo + rng.integers(0, L, n)).astype(np.int32)
        lo[0], hi[0] = L, L                        # an empty context at the end: valid
        tab.launch_ranges_ok(cp.asarray(lo), cp.asarray(hi), L, ok)
        assert int(ok[0]) == 1, n
        for t, (a, b) in ((n - 1, (-1, 3)), (n // 2, (5, 4)), (0, (0, L + 1)), (n - 1, (-(2**31), L))):
            bad_lo, bad_hi = lo.copy(), hi.copy()
            bad_lo[t], bad_hi[t] = a, b
            ok[0] = 7
            tab.launch_ranges_ok(cp.asarray(bad_lo), cp.asarray(bad_hi), L, ok)
            assert int(ok[0]) == 0, (n, t, a, b)
    with pytest.raises(ValueError, match="argument 'hi'"):
        tab.launch_ranges_ok(cp.zeros(3, cp.int32), cp.zeros(3, cp.int64), L, ok)


@pytest.mark.parametrize("beside", [True, False])
def test_torch_op_bad_ranges_fire_its_device_assert(beside):
    """The op's range check (hytopk_table_ranges_ok, then torch._assert_async) beside the kernels on a
    side stream (table_topk.RANGE_CHECK_BESIDE, joined back before the op returns) or first on the
    caller's stream: good contexts run clean twice, a row with hi = L + 1 raises the device-side
    assert at the next sync. In a subprocess: the assert ends its CUDA context."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = (
        "import sys, torch\n"
        "import workbench.torch as wt\n"
        "from workbench.torch import table_topk as op\n"
        f"op.RANGE_CHECK_BESIDE = {beside}\n"
        "s = torch.randn(4, 5000, device='cuda')\n"
        "lo = torch.zeros(4, dtype=torch.int32, device='cuda')\n"
        "hi = torch.full((4,), 5000, dtype=torch.int32, device='cuda')\n"
        "for _ in range(2):\n"
        "    i, v = wt.topk(s, lo, hi, 64)\n"
        "    torch.cuda.synchronize()\n"
        "assert torch.equal(v, torch.topk(s, 64, dim=1).values)\n"
        "hi[2] = 5001\n"
        "try:\n"
        "    wt.topk(s, lo, hi, 64)\n"
        "    torch.cuda.synchronize()\n"
        "except RuntimeError as e:\n"
        "    print('RAISED', 'assert' in str(e).lower())\n"
        "    sys.exit(0)\n"
        "print('NO ERROR')\n")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH"), str(root)) if p])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert "RAISED True" in r.stdout, r.stdout + r.stderr[-2000:]


def test_torch_op_never_syncs_the_host():
    """torch.ops.hytopk.topk on CUDA tensors checks lo/hi on the device (no copy to the host, no wait for
    the GPU): it runs under torch.cuda.set_sync_debug_mode("error"), exact; bad ranges still never
    reach memory out of the row (the kernels clamp them)."""
    torch = pytest.importorskip("torch")
    import workbench.torch as wt
    rng = np.random.default_rng(12)
    n, L, k = 6, 40000, 512
    lo, hi = G.layout("varlen", n, L, k, rng)
    s_h = G.score_table("gaussian", n, L, k, rng, lo, hi)
    s = torch.from_numpy(s_h).cuda()
    lo_t, hi_t = torch.from_numpy(lo).cuda(), torch.from_numpy(hi).cuda()
    wt.topk(s, lo_t, hi_t, k)                 # warm-up: compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        i, v = wt.topk(s, lo_t, hi_t, k)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ri, rv = R.topk(s_h, lo, hi, k)
    assert np.array_equal(i.cpu().numpy(), ri) and np.array_equal(v.cpu().numpy().view(np.uint32), rv.view(np.uint32))


def test_bad_arguments_name_the_argument(tab):
    s = cp.zeros((3, 100), cp.float32)
    lo, hi = np.zeros(3, np.int32), np.full(3, 100, np.int32)
    with pytest.raises(ValueError, match="'k'"):
        tab.table_topk(s, lo, hi, 100000)
    with pytest.raises(ValueError, match="'k'"):
        tab.table_topk(s, lo, hi, 0)
    with pytest.raises(TypeError, match="'scores'"):
        tab.table_topk(cp.zeros((3, 100), cp.float64), lo, hi, 4)
    with pytest.raises(ValueError, match="'hi'"):
        tab.table_topk(s, lo, np.full(3, 101), 4)
    with pytest.raises(ValueError, match="'lo'"):
        tab.table_topk(s, np.zeros(2, np.int32), hi, 4)
    with pytest.raises(ValueError, match="'scores'"):
        tab.TableHyTopK(3, 100, lo, hi, 4)(cp.zeros((3, 99), cp.float32))
    with pytest.raises(ValueError, match="'method'"):
        tab.table_topk(s, lo, hi, 4, method="sort")
    with pytest.raises(ValueError, match="'hist_atomics'"):
        tab.table_topk(s, lo, hi, 4, hist_atomics="none")
    with pytest.raises(ValueError, match="'count'"):
        tab.fused_hytopk(s, lo, hi, 4, count=cp.zeros(2, cp.int32))
    with pytest.raises(ValueError, match="'oversample'"):
        tab.fused_hytopk(s, lo, hi, 4, oversample=-1.0)
    with pytest.raises(ValueError, match="'design'"):
        tab.fused_hytopk(s, lo, hi, 4, design="v3")
    with pytest.raises(ValueError, match="'kernels'"):
        tab.TableHyTopK(3, 100, lo, hi, 4, kernels="v3")
    with pytest.raises(ValueError, match="'sampling'"):
        tab.table_topk(s, lo, hi, 4, sampling="every")
    with pytest.raises(ValueError, match="'sampling'"):
        tab.TableHyTopK(3, 100, lo, hi, 4, kernels="v1", sampling="runs")
    with pytest.raises(ValueError, match="'sampling'"):
        tab.fused_hytopk(s, lo, hi, 4, design="v1", sampling="runs")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pipeline_plan_on_tables_uses_the_table_variants(dtype):
    """The pipeline driver's plan (Backend.plan(...).table) with the CuPy defaults on float32 and
    bf16 tables, host and device-side (capture-safe) recovery: the streaming filter and the radix
    recovery (empty recovery slots -1 are skipped) give the exact top-k."""
    import workbench
    b = workbench.backend("cupy")
    rng = np.random.default_rng(11)
    n, L, k = 24, 30000, 512
    for family, lay, capacity in (("alias_between_samples", "varlen", None), ("relu_plateau", "causal_tail", k),
                                  ("gaussian", "full", None)):
        lo, hi = G.layout(lay, n, L, k, rng)
        s = G.score_table(family, n, L, k, rng, lo, hi)
        wide = s
        if dtype == "bfloat16":
            s, wide = bf16_table(s)
        ri, rv = R.topk(wide, lo, hi, k)
        plan = b.plan(lo, hi, k, capacity=capacity)
        for capture_safe in (False, True):
            res = plan.table(cp.asarray(s), capture_safe=capture_safe).host()
            assert np.array_equal(cp.asnumpy(res.idx), ri), (family, capture_safe)
            assert np.array_equal(cp.asnumpy(res.val).view(np.uint32), rv.view(np.uint32)), (family, capture_safe)
