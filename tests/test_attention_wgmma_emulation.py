"""The Hopper wgmma attention forwards without a GPU: the real source of kernels_cuda/attend_wgmma2.cu
(wgmma2, and wgmma2s: the swizzled key tile) and attend_wgmma3.cu (wgmma3) compiled for the CPU
against tests/wgmma_emulation/wgmma_emu.h (mbarriers, named barriers, cp.async, wgmma.mma_async with
its descriptors and fragments; one std::thread per CUDA thread) and checked as the GPU tests check
them (tests/test_attention_wgmma_gpu.py): bit for bit on the exact hot/cold logits, the float64
reference's tolerance on random inputs.

wgmma2 first: it is GPU-verified (bit for bit with the removed version 1 on the H200), so its tests
validate the emulator; then the same tests on wgmma3. The emulator also fails a run (EmulationError)
on a deadlock (its watchdog; also a setmaxnreg.inc the launch's registers cannot serve), an
out-of-bounds shared or global access, an mbarrier misuse, or a wgmma whose shared-memory operands
change between the warps' issues or before its wait_group.
Skips without g++ (C++20); the longer sweeps only with HYTOPK_EMULATION_SWEEP=1. The 2-CTA cluster
kernels (wgmma2c / wgmma2sc) are not emulated.

The MLA backward (attend_wgmma_bwd.cu, attend_backward version 4; not yet run on a GPU: these are
its only checks so far, with the wrapper's plumbing in tests/attend_emulation/run.py): dq and the kv
gradient (its part rows summed per key, or its atomics) against the float64 reference on the
adversarial selections, a query chunk, and under jitter."""
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


def check_hot_cold(driver, version, Hq, kind, n, tag="wgmma", **kw):
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
    out, lse = E.forward(driver, qd, kv, idx, 1.0, version=version, **kw)
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


PAIR_VERSIONS = ["wgmma2sp", "wgmma3p"]          # a query pair per block over its union


@pytest.mark.parametrize("version", PAIR_VERSIONS)
@pytest.mark.parametrize("Hq,kind,n", [(8, "shared", 3), (16, "dups", 4), (32, "empty", 3), (8, "disjoint", 2),
                                       (5, "dups", 3)])
def test_pair_exact_hot_cold_logits_bit_for_bit(driver, version, Hq, kind, n):
    """A query pair per block over its union, the rows of query 2p+1 after those of 2p (a key listed
    twice by a query counts twice; keys only the other query selected masked)."""
    check_hot_cold(driver, version, Hq, kind, n, tag="wgmma-pair")


@pytest.mark.parametrize("version", PAIR_VERSIONS)
@pytest.mark.parametrize("n,Hq,kk,kind", [(3, 8, 100, "shared"), (2, 16, 130, "dups"), (1, 32, 64, "empty"),
                                          (4, 8, 257, "disjoint"), (2, 16, 64, "pad_only"), (5, 32, 40, "random")])
def test_pair_random_inputs_match_reference(driver, version, n, Hq, kk, kind):
    """On random bf16 inputs: the reference's tolerance, odd n (the last block's second query
    absent), unions of one to several key tiles (odd and even tile counts), queries without a key
    (out 0, lse -inf)."""
    rng = np.random.default_rng(seed("wgmma-pair-rand", n, Hq, kk, kind))
    L = 300
    kv, kh = bf16(rng.standard_normal((L, 576)))
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = E.forward(driver, qd, kv, idx, None, version=version)
    ro, rl = reference(qh, kh, idx)
    np.testing.assert_allclose(out, ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-3)
    empty = ~((idx >= 0) & (idx < L)).any(1)
    assert np.all(out[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.parametrize("version,Hq", [("wgmma3", 16), ("wgmma3", 128), ("wgmma3p", 16)])
def test_prefetch_changes_no_bit(driver, version, Hq):
    """Version 3's L2 prefetch (the producer's cp.async.bulk.prefetch.L2 of the rows 1 or 2 pairs of
    tiles ahead; the emulation checks each address lies in kv) leaves every bit as it was, over
    lists of several pairs whose ends fall inside the prefetch distance, with padding and keys past L."""
    rng = np.random.default_rng(seed("wgmma-prefetch", version, Hq))
    n, L, kk = 3, 500, 333
    kv, _ = bf16(rng.standard_normal((L, 576)))
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, "shared")
    idx[0, 300], idx[1, 10] = L + 3, -1
    o0, l0 = E.forward(driver, qd, kv, idx, version=version, prefetch=0)
    for pf in (1, 2):
        o, lv = E.forward(driver, qd, kv, idx, version=version, prefetch=pf)
        np.testing.assert_array_equal(bits(o), bits(o0))
        np.testing.assert_array_equal(bits(lv), bits(l0))


@pytest.mark.parametrize("version,Hq,kind,n", [("wgmma3", 128, "dups", 3), ("wgmma3", 16, "empty", 2),
                                               ("wgmma3p", 16, "dups", 4), ("wgmma3p", 8, "disjoint", 3)])
def test_interleaved_slot_order(driver, version, Hq, kind, n):
    """Version 3 with tile t of T taking slots t, t + T, ... (interleave): exact hot/cold bits (a key
    listed twice counts twice) and the reference's tolerance on random inputs over 1 to 5 tiles
    (odd counts, a partial last column of slots, padding)."""
    check_hot_cold(driver, version, Hq, kind, n, tag="wgmma-il", interleave=True)
    rng = np.random.default_rng(seed("wgmma-il-rand", version, Hq, kind))
    L = 300
    kv, kh = bf16(rng.standard_normal((L, 576)))
    for kk in (1, 130, 257):
        qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
        idx = make_idx(rng, n, L, kk, kind)
        out, lse = E.forward(driver, qd, kv, idx, None, version=version, interleave=True, prefetch=kk % 3)
        ro, rl = reference(qh, kh, idx)
        np.testing.assert_allclose(out, ro, rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-3)


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
    with warpgroup 1 not waiting for P_0 before its P_0 . V_0R (an emulation error, mostly a wgmma
    operand changed under it, or wrong numbers; up to 30 runs with HYTOPK_EMU_JITTER's random sleeps
    for other interleavings; the earlier 10 runs that took two messages only failed once on the
    H200's 16-core host, which ran the driver's threads more in parallel)."""
    src2 = (E.KERNELS / "attend_wgmma2.cu").read_text()
    src3 = (E.KERNELS / "attend_wgmma3.cu").read_text()
    bad2 = "#define HYTOPK_ATTW2_V_SWAP 1\n" + src2.replace("mbar_init(full0, 128);", "mbar_init(full0, SWZ ? 128 : 129);")
    race = "                bar_sync(BAR_P0, 256);\n"
    assert bad2 != src2 and src3.count(race) == 1          # (warpgroup 1's wait for P_0)
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
    for run in range(30):               # until it shows: the interleaving decides (7 of 8 runs on 2 cores)
        try:
            out3, _ = E.forward(drv, qd, kv, idx, version="wgmma3", env={"HYTOPK_EMU_JITTER": "0.05", "HYTOPK_EMU_SEED": str(run)})
        except E.EmulationError:        # an operand changed under a wgmma, or whatever else the race set off
            break
        if np.abs(out3 - ro).max() > 0.1:
            break
    else:
        pytest.fail("the wgmma3 race was not caught in 30 runs")


def test_setmaxnreg_beyond_the_launch_registers_deadlocks(tmp_path):
    """The emulation keeps setmaxnreg's pool: the registers the block launched with (168 x 384).
    wgmma3 with its producer at 48 (128 x 48 + 256 x 232 = 65536 > 64512: the first H200 run of the
    FlashMLA schedule hung so) never gets its consumers their 232: a deadlock, reported with the
    waiting setmaxnreg.inc (the kernel's static_assert, which stops this at compile time, taken out)."""
    src3 = (E.KERNELS / "attend_wgmma3.cu").read_text()
    budget = "constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;"
    guard = src3[src3.index("static_assert(PRODUCERS * PRODUCER_REGS"):src3.index("static_assert(PRODUCER_REGS <= LAUNCH_REGS")]
    assert src3.count(budget) == 1 and "setmaxnreg" in guard
    bad3 = src3.replace(budget, budget.replace("40", "48")).replace(guard, "")
    drv = E.build(tmp_path, sources={"attend_wgmma3.cu": bad3})
    rng = np.random.default_rng(5)
    kv, _ = bf16(rng.standard_normal((100, 576)))
    qd, _ = bf16(rng.standard_normal((1, 64, 576)))
    idx = make_idx(rng, 1, 100, 64, "random")
    with pytest.raises(E.EmulationError, match="deadlock") as e:
        E.forward(drv, qd, kv, idx, version="wgmma3", env={"HYTOPK_EMU_STALL_S": "3"})
    assert "setmaxnreg.inc from 168 to 232" in str(e.value)


@pytest.mark.slow
@sweep
@pytest.mark.parametrize("version", VERSIONS + PAIR_VERSIONS)
@pytest.mark.parametrize("rep", range(3))
def test_random_sweep(driver, version, rep):
    """Many shapes per version: every head-block remainder (query pairs: 1 to 32 heads, odd n), 1 to
    ~330 slots, every selection kind; version 3 with and without its L2 prefetch."""
    rng = np.random.default_rng(seed("sweep", version, rep))
    for kind in ("random", "dups", "shared", "disjoint", "empty", "pad_only"):
        heads = [1, 5, 8, 16, 32] if version in PAIR_VERSIONS else [16, 64, 96, 128, 160]
        n, Hq, kk = int(rng.integers(1, 6)), int(rng.choice(heads)), int(rng.integers(1, 330))
        L = int(rng.integers(max(1, kk // 2), 700))
        kv, kh = bf16(rng.standard_normal((L, 576)) * rng.choice([0.5, 1.0, 3.0]))
        qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
        idx = make_idx(rng, n, L, kk, kind)
        jitter = {"HYTOPK_EMU_JITTER": "0.02", "HYTOPK_EMU_SEED": str(rep)} if rep else None   # other interleavings
        out, lse = E.forward(driver, qd, kv, idx, None, version=version,
                             out_dtype=str(rng.choice(["float32", "bfloat16"])), env=jitter,
                             prefetch=int(rng.integers(0, 3)) if version.startswith("wgmma3") else 0,
                             interleave=bool(rng.integers(0, 2)) and version.startswith("wgmma3"))
        if out.dtype == np.uint16:
            out = bf16_bits_to_float32(out)
        ro, rl = reference(qh, kh, idx)
        np.testing.assert_allclose(out, ro, rtol=3e-2, atol=3e-2, err_msg=f"{kind} n={n} Hq={Hq} kk={kk} L={L}")
        np.testing.assert_allclose(lse, rl, rtol=1e-4, atol=1e-2, err_msg=f"{kind} n={n} Hq={Hq} kk={kk} L={L}")


# ------------------------------------------------------------------ backward (attend_wgmma_bwd.cu)
def backward_case(rng, n, Hq, kk, kind, L=150):
    """Random bf16 q / kv / dout, a selection of `kind` (slots past L and below -1 masked as -1;
    'full': every slot a distinct valid key, but one padding slot in the last query's first tile:
    the kernel's unpredicated writes where a warp's rows are all valid), and the forward's lse /
    delta (float32) as the wrapper passes them."""
    kv, kh = bf16(rng.standard_normal((L, 576)))
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    dod, doh = bf16(rng.standard_normal((n, Hq, 512)))
    if kind == "full":
        idx = np.stack([rng.choice(L, kk, replace=False) for _ in range(n)]).astype(np.int32)
        idx[-1, 7] = -1
    else:
        idx = make_idx(rng, n, L, kk, kind)
    if kind == "random" and kk > 8:
        idx[0, 3], idx[-1, 5] = L + 7, -5
    ro, rl = reference(qh, kh, idx)
    delta = (doh * ro).sum(-1).astype(np.float32)
    valid = np.where((idx >= 0) & (idx < L), idx, -1)
    rq, rk, rv = RA.attend_backward(doh, qh, kh[:, None, :], kh[:, None, :512], valid)
    return kv, qd, dod, idx, rl.astype(np.float32), delta, rq, RA.mla_dkv(rk, rv), valid


def rel_close(got, want, tol=1e-2):
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= tol * max(1e-3, float(np.abs(want).max()) if want.size else 0.0), err


def summed_part_rows(part, idx, t0, L):
    """dkv from the part rows [count, nhb, kk, 576] of queries t0 .., in entry order (as the reduce)."""
    dkv = np.zeros((L, 576))
    count, nhb, kk, _ = part.shape
    for tl in range(count):
        for hb in range(nhb):
            for j in range(kk):
                if idx[t0 + tl, j] >= 0:
                    dkv[idx[t0 + tl, j]] += part[tl, hb, j]
    return dkv


# (n, Hq, kk, kind, atomic): one or two 32-key tiles and a partial one, 64 heads, a partial head block
# (8: rows 8 .. 63 zero), two head blocks (80: the second partial)
BWD_CASES = [(3, 64, 45, "random", False), (3, 64, 70, "dups", False), (4, 64, 45, "shared", False),
             (3, 64, 33, "disjoint", False), (3, 64, 45, "empty", False), (2, 64, 40, "pad_only", False),
             (3, 8, 45, "dups", True), (2, 80, 40, "shared", False), (2, 64, 1, "random", True),
             (3, 64, 64, "full", False), (3, 80, 70, "full", True)]


@pytest.mark.parametrize("n,Hq,kk,kind,atomic", BWD_CASES)
def test_backward_matches_reference(driver, n, Hq, kk, kind, atomic):
    """dq and the kv gradient (part rows summed per key, or the atomics) against the float64
    reference at the GPU tests' tolerance; masked slots' part rows are never written (NaN stays),
    untouched keys get exactly 0 and queries without a key a dq of exactly 0."""
    rng = np.random.default_rng(seed("wgmma-bwd", n, Hq, kk, kind, atomic))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, n, Hq, kk, kind, L)
    dq, out = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic)
    rel_close(dq, rq)
    dkv = out if atomic else summed_part_rows(out, valid, 0, L)
    rel_close(dkv, rkv)
    if not atomic:
        rows = out.transpose(0, 2, 1, 3)                         # [n, kk, nhb, 576]
        assert np.isnan(rows[valid < 0]).all() and not np.isnan(rows[valid >= 0]).any()
    else:
        untouched = np.setdiff1d(np.arange(L), valid[valid >= 0])
        assert np.all(out[untouched] == 0)
    assert np.all(dq[(valid < 0).all(1)] == 0)


@pytest.mark.parametrize("atomic", [False, True], ids=["part", "atomic"])
def test_backward_vector_writes_equal_scalar_ones(driver, atomic):
    """The 16-byte writes (a 4x4 transpose among lanes, then st.global.v4.f32 / red.global.add.v4.f32)
    put the same floats in the same places as the float-by-float ones. Atomics: with distinct keys
    per query there is one add per (block, key, column), and the emulation runs blocks one after
    another, so the bits agree too. Two head blocks (80 heads), a partial tile, masked slots."""
    rng = np.random.default_rng(seed("wgmma-bwd-vec", atomic))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, 3, 80, 45, "full")
    dq_v, out_v = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, vec=True)
    dq_s, out_s = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, vec=False)
    np.testing.assert_array_equal(bits(dq_v), bits(dq_s))
    np.testing.assert_array_equal(bits(out_v), bits(out_s))
    if atomic:
        assert np.count_nonzero(out_v) > 0.9 * 576 * np.unique(idx[(idx >= 0) & (idx < kv.shape[0])]).size
    else:
        assert np.count_nonzero(~np.isnan(out_v)) > 0.5 * out_v.size


# the staged kernel (the producer warpgroup writes dK/dV from shared memory) on the cases that
# exercise its units: partial tiles and head blocks, masked slots, duplicated keys, one key
STAGED_CASES = [(3, 64, 45, "random", False), (3, 64, 70, "dups", True), (3, 64, 33, "disjoint", False),
                (3, 64, 45, "empty", True), (2, 80, 40, "shared", True), (2, 64, 1, "random", False),
                (3, 80, 70, "full", False)]


@pytest.mark.parametrize("n,Hq,kk,kind,atomic", STAGED_CASES)
def test_backward_staged_matches_reference_and_direct_writes(driver, n, Hq, kk, kind, atomic):
    """Staged dK/dV against the float64 reference, and bit for bit the direct kernel's: the same
    accumulators written through another path (part rows: plain stores; atomics: the emulation runs
    blocks one after another, and with distinct keys per query each (key, column) gets one add per
    block in block order). Masked slots' part rows stay unwritten, untouched keys exactly 0."""
    rng = np.random.default_rng(seed("wgmma-bwd-staged", n, Hq, kk, kind, atomic))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, n, Hq, kk, kind, L)
    dq, out = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="staged")
    rel_close(dq, rq)
    rel_close(out if atomic else summed_part_rows(out, valid, 0, L), rkv)
    if atomic:
        untouched = np.setdiff1d(np.arange(L), valid[valid >= 0])
        assert np.all(out[untouched] == 0)
    else:
        rows = out.transpose(0, 2, 1, 3)
        assert np.isnan(rows[valid < 0]).all() and not np.isnan(rows[valid >= 0]).any()
    dq_d, out_d = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, vec=True)
    np.testing.assert_array_equal(bits(dq), bits(dq_d))
    if not atomic or kind != "dups":
        np.testing.assert_array_equal(bits(out), bits(out_d))


def test_backward_staged_under_jitter(driver):
    """The staged hand-over under other interleavings (random sleeps at every synchronisation): the
    same bits, no emulation error (a unit overwritten before the storers read it, keys of a stage
    reused while drained)."""
    rng = np.random.default_rng(seed("wgmma-bwd-staged-jitter"))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, 2, 80, 100, "random")
    calm = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="staged")
    shaken = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="staged",
                        env={"HYTOPK_EMU_JITTER": "0.02", "HYTOPK_EMU_SEED": "7"})
    for a, b in zip(calm, shaken):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_backward_staged_missing_free_arrival_deadlocks(driver, tmp_path):
    """The staged hand-over's named barriers pair every arrival: a planted bug, the storers' free
    arrival dropped, leaves the consumer waiting and the watchdog reports the deadlock (the kernel's
    trap on the GPU would be a hang)."""
    src = (E.KERNELS / "attend_wgmma_bwd.cu").read_text()
    arrive = "\n                bar_arrive(BAR_UFREE + sc, UNIT_BAR_THREADS);\n"   # the producer's drain
    assert src.count(arrive) == 1
    bad = E.build(tmp_path / "bad", sources={"attend_wgmma_bwd.cu": src.replace(arrive, "\n                (void)0;\n")})
    kv, qd, dod, idx, lse, delta, *_ = backward_case(np.random.default_rng(4), 1, 64, 40, "random")
    with pytest.raises(E.EmulationError, match="deadlock|trap"):
        E.backward(bad, qd, kv, idx, dod, lse, delta, writes="staged", env={"HYTOPK_EMU_STALL_S": "3"})


# the split backward (two passes: P / dS in bf16 through a scratch, then dK/dV of all the heads at
# once with the keys as M): partial 64-key blocks (an odd 32-key tile count: the first pass zeroes the
# last block's second half), one and two head blocks (8, 80, 128 heads), masked slots, duplicates
SPLIT_CASES = [(3, 64, 45, "random", False), (3, 64, 70, "dups", True), (3, 8, 33, "disjoint", False),
               (3, 64, 45, "empty", True), (2, 80, 40, "shared", False), (2, 64, 1, "random", True),
               (2, 128, 100, "full", False), (2, 128, 130, "dups", True)]


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("n,Hq,kk,kind,atomic", SPLIT_CASES)
def test_backward_split_matches_reference(driver, n, Hq, kk, kind, atomic, bulk):
    """dq bit for bit the one-pass kernel's (the first pass is that kernel without its dK/dV MMAs);
    dK/dV against the float64 reference; one part row per (query, slot), masked slots' rows never
    written; untouched keys exactly 0; the second pass's rows written from the accumulators or by
    the TMA's bulk operations."""
    rng = np.random.default_rng(seed("wgmma-bwd-split", n, Hq, kk, kind, atomic))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, n, Hq, kk, kind, L)
    dq, out = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", bulk=bulk)
    rel_close(dq, rq)
    rel_close(out if atomic else summed_part_rows(out, valid, 0, L), rkv)
    if atomic:
        untouched = np.setdiff1d(np.arange(L), valid[valid >= 0])
        assert np.all(out[untouched] == 0)
    else:
        assert out.shape == (n, 1, kk, 576)
        rows = out[:, 0]
        assert np.isnan(rows[valid < 0]).all() and not np.isnan(rows[valid >= 0]).any()
    dq_d, _ = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic)
    np.testing.assert_array_equal(bits(dq), bits(dq_d))


@pytest.mark.parametrize("kw", [dict(bulk=False, dq_pass=False), dict(bulk=True, dq_pass=False), dict(dq_pass=True),
                                dict(dq_pass=True, ring=(1, 2))], ids=["two-pass", "two-pass-bulk", "dq-pass", "ring"])
def test_backward_split_under_jitter_and_chunks(driver, kw):
    """Other interleavings (random sleeps at every synchronisation: the stages, the P hand-over's two
    buffers, the third pass's stages published as their copies land) give the same bits, and a chunk
    (queries 1 .. 1) writes its own part rows and dq rows only, with the same bits as the whole run;
    the two-pass split (its first pass with dq), the dq pass's three launches and the ring."""
    rng = np.random.default_rng(seed("wgmma-bwd-split-jitter"))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, 3, 128, 300, "random")
    calm = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="split", **kw)
    shaken = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="split", **kw,
                        env={"HYTOPK_EMU_JITTER": "0.02", "HYTOPK_EMU_SEED": "3"})
    for a, b in zip(calm, shaken):
        np.testing.assert_array_equal(bits(a), bits(b))
    dq, part = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="split", t0=1, count=1, **kw)
    np.testing.assert_array_equal(bits(dq[1]), bits(calm[0][1]))
    assert np.isnan(dq[[0, 2]]).all()
    np.testing.assert_array_equal(bits(part[0]), bits(calm[1][1]))


def test_backward_split_bulk_rows_and_planted_waits(driver, tmp_path):
    """The second pass's part rows are the same bits whether the accumulators or the TMA write them.
    Each of the bulk path's two waits, planted out of a scratch copy, is caught: without the read
    wait a warp's staging buffer is refilled before the TMA has read it (the emulation reads a bulk
    operation's source at the latest wait that allows it, here the final one: the last rows land
    everywhere); without the final wait a thread exits with its bulk groups in flight."""
    rng = np.random.default_rng(seed("wgmma-bwd-split-bulk"))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, 2, 128, 200, "random")
    good = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="split", bulk=True)
    direct = E.backward(driver, qd, kv, idx, dod, lse, delta, writes="split", bulk=False)
    for a, b in zip(good, direct):
        np.testing.assert_array_equal(bits(a), bits(b))
    src = (E.KERNELS / "attend_wgmma_bwd.cu").read_text()
    read_wait, final_wait = "if (lane < 8) bulk_wait_read<0>();", "if (BULK && lane < 8) bulk_wait<0>();"
    assert src.count(read_wait) == 1 and src.count(final_wait) == 1
    for name, bad in (("read", src.replace(read_wait, "(void)0;")), ("final", src.replace(final_wait, "(void)0;"))):
        drv = E.build(tmp_path / name, sources={"attend_wgmma_bwd.cu": bad})
        try:
            got = E.backward(drv, qd, kv, idx, dod, lse, delta, writes="split", bulk=True)
        except E.EmulationError as e:
            assert name == "final" and "bulk groups" in str(e), (name, str(e)[-500:])
            continue
        assert name == "read" and not np.array_equal(bits(got[1]), bits(good[1])), name


# the dq pass takes two head blocks (65 .. 128 heads; fewer: the two-pass split's first pass)
DQ_PASS_CASES = [(2, 128, 100, "full", False), (2, 128, 130, "dups", True), (2, 80, 45, "random", True),
                 (3, 128, 70, "empty", False), (2, 100, 1, "shared", True), (2, 128, 200, "disjoint", False)]


@pytest.mark.parametrize("n,Hq,kk,kind,atomic", DQ_PASS_CASES)
def test_backward_split_dq_pass_same_bits(driver, n, Hq, kk, kind, atomic):
    """The split with a dq pass (the first pass without dq, Q / dO as register fragments over 64-key
    tiles; dq = dS K from a third pass) makes the same P / dS as the two-pass split, so the same bits:
    dq (its 16-key chunks summed in the same order) and the deterministic part rows; the atomics'
    dkv within the float atomics' order; both against the float64 reference."""
    rng = np.random.default_rng(seed("wgmma-bwd-split-dq", n, Hq, kk, kind, atomic))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, n, Hq, kk, kind, L)
    dq, out = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=True)
    dq_s, out_s = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=False)
    np.testing.assert_array_equal(bits(dq), bits(dq_s))
    rel_close(dq, rq)
    rel_close(out if atomic else summed_part_rows(out, valid, 0, L), rkv)
    if atomic:
        np.testing.assert_allclose(out, out_s, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(bits(out), bits(out_s))


RING_CASES = [((0, 1), False, 3, "dups"), ((1, 2), True, 4, "random"), ((2, 3), False, 5, "empty"),
              ((3, 5), True, 3, "disjoint"), ((1, 3), False, 4, "shared")]


@pytest.mark.parametrize("ring,atomic,n,kind", RING_CASES)
def test_backward_split_ring_same_bits(driver, ring, atomic, n, kind):
    """hytopk_attend_bwd_ring (the wrapper's RING): the three passes in one launch, blocks in ticket
    order, query t's P / dS in ring slot t % slots (reused once its six consumers released it): dq and the
    deterministic part rows the same bits as the three launches, the atomics' dkv within their order;
    a chunk (t0 1) writes its own dq rows only, and its dkv as the three launches' chunk. (The blocks run
    one after another here, so a missing wait or fence between blocks shows only on the GPU:
    tests/test_attention_wgmma_bwd_gpu.py reuses slots across 40 queries.)"""
    rng = np.random.default_rng(seed("wgmma-bwd-split-ring", ring, atomic, n, kind))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, n, 128, 130, kind, L)
    dq, out = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=True, ring=ring)
    dq_s, out_s = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=True)
    np.testing.assert_array_equal(bits(dq), bits(dq_s))
    rel_close(dq, rq)
    if atomic:
        np.testing.assert_allclose(out, out_s, rtol=1e-5, atol=1e-6)
        rel_close(out, rkv)
    else:
        np.testing.assert_array_equal(bits(out), bits(out_s))
    if ring in ((1, 2), (2, 3)):
        dq1, out1 = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=True,
                               ring=ring, t0=1, count=2)
        _, out1_s = E.backward(driver, qd, kv, idx, dod, lse, delta, atomic=atomic, writes="split", dq_pass=True,
                               t0=1, count=2)
        np.testing.assert_array_equal(bits(dq1[1:3]), bits(dq_s[1:3]))
        assert np.isnan(dq1[[0, 3]]).all()
        if atomic:
            np.testing.assert_allclose(out1, out1_s, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(bits(out1), bits(out1_s))


RELEASES = {
    # the third pass's consumers never free a stage: its producer waits for one
    "dq pass stage": ("if (lane == 0) mbar_arrive(empty0 + 8 * ((T - 1) % NST));", 1, 600, None),
    # the ring's consumers never release their slot: the slot's next query's first pass waits
    "ring slot": ("if (threadIdx.x == 0) flag_release_add(done, 1);", 3, 70, (1, 2)),
}


@pytest.mark.parametrize("what", sorted(RELEASES))
def test_backward_split_missing_release_deadlocks(driver, tmp_path, what):
    """A planted missing release is caught: the watchdog reports the deadlock (on the GPU: the wait's
    trap)."""
    release, n, kk, ring = RELEASES[what]
    rng = np.random.default_rng(seed("wgmma-bwd-split-planted", what))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, n, 128, kk, "random")
    src = (E.KERNELS / "attend_wgmma_bwd.cu").read_text()
    assert src.count(release) == 1
    drv = E.build(tmp_path / "norelease", sources={"attend_wgmma_bwd.cu": src.replace(release, "(void)0;")})
    with pytest.raises(E.EmulationError, match="deadlock|trap"):
        E.backward(drv, qd, kv, idx, dod, lse, delta, writes="split", dq_pass=True, ring=ring,
                   env={"HYTOPK_EMU_STALL_S": "3"})


def test_backward_chunk_writes_only_its_queries(driver):
    """t0 / count (attend_backward's query chunks): dq rows of other queries stay unwritten (NaN), the
    part rows are the chunk's, indexed from 0, and equal the whole launch's."""
    rng = np.random.default_rng(seed("wgmma-bwd-chunk"))
    L = 150
    kv, qd, dod, idx, lse, delta, rq, rkv, valid = backward_case(rng, 3, 64, 40, "dups", L)
    dq_all, part_all = E.backward(driver, qd, kv, idx, dod, lse, delta)
    dq, part = E.backward(driver, qd, kv, idx, dod, lse, delta, t0=1, count=1)
    assert np.isnan(dq[[0, 2]]).all()
    np.testing.assert_array_equal(bits(dq[1]), bits(dq_all[1]))
    np.testing.assert_array_equal(bits(part[0]), bits(part_all[1]))


def test_backward_under_jitter(driver):
    """Other interleavings (random sleeps at every synchronisation): the same bits, no emulation error
    (a stage reused before both consumers released it, P / dS overwritten while read)."""
    rng = np.random.default_rng(seed("wgmma-bwd-jitter"))
    kv, qd, dod, idx, lse, delta, *_ = backward_case(rng, 2, 64, 100, "random")
    calm = E.backward(driver, qd, kv, idx, dod, lse, delta)
    shaken = E.backward(driver, qd, kv, idx, dod, lse, delta, env={"HYTOPK_EMU_JITTER": "0.02", "HYTOPK_EMU_SEED": "5"})
    for a, b in zip(calm, shaken):
        np.testing.assert_array_equal(bits(a), bits(b))
