"""``torch.ops.hytopk.topk(scores, lo, hi, k) -> (idx, val)``: the exact top-k of a score table.

The contract's top-k (CONTRACT.md §2: order keys, ties -> lower position, NaN lowest,
-0 == +0, -1 / -inf padding) of each row's context [lo, hi) of a float32 or bfloat16 table
(bf16 widened exactly to float32), idx int32 [n, k] and val float32 [n, k] in rank order.

CPU: the NumPy reference. CUDA: workbench.families.cupy.table.table_topk (its default: the fused
HyTopK kernel of table_v2.cu, samples in runs, the radix top-k of table_topk.cu for the rows it
lists) zero-copy on PyTorch's current stream, writing into tensors allocated by PyTorch; no host
sync: the values of lo/hi are checked by a device-side assert (torch._assert_async, as the replay
op checks idx; a host check would copy them and wait for the GPU on every call), and the kernels
clamp them into [0, L] whatever they hold. The op can be captured in a CUDA graph after one warm-up
call (the first call compiles the kernel). Without CuPy, or
with HYTOPK_TORCH_BACKEND=torch, a pure-torch path computes the same answer (a sort key
per entry, then torch.topk over it).
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

import reference as R
from reference import validate as V

from .ops import CALLS

TABLE_DTYPES = (torch.float32, torch.bfloat16)
# The CuPy path's range check (hytopk_table_ranges_ok, then torch._assert_async) on a side stream forked
# from the caller's and joined back before the op returns, beside the top-k kernels instead of before
# them: it only feeds the assert (the kernels clamp lo / hi whatever they hold). False: on the caller's
# stream, first. scripts/probe_fused_phases.py times the op both ways.
RANGE_CHECK_BESIDE = True
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(dev: int) -> torch.cuda.Stream:
    """One side stream per device for the range check (made once: a stream per call costs more than the check)."""
    st = _SIDE_STREAMS.get(dev)
    if st is None:
        st = _SIDE_STREAMS[dev] = torch.cuda.Stream(device=dev)
    return st


def _check(scores, lo, hi, k, *, host, ranges=True):
    """Shape/dtype/device checks always; the values of lo/hi on the host unless ``host`` is False
    (then device-side asserts, unless ``ranges`` is False: the caller checks them itself)."""
    if not isinstance(scores, Tensor) or scores.dim() != 2 or scores.dtype not in TABLE_DTYPES:
        raise TypeError(f"argument 'scores' must be a 2-D float32 or bfloat16 tensor, got "
                        f"{getattr(scores, 'dtype', type(scores).__name__)} {tuple(getattr(scores, 'shape', ()))}")
    V.check_same_device(scores=scores, lo=lo, hi=hi)
    n, L = scores.shape
    V._check_L("scores", L, "columns")
    k = V.check_k(k)
    if host:
        V.check_ranges(lo, hi, n, L)
    else:
        V.check_array("lo", lo, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))
        V.check_array("hi", hi, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))
        if ranges:
            torch._assert_async(((lo >= 0) & (lo <= hi) & (hi <= L)).all(), RANGES_MSG)
    return n, L, k


RANGES_MSG = "arguments 'lo'/'hi': need 0 <= lo <= hi <= L"


@torch.library.custom_op("hytopk::topk", mutates_args=(), device_types="cpu")
def topk_op(scores: Tensor, lo: Tensor, hi: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k of each row's context of a float32 / bfloat16 score table (CONTRACT.md §2)."""
    CALLS["topk"] += 1
    _check(scores, lo, hi, k, host=True)
    s = scores.detach().contiguous().float().numpy()
    idx, val = R.topk(s, lo.numpy(), hi.numpy(), k)
    return torch.from_numpy(idx), torch.from_numpy(val)


@functools.lru_cache(maxsize=1)
def _cupy_table():
    """workbench.families.cupy.table, or None where CuPy cannot run."""
    if os.environ.get("HYTOPK_TORCH_BACKEND", "").strip().lower() in ("torch", "numba"):
        return None
    try:
        from workbench.families.cupy import table
        from workbench.families.cupy._launch import gpu_status
        return table if gpu_status()[0] else None
    except Exception:
        return None


@topk_op.register_kernel("cuda")
def _topk_cuda(scores, lo, hi, k):
    CALLS["topk"] += 1
    mod = _cupy_table()
    # int32 contexts on the CuPy path: one kernel checks them (hytopk_table_ranges_ok, then the assert),
    # not seven small torch launches (~10 us of a 0.65 ms call at 4096 x 131072); others before the cast
    own_check = mod is not None and lo.dtype == torch.int32 and hi.dtype == torch.int32
    n, L, k = _check(scores, lo, hi, k, host=False, ranges=not own_check)
    s = scores.detach().contiguous()
    lo32, hi32 = lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous()
    if mod is None:
        return exact_topk_torch(s, lo32, hi32, k)
    idx = torch.empty((n, k), dtype=torch.int32, device=s.device)
    val = torch.empty((n, k), dtype=torch.float32, device=s.device)
    if n == 0:
        return idx, val
    import cupy
    from workbench.families import get_family
    dev = s.device.index if s.device.index is not None else torch.cuda.current_device()
    fam = get_family("cupy")
    with torch.cuda.device(s.device):
        cur = torch.cuda.current_stream(s.device)
        side = _side_stream(dev) if own_check and RANGE_CHECK_BESIDE else None
        if own_check:
            ok = torch.empty((), dtype=torch.bool, device=s.device)
            check = cur if side is None else side
            if side is not None:
                side.wait_stream(cur)               # lo / hi are ready; joined back below (graph capture: fork / join)
            with torch.cuda.stream(check), fam.stream_scope(check.cuda_stream, dev):
                mod.launch_ranges_ok(cupy.from_dlpack(lo32), cupy.from_dlpack(hi32), L, ok.data_ptr())
                torch._assert_async(ok, RANGES_MSG)
        # PyTorch's stream, and scratch from torch's allocator (a CUDA-graph capture's private pool)
        with fam.stream_scope(cur.cuda_stream, dev):
            mod.table_topk(s, lo32, hi32, k, out=(cupy.from_dlpack(idx), cupy.from_dlpack(val)), host_check=False)
        if side is not None:
            cur.wait_stream(side)                   # ok, lo and hi are the caller's stream's again after this
    return idx, val


@topk_op.register_fake
def _topk_fake(scores, lo, hi, k):
    V.check_same_device(scores=scores, lo=lo, hi=hi)
    torch._check(scores.dim() == 2, lambda: "argument 'scores' must be 2-D")
    torch._check(scores.dtype in TABLE_DTYPES, lambda: f"argument 'scores' must be float32 or bfloat16, got {scores.dtype}")
    if isinstance(k, int):
        V.check_k(k)
    n = scores.shape[0]
    return scores.new_empty((n, k), dtype=torch.int32), scores.new_empty((n, k), dtype=torch.float32)


def order_keys_torch(s: Tensor) -> Tensor:
    """CONTRACT.md §2's order key of float32 (or bf16, widened) scores, as int64 in [0, 2**32)."""
    b = s.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(b >= 0x80000000, 0xFFFFFFFF - b, b + 0x80000000)
    key = torch.where(b == 0x80000000, torch.full_like(key, 0x80000000), key)     # -0.0 -> +0.0
    return torch.where(torch.isnan(s.float()), torch.zeros_like(key), key)


def exact_topk_torch(scores: Tensor, lo: Tensor, hi: Tensor, k: int, chunk: int = 256):
    """The same answer in plain torch: sort word (key << 31) | (2**31 - 1 - position) per entry of
    the context (distinct, so torch.topk's order is rank order), -1 outside; chunks of rows."""
    n, L = scores.shape
    idx = torch.full((n, k), -1, dtype=torch.int32, device=scores.device)
    val = torch.full((n, k), float("-inf"), dtype=torch.float32, device=scores.device)
    kk = min(k, L)
    if kk == 0:
        return idx, val
    pos = torch.arange(L, device=scores.device, dtype=torch.int64)
    for a in range(0, n, chunk):
        blk = scores[a:a + chunk]
        inside = (pos >= lo[a:a + chunk, None].long()) & (pos < hi[a:a + chunk, None].long())
        word = torch.where(inside, (order_keys_torch(blk) << 31) | ((1 << 31) - 1 - pos), torch.full_like(pos, -1))
        top, at = torch.topk(word, kk, dim=1, sorted=True)
        ok = top >= 0
        idx[a:a + chunk, :kk] = torch.where(ok, at, torch.full_like(at, -1)).to(torch.int32)
        val[a:a + chunk, :kk] = torch.where(ok, blk.float().gather(1, at), torch.full_like(top, float("-inf"),
                                                                                         dtype=torch.float32))
    return idx, val


def topk(scores, lo, hi, k):
    """``torch.ops.hytopk.topk``."""
    return torch.ops.hytopk.topk(scores, lo, hi, k)
