"""Issue 21, the second table design (kernels_cuda/table_v2.cu) on the CPU: its kernels are
instantiated for both table dtypes, and NumPy mirrors of the two pieces of integer arithmetic
it relies on are exact: the two-range form of key(x) >= key(T) (KeyAtLeast, hytopk_table.cuh)
against the contract's order keys on every special value and many random bit patterns, and the
quotient/remainder stepping of the sample positions (gather_sample_keys) against
lo + (j * c) // M. The kernels themselves: tests/test_table_topk_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

import reference as R
from workbench import instantiations as INST

U32 = np.uint32


def key_at_least_mirror(tb: int):
    """hytopk_table.cuh KeyAtLeast::of, line for line."""
    mag = tb & 0x7FFFFFFF
    if mag > 0x7F800000:
        return 0, 0xFFFFFFFF, 0, 0xFFFFFFFF
    if mag == 0:
        return 0, 0x7F800000, 0x80000000, 0
    if tb < 0x80000000:
        return tb, 0x7F800000 - tb, tb, 0x7F800000 - tb
    return 0, 0x7F800000, 0x80000000, tb - 0x80000000


def passes(tb: int, bits: np.ndarray) -> np.ndarray:
    a1, s1, a2, s2 = (U32(x) for x in key_at_least_mirror(tb))
    with np.errstate(over="ignore"):
        return ((bits - a1) <= s1) | ((bits - a2) <= s2)     # uint32 wrap-around, as in CUDA


SPECIAL = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
                    0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001,
                    0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC00000, 0xFFFFFFFF, 0x40490FDB, 0xC0490FDB], U32)


def test_range_test_is_the_order_key_comparison():
    rng = np.random.default_rng(0)
    bits = np.concatenate([SPECIAL, SPECIAL + U32(1), SPECIAL - U32(1),
                           rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(U32)])
    keys = R.order_keys(bits.view(np.float32)).astype(np.uint64)
    thresholds = np.concatenate([SPECIAL, rng.integers(0, 2**32, 300, dtype=np.uint64).astype(U32)])
    for tb in thresholds.tolist():
        tkey = int(R.order_keys(np.array([tb], U32).view(np.float32))[0])
        assert np.array_equal(passes(tb, bits), keys >= tkey), hex(tb)


def single_mirror(tb: int) -> bool:
    """KeyAtLeast::single: a positive normal T or +inf (one range, one float compare an element)."""
    a1, s1, a2, s2 = key_at_least_mirror(tb)
    return a1 == a2 and s1 == s2 and a1 >= 0x00800000


def test_one_range_float_compare_is_the_order_key_comparison():
    """KeyAtLeast::test<true> where single() holds: b >= T as floats equals key(b) >= key(T) on every
    special value and random bits, also with subnormal inputs flushed to zero (CuPy's -ftz=true). A
    subnormal T is not single(): flushed, it would let +0 (and every subnormal below T) through."""
    rng = np.random.default_rng(2)
    bits = np.concatenate([SPECIAL, SPECIAL + U32(1), SPECIAL - U32(1),
                           rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(U32)])
    keys = R.order_keys(bits.view(np.float32)).astype(np.uint64)
    x = bits.view(np.float32)
    flushed = np.where((bits & U32(0x7F800000)) == 0, np.float32(0), x)
    thresholds = np.concatenate([SPECIAL, rng.integers(0x00800000, 0x7F800001, 300, dtype=np.uint64).astype(U32),
                                 rng.integers(0, 2**32, 300, dtype=np.uint64).astype(U32)])
    tested = 0
    for tb in thresholds.tolist():
        tkey = int(R.order_keys(np.array([tb], U32).view(np.float32))[0])
        if not single_mirror(tb):
            assert not (0x00800000 <= tb <= 0x7F800000), hex(tb)
            continue
        t = np.array([tb], U32).view(np.float32)[0]
        with np.errstate(invalid="ignore"):
            assert np.array_equal(x >= t, keys >= tkey), hex(tb)
            assert np.array_equal(flushed >= t, keys >= tkey), hex(tb)
        tested += 1
    assert tested >= 300
    tb = 0x00000010                                       # a subnormal T, flushed: +0 would pass
    tkey = int(R.order_keys(np.array([tb], U32).view(np.float32))[0])
    assert not single_mirror(tb)
    with np.errstate(invalid="ignore"):
        assert not np.array_equal(flushed >= np.float32(0), keys >= tkey)


def test_bits_of_key_is_a_canonical_score_of_that_key():
    """bits_of_key (hytopk_table.cuh): the threshold kernel's T has the selected key (the key
    of a sample, so every key some score has)."""
    rng = np.random.default_rng(1)
    scores = np.concatenate([SPECIAL, rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(U32)])
    keys = R.order_keys(scores.view(np.float32)).astype(U32)
    bits = np.where(keys >= U32(0x80000000), keys ^ U32(0x80000000), ~keys).astype(U32)
    assert np.array_equal(R.order_keys(bits.view(np.float32)), keys)


@pytest.mark.parametrize("c", [4097, 8191, 8192, 131072, 1_000_003, 1 << 30, 2**31 - 1])
def test_sample_position_stepping_is_exact(c):
    """gather_sample_keys: thread j0 starts at (j0 * c) // M and steps by B samples with
    quotient dq and remainder dr; every position equals the contract's lo + (j * c) // M."""
    M = int(R.num_samples(np.array([c]))[0])
    B, PER = 512, 16
    dq, dr = divmod(B * c, M)
    want = (np.arange(M, dtype=np.int64) * c) // M
    got = np.empty(M, np.int64)
    for j0 in range(0, B):
        Q, Rm = divmod(j0 * c, M)
        for i in range(PER):
            j = j0 + i * B
            if j < M:
                got[j] = Q
            Q, Rm = Q + dq, Rm + dr
            if Rm >= M:
                Q, Rm = Q + 1, Rm - M
    assert np.array_equal(got, want)


def test_table_v2_kernels_are_instantiated_for_both_table_dtypes():
    names = INST.name_expressions("table_v2.cu")
    for kern in ("hytopk_table_threshold", "hytopk_table_filter_pieces", "hytopk_table_fused"):
        for src in (INST.TABLE, INST.TABLE_BF16):
            assert f"{kern}<{src}>" in names
    assert "hytopk_select_smem" in names


def visits_mirror(L, P, n, t, a, c, pieces, piece_vecs, B, U, aligned):
    """Every (position, full) the filter's blocks of row t hand on, mirroring
    hytopk_table_filter_pieces + stream_row + stream_tile (flat vector numbering, pieces of the
    row's vector range, block steps, the unchecked path's condition)."""
    row0, total = t * L, n * L
    g_lo, g_hi = row0 + a, row0 + a + c
    v_row, v_row_end = g_lo // P, (g_hi + P - 1) // P
    seen = []
    for j in range(pieces):
        v_first = v_row + j * piece_vecs
        v_stop = min(v_row_end, v_first + piece_vecs)
        vs, step = v_first, B * U
        while vs < v_stop:
            full = aligned and vs * P >= g_lo and (vs + step) * P <= g_hi and vs + step <= v_stop
            for tid in range(B):
                for u in range(U):
                    v = vs + tid + u * B
                    if full:
                        assert v < v_stop and (v + 1) * P <= total
                    for e in range(P):
                        p = v * P + e - row0
                        if full or (v < v_stop and a <= p < a + c):
                            seen.append((p, full))
            vs += step
    return seen


@pytest.mark.parametrize("P", [4, 8])
def test_filter_pieces_visit_every_context_element_once(P):
    """The (row, piece) decomposition and the unchecked steps: each position of [lo, hi) once,
    nothing outside it, for contexts starting and ending anywhere in a vector, rows whose
    starts are not vector aligned, and several pieces per row (small B, U, pieces here)."""
    rng = np.random.default_rng(P)
    B, U, steps = 4, 2, 3
    piece_vecs = B * U * steps
    for _ in range(300):
        L = int(rng.integers(1, 400))
        n = int(rng.integers(1, 4))
        t = int(rng.integers(0, n))
        a = int(rng.integers(0, L + 1))
        c = int(rng.integers(0, L - a + 1))
        aligned_base = bool(rng.integers(0, 2))
        span = L // P if (aligned_base and L % P == 0) else (L - 1) // P + 2   # table_v2.filter_geometry
        pieces = max(1, -(-span // piece_vecs))
        got = visits_mirror(L, P, n, t, a, c, pieces, piece_vecs, B, U, aligned_base)
        pos = sorted(p for p, _ in got)
        assert pos == list(range(a, a + c)), (L, n, t, a, c, aligned_base)


def reg_bitonic_mirror(words, B, E):
    """hytopk_table.cuh bitonic_sort_desc_reg, stage by stage: index i = tid * E + e; strides
    below E swap inside a thread, below 32 E exchange with lane tid ^ (stride / E) (same warp,
    same e), the rest through shared memory; the lower index of a descending run keeps the
    larger word. Every stage is one vectorised step over all indices (the data movement the
    kernel does; the choice of path only says where the partner comes from)."""
    P = B * E
    x = np.zeros(P, np.uint64)
    x[:words.size] = words
    i = np.arange(P)
    size = 2
    while size <= P:
        stride = size // 2
        while stride > 0:
            partner = i ^ stride
            if E <= stride < 32 * E:          # the shuffle path stays inside a warp
                assert ((partner // E) // 32 == (i // E) // 32).all() and (partner % E == i % E).all()
            if stride < E:                    # the in-thread path stays inside a thread
                assert (partner // E == i // E).all()
            want_max = ((i & stride) == 0) == ((i & size) == 0)
            y = x[partner]
            x = np.where(want_max, np.maximum(x, y), np.minimum(x, y))
            stride //= 2
        size *= 2
    return x


@pytest.mark.parametrize("B,E", [(512, 1), (512, 2), (512, 4), (256, 4), (32, 2)])
def test_register_bitonic_network_sorts_descending(B, E):
    rng = np.random.default_rng(B * 10 + E)
    P = B * E
    for cnt in (0, 1, 2, P // 2 - 1, P // 2 + 1, P - 1, P):
        words = rng.choice(2**62, size=cnt, replace=False).astype(np.uint64) + np.uint64(1)   # distinct, > padding
        got = reg_bitonic_mirror(words, B, E)
        assert np.array_equal(got[:cnt], np.sort(words)[::-1]), cnt
        assert (got[cnt:] == 0).all()


def table_v2_with_numpy(body: str):
    """`body` run in a subprocess with workbench.families.cupy.table_v2 as v2 on NumPy standing in for
    CuPy (tests/fake_cupy: the stand-in must never reach this process) and 227 KiB of opt-in shared
    memory as on the H100 / H200; returns its `out`, through JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parent
    code = ("import json, workbench.families.cupy.table_v2 as v2\nv2._limit = lambda: 232448\n" + body
            + "print(json.dumps(out))\n")
    env = {"PYTHONPATH": f"{here / 'fake_cupy'}:{here.parent}", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_cluster_kernel_is_instantiated_and_its_geometry_fits():
    """hytopk_table_cluster is instantiated at every CLUSTER_CONFIGS size for both dtypes, and
    table_v2.cluster_geometry (run with NumPy standing in for CuPy, tests/fake_cupy, in a subprocess;
    227 KiB of opt-in shared memory as on the H100 / H200) takes 128K-key rows at the shipped cluster
    sizes within the shared memory, each slice buffer covering every vector a slice can touch, and
    leaves 1M-key rows to the fused kernel."""
    names = INST.name_expressions("table_v2.cu")
    for C, t, share in INST.CLUSTER_CONFIGS:
        for src in (INST.TABLE, INST.TABLE_BF16):
            assert f"hytopk_table_cluster<{src}, {C}, {t}, {str(share).lower()}>" in names
    out = table_v2_with_numpy(
        "out = []\n"
        "for L in (131072, 131071, 65537, 5003, 1 << 20):\n"
        "    for cxx in ('hytopk::TableSource', 'hytopk::TableBf16Source'):\n"
        "        for k in (2048, 512):\n"
        "            g = v2.cluster_geometry(L, cxx, k)\n"
        "            out.append([L, cxx, k, g, g and v2.cluster_smem_bytes(k, g[3], g[2], g[1])])\n")
    for L, cxx, k, g, smem in out:
        if L == 1 << 20:
            assert g is None
            continue
        C, threads, buf_words, cap = g
        assert (C, threads, True) in INST.CLUSTER_CONFIGS and smem <= 232448 and cap >= 4096
        P = 4 if cxx == "hytopk::TableSource" else 8
        S = -(-(-(-L // C)) // P) * P                     # table_v2.cu ClusterRow::of at c = L (the longest)
        for h0 in range(P):                               # vectors of slice q: ceil((h0 + len) / P), len <= S
            assert -(-(h0 + S) // P) * 16 <= 4 * buf_words
        if L == 131072 and k == 2048:
            assert cap >= 9216                            # ~7 sigma above the expected 6144 candidates


@pytest.mark.parametrize("lo,c,run", [(0, 131072, 16), (5, 131067, 16), (3, 1048570, 16), (17, 140000, 32),
                                      (0, 16384, 16), (1, 16383, 16), (7, 9000, 16)])
def test_run_sample_positions(lo, c, run):
    """reference.run_sample_positions (the table top-k's samples in runs, gather_run_keys): M distinct
    positions inside the context, runs of `run` consecutive keys, each run but the first starting on
    a multiple of `run` (64 bytes of the table), spread over the whole context; the contract's
    positions where c < 4 M."""
    M = int(R.num_samples(c))
    p = R.run_sample_positions(lo, c, M, run)
    assert len(p) == M and len(np.unique(p)) == M
    assert p.min() >= lo and p.max() < lo + c
    if not R.runs_apply(c, M):
        assert np.array_equal(p, R.sample_positions(lo, c, M))
        return
    U = -(-M // run)
    starts = p[::run]
    assert len(starts) == U and starts[0] == lo and (starts[1:] % run == 0).all()
    for u in range(U):
        seg = p[u * run:(u + 1) * run]
        assert np.array_equal(seg, np.arange(seg[0], seg[0] + len(seg)))
    assert starts[-1] >= lo + c - 2 * ((c - run) // (U - 1)) - run    # the last run near the context's end


def test_run_sample_positions_small_m_keeps_the_contracts():
    """An M below two runs (whatever a caller passes) keeps the contract's positions (runs_apply)."""
    for M in (1, 16, 63):
        assert not R.runs_apply(100000, M)
        assert np.array_equal(R.run_sample_positions(3, 100000, M, 32), R.sample_positions(3, 100000, M))
    assert R.runs_apply(100000, 64) and not R.runs_apply(255, 64)


@pytest.mark.parametrize("coarse", [0, 1, 8, 64])
def test_coarse_key_is_the_radix_select_rounded_down(coarse):
    """reference.coarse_key (the table top-k's threshold, block_radix_select_keys' coarse): coarse = 0
    is the r-th best key; else a key at or below it, with at most max(1, r // coarse) - 1 more keys at
    or above it than r (beyond the r-th key's own ties), lower bits 0 below the level it stopped at;
    randn rows with and without ties, every special value, every rank."""
    rng = np.random.default_rng(coarse)
    for trial in range(120):
        m = int(rng.integers(1, 3000))
        x = rng.standard_normal(m).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x * 4) / 4                                      # plateaus
        if trial % 5 == 0:
            x[rng.integers(0, m, 8)] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32), 8)
        if trial % 7 == 0:                                               # a -inf / NaN tail where the rank falls
            x[rng.integers(0, m, m // 2)] = rng.choice(np.array([np.nan, -np.inf], np.float32), m // 2)
        keys = R.order_keys(x)
        for r in {1, m, int(rng.integers(1, m + 1))}:
            exact = int(np.sort(keys)[::-1][r - 1])
            key = R.coarse_key(keys, r, coarse)
            if coarse == 0:
                assert key == exact
                continue
            above = int((keys >= key).sum())
            assert key <= exact and r <= above <= max(int((keys >= exact).sum()), r - 1 + max(1, r // coarse))
            assert R.order_keys(np.array([R.key_score(key)], np.float32))[0] == key or key == exact
            assert not np.isnan(R.key_score(key)) or key == exact


def test_sample_plan_min_rank():
    """sample_plan's min_rank raises r to min(M, min_rank) and leaves larger ranks and unsampled rows."""
    lo = np.zeros(4, np.int64)
    hi = np.array([140000, 140000, 2000, 10], np.int64)
    M, r = R.sample_plan(lo, hi, 64, 1.5)
    M2, r2 = R.sample_plan(lo, hi, 64, 1.5, 48)
    assert np.array_equal(M, M2)
    assert r2.tolist() == [48, 48, max(int(r[2]), min(int(M[2]), 48)), 0]
    assert np.array_equal(R.sample_plan(lo, hi, 2048, 1.5, 48)[1], R.sample_plan(lo, hi, 2048, 1.5)[1])


def test_fused_launch_takes_the_short_blocks_where_their_cap_holds_the_counts():
    """table_v2.fused_launch (NumPy standing in for CuPy, in a subprocess; 227 KiB of opt-in shared
    memory): shipped with FUSED_SHORT = (512, 3) (cap 6144) for float32 tables only: table_topk's plan
    at 128K keys, k = 2048 takes it, a bf16 table (512, 2). Set to (256, 3): with the samples in
    runs, it where its cap holds a full row's expected count plus FUSED_SHORT_SIGMAS spreads
    (table_topk's plan at 128K keys, k = 2048), else (512, 2) (256K and 1M keys); the contract's
    samples keep (1024, 1); the sweep's override wins; the caps are the launch's."""
    cases = [(2048, 131072, 1.5, 48), (2048, 262144, 1.5, 48), (2048, 1 << 20, 1.5, 48), (512, 131072, 1.5, 48),
             (2048, 131072, 3.0, 0), (2048, 4096, 1.5, 48), (4096, 131072, 1.5, 48)]
    out, short, sigmas, shipped = table_v2_with_numpy(
        f"cases = {cases!r}\n"
        "shipped = [list(v2.FUSED_SHORT), v2.fused_launch(1, *cases[0]), v2.fused_cap(2048, 1, *cases[0][1:]),\n"
        "           v2.fused_launch(1, *cases[0], 'hytopk::TableBf16Source'), v2.fused_launch(1, *cases[2])]\n"
        "v2.FUSED_SHORT = (256, 3)\n"
        "out = [[c, v2.fused_launch(1, *c), v2.fused_cap(c[0], 1, *c[1:]), v2.fused_launch(0, *c),\n"
        "        v2.cap_for(c[0], *v2.FUSED_SHORT)] for c in cases]\n"
        "v2.FUSED_THREADS, v2.FUSED_MIN_BLOCKS = 1024, 1\n"
        "out.append(v2.fused_launch(1, *cases[0]))\n"
        "out = [out, v2.FUSED_SHORT, v2.FUSED_SHORT_SIGMAS, shipped]\n")
    assert shipped == [[512, 3], [512, 3], 6144, [512, 2], [512, 2]]
    assert out.pop() == [1024, 1]
    got = {tuple(c): (tuple(runs), cap, tuple(contract), short_cap) for c, runs, cap, contract, short_cap in out}
    assert tuple(short) == (256, 3) and got[(2048, 131072, 1.5, 48)][:2] == ((256, 3), 6144)
    assert got[(2048, 262144, 1.5, 48)][:2] == ((512, 2), 10752) and got[(2048, 1 << 20, 1.5, 48)][0] == (512, 2)
    for (k, L, os_, mr), (runs, cap, contract, short_cap) in got.items():
        assert contract == (1024, 1)
        M, r = (int(v[0]) for v in R.sample_plan([0], [L], k, os_, mr))
        fits = L * r / M * 9 / 8 * (1 + sigmas / r ** 0.5) <= short_cap
        assert (runs == (256, 3)) == fits, (k, L, os_, mr)
