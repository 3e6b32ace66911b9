"""The Hopper wgmma attention forwards without a GPU: the real source of kernels_cuda/attend_wgmma2.cu
(wgmma2, and wgmma2s: the swizzled key tile) and attend_wgmma3.cu (wgmma3) compiled for the CPU
against tests/wgmma_emulation/wgmma_emu.h (mbarriers, named barriers, cp.async, wgmma.mma_async with
its descriptors and fragments; one std::thread per CUDA thread) and checked as the GPU tests check
them (tests/test_attention_wgmma_gpu.py): bit for bit on the exact hot/cold logits, the float64
reference's tolerance on random inputs.

wgmma2 first: it is GPU-verified (bit for bit with the removed version 1 on the H200), so its tests
validate the emulator; then the same tests on wgmma3. The emulator also fails a run (EmulationError)
on a deadlock (its watchdog), an out-of-bounds shared or global access, an mbarrier misuse, or a
wgmma whose shared-memory operands change between the warps' issues or before its wait_group.
Skips without g++ (C++20); the longer sweeps only with HYTOPK_EMULATION_SWEEP=1. The 2-CTA cluster
kernels (wgmma2c / wgmma2sc) are not emulated."""
from __future__ import annotations

import os

import numpy as np
import pytest

from reference import attention as RA
from tests.test_attention import make_idx
from tests.strategies import stable_seed as seed
from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits

from wgmma_emulation import emulate as E

pytestmark = pytest.mark.skipif(E.compiler() is None, reason="no g++ to build the CPU emulation")
sweep = pytest.mark.skipif(os.environ.get("HYTOPK_EMULATION_SWEEP") != "1",
                           reason="set HYTOPK_EMULATION_SWEEP=1 for the long emulation sweeps")

VERSIONS = ["wgmma2", "wgmma2s", "wgmma3"]      # wgmma2 first: the GPU-verified one validates the emulator


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    # compiler() is None (the module skips) without a C++20 g++; with one, a build error is a failure
    return E.build(tmp_path_factory.mktemp("wgmma_emulation"))


def bf16(x):
    """(bf16 bits, the float64 values they hold)."""
    b = float32_to_bf16_bits(np.ascontiguousarray(x, np.float32))
    return b, bf16_bits_to_float32(b).astype(np.float64)


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def reference(qh, kvh, idx):
    L = kvh.shape[0]
    idx = np.where((idx >= 0) & (idx < L), idx, -1)             # the kernels mask out-of-range slots too
    return RA.attend(qh, kvh[:, None, :], kvh[:, None, :512], idx)


def check_hot_cold(driver, version, Hq, kind, n, tag="wgmma"):
    """tests/test_attention_wgmma_gpu.py's case: hot keys (logit 0) and cold keys (exp2 underflows to
    exactly 0): out = the exact mean of the hot keys' small-integer values (the float32 quotient; a
    key listed twice counts twice)."""
    rng = np.random.default_rng(seed(tag, Hq, kind) if tag == "wgmma" else seed(tag, Hq, kind, n))
    L, kk = 300, 100
    kvv = np.zeros((L, 576))
    kvv[:, 0] = np.where(rng.random(L) < 0.4, -128.0, 0.0)
    kvv[:, 1:512] = rng.integers(-4, 5, (L, 511))
    kv, kh = bf16(kvv)
    q = np.zeros((n, Hq, 576))
    q[:, :, 0] = np.where(rng.random((n, Hq)) < 0.8, 2.0, 0.0)
    qd, qh = bf16(q)
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = E.forward(driver, qd, kv, idx, 1.0, version=version)
    want = np.zeros((n, Hq, 512), np.float32)
    for t in range(n):
        sl = idx[t][idx[t] >= 0]
        if len(sl) == 0:
            continue
        for h in range(Hq):
            logit = kh[sl] @ qh[t, h]
            use = sl[logit == logit.max()]
            want[t, h] = kh[use, :512].sum(0).astype(np.float32) / np.float32(len(use))
    np.testing.assert_array_equal(bits(out), bits(want))
    assert np.all(np.isneginf(lse[(idx < 0).all(1)]))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("Hq,kind", [(128, "random"), (64, "dups"), (16, "empty")])
def test_exact_hot_cold_logits_bit_for_bit(driver, version, Hq, kind):
    check_hot_cold(driver, version, Hq, kind, 3)


# (n, Hq, kk, kind): odd / even tile counts, a partial last tile, one slot, a partial head block
RANDOM_CASES = [(2, 64, 200, "random"), (3, 128, 100, "dups"), (2, 96, 130, "empty"), (1, 16, 1, "random"),
                (2, 64, 64, "pad_only"), (2, 64, 257, "shared")]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("n,Hq,kk,kind", RANDOM_CASES)
def test_random_inputs_match_reference(driver, version, n, Hq, kk, kind):
    """The GPU tests' tolerance on random bf16 inputs, with padding, duplicates, queries without a
    valid key (out 0, lse -inf) and out-of-range slots (masked as -1 is)."""
    rng = np.random.default_rng(seed("wgmma-emu", n, Hq, kk, kind))
    L = 300
    kv, kh = bf16(rng.standard_normal((L, 576)))
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, kind)
    if kind == "random" and kk > 8:                              # slots past L and below -1: masked
        idx[0, 3], idx[-1, 5] = L + 7, -5
    out, lse = E.forward(driver, qd, kv, idx, None, version=version)
    ro, rl = reference(qh, kh, idx)
    np.testing.assert_allclose(out, ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-3)
    empty = ~((idx >= 0) & (idx < L)).any(1)
    assert np.all(out[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.parametrize("Hq,kind,n", [(8, "shared", 3), (16, "dups", 4), (32, "empty", 3), (8, "disjoint", 2)])
def test_pair_exact_hot_cold_logits_bit_for_bit(driver, Hq, kind, n):
    """wgmma2sp (a query pair per block over its union, the rows of query 2p+1 after those of 2p)."""
    check_hot_cold(driver, "wgmma2sp", Hq, kind, n, tag="wgmma-pair")


@pytest.mark.parametrize("n,Hq,kk,kind", [(3, 8, 100, "shared"), (2, 16, 130, "dups"), (1, 32, 64, "empty"),
                                          (4, 8, 257, "disjoint"), (2, 16, 64, "pad_only"), (5, 32, 40, "random")])
def test_pair_random_inputs_match_reference(driver, n, Hq, kk, kind):
    """wgmma2sp on random bf16 inputs: the reference's tolerance, odd n (the last block's second
    query absent), unions of one to several key tiles, queries without a key (out 0, lse -inf)."""
    rng = np.random.default_rng(seed("wgmma-pair-rand", n, Hq, kk, kind))
    L = 300
    kv, kh = bf16(rng.standard_normal((L, 576)))
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = E.forward(driver, qd, kv, idx, None, version="wgmma2sp")
    ro, rl = reference(qh, kh, idx)
    np.testing.assert_allclose(out, ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-3)
    empty = ~((idx >= 0) & (idx < L)).any(1)
    assert np.all(out[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.parametrize("version", VERSIONS)
def test_bf16_output_is_the_rounded_float32_one(driver, version):
    rng = np.random.default_rng(6)
    kv, _ = bf16(rng.standard_normal((300, 576)))
    qd, _ = bf16(rng.standard_normal((2, 64, 576)))
    idx = make_idx(rng, 2, 300, 130, "random")
    o32, l32 = E.forward(driver, qd, kv, idx, version=version)
    o16, l16 = E.forward(driver, qd, kv, idx, version=version, out_dtype="bfloat16")
    np.testing.assert_array_equal(o16, float32_to_bf16_bits(o32))
    np.testing.assert_array_equal(bits(l16), bits(l32))


def test_variants_agree(driver):
    """wgmma2s = wgmma2 bit for bit (one arithmetic order; the GPU tests' claim), kv rows inside a
    wider buffer (stride 640) give the same bits, the dynamic shared memory at a 1024-byte boundary
    (no round-up) too; wgmma3 (other rounding) within the GPU tests' tolerance of wgmma2."""
    rng = np.random.default_rng(8)
    L, n, Hq, kk = 400, 2, 128, 200
    wide, _ = bf16(rng.standard_normal((L, 640)))
    kv = np.ascontiguousarray(wide[:, :576])
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, "random")
    o2, l2 = E.forward(driver, qd, kv, idx)
    for version, kvx, off in (("wgmma2s", kv, 0x410), ("wgmma2", wide, 0x410), ("wgmma2", kv, 0x400),
                              ("wgmma3", wide, 0x400)):
        o, lv = E.forward(driver, qd, kvx, idx, version=version, smem_off=off)
        if version == "wgmma3":
            np.testing.assert_allclose(o, o2, rtol=1e-2, atol=1e-2)
            np.testing.assert_allclose(lv, l2, rtol=1e-5, atol=1e-4)
        else:
            np.testing.assert_array_equal(bits(o), bits(o2))
            np.testing.assert_array_equal(bits(lv), bits(l2))


def test_planted_bugs_are_caught(tmp_path):
    """Scratch copies of the kernels with planted bugs are caught: a full barrier that waits for one
    arrival too many (wgmma2: a deadlock, reported by the watchdog or the kernel's trap); V's two
    descriptor offsets swapped (wgmma2s, its HYTOPK_ATTW2_V_SWAP probe: wrong numbers); wgmma3
    without its warpgroup barrier before P overwrites the rope tile (the race the emulation found: a
    wgmma operand changed under another warp's part; it shows in about half the runs, so up to 10,
    with HYTOPK_EMU_JITTER's random sleeps for other interleavings)."""
    src2 = (E.KERNELS / "attend_wgmma2.cu").read_text()
    src3 = (E.KERNELS / "attend_wgmma3.cu").read_text()
    bad2 = "#define HYTOPK_ATTW2_V_SWAP 1\n" + src2.replace("mbar_init(full0, 128);", "mbar_init(full0, SWZ ? 128 : 129);")
    race = "                bar_sync(BAR_WG0 + w, 128);\n"
    assert bad2 != src2 and src3.count(race) == 1          # (the one before the P stores)
    bad3 = src3.replace(race, "", 1)
    drv = E.build(tmp_path, sources={"attend_wgmma2.cu": bad2, "attend_wgmma3.cu": bad3})
    rng = np.random.default_rng(3)
    kv, kh = bf16(rng.standard_normal((300, 576)))
    qd, qh = bf16(rng.standard_normal((2, 96, 576)))
    idx = make_idx(rng, 2, 300, 200, "random")
    with pytest.raises(E.EmulationError, match="deadlock|trap"):
        E.forward(drv, qd, kv, idx, version="wgmma2", env={"HYTOPK_EMU_STALL_S": "3"})
    out, _ = E.forward(drv, qd, kv, idx, version="wgmma2s")
    ro, _ = reference(qh, kh, idx)
    assert np.abs(out - ro).max() > 0.1
    for run in range(10):               # it shows in about half the runs: until it does (other interleavings)
        try:
            E.forward(drv, qd, kv, idx, version="wgmma3", env={"HYTOPK_EMU_JITTER": "0.05", "HYTOPK_EMU_SEED": str(run)})
        except E.EmulationError as e:
            assert "operands changed" in str(e) or "saw other shared-memory operands" in str(e), str(e)
            break
    else:
        pytest.fail("the wgmma3 race was not caught in 10 runs")


@pytest.mark.slow
@sweep
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("rep", range(3))
def test_random_sweep(driver, version, rep):
    """Many shapes per version: every head-block remainder, 1 to ~330 slots, every selection kind."""
    rng = np.random.default_rng(seed("sweep", version, rep))
    for kind in ("random", "dups", "shared", "disjoint", "empty", "pad_only"):
        n, Hq, kk = int(rng.integers(1, 4)), int(rng.choice([16, 64, 96, 128, 160])), int(rng.integers(1, 330))
        L = int(rng.integers(max(1, kk // 2), 700))
        kv, kh = bf16(rng.standard_normal((L, 576)) * rng.choice([0.5, 1.0, 3.0]))
        qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
        idx = make_idx(rng, n, L, kk, kind)
        jitter = {"HYTOPK_EMU_JITTER": "0.02", "HYTOPK_EMU_SEED": str(rep)} if rep else None   # other interleavings
        out, lse = E.forward(driver, qd, kv, idx, None, version=version,
                             out_dtype=str(rng.choice(["float32", "bfloat16"])), env=jitter)
        if out.dtype == np.uint16:
            out = bf16_bits_to_float32(out)
        ro, rl = reference(qh, kh, idx)
        np.testing.assert_allclose(out, ro, rtol=3e-2, atol=3e-2, err_msg=f"{kind} n={n} Hq={Hq} kk={kk} L={L}")
        np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-2, err_msg=f"{kind} n={n} Hq={Hq} kk={kk} L={L}")
