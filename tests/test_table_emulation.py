"""Issue 21 without a GPU: the real source of kernels_cuda/table_v2.cu (fused_v2 with the radix
fallback of table_topk.cu, the one-read and cluster kernels, the v2 threshold, filter and
select_smem) compiled for the CPU against
tests/table_emulation/cuda_emu.h and checked against the reference on adversarial families,
varlen / causal / edge contexts, float32 and bf16, unaligned bases, capacity overflow and rows
of several filter pieces. Skips without g++ (C++20); the long sweeps (every family and layout,
three seeds: ~20-40 min on 2 cores) only with HYTOPK_EMULATION_SWEEP=1. The same checks on the
GPU: tests/test_table_topk_gpu.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

import reference as R
from reference import generate as G
from tests.strategies import stable_seed

from table_emulation import emulate as E

pytestmark = pytest.mark.skipif(E.compiler() is None, reason="no g++ to build the CPU emulation")
# the sweeps take tens of minutes on a 2-core machine: opt-in (HYTOPK_EMULATION_SWEEP=1)
sweep = pytest.mark.skipif(os.environ.get("HYTOPK_EMULATION_SWEEP") != "1",
                           reason="set HYTOPK_EMULATION_SWEEP=1 for the long emulation sweeps")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    # compiler() is None (the module skips) without a C++20 g++; with one, a build error is a failure
    return E.build(tmp_path_factory.mktemp("table_emulation"))


@pytest.mark.parametrize("family,lay,k,capacity,bf16,offset", [
    ("gaussian", "full", 256, 2000, False, 0),      # the fast select's own path (small bins)
    ("ties_at_kth", "varlen", 300, 300, True, 3),
    ("specials", "edge", 512, 2000, False, 2),
    ("equal", "full", 64, 1000, False, 1),
])
def test_v2_kernels_on_the_cpu(driver, family, lay, k, capacity, bf16, offset):
    rng = np.random.default_rng(stable_seed(family, lay))
    n, L = 3, 2001
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    E.check_case(driver, s, lo, hi, k, capacity, offset=offset, bf16=bf16)


@pytest.mark.parametrize("values,k", [(22, 512), (16, 512), (40, 300)])
def test_v2_select_ranks_tie_bins_on_the_cpu(driver, values, k):
    """Rows of `values` distinct values (bins of ~2001 / values equal keys, as a bf16 table's near its
    k-th at 128K keys): 22 values at k 512 are bins of ~90 the fast select ranks (about 6 bins x 90^2
    comparisons, under FAST_RANK_WORK x k), 16 values bins of ~125 it leaves to the key select (over
    the budget); both exact, ties by lower position."""
    rng = np.random.default_rng(values)
    n, L = 3, 2001
    s = rng.integers(0, values, (n, L)).astype(np.float32) * np.float32(0.25)
    lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    E.check_case(driver, s, lo, hi, k, 2000, bf16=bool(values % 2))


@pytest.mark.parametrize("k,capacity,offset,bf16", [(512, 5000, 1, False),
                                                    pytest.param(2048, 64, 0, True, marks=[pytest.mark.slow, sweep])])
def test_v2_filter_pieces_and_every_threshold_kind_on_the_cpu(driver, k, capacity, offset, bf16):
    """Rows of two filter pieces, contexts starting and ending inside vectors, thresholds of
    every kind the range test tells apart, a plateau past the filter's stage (its spill path)."""
    rng = np.random.default_rng(41)
    n, L = 8, 40003
    s = rng.standard_normal((n, L)).astype(np.float32)
    s[:, ::5] = 0.0
    s[:, 1::7] = -0.0
    s[:, 2::11] = np.nan
    s[:, 3::13] = -np.inf
    s[:, 4::17] = np.inf
    s[:, 6::19] = np.float32(1e-45)
    s[:, 8::23] = np.float32(-1e-45)
    s[3, 1000:39000] = 2.5
    lo = np.array([0, 1, 3, 7, 0, 5, 32767, 40002], np.int32)
    hi = np.array([L, L - 1, 33001, L, 9, L - 3, 40000, L], np.int32)
    T = np.array([0.5, 0.0, -0.0, 2.5, np.nan, -1.0, 1e-45, -np.inf], np.float32)
    E.check_case(driver, s, lo, hi, k, capacity, T=T, offset=offset, bf16=bf16)


@pytest.mark.slow
@sweep
@pytest.mark.parametrize("seed", range(3))
def test_v2_kernels_on_the_cpu_every_family(driver, seed):
    rng = np.random.default_rng(seed)
    for family in G.SCORE_FAMILIES:
        for lay in G.LAYOUTS:
            n, L = 3, int(rng.integers(500, 40000))
            k = int(rng.choice([16, 64, 300, 512, 2048]))
            lo, hi = G.layout(lay, n, L, k, rng)
            s = G.score_table(family, n, L, k, rng, lo, hi)
            bf16 = bool(rng.integers(0, 2))
            E.check_case(driver, s, lo, hi, k, int(rng.choice([k, 500, L])), offset=int(rng.integers(0, 8 if bf16 else 4)),
                         bf16=bf16)


def test_v2_select_hint_with_keys_above_every_sample_on_the_cpu(driver):
    """The fused select's key bounds (table_v2.cu fused_hint: bins from K* to the best sample key, the
    keys above it clamped into the best bin): rows with keys above every sample, placed off both
    sampling's positions (the contract's and the runs'), exact with the reference's counts. Row 0: 600
    of them (the best bin's ranking past FAST_RANK_WORK: the sorting select takes the row); row 1: 40,
    with ties among them (ranked by position inside the clamped bin); row 2: none above, a varlen
    context."""
    from reference import sampling as S
    rng = np.random.default_rng(21)
    n, L, k = 3, 20000, 128
    s = rng.standard_normal((n, L)).astype(np.float32)
    lo, hi = np.array([0, 0, 37]), np.array([L, L, L - 11])
    M, _ = R.sample_plan(lo, hi, k, 3.0)
    for t, many in ((0, 600), (1, 40)):
        c = int(hi[t] - lo[t])
        sampled = set(S.sample_positions(int(lo[t]), c, int(M[t])).tolist())
        sampled |= set(S.run_sample_positions(int(lo[t]), c, int(M[t]), 16).tolist())
        free = np.array(sorted(set(range(int(lo[t]), int(hi[t]))) - sampled))
        at = rng.choice(free, many, replace=False)
        s[t, at] = (50.0 + rng.integers(0, many // 4, many)).astype(np.float32)     # ties among them
    E.check_case(driver, s, lo, hi, k, 4000)


def test_v2_fused_fallback_of_listed_rows_on_the_cpu(driver):
    """The rows of an all-equal table overflow the fused kernel's shared memory (15000 > its 13056
    at k = 64): they are listed and the radix kernel writes them (the driver's grid of
    min(n, 2) blocks strides over the list); a row with c <= k and an empty row stay with the
    fused kernel."""
    n, L, k = 5, 15000, 64
    s = np.full((n, L), 0.75, np.float32)
    lo = np.array([0, 3, 100, 7, 1], np.int32)
    hi = np.array([L, L, 150, 7, L - 1], np.int32)  # 15000, 14997, 50 (<= k), 0, 14998
    count, failed = E.check_case(driver, s, lo, hi, k, 2000)
    assert failed.tolist() == [1, 1, 0, 0, 1]       # three rows listed, two blocks


@pytest.mark.parametrize("family,lay,k,bf16,offset", [
    ("gaussian", "full", 256, False, 0),
    ("alias_on_samples", "full", 64, False, 1),         # the pre-sample is a subset of the samples: aliased too
    ("alias_between_samples", "varlen", 300, True, 3),
    ("ties_at_kth", "full", 512, False, 0),
    ("specials", "edge", 128, True, 2),
    ("relu_plateau", "random", 64, False, 0),
    ("integers", "causal_tail", 256, False, 3),
])
def test_v2_fused_one_read_on_the_cpu(driver, family, lay, k, bf16, offset):
    """The one-read fused kernel (hytopk_table_fused1) on the adversarial families: the driver asserts
    its finished rows, counts and listed rows equal the fused kernel's (forced one-read plan at 1024
    threads, the default plan at 512); here: the one-read path really ran (rows of M >= 128 samples
    whose T0 held)."""
    rng = np.random.default_rng(stable_seed(family, lay, "one"))
    n, L = 3, 12000
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    stats = {}
    E.check_case(driver, s, lo, hi, k, 2000, offset=offset, bf16=bf16, stats=stats)
    if family in ("gaussian", "alias_between_samples"):
        assert stats["one_read"][0] >= 1 and stats["one_read"][1] >= 1, stats


def test_v2_fused_one_read_fallbacks_on_the_cpu(driver):
    """Rows whose T0 fails read again with K* and end as the fused kernel ends them. k = 1024, c =
    16384: M = 4096 samples (every 4th position), r = 768, T0 = about the 481st best of the 1024
    pre-samples (every 16th position). Row 0: all equal, a few higher: the collection overflows
    (then listed: count > cap). Row 1: the pre-sample positions alone are high: 481 < r samples at
    or above T0, so K* < T0. Row 2: read once."""
    n, L, k = 3, 16384, 1024
    rng = np.random.default_rng(7)
    s = rng.standard_normal((n, L)).astype(np.float32)
    s[0, :] = 0.5
    s[0, ::97] = 1.0
    s[1, ::16] = 10.0 + rng.random(L // 16).astype(np.float32)
    lo = np.zeros(n, np.int32)
    hi = np.full(n, L, np.int32)
    stats = {}
    count, failed = E.check_case(driver, s, lo, hi, k, 2000, stats=stats)
    assert stats["one_read"] == [1, 1], stats        # only row 2 is read once (both launches)
    assert failed.tolist()[0] == 1


def _edge_lengths_case(family, k, rng, n=8, L=6007):
    """Rows of every context length the contract singles out (0, 1, k - 1, k, k + 1, M - 1, M, L), each
    ending at L (the last row: at the table's end)."""
    import reference as R
    M = int(R.sample_plan(np.array([0]), np.array([L]), k, 3.0)[0][0])
    lengths = np.array([0, 1, k - 1, k, k + 1, M - 1, M, L])[:n]
    hi = np.full(n, L, np.int64)
    lo = hi - lengths
    return G.score_table(family, n, L, k, rng, lo, hi), lo, hi


CLUSTER_CASES = [                  # every check_case runs the cluster kernel too: these add the edge lengths
    ("gaussian", 128, False, 0),
    pytest.param("ties_at_kth", 256, True, 3, marks=sweep),
    pytest.param("specials", 128, False, 1, marks=sweep),
    pytest.param("equal", 64, False, 2, marks=sweep),
    pytest.param("relu_plateau", 128, True, 0, marks=sweep),
    pytest.param("alias_on_samples", 64, False, 3, marks=sweep),
    pytest.param("alias_between_samples", 256, True, 5, marks=sweep),
    pytest.param("integers", 512, False, 0, marks=sweep),
]


@pytest.mark.parametrize("family,k,bf16,offset", CLUSTER_CASES)
def test_cluster_kernel_every_edge_length_on_the_cpu(driver, family, k, bf16, offset):
    """hytopk_table_cluster (C = 2 blocks on two clusters, C = 4 on one: eight rows, so the leaders
    wrap around and the slice buffers, mbarriers and candidate areas are reused) on contexts of every
    length the contract singles out, rows c <= k (the leader returns the whole row) between sampled
    ones, unaligned bases (every slice by ordinary loads), bf16. The driver asserts counts, listed rows
    and finished rows equal the fused kernel's; check_case the final output (listed rows by the radix
    kernel) against the reference."""
    rng = np.random.default_rng(stable_seed(family, k, "cluster"))
    s, lo, hi = _edge_lengths_case(family, k, rng)
    E.check_case(driver, s, lo, hi, k, 2000, offset=offset, bf16=bf16, every_cluster=True)


def test_cluster_kernel_listed_rows_on_the_cpu(driver):
    """Rows the cluster kernel lists for the radix kernel, between rows it finishes: all equal and a
    plateau at the threshold (count > its cap of 12800 at k = 64), the contract's sample positions
    alone high (53 candidates < k: underflow); a gaussian row and a row of c = k."""
    n, L, k = 5, 15000, 64
    rng = np.random.default_rng(11)
    s = rng.standard_normal((n, L)).astype(np.float32)
    s[0] = 0.75
    s[2, :14000] = 1.5
    lo = np.array([0, 3, 1, 7, 2], np.int32)
    hi = np.array([L, L, L - 1, 7 + k, L], np.int32)
    c, M = L - 2, 4096                                  # row 4: M = 4096 samples at 2 + (j c) // M
    s[4] = -1.0 - rng.random(L).astype(np.float32)
    s[4, 2 + (np.arange(M) * c) // M] = 10.0 + rng.random(M).astype(np.float32)
    count, failed = E.check_case(driver, s, lo, hi, k, 2000, every_cluster=True)
    assert failed.tolist() == [1, 0, 1, 0, 1], (count, failed)


@pytest.mark.parametrize("bf16", [False, True])
def test_cluster_kernel_full_128k_rows_on_the_cpu(driver, bf16):
    """Two 131072-key rows (one full, one starting and ending inside a vector) through the cluster
    kernel at C = 8 blocks of 128 threads (1024 threads in flight), k = 2048, against the fused kernel
    and the reference."""
    rng = np.random.default_rng(5)
    n, L, k = 2, 131072, 2048
    s = rng.standard_normal((n, L)).astype(np.float32)
    lo, hi = np.array([0, 5]), np.array([L, L - 2])
    E.check_case(driver, s, lo, hi, k, 2000, bf16=bf16, cluster_only=True)


@pytest.mark.parametrize("family,lay,k,bf16,offset", [
    ("gaussian", "full", 512, False, 0),
    ("ties_at_kth", "varlen", 300, True, 3),
    ("specials", "causal_tail", 256, False, 1),
    ("relu_plateau", "full", 128, True, 2),
])
def test_v2_run_sampling_on_the_cpu(driver, family, lay, k, bf16, offset):
    """The fused kernel and the threshold with the samples in 64-byte runs (table_v2.py sampling
    "runs"; contexts of >= 4 M keys, the shorter ones the contract's positions): thresholds equal
    reference.stage_threshold(..., run), counts the reference's above them, the top-k exact
    (check_case's check_runs). Row 0 of the gaussian case puts high scores exactly on the run
    positions (the runs' aliasing: underflow, listed, the radix kernel writes it)."""
    import reference as R
    rng = np.random.default_rng(stable_seed(family, lay, "runs"))
    n, L = 3, 20011
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    if family == "gaussian":
        c = int(hi[0] - lo[0])
        M = int(R.sample_plan(lo[:1], hi[:1], k, 3.0)[0][0])
        assert R.runs_apply(c, M)
        s[0, R.run_sample_positions(int(lo[0]), c, M, 16)] = 100.0 + rng.random(M).astype(np.float32)   # only r >= T
    stats = {}
    E.check_case(driver, s, lo, hi, k, 2000, offset=offset, bf16=bf16, stats=stats)
    if family == "gaussian":
        assert stats["runs_failed"].tolist() == [1, 0, 0], stats     # the aliased row underflows, the others pass
        assert stats["runs_count"][0] < k and stats["runs_count"][1] > k



@pytest.mark.parametrize("bf16", [False, True])
def test_v2_l2_prefetches_inside_contexts_on_the_cpu(driver, bf16):
    """Every L2 prefetch of the table kernels (prefetch_l2: the fused kernel's head and stream, the
    filter's) on a 16-byte aligned table whose rows start off a vector (a % 4 != 0) with contexts long
    enough for several stream steps and the run samples: tests/table_emulation/cuda_emu.h
    check_prefetch aborts the driver on a prefetch outside its row's context rounded out to vectors
    (on the GPU a prefetch is a hint: nothing else would catch one), and the results are exact.
    Checked to fail with the fused kernel's head prefetch started one vector early."""
    rng = np.random.default_rng(2112)
    n, L, k = 4, 20011, 128
    lo = np.array([0, 37, 1234, 3001])
    hi = np.array([L, L - 5, L - 3, L - 1])
    for t in range(n):
        M = int(R.sample_plan(lo[t:t + 1], hi[t:t + 1], k, 3.0)[0][0])
        assert R.runs_apply(int(hi[t] - lo[t]), M)
    s = G.score_table("gaussian", n, L, k, rng, lo, hi)
    E.check_case(driver, s, lo, hi, k, 2000, offset=0, bf16=bf16)
