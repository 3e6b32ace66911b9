"""Sparse attention over the selected keys on bf16 tensor cores (kernels_cuda/attend.cu).

Variants of the `attend` stage (signature in registry.ATTENTION_STAGES):
  cupy.attend.one   one query per block: its heads (of one kv head) are the MMA rows, padded to 16/32/64
  cupy.attend.pair  two adjacent queries per block over the union of their selections
                    (reference.attention.pair_union); each query masks the keys it did not select
  cupy.attend.one_acc2 / pair_acc2  the same with two logit accumulators per n8 tile
  cupy.attend.pair_nk64  `pair` with 64-key tiles where they fit (32 rows: 16 heads)
and of `attend_backward`:
  cupy.attend_backward.deterministic  dK/dV per (query, slot) into a bounded scratch, summed per key
                                      in a fixed order (bitwise reproducible), query chunk by chunk
  cupy.attend_backward.deterministic_v2  the same with head-block pairs sharing scratch rows (in a
                                      fixed order) and a warp-per-key reduction (reproducible)
  cupy.attend_backward.atomic         dK/dV by float atomics (fast, not reproducible)
  cupy.attend_backward.key_major      GQA / MHA with few query heads per kv head: dQ query-major,
                                      dK/dV key-major (each key's entries in a fixed order, no part
                                      rows, no atomics): bitwise reproducible; attend_backward's
                                      default where it applies (key_major_applies)

Inputs: bf16 (uint16 bits, torch.bfloat16) or float32 (rounded to bf16 here). MLA's shared kv is
passed as k = kv[:, None, :], v = kv[:, None, :d_v] (reference.attention.mla_kv): one gathered row
then serves as K and V. dK/dV come back float32; for shared kv, dk is the whole kv gradient and dv
is None.
"""
from __future__ import annotations

import math

import cupy as cp
import numpy as np

from reference import attention as RA
from workbench import instantiations as INST

from ... import loader
from ...bf16 import float32_to_bf16_bits
from ...registry import register
from ._launch import as_device, launch_stream

THREADS = 256
SMEM_OPTIN = INST.ATTEND_SMEM_LIMIT
NULL = np.uint64(0)              # a null pointer argument
SCRATCH_BYTES = 1 << 30          # deterministic backward: the per-slot dK/dV scratch of one query chunk
SCRATCH_BYTES_V2 = 4 << 30       # version 2's (fewer chunks: fewer sorts, launches and dK/dV passes)


def _fn(name: str):
    return loader.module("attend.cu", (name,), options=INST.FILE_OPTIONS.get("attend.cu", ())).function(name)


def _launch(fn, grid, args, smem):
    grid = tuple(int(g) for g in grid)
    if any(g <= 0 for g in grid):
        return
    if grid[1] > 65535:
        raise ValueError(f"grid {grid}: too many kv heads x head blocks for one launch")
    smem = int(smem)
    if smem > SMEM_OPTIN:
        raise ValueError(f"attend: a block needs {smem} bytes of shared memory, more than {SMEM_OPTIN}")
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    fn(grid, (THREADS,), args, shared_mem=smem)


def _bf16(x, name):
    a = as_device(x)
    if a.dtype in (cp.uint16, cp.int16):
        return a.view(cp.uint16)
    if a.dtype in (cp.float32, cp.float64):
        return float32_to_bf16_bits(cp.ascontiguousarray(a, cp.float32), cp)
    raise TypeError(f"argument '{name}' must be bf16 (uint16 bits / torch.bfloat16) or float32, got {a.dtype}")


def _shares_rows(k, v) -> bool:
    """v is a prefix view of k's rows (MLA: v = kv[:, None, :d_v])."""
    return (k.size > 0 and k.data.ptr == v.data.ptr and k.dtype == v.dtype and k.strides[:2] == v.strides[:2]
            and k.strides[2] == v.strides[2] == k.itemsize and v.shape[2] <= k.shape[2]
            and (k.shape[1] == 1 or k.strides[1] == k.shape[2] * k.itemsize)
            and k.strides[0] % k.itemsize == 0 and k.strides[0] >= k.shape[1] * k.shape[2] * k.itemsize)


def _pad_last(a, d):
    if a.shape[-1] == d:
        return cp.ascontiguousarray(a)
    out = cp.zeros(a.shape[:-1] + (d,), a.dtype)
    out[..., :a.shape[-1]] = a
    return out


class Bound:
    """Device inputs of one attend call: bf16 q [n, Hq, DQK], k rows, v rows, int32 idx; dims padded
    to multiples of 16 (zero columns add exactly 0 to every dot product)."""

    def __init__(self, q, k, v, idx, scale):
        q, k, v, idx = as_device(q), as_device(k), as_device(v), as_device(idx)
        self.n, self.Hq, self.d_qk, self.L, self.Hkv, self.d_v, self.kk = RA.check_attention_args(
            q, k, v, idx, idx_values=False, dtypes=("float32", "bfloat16", "uint16", "int16"))
        self.scale = RA.check_scale(scale, self.d_qk)
        self.G = self.Hq // self.Hkv
        if idx.size:                                      # (L = 0: only -1; the part-row reduction trusts it)
            lo, hi = (int(x) for x in cp.asnumpy(cp.stack((idx.min(), idx.max()))))   # one sync
            if lo < -1 or hi >= self.L:
                raise ValueError(f"argument 'idx': entries must lie in [-1, L = {self.L}), got [{lo}, {hi}]")
        self.idx = cp.ascontiguousarray(idx)
        DQK, DV = -(-self.d_qk // 16) * 16, -(-self.d_v // 16) * 16
        shared = _shares_rows(k, v) and DQK == self.d_qk and DV <= DQK
        q, k = _bf16(q, "q"), _bf16(k, "k")
        self.q = _pad_last(q, DQK)
        if shared:
            self.k = k                                    # rows of stride k.strides[0]
            self.v = k
            self.k_stride = k.strides[0] // 2
        else:
            self.k = _pad_last(k, DQK)
            self.v = _pad_last(_bf16(v, "v"), DV)
            self.k_stride = self.Hkv * DQK
        self.v_stride = self.Hkv * DV
        self.shared, self.DQK, self.DV = shared, DQK, DV
        self.scale_log2 = np.float32(self.scale / math.log(2.0))

    def rows(self, qpt: int):
        """(MT, heads per block): the MMA rows of a block hold qpt queries x heads of one kv head."""
        hb = min(self.G, 64 // qpt)
        need = qpt * hb
        rows = next(r for r in INST.ATTEND_ROWS if r >= need)
        return rows // 16, hb

    def smem(self, mt, qpt, backward=False, nk=None):
        return INST.attend_smem(mt, self.DQK, self.DV, qpt, self.shared, backward, nk)


UNION_MAX_L = 1 << 30            # the union kernel packs (position << 1 | query) into 32 bits
UNION_REG_MAX = 16 * THREADS     # hytopk_attend_pair_union_reg: at most 16 entries per thread
UNION_BITS_SMEM = 96 << 10       # hytopk_attend_pair_union_bits: three L-bit bitmaps in at most this
UNION_BITS_SCAN = 8              # ... and at most this many bitmap words per entry of the pair to scan
UNION_REPEATS = 512              # attend.cu's list of repeated keys per pair (more: the block sorts)


def union_bits_fit(L, kk) -> bool:
    """The bitmap union takes contexts whose three L-bit bitmaps fit UNION_BITS_SMEM and whose
    scan (L / 32 words) is at most UNION_BITS_SCAN words per entry of the pair."""
    W = -(-L // 32)
    return 0 < W and 12 * W <= UNION_BITS_SMEM and W <= UNION_BITS_SCAN * 2 * kk


def _union_bits_smem(W, N) -> int:
    return max(12 * W + 4 * UNION_REPEATS, 4 * N)


def pair_union(idx, L, *, kernel="auto"):
    """reference.attention.pair_union on the GPU, one block per pair: kernel 'bits' sets each
    query's keys in a bitmap and scans it (hytopk_attend_pair_union_bits: no sort; union_bits_fit),
    'reg' sorts the pair's 2 kk entries in registers (hytopk_attend_pair_union_reg, 2 kk <= 4096),
    'smem' in shared memory (hytopk_attend_pair_union, the first version); all give the same
    output; 'auto' the first that fits; CuPy's sort where none fits."""
    if kernel not in ("auto", "bits", "reg", "smem"):
        raise ValueError(f"argument 'kernel' must be 'auto', 'bits', 'reg' or 'smem', got {kernel!r}")
    n, kk = idx.shape
    P = (n + 1) // 2
    N = max(256, 1 << max(0, 2 * kk - 1).bit_length())
    if L > UNION_MAX_L or 4 * N > SMEM_OPTIN:
        return RA.pair_union(idx, cp)
    uidx = cp.empty((P, 2 * kk), cp.int32)
    mult = cp.empty((P, 2 * kk, 2), cp.int32)
    count = cp.empty(P, cp.int32)
    idx = cp.ascontiguousarray(idx)
    if kernel == "auto":
        kernel = "bits" if union_bits_fit(L, kk) else "reg"
    if kernel == "bits" and union_bits_fit(L, kk):
        W = -(-L // 32)
        _launch(_fn("hytopk_attend_pair_union_bits"), (P, 1),
                (idx, np.int32(n), np.int32(kk), np.int64(L), np.int32(W), np.int32(N), uidx, mult, count),
                _union_bits_smem(W, N))
    elif kernel in ("bits", "reg") and N <= UNION_REG_MAX:
        _launch(_fn(f"hytopk_attend_pair_union_reg<{N // THREADS}>"), (P, 1),
                (idx, np.int32(n), np.int32(kk), np.int64(L), uidx, mult, count), 0)
    else:
        _launch(_fn("hytopk_attend_pair_union"), (P, 1),
                (idx, np.int32(n), np.int32(kk), np.int64(L), np.int32(N), uidx, mult, count), 4 * N)
    return uidx, mult, count


def attend_forward(q, k, v, idx, scale=None, *, qpt=1, out_dtype="bfloat16", acc=1, wide=False):
    """(out [n, Hq, d_v], lse float32 [n, Hq]) on the GPU; qpt 1 (`one`) or 2 (`pair`); acc 2: two
    logit accumulators per n8 tile (hytopk_attend_fwd_acc2, padded d_qk a multiple of 32); wide:
    64-key tiles where they fit (INST.attend_wide_nk: 32 rows, e.g. pair at 16 heads). acc 2 and
    wide round differently from the defaults (other summation order / softmax tiles)."""
    if out_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"argument 'out_dtype' must be 'bfloat16' or 'float32', got {out_dtype!r}")
    if acc not in (1, 2):
        raise ValueError(f"argument 'acc' must be 1 or 2, got {acc!r}")
    with launch_stream():
        b = Bound(q, k, v, idx, scale)
        out_bf16 = out_dtype == "bfloat16"
        out = cp.empty((b.n, b.Hq, b.DV), cp.uint16 if out_bf16 else cp.float32)
        lse = cp.empty((b.n, b.Hq), cp.float32)
        mt, hb = b.rows(qpt)
        nhb = -(-b.G // hb)
        if qpt == 1:
            lst, lens, mult, U, tiles = b.idx, NULL, NULL, b.kk, b.n
        else:
            lst, mult, lens = pair_union(b.idx, b.L)
            U, tiles = lst.shape[1], lst.shape[0]
        name = INST.attend_fwd_acc2_name if acc == 2 and b.DQK % 32 == 0 else INST.attend_fwd_name
        nk = INST.attend_wide_nk(mt, b.DQK, b.DV, qpt, b.shared) if wide else INST.attend_nk(mt)
        fn = _fn(name(mt, b.DQK, b.DV, qpt, b.shared, out_bf16, nk))
        _launch(fn, (tiles, b.Hkv * nhb),
                (b.q, b.k, np.int64(b.k_stride), b.v, np.int64(b.v_stride), lst, lens, mult, np.int32(U),
                 np.int32(b.n), np.int64(b.L), np.int32(b.Hq), np.int32(b.Hkv), np.int32(hb), b.scale_log2,
                 out, lse), b.smem(mt, qpt, nk=nk))
        if b.DV != b.d_v:
            out = cp.ascontiguousarray(out[:, :, :b.d_v])
        return out, lse


KEY_MAJOR_MAX_G = 4      # query heads per kv head up to which dK/dV go key-major (version 3)


def key_major_applies(b: "Bound") -> bool:
    """Version 3 (key-major dK/dV) fits: separate k / v (not MLA's shared rows: a key's entries
    would each read all of a query's heads), at most KEY_MAJOR_MAX_G query heads per kv head (each
    (key, entry) pair reads G rows of q and dout: past a few heads the per-slot part rows of
    version 1 move fewer bytes), padded head dims multiples of 64, entry ids (t * kk + slot) in int32."""
    return (not b.shared and b.G <= KEY_MAJOR_MAX_G and b.DQK % 64 == 0 and b.DV % 64 == 0
            and b.n * b.kk < 2 ** 31)


def key_entries(idx, L):
    """(entry int32 [valid slots], starts int64 [L + 1]): the slots t * kk + slot sorted by key, then
    by slot id (unique sort keys: a fixed order whatever the sort), and each key's first entry."""
    flat = idx.ravel().astype(cp.int64)
    comp = cp.sort((flat << 32) | cp.arange(flat.size, dtype=cp.int64))   # padding (-1) sorts first
    keys = comp >> 32
    entry = (comp & 0xFFFFFFFF).astype(cp.int32)
    return entry, cp.searchsorted(keys, cp.arange(L + 1, dtype=cp.int64)).astype(cp.int64)


def attend_backward(dout, q, k, v, idx, out, lse, scale=None, *, deterministic=True, scratch_bytes=None,
                    version=None):
    """(dq float32 [n, Hq, d_qk], dk float32, dv float32 or None for shared kv) of attend_forward's
    out (as returned: bf16 or float32) for the upstream gradient dout; lse from the forward.
    version 1: per-slot part rows (deterministic) or atomics (deterministic False).
    version 2 (deterministic only): head blocks 2h, 2h+1 share one part row (2h+1 adds 2h's value,
    read back from L2: half the scratch traffic, a fixed order), a warp-per-key float4 reduction,
    and a larger default scratch (fewer chunks); other bits than version 1's past one head block.
    version 3 (key_major_applies only): dq by hytopk_attend_bwd_dq (query pairs over their union),
    dK/dV key-major by hytopk_attend_dkv_keys: bitwise reproducible whatever ``deterministic``
    says, no scratch.
    version 4 (MLA at d_qk 576 / d_v 512 on Hopper): the wgmma backward (attend_wgmma_bwd.py),
    version 1's part rows (deterministic: version 2's default scratch) or atomics.
    None: 3 where it applies, else 1."""
    if version not in (None, 1, 2, 3, 4):
        raise ValueError(f"argument 'version' must be None, 1, 2, 3 or 4, got {version!r}")
    with launch_stream():
        b = Bound(q, k, v, idx, scale)
        if version is None:
            version = 3 if key_major_applies(b) else 1
        if version == 3 and not key_major_applies(b):
            raise ValueError(f"argument 'version': 3 (key-major) needs separate k / v, at most {KEY_MAJOR_MAX_G} "
                             f"query heads per kv head and head dims multiples of 64 (got shared={b.shared}, "
                             f"G={b.G}, d_qk={b.d_qk}, d_v={b.d_v})")
        if version == 4:
            from . import attend_wgmma_bwd as AWB
            AWB.check_applies(b)
        out, lse = as_device(out), as_device(lse)
        if tuple(lse.shape) != (b.n, b.Hq) or lse.dtype != cp.float32:
            raise ValueError(f"argument 'lse' must be float32 [{b.n}, {b.Hq}], got {lse.dtype} {tuple(lse.shape)}")
        if tuple(out.shape) != (b.n, b.Hq, b.d_v):
            raise ValueError(f"argument 'out' must have shape {(b.n, b.Hq, b.d_v)}, got {tuple(out.shape)}")
        dout = as_device(dout)
        if tuple(dout.shape) != (b.n, b.Hq, b.d_v):
            raise ValueError(f"argument 'dout' must have shape {(b.n, b.Hq, b.d_v)}, got {tuple(dout.shape)}")
        do = _pad_last(_bf16(dout, "dout"), b.DV)
        out_bf16 = out.dtype in (cp.uint16, cp.int16)
        o = _pad_last(out.view(cp.uint16) if out_bf16 else cp.ascontiguousarray(out, cp.float32), b.DV)
        lse = cp.ascontiguousarray(lse)
        rows = b.n * b.Hq
        delta = cp.empty(rows, cp.float32)
        _launch(_fn(f"hytopk_attend_delta<{'true' if out_bf16 else 'false'}>"), (-(-rows // 8), 1),
                (do, o, np.int64(rows), np.int32(b.DV), delta), 0)
        dq = cp.zeros((b.n, b.Hq, b.DQK), cp.float32)
        dk = cp.zeros((b.L, b.Hkv, b.DQK), cp.float32)
        dv = None if b.shared else cp.zeros((b.L, b.Hkv, b.DV), cp.float32)
        if b.kk and b.n and version == 3:
            _backward_key_major(b, do, lse, delta, dq, dk, dv)
        elif b.kk and b.n and version == 4:
            AWB.backward(b, deterministic, scratch_bytes, do, lse, delta, dq, dk)
        elif b.kk and b.n:
            _backward_slots(b, version, deterministic, scratch_bytes, do, lse, delta, dq, dk, dv)
        if b.DQK != b.d_qk:
            dq = cp.ascontiguousarray(dq[:, :, :b.d_qk])
            dk = cp.ascontiguousarray(dk[:, :, :b.d_qk])
        if dv is not None and b.DV != b.d_v:
            dv = cp.ascontiguousarray(dv[:, :, :b.d_v])
        return dq, dk, dv


def _backward_key_major(b, do, lse, delta, dq, dk, dv):
    """Version 3: dq per query pair (hytopk_attend_bwd_dq), dK / dV per key (hytopk_attend_dkv_keys)."""
    # dq query-major, a query pair per block over its union as the forward's `pair` (G <= 4:
    # every head of both queries in one block): the pair's shared keys are read once
    qmt, qhb = b.rows(2)
    lst, mult, lens = pair_union(b.idx, b.L)
    _launch(_fn(INST.attend_bwd_dq_name(qmt, b.DQK, b.DV, 2, b.shared)), (lst.shape[0], b.Hkv),
            (b.q, b.k, np.int64(b.k_stride), b.v, np.int64(b.v_stride), lst, lens, mult,
             np.int32(lst.shape[1]), np.int32(b.n), np.int64(b.L), np.int32(b.Hq), np.int32(b.Hkv),
             np.int32(qhb), np.float32(b.scale), b.scale_log2, do, lse, delta, dq),
            b.smem(qmt, 2, backward=True))
    entry, starts = key_entries(b.idx, b.L)
    _launch(_fn(INST.attend_dkv_keys_name(b.DQK, b.DV)), (-(-(b.L * b.Hkv) // 8), 1),
            (b.q, b.k, np.int64(b.k_stride), b.v, np.int64(b.v_stride), do, lse, delta, entry, starts,
             np.int32(b.kk), np.int64(b.L), np.int32(b.Hq), np.int32(b.Hkv), np.float32(b.scale),
             b.scale_log2, dk, dv), 0)


def _backward_slots(b, version, deterministic, scratch_bytes, do, lse, delta, dq, dk, dv):
    """Versions 1 and 2: the mma.sync backward's per-slot dK / dV, by atomics or part rows summed
    per key in a fixed order (attend_backward's docstring)."""
    W = b.DQK if b.shared else b.DQK + b.DV
    mt, hb = b.rows(1)
    nhb = -(-b.G // hb)
    fn = _fn(INST.attend_bwd_name(mt, b.DQK, b.DV, b.shared, not deterministic))
    smem = b.smem(mt, 1, backward=True)
    common = (b.q, b.k, np.int64(b.k_stride), b.v, np.int64(b.v_stride), b.idx, np.int32(b.kk), np.int32(b.n))
    tail = (np.int64(b.L), np.int32(b.Hq), np.int32(b.Hkv), np.int32(hb), np.float32(b.scale), b.scale_log2,
            do, lse, delta, dq, dk, dv if dv is not None else dk)
    if not deterministic:
        _launch(fn, (b.n, b.Hkv * nhb), common + (np.int32(0),) + tail + (dk,), smem)
    elif version == 1:
        chunk = part_chunk(b, nhb, W, scratch_bytes or SCRATCH_BYTES)
        sum_part_rows(b, chunk, nhb, W, False, dk, dv,
                      lambda t0, c, part: _launch(fn, (c, b.Hkv * nhb), common + (np.int32(t0),) + tail + (part,), smem))
    else:
        # one part row per head-block pair (one head block: the plain kernel, the same bits)
        nrow = -(-nhb // 2)
        chunk = part_chunk(b, nrow, W, scratch_bytes or _scratch_v2())
        if nhb > 1:
            fn = _fn(INST.attend_bwd_hb2_name(mt, b.DQK, b.DV, b.shared))
            flags = cp.empty(1 + chunk * b.Hkv * nrow, cp.int32)   # [0]: the work counter

        def launch(t0, c, part):
            if nhb > 1:
                flags.fill(0)
                _launch(fn, (c * b.Hkv * nhb, 1), common + (np.int32(t0),) + tail + (part, flags), smem)
            else:
                _launch(fn, (c, b.Hkv * nhb), common + (np.int32(t0),) + tail + (part,), smem)
        sum_part_rows(b, chunk, nrow, W, True, dk, dv, launch)


def part_chunk(b, nrow, W, scratch: int, max_chunk: int | None = None) -> int:
    """Queries per chunk of the deterministic backward: as many as `scratch` bytes of part rows
    hold (nrow rows of W floats per (query, kv head, slot)), at least one, at most max_chunk."""
    per_query = b.Hkv * nrow * b.kk * W * 4
    return max(1, min(b.n, scratch // max(1, per_query), max_chunk or b.n))


def sum_part_rows(b, chunk, nrow, W, warp, dk, dv, launch):
    """The deterministic dK / dV of the per-slot kernels (versions 1, 2, 4), chunk by chunk:
    launch(t0, c, part) writes the part rows of queries t0 .. t0+c-1, then _reduce_chunk adds them
    per key in entry order (a fixed order); warp: the warp-per-key reduction where it takes W."""
    part = cp.empty((chunk * b.Hkv * nrow * b.kk, W), cp.float32)
    wname = INST.attend_reduce_warp_name(b.shared, W) if warp else None
    red = _fn(wname or f"hytopk_attend_dkv_reduce<{'true' if b.shared else 'false'}>")
    for t0 in range(0, b.n, chunk):
        c = min(chunk, b.n - t0)
        launch(t0, c, part)
        _reduce_chunk(red, part, b, t0, c, nrow, W, dk, dv, warp=wname is not None)


def _scratch_v2() -> int:
    """Version 2's default scratch: 4 GiB (a few query chunks at MLA's 128 heads), at most a
    quarter of the free device memory, at least version 1's."""
    free = cp.cuda.Device().mem_info[0]
    return max(SCRATCH_BYTES, min(SCRATCH_BYTES_V2, free // 4))


def _reduce_chunk(red, part, b, t0, c, nhb, W, dk, dv, warp=False):
    """Add the chunk's per-slot rows into dk/dv, per key row in entry order (a fixed order); nhb:
    part rows per (query, kv head, slot); warp: red is hytopk_attend_dkv_reduce_warp."""
    ids = b.idx[t0:t0 + c]                                             # [c, kk]
    # entry e = ((tl * Hkv + g) * nhb + hb) * kk + slot, as the kernel writes them
    e = cp.arange(c * b.Hkv * nhb * b.kk, dtype=cp.int64).reshape(c, b.Hkv, nhb, b.kk)
    key = cp.broadcast_to(ids[:, None, None, :].astype(cp.int64), e.shape)
    g = cp.broadcast_to(cp.arange(b.Hkv, dtype=cp.int64)[None, :, None, None], e.shape)
    valid = (key >= 0).ravel()
    E = np.int64(e.size)
    comp = ((key * b.Hkv + g).ravel() * E + e.ravel())[valid]           # (key row, entry): unique
    if comp.size == 0:
        return
    comp = cp.sort(comp)
    row = comp // E
    order = comp - row * E
    first = cp.ones(comp.size, cp.bool_)
    first[1:] = row[1:] != row[:-1]
    starts = cp.flatnonzero(first).astype(cp.int64)
    dst_row = row[starts]
    starts = cp.concatenate([starts, cp.asarray([comp.size], cp.int64)])
    nseg = int(dst_row.size)
    grid = (-(-nseg // 8), 1) if warp else (nseg, -(-W // THREADS))
    _launch(red, grid, (part, np.int32(W), np.int32(b.DQK), np.int32(b.DV), order, starts,
                        dst_row, np.int32(nseg), dk, dv if dv is not None else dk), 0)


@register("attend", "cupy.attend.one", gpu_only=True)
def attend_one(q, k, v, idx, scale=None):
    """One query per block, its heads as MMA rows (padded to 16/32/64), keys gathered per tile."""
    return attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")


@register("attend", "cupy.attend.pair", gpu_only=True)
def attend_pair(q, k, v, idx, scale=None):
    """Two adjacent queries per block over the union of their selections (each masks the other's keys)."""
    return attend_forward(q, k, v, idx, scale, qpt=2, out_dtype="float32")


@register("attend", "cupy.attend.one_acc2", gpu_only=True)
def attend_one_acc2(q, k, v, idx, scale=None):
    """`one` with two logit accumulators per n8 tile (half the dependent MMA chain)."""
    return attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32", acc=2)


@register("attend", "cupy.attend.pair_acc2", gpu_only=True)
def attend_pair_acc2(q, k, v, idx, scale=None):
    """`pair` with two logit accumulators per n8 tile (half the dependent MMA chain)."""
    return attend_forward(q, k, v, idx, scale, qpt=2, out_dtype="float32", acc=2)


@register("attend", "cupy.attend.pair_nk64", gpu_only=True)
def attend_pair_nk64(q, k, v, idx, scale=None):
    """`pair` with 64-key tiles where they fit (32 rows: 16 heads): half the tiles (barriers,
    softmax rescales) per key of the 32-key tiles."""
    return attend_forward(q, k, v, idx, scale, qpt=2, out_dtype="float32", wide=True)


@register("attend_backward", "cupy.attend_backward.deterministic", gpu_only=True)
def attend_backward_deterministic(dout, q, k, v, idx, scale=None):
    """Fixed-order dK/dV (per-slot scratch summed per key in entry order): bitwise reproducible."""
    out, lse = attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return attend_backward(dout, q, k, v, idx, out, lse, scale, deterministic=True, version=1)


@register("attend_backward", "cupy.attend_backward.deterministic_v2", gpu_only=True)
def attend_backward_deterministic_v2(dout, q, k, v, idx, scale=None):
    """Fixed order with head-block pairs sharing part rows (the second adds the first's value) and
    a warp-per-key reduction: bitwise reproducible, other bits than `deterministic`."""
    out, lse = attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return attend_backward(dout, q, k, v, idx, out, lse, scale, deterministic=True, version=2)


@register("attend_backward", "cupy.attend_backward.key_major", gpu_only=True)
def attend_backward_key_major(dout, q, k, v, idx, scale=None):
    """dQ query-major, dK/dV key-major (each key's entries in a fixed order): bitwise
    reproducible, no scratch; GQA / MHA with at most KEY_MAJOR_MAX_G query heads per kv head."""
    out, lse = attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return attend_backward(dout, q, k, v, idx, out, lse, scale, version=3)


@register("attend_backward", "cupy.attend_backward.atomic", gpu_only=True)
def attend_backward_atomic(dout, q, k, v, idx, scale=None):
    """dK/dV by float atomics: fastest, not bitwise reproducible."""
    out, lse = attend_forward(q, k, v, idx, scale, qpt=1, out_dtype="float32")
    return attend_backward(dout, q, k, v, idx, out, lse, scale, deterministic=False, version=1)
