"""Sparse attention backward on wgmma (sm_90a) for MLA (kernels_cuda/attend_wgmma_bwd.cu).

attend.attend_backward(version=4) lands here: MLA's shared kv at d_qk 576 / d_v 512 on Hopper (as
attend_wgmma2.unsupported says), one query x 64 heads per block, dQ / S / dP / dK / dV on wgmma
(the mma.sync backward of attend.cu runs everything else). The same function as versions 1 / 2,
other rounding (P and dS in bf16 as theirs, other accumulation order): compared with the reference
within tolerance, and bitwise reproducible when deterministic.
  cupy.attend_backward.wgmma         per-(query, head block, slot) part rows summed per key in a
                                     fixed order (version 1's reduction): bitwise reproducible
  cupy.attend_backward.wgmma_atomic  dK/dV by float atomics into dkv: not reproducible
dK/dV leave one of three ways (WRITES; "auto", the default: the faster on the H200 per mode and head
blocks, AUTO_WRITES: split but for the atomics at one head block, staged above 128 heads):
  "split": two passes. The first is the one-pass kernel without its dK/dV MMAs: S, dP, dQ, and P / dS
    (bf16, the same operands) into a scratch; the second computes dKV = dS^T Q + P^T dO of all the
    query's heads at once (keys as the MMA's M, up to 128 heads as its K), so each (query, slot,
    column) leaves once instead of once per 64-head block. The second pass's rows go through the
    TMA's bulk operations (DKV_BULK: each warp stages 8 rows of 192 floats, lanes 0-7 hand one
    768-byte row each to cp.reduce.async.bulk .add.f32, or cp.async.bulk into the part rows), or
    8 bytes at a time from the accumulators. results/h200-2026-12-04-s11 (H200, 128 heads, n 8192,
    L 65536, k 2048, alternating rounds, run 1): atomics 43.3 ms (bulk) against 47.0 (8-byte) and
    48.2 staged; deterministic 57.2 against 59.1 (the same bits). The first pass takes 22.4-22.6 ms;
    neither a second staging buffer (run 2: 43.0 with no read wait at all), a chunk's second pass
    under the next chunk's first (run 3: 43.2-43.3 against 43.8) nor sorted keys (run 5) pay; with
    dkv inside the L2 (L 8192) the whole backward takes 36.9 ms (run 2). The first pass gathers
    its key tiles into the 128-byte swizzle, one L2 request per 32-byte sector (the core-matrix
    layout took one per 16 bytes): atomics 40.6 ms against 43.5, deterministic 51.2 against 54.2,
    the same bits (results/h200-2026-12-04-s12 run 7). Neither the second pass in key-range phases
    (dkv L / P keys at a time) nor each query's slots sorted by key paid enough to keep
    (results/h200-2026-12-04-s13; commits 002326d, acb032a). At two head blocks (65 .. 128 heads)
    the split takes a dq pass (DQ_PASS): its first pass computes S / dP only, Q and dO held in
    registers, and a third pass makes dq = dS K. Both gather into the 128-byte swizzle. Atomics take
    40.4 ms against 41.9, deterministic 57.2 against 58.7; dq and the deterministic dk are the same
    bits (results/h200-2026-12-04-s13 run 6). The dq pass's three passes then run as one launch (RING,
    its default: hytopk_attend_bwd_ring): the blocks take tickets, and ticket order runs the first pass
    of query t beside the second and third passes of query t - lag, query t's P / dS in slot t % slots
    of a 128 MiB ring, handed over by release / acquire flags in global memory. The first pass (gather
    and tensor bound), the second (L2 reductions) and the third then share the SMs: atomics 36.66 ms
    against 40.36, deterministic 50.41 against 53.33, the same bits (results/h200-2026-12-04-s14 run 2);
    in the bench 34.91 ms, 0.62 of the op's forward rate (run 3). At most 128 heads (two head blocks):
    above, staged.
  "staged": each consumer hands its dK/dV to the producer warpgroup a 16-slot x
    64-column unit at a time through shared memory, and the producer writes them 16 bytes at a time
    (red.global.add.v4.f32 / st.global.v4.f32), so the consumers go on to their next MMAs instead of
    waiting on the writes. Run 7 of results/h200-2026-12-02-s7 (H200, 128 heads, n 8192, L 65536,
    k 2048, alternating rounds): atomics 49.9 ms against the direct 51.7, deterministic 83.3 ms
    against 92.1; 44.8 ms with named-barrier hand-overs (results/h200-2026-12-03-s9). (The TMA's bulk
    reductions add the same floats faster, 26.5 ms against 35.8 with no MMA, but a kernel writing
    through them took 62-67 ms: commit cd2ef35, results/h200-2026-12-03-s8.)
  "direct": each consumer writes from its accumulators, the part rows 16 bytes at a time
    (st.global.v4.f32), the atomics one float at a time (faster on the H200 than
    red.global.add.v4.f32 after the lane transpose it needs); VEC_WRITES = True takes the 16-byte
    atomics (scripts/bench_attention.py's comparison row).
Direct and staged write the same floats to the same places: the part rows, hence the deterministic
dk, are the same bits whichever wrote them. Split sums the head blocks inside the MMA: other bits,
equally reproducible; dq is the same bits on all three.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from workbench import instantiations as INST

from ... import loader
from ...cubin_info import check_launch
from ...registry import register
from . import attend as A
from .attend_wgmma2 import unsupported
from .wgmma import require_sm90

FILE = "attend_wgmma_bwd.cu"
VEC_WRITES: bool | None = None     # None: instantiations.ATTEND_WGMMA_BWD_VEC; True: 16-byte atomics too
WRITES = "auto"                    # how dK/dV leave: instantiations.ATTEND_WGMMA_BWD_WRITES, or "auto" (AUTO_WRITES)
# (deterministic, head blocks) -> the faster path on the H200 (results/h200-2026-12-04-s14 run 7, n 8192, k 2048): at
# one head block (16 / 32 / 64 heads) the atomics' staged 22.3-23.0 ms against split 28.5-29.7, deterministic split
# 43.5-45.8 against staged 43.8-46.0; at two (100 / 128 heads) split (the ring) 33.2 / 34.8 against staged 43.4 / 44.7,
# deterministic 52.9 / 54.3 against 89.1 / 90.7. Above two head blocks: staged.
AUTO_WRITES = {(True, 1): "split", (False, 1): "staged", (True, 2): "split", (False, 2): "split"}
DKV_BULK: bool | None = None       # split's second pass through the TMA's bulk operations (None: instantiations)
DQ_PASS: bool | None = None        # split with dq in a third pass, Q / dO in the first's registers (None: instantiations)
RING: tuple | bool | None = None   # the dq pass's passes in one launch over ring slots of P / dS, (lag, slots)
                                   # (None: instantiations.ATTEND_WGMMA_BWD_RING; False: three launches)
_FITS: dict[int, object] = {}     # id -> function already checked (held, so ids are not reused)


def _fn(name: str, writes: str = "direct", roles=None, smem=None, threads=None, more_roles=()):
    """The kernel `name`, checked once: its launch fits (registers x threads, each role set's setmaxnreg
    budgets: roles, and more_roles where blocks take other roles) and its dynamic shared memory is allowed."""
    fn = loader.module(FILE, (name,), options=INST.FILE_OPTIONS[FILE]).function(name)
    if id(fn) not in _FITS:           # a launch that cannot fit says why (registers x threads)
        for rs in (roles or INST.attend_wgmma_bwd_roles(writes), *more_roles):
            check_launch(fn.num_regs, fn.max_threads_per_block, threads or INST.ATTEND_WGMMA_BWD_THREADS, name, roles=rs)
        smem = smem or INST.attend_wgmma_bwd_smem(writes)
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        _FITS[id(fn)] = fn
    return fn


def check_applies(b) -> None:
    """A ValueError naming the arguments when version 4 cannot take these inputs."""
    why = unsupported(b)
    if why:
        raise ValueError(f"arguments 'k', 'v': attend_backward version 4 (wgmma) {why}; use version 1 or 2")
    require_sm90()


def backward(b, deterministic, scratch_bytes, do, lse, delta, dq, dk):
    """attend_backward's version 4 on a Bound b (checked by check_applies): dq written, dk (MLA's
    dkv [L, 1, 576]) summed from part rows per key in a fixed order, or by atomics."""
    nhb = -(-b.Hq // INST.ATTEND_WGMMA_HEADS)
    writes = AUTO_WRITES.get((bool(deterministic), nhb), "staged") if WRITES == "auto" else WRITES
    if writes == "split" and b.Hq > INST.ATTEND_WGMMA_BWD_SPLIT_HEADS:
        writes = "staged"             # the second pass sums at most two head blocks
    if writes == "split":
        return _split(b, nhb, deterministic, scratch_bytes, do, lse, delta, dq, dk)
    smem, threads = INST.attend_wgmma_bwd_smem(writes), INST.ATTEND_WGMMA_BWD_THREADS
    head = (b.q, b.k, np.int64(b.k_stride), b.idx, np.int32(b.kk), np.int32(b.n))
    tail = (np.int64(b.L), np.int32(b.Hq), np.int32(nhb), np.float32(b.scale), b.scale_log2, do, lse, delta, dq)
    if not deterministic:
        if b.n * nhb >= 2 ** 31:
            raise ValueError(f"argument 'q': {b.n} queries x {nhb} head blocks exceed one launch's 2^31 - 1 blocks")
        fn = _fn(INST.attend_wgmma_bwd_name(True, VEC_WRITES, writes), writes)
        fn((b.n * nhb,), (threads,), head + (np.int32(0),) + tail + (dk,), shared_mem=smem)
        return
    W = b.DQK
    fn = _fn(INST.attend_wgmma_bwd_name(False, writes=writes), writes)
    chunk = A.part_chunk(b, nhb, W, scratch_bytes or A._scratch_v2(), max_chunk=(2 ** 31 - 1) // nhb)
    A.sum_part_rows(b, chunk, nhb, W, True, dk, None,
                    lambda t0, c, part: fn((c * nhb,), (threads,), head + (np.int32(t0),) + tail + (part,),
                                           shared_mem=smem))


def _split(b, nhb, deterministic, scratch_bytes, do, lse, delta, dq, dk):
    """WRITES = "split": per query chunk, the first pass (dq, and P / dS in bf16 into a scratch of
    nhb * 64 x ceil(kk / 64) * 64 x 2 per query) then the second (dK/dV of all the query's heads at
    once: atomics into dk, or one part row per (query, slot) summed per key in a fixed order)."""
    hpad, nt = nhb * INST.ATTEND_WGMMA_HEADS, -(-b.kk // 64)
    per_query = hpad * nt * 64 * 2 * 2
    smem, threads = INST.attend_wgmma_bwd_smem("split"), INST.ATTEND_WGMMA_BWD_THREADS
    dq_pass = (INST.ATTEND_WGMMA_BWD_DQ_PASS if DQ_PASS is None else DQ_PASS) and hpad == 128   # two head blocks
    ring = INST.ATTEND_WGMMA_BWD_RING if RING is None else RING
    if dq_pass and ring:
        return _ring(b, ring, per_query, deterministic, scratch_bytes, do, lse, delta, dq, dk)
    if dq_pass:
        smem = INST.ATTEND_WGMMA_BWD_SP_SMEM
        first = _fn("hytopk_attend_bwd_sp", roles=INST.ATTEND_WGMMA_BWD_SP_ROLES, smem=smem, threads=threads)
        third = _fn("hytopk_attend_bwd_dqp", roles=INST.ATTEND_WGMMA_BWD_DKV_ROLES,
                    smem=INST.ATTEND_WGMMA_BWD_DQ_SMEM, threads=INST.ATTEND_WGMMA_BWD_DKV_THREADS)
    else:
        first = _fn(INST.attend_wgmma_bwd_name(False, writes="split"), "split")
    dkv_smem = INST.attend_wgmma_bwd_dkv_smem(DKV_BULK)
    second = _fn(INST.attend_wgmma_bwd_dkv_name(not deterministic, hpad, DKV_BULK), roles=INST.ATTEND_WGMMA_BWD_DKV_ROLES,
                 smem=dkv_smem, threads=INST.ATTEND_WGMMA_BWD_DKV_THREADS)
    dkv_threads = INST.ATTEND_WGMMA_BWD_DKV_THREADS
    head = (b.q, b.k, np.int64(b.k_stride), b.idx, np.int32(b.kk), np.int32(b.n))
    tail = (np.int64(b.L), np.int32(b.Hq), np.int32(nhb), np.float32(b.scale), b.scale_log2, do, lse, delta, dq)
    scratch = scratch_bytes or A._scratch_v2()
    W = b.DQK
    per_row = 0 if not deterministic else b.Hkv * b.kk * W * 4       # part rows per query
    chunk = max(1, min(b.n, scratch // (per_query + per_row), (2 ** 31 - 1) // (nhb * 3)))
    pds = cp.empty(chunk * per_query // 2, cp.uint16)

    first_tail = tail[:-1] if dq_pass else tail     # the dq pass's first pass takes no dq (the third writes it)

    def launch(t0, c, out):
        first((c * nhb,), (threads,), head + (np.int32(t0),) + first_tail + (pds,), shared_mem=smem)
        second((c * 3,), (dkv_threads,), (b.q, do, pds, b.idx, np.int32(b.kk), np.int32(t0), np.int64(b.L),
                                      np.int32(b.Hq), out), shared_mem=dkv_smem)
        if dq_pass:
            third((c * 3,), (dkv_threads,), (b.k, np.int64(b.k_stride), pds, b.idx, np.int32(b.kk), np.int32(t0),
                                             np.int64(b.L), np.int32(b.Hq), dq), shared_mem=INST.ATTEND_WGMMA_BWD_DQ_SMEM)

    if not deterministic:
        for t0 in range(0, b.n, chunk):
            launch(t0, min(chunk, b.n - t0), dk)
        return
    A.sum_part_rows(b, chunk, 1, W, True, dk, None, launch)


def _ring(b, ring, per_query, deterministic, scratch_bytes, do, lse, delta, dq, dk):
    """RING = (lag, slots): the dq pass's three passes in one launch per query chunk (the atomics: one
    chunk; deterministic: as many queries as their part rows fit the scratch), the first pass of query
    t beside the second and third of query t - lag, P / dS (per_query bytes each) in slot t % slots
    (hytopk_attend_bwd_ring)."""
    lag, ring = (int(x) for x in ring)
    if not 0 <= lag < ring:
        raise ValueError(f"argument 'RING': lag {lag} must be >= 0 and below the ring's {ring} slots")
    smem = max(INST.ATTEND_WGMMA_BWD_SP_SMEM, INST.attend_wgmma_bwd_dkv_smem(DKV_BULK), INST.ATTEND_WGMMA_BWD_DQ_SMEM)
    threads = INST.ATTEND_WGMMA_BWD_DKV_THREADS
    fn = _fn(INST.attend_wgmma_bwd_ring_name(not deterministic, DKV_BULK), roles=INST.ATTEND_WGMMA_BWD_DKV_ROLES,
             smem=smem, threads=threads, more_roles=(INST.ATTEND_WGMMA_BWD_SP_ROLES,))   # its first-pass blocks: split_sp's
    ring = min(ring, b.n)
    pds = cp.empty(ring * per_query // 2, cp.uint16)
    flags = cp.zeros(1 + 2 * ring, cp.int32)

    def launch(t0, c, out):
        flags.fill(0)
        fn((8 * c,), (threads,), (b.q, b.k, np.int64(b.k_stride), b.idx, np.int32(b.kk), np.int32(b.n), np.int32(t0),
                                  np.int32(c), np.int64(b.L), np.int32(b.Hq), np.float32(b.scale), b.scale_log2, do, lse,
                                  delta, pds, out, dq, flags, np.int32(min(lag, c, ring - 1)), np.int32(ring)),
           shared_mem=smem)

    most = (2 ** 31 - 1) // 8
    if not deterministic:
        for t0 in range(0, b.n, most):
            launch(t0, min(most, b.n - t0), dk)
        return
    per_row = b.Hkv * b.kk * b.DQK * 4
    chunk = max(1, min(b.n, (scratch_bytes or A._scratch_v2()) // per_row, most))
    A.sum_part_rows(b, chunk, 1, b.DQK, True, dk, None, launch)


@register("attend_backward", "cupy.attend_backward.wgmma", gpu_only=True)
def attend_backward_wgmma(dout, q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a): part rows summed per key in a fixed order (bitwise reproducible)."""
    out, lse = A.attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return A.attend_backward(dout, q, k, v, idx, out, lse, scale, deterministic=True, version=4)


@register("attend_backward", "cupy.attend_backward.wgmma_atomic", gpu_only=True)
def attend_backward_wgmma_atomic(dout, q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a): dK/dV by float atomics (not reproducible)."""
    out, lse = A.attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return A.attend_backward(dout, q, k, v, idx, out, lse, scale, deterministic=False, version=4)
