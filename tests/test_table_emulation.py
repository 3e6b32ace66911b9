"""Issue 21 without a GPU: the real source of kernels_cuda/table_v2.cu (fused_v2 with the radix
fallback of table_topk.cu, the v2 threshold, filter and select_smem) compiled for the CPU against
tests/table_emulation/cuda_emu.h and checked against the reference on adversarial families,
varlen / causal / edge contexts, float32 and bf16, unaligned bases, capacity overflow and rows
of several filter pieces. Skips without g++ (C++20); the long sweeps (every family and layout,
three seeds: ~20-40 min on 2 cores) only with HYTOPK_EMULATION_SWEEP=1. The same checks on the
GPU: tests/test_table_topk_gpu.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

from reference import generate as G

from table_emulation import emulate as E

pytestmark = pytest.mark.skipif(E.compiler() is None, reason="no g++ to build the CPU emulation")
# the sweeps take tens of minutes on a 2-core machine: opt-in (HYTOPK_EMULATION_SWEEP=1)
sweep = pytest.mark.skipif(os.environ.get("HYTOPK_EMULATION_SWEEP") != "1",
                           reason="set HYTOPK_EMULATION_SWEEP=1 for the long emulation sweeps")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    try:
        return E.build(tmp_path_factory.mktemp("table_emulation"))
    except Exception as e:              # an old compiler without C++20 <barrier> / atomic_ref
        pytest.skip(f"the emulation does not build here: {e}")


@pytest.mark.parametrize("family,lay,k,capacity,bf16,offset", [
    ("gaussian", "full", 256, 2000, False, 0),      # the fast select's own path (no kept bin > 64)
    ("ties_at_kth", "varlen", 300, 300, True, 3),
    ("specials", "edge", 512, 2000, False, 2),
    ("equal", "full", 64, 1000, False, 1),
])
def test_v2_kernels_on_the_cpu(driver, family, lay, k, capacity, bf16, offset):
    rng = np.random.default_rng(hash((family, lay)) % 2**32)
    n, L = 3, 2001
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    E.check_case(driver, s, lo, hi, k, capacity, offset=offset, bf16=bf16)


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
    rng = np.random.default_rng(hash((family, lay, "one")) % 2**32)
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
