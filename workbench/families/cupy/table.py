"""Selection over a given score table at memory speed (issue 21): kernels_cuda/table_topk.cu.

- ``cupy.filter.table_stream``: stage 5 on a table, a persistent streaming filter (16-byte
  loads, one atomic per warp per tile).
- ``cupy.recover.table_radix``: stage 7 on a table, the exact radix top-k of whole rows
  (11-bit MSB-first histograms with early exit, one collecting read, bitonic sort).
- ``cupy.filter.auto`` / ``cupy.recover.auto``: the family defaults; they pick the two above
  for table sources and the SIMT / materialising variants for indexer sources (a stage set
  holds one variant per stage, whatever the source).
- ``table_topk(scores, lo, hi, k)``: the exact top-k of every row, no host sync.
- ``fused_hytopk(scores, lo, hi, k)``: HyTopK fused into the same kernel (sampled threshold, one
  collecting read, exact select; under/overflowing rows fall back in the same block).
- ``TableHyTopK``: the table HyTopK pipeline planned once (host work, buffers) and launched
  with no host work: threshold -> streaming filter -> select -> check -> device-side
  recovery of the failed rows by the radix top-k.
- The second design (table_v2.py, kernels_cuda/table_v2.cu): ``method="fused_v2"`` /
  ``fused_hytopk(..., design="v2")`` and ``TableHyTopK(..., kernels="v2")``.

Tables are float32 or bf16 (torch.bfloat16 / uint16 bits, widened exactly to float32).
"""
from __future__ import annotations


import cupy as cp
import numpy as np

import reference as R
from reference import validate as V

from ...registry import register
from ._launch import (BLOCK, device_limits, as_device, bitonic_topk_smem_bytes, bind, check_k_fits, i32, kernel, launch,
                      launch_stream, next_pow2, table_array)
from . import filter as _filter
from . import recover as _recover
from . import table_v2 as _v2
from ._shared import block_threshold, candidate_buffers, check_capacity

TOPK_BLOCK = 512            # table_topk.cu TOPK_BLOCK
FILTER_U = 4                # table_topk.cu FILTER_U
FILTER_BLOCKS_PER_SM = 4    # its __launch_bounds__ minimum
TOPK_SMEM_TARGET = 110 * 1024   # two blocks per SM (the register bound) share the SM's 228 KiB (1 KiB reserved per block)
CAP_MAX = 16384
PER_VEC = {"hytopk::TableSource": 4, "hytopk::TableBf16Source": 8}




def topk_smem_words(k: int, cap: int) -> int:
    """table_topk.cu table_topk_smem_words."""
    return 2048 + 12 + 3 * next_pow2(k) + 2 * cap


def topk_cap(k: int, limit_bytes: int) -> int:
    """Entries of the k-th key's bin the radix top-k collects in shared memory: as many as keep
    two blocks per SM (fewer histogram reads), else whatever the opt-in limit leaves."""
    fixed = 2048 + 12 + 3 * next_pow2(k)
    cap = (TOPK_SMEM_TARGET // 4 - fixed) // 2 // 256 * 256
    if cap < 256:
        cap = (limit_bytes // 4 - fixed) // 2
    return min(CAP_MAX, cap)


def check_topk_k(k) -> tuple[int, int]:
    """(k, cap) for this device, or a ValueError naming 'k' when its sort buffers do not fit."""
    k = V.check_k(k)
    _, limit = device_limits()
    cap = topk_cap(k, limit)
    if cap < 1:
        raise ValueError(f"argument 'k' = {k}: the table top-k needs {4 * topk_smem_words(k, 1)} bytes of "
                         f"shared memory; this device has {limit} (k <= 16384 fits on an H200)")
    return k, cap


def _aligned(a) -> int:
    return int(a.data.ptr % 16 == 0)


def _per_vec(cxx: str) -> int:
    return PER_VEC[cxx]


# hytopk_table_topk mode bits (table_topk.cu)
TOPK_ROWS, TOPK_FAILED, TOPK_SAMPLED, TOPK_PLAIN_ATOMICS = 1, 2, 4, 8
MAX_SAMPLES = 8192
HIST_ATOMICS = ("match", "plain")
# plain shared atomics won on the H200 (results/h200-2026-11-30-s2/run3-table_topk.json: 2.0-3.0x torch.topk
# against 1.5-2.0x with __match_any_sync); the fused method won at every size (2.6x / 5.4x at k = 2048)
DEFAULT_HIST_ATOMICS = "plain"


def launch_ranges_ok(lo, hi, L, ok):
    """ok[0] (a device byte) = 1 when 0 <= lo[t] <= hi[t] <= L for every row, else 0, on the current
    stream with no host work (table_topk.cu hytopk_table_ranges_ok; lo / hi: int32 device arrays of n
    rows, ok: a device pointer as an int or an array of >= 1 byte); the torch op's device-side check."""
    lo, hi = cp.asarray(lo), cp.asarray(hi)
    for name, x in (("lo", lo), ("hi", hi)):
        if x.dtype != cp.int32 or x.ndim != 1 or x.shape != lo.shape or not x.flags.c_contiguous:
            raise ValueError(f"argument '{name}' must be a contiguous int32 [n] device array like lo, got "
                             f"{x.dtype} {x.shape}")
    ptr = np.uint64(ok if isinstance(ok, (int, np.integer)) else ok.data.ptr)
    launch(kernel("table_topk.cu", "hytopk_table_ranges_ok"), (1,), (lo, hi, np.int32(lo.shape[0]), np.int64(L), ptr),
           threads=1024)


def launch_topk(s, cxx, lo, hi, k, cap, idx, val, *, rows=None, failed=None, count=None, oversample=3.0,
                hist_atomics=DEFAULT_HIST_ATOMICS):
    """The radix top-k kernel: rows listed (rows) or all (output row t = table row t); failed:
    only rows with failed[t] != 0 are written; count (int32 [n]): the fused HyTopK (sampled
    threshold, one collecting read) writing each row's candidate count there."""
    if hist_atomics not in HIST_ATOMICS:
        raise ValueError(f"argument 'hist_atomics' must be one of {HIST_ATOMICS}, got {hist_atomics!r}")
    n, L = s.shape
    nrows = rows.shape[0] if rows is not None else n
    mode = ((TOPK_ROWS if rows is not None else 0) | (TOPK_FAILED if failed is not None else 0)
            | (TOPK_SAMPLED if count is not None else 0) | (TOPK_PLAIN_ATOMICS if hist_atomics == "plain" else 0))
    if count is not None and 2 * cap < MAX_SAMPLES:
        raise ValueError(f"argument 'k' = {k}: too large for the fused HyTopK (its samples need "
                         f"{MAX_SAMPLES} words of shared memory); use table_topk")
    dummy = lo
    launch(kernel("table_topk.cu", f"hytopk_table_topk<{cxx}>"), (nrows,),
           (s, np.int64(L), np.int32(n), rows if rows is not None else dummy, np.int32(nrows),
            failed if failed is not None else dummy, np.int32(mode), lo, hi, np.int32(k), np.int32(cap),
            np.int32(_aligned(s)), np.float64(oversample), count if count is not None else dummy, idx, val),
           4 * topk_smem_words(k, cap), threads=TOPK_BLOCK)


def launch_filter(s, cxx, lo, hi, T, capacity, cand_idx, cand_val, count):
    """The streaming filter kernel (count must be zeroed)."""
    n, L = s.shape
    P = _per_vec(cxx)
    tile = BLOCK * FILTER_U
    tiles_per_row = -(-(L // P + 2) // tile)
    sms, _ = device_limits()
    grid = min(n * tiles_per_row, sms * FILTER_BLOCKS_PER_SM)
    launch(kernel("table_topk.cu", f"hytopk_table_filter<{cxx}>"), (grid,),
           (s, np.int64(L), np.int32(n), lo, hi, T, np.int32(capacity), np.int64(tiles_per_row),
            np.int32(_aligned(s)), cand_idx, cand_val, count))


@register("filter", "cupy.filter.table_stream", sources=("table",), gpu_only=True,
          notes="persistent streaming filter: 16-byte loads, one atomic per warp per tile")
def filter_table_stream(source, lo, hi, T, capacity):
    capacity = check_capacity(capacity)
    with launch_stream():
        src = bind(source)
        if src.kind != "table":
            raise TypeError("argument 'source': cupy.filter.table_stream takes a table source")
        s = src.args[0]
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(src.n, capacity)
        launch_filter(s, src.cxx, lo, hi, T, capacity, cand_idx, cand_val, count)
        return cand_idx, cand_val, count


@register("recover", "cupy.recover.table_radix", sources=("table",), gpu_only=True,
          notes="exact radix top-k of whole table rows: 11-bit histograms with early exit, bitonic sort")
def recover_table_radix(source, lo, hi, rows, k):
    k, cap = check_topk_k(k)
    with launch_stream():
        src = bind(source)
        if src.kind != "table":
            raise TypeError("argument 'source': cupy.recover.table_radix takes a table source")
        lo, hi, rows = i32(lo, "lo"), i32(hi, "hi"), i32(rows, "rows")
        nr = rows.shape[0]
        idx = cp.empty((nr, k), cp.int32)
        val = cp.empty((nr, k), cp.float32)
        if nr:
            launch_topk(src.args[0], src.cxx, lo, hi, k, cap, idx, val, rows=rows)
        return idx, val


def _is_table(source) -> bool:
    return isinstance(source, R.TableSource)


@register("filter", "cupy.filter.auto", gpu_only=True,
          notes="table sources: cupy.filter.table_v2; indexer sources: cupy.filter.simt")
def filter_auto(source, lo, hi, T, capacity):
    if _is_table(source):                   # run 3: 3.1-4.1 TB/s against 0.9-1.2 for table_stream
        from .table_v2 import filter_table_v2
        return filter_table_v2(source, lo, hi, T, capacity)
    return _filter.filter_simt(source, lo, hi, T, capacity)


@register("recover", "cupy.recover.auto", gpu_only=True,
          notes="table sources: cupy.recover.table_radix; indexer sources: cupy.recover.materialise")
def recover_auto(source, lo, hi, rows, k):
    return (recover_table_radix if _is_table(source) else _recover.recover)(source, lo, hi, rows, k)


def _check_lo_hi(lo, hi, n, L, host_check):
    if host_check:
        V.check_ranges(lo, hi, n, L)
    else:                      # shapes and dtypes only: the kernels clamp lo/hi into [0, L]
        V.check_array("lo", lo, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))
        V.check_array("hi", hi, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))


METHODS = ("radix", "fused", "fused_v2")
DESIGNS = ("v1", "v2")
DEFAULT_METHOD = "fused_v2"  # table_topk's default (what torch.ops.hytopk.topk runs): fastest on every
#                              row of the H200 bench (results/h200-2026-11-30-s3/run3-table_topk.json)
# table_topk's fused_v2 samples (table_v2.SAMPLINGS; the answer is the same): runs, 1.053 / 9.235 ms against
# 1.327 / 10.40 with the contract's (4096 x 131072 / 8192 x 1048576 float32, k 2048, results/h200-2026-12-01-s4 run 1)
DEFAULT_SAMPLING = "runs"
# table_topk's threshold plan with runs (it returns only the top-k, so the plan is free): oversample
# 1.5 (~3k candidates at k = 2048: half the select and appends of 3.0), the rank at least 48 samples
# where samples are sparse (1M keys: 16 expected above the k-th, so 3.0 again; at 1.5 ~4% of
# rows fell below k there, H200 2026-12-01 s5 run 1)
TOPK_OVERSAMPLE = 1.5
TOPK_MIN_RANK = 48
# and its threshold only as fine as it needs to be (reference.coarse_key): two radix levels of the
# samples instead of four on a randn row, at most r / 8 more samples above it
TOPK_COARSE = 8


def table_topk(scores, lo, hi, k, *, out=None, host_check=True, hist_atomics=DEFAULT_HIST_ATOMICS, method=None,
               sampling=None):
    """Exact top-k (CONTRACT.md §2: rank order, -1 / -inf padding) of every row's context
    [lo, hi) of a float32 or bf16 table, on the current stream (PyTorch's when torch is in
    use), zero-copy for device inputs. Returns CuPy (idx int32 [n, k], val float32 [n, k]);
    ``out``: preallocated (idx, val) to write into. ``host_check=False`` skips the one host
    read (the value check of lo/hi: the kernel then clamps them into [0, L]), so the call
    can be captured in a CUDA graph. ``hist_atomics``: "match" (one shared atomic per distinct
    digit per warp) or "plain" (one per entry); ``method``: "radix" (histograms of the whole
    row), "fused" (fused_hytopk: a sampled threshold first) or "fused_v2" (its second design,
    table_v2.py); ``sampling`` (fused_v2): where its threshold's samples sit, "contract" or "runs"
    (table_v2.py; None: DEFAULT_SAMPLING); same answer, different speed."""
    method = DEFAULT_METHOD if method is None else method
    sampling = DEFAULT_SAMPLING if sampling is None else sampling
    _v2.check_sampling(sampling)
    if method not in METHODS:
        raise ValueError(f"argument 'method' must be one of {METHODS}, got {method!r}")
    if hist_atomics not in HIST_ATOMICS:            # checked whatever the method (fused_v2 does not use it)
        raise ValueError(f"argument 'hist_atomics' must be one of {HIST_ATOMICS}, got {hist_atomics!r}")
    if method in ("fused", "fused_v2"):
        runs = method == "fused_v2" and sampling == "runs"
        return fused_hytopk(scores, lo, hi, k, out=out, host_check=host_check, hist_atomics=hist_atomics,
                            design="v2" if method == "fused_v2" else "v1",
                            sampling=sampling if method == "fused_v2" else "contract",
                            oversample=TOPK_OVERSAMPLE if runs else 3.0, min_rank=TOPK_MIN_RANK if runs else 0,
                            coarse=TOPK_COARSE if runs else 0)
    return _table_select(scores, lo, hi, k, out, host_check, dict(hist_atomics=hist_atomics))


def fused_hytopk(scores, lo, hi, k, *, oversample=3.0, out=None, count=None, host_check=True,
                 hist_atomics=DEFAULT_HIST_ATOMICS, design="v1", sampling="contract", min_rank=0, coarse=0):
    """HyTopK over a table in one kernel and about one read per row: each row's threshold from
    its own samples (CONTRACT.md §3.1-3.4, oversample as there), one read collecting the keys
    at or above it into shared memory, the exact select among them; a row whose candidates
    under- or overflow (§3.6) falls back to the radix top-k in the same block. Same answer as
    table_topk, bit for bit; no host work, no host sync with ``host_check=False``.
    ``count``: an int32 [n] device array that receives each row's candidate count (§3.5).
    ``design``: "v1" (hytopk_table_topk's sampled mode, the fallback inside the block) or "v2"
    (table_v2.py: the streaming kernel, the rows it lists through a second launch; its fallback
    always uses plain atomics, ``hist_atomics`` is v1's). ``sampling`` (v2 only): "contract" or "runs"
    (the same M samples in 64-byte runs, table_v2.py; ``count`` is then the count above that
    threshold). ``min_rank`` (v2 only; 0: the contract's rank): each row's rank r at least
    min(M, min_rank) (reference.sample_plan's min_rank), so a small ``oversample`` keeps enough
    samples above the threshold where they are sparse; ``count`` is then the count above that
    threshold. ``coarse`` (v2 only; 0: the r-th best sample's key exactly): the threshold rounded down
    at the first 8-bit radix level whose digit holds at most max(1, r // coarse) samples
    (reference.coarse_key; fewer select passes, a few more candidates)."""
    V.check_oversample(oversample)
    if design not in DESIGNS:
        raise ValueError(f"argument 'design' must be one of {DESIGNS}, got {design!r}")
    runs = _v2.check_sampling(sampling)
    if runs and design != "v2":
        raise ValueError("argument 'sampling' = 'runs' needs design='v2'")
    for name, v in (("min_rank", min_rank), ("coarse", coarse)):        # the v2 kernel's int32 arguments
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v <= 2**31 - 1:
            raise ValueError(f"argument '{name}' must be an int in [0, 2**31 - 1], got {v!r}")
        if v and design != "v2":
            raise ValueError(f"argument '{name}' needs design='v2'")
    return _table_select(scores, lo, hi, k, out, host_check,
                         dict(count=count, oversample=oversample, hist_atomics=hist_atomics, runs=runs,
                              min_rank=int(min_rank), coarse=int(coarse)), fused=design)


def _table_select(scores, lo, hi, k, out, host_check, kw, fused=None):
    k, cap = check_topk_k(k)
    with launch_stream():
        s, cxx = table_array(scores)
        n, L = s.shape
        V._check_L("scores", L, "columns")
        _check_lo_hi(lo, hi, n, L, host_check)
        lo_d, hi_d = i32(lo, "lo"), i32(hi, "hi")
        if out is None:
            idx, val = cp.empty((n, k), cp.int32), cp.empty((n, k), cp.float32)
        else:
            idx, val = (as_device(x) for x in out)
            if idx.shape != (n, k) or val.shape != (n, k) or idx.dtype != cp.int32 or val.dtype != cp.float32 \
                    or not (idx.flags.c_contiguous and val.flags.c_contiguous):
                raise ValueError(f"argument 'out': expected contiguous int32 and float32 arrays of shape {(n, k)}")
        if fused:
            if kw["count"] is None:
                kw["count"] = cp.empty(n, cp.int32)
            else:
                kw["count"] = as_device(kw["count"])        # CuPy or torch CUDA int32: written in place
            if kw["count"].shape != (n,) or kw["count"].dtype != cp.int32 or not kw["count"].flags.c_contiguous:
                raise ValueError(f"argument 'count': expected an int32 array of shape {(n,)}")
        if fused == "v2":
            _v2.fused_v2(s, cxx, lo_d, hi_d, k, cap, kw["oversample"], kw["count"], idx, val, kw["runs"],
                         kw["min_rank"], kw["coarse"])
        else:
            for key in ("runs", "min_rank", "coarse"):
                kw.pop(key, None)
            launch_topk(s, cxx, lo_d, hi_d, k, cap, idx, val, **kw)
        return idx, val


class TableHyTopK:
    """HyTopK over a score table, planned once and launched with no host work.

    ``plan = TableHyTopK(n, L, lo, hi, k)`` does the host work (sample plan, capacity) and
    allocates every buffer; ``plan(scores)`` launches threshold -> streaming filter ->
    select -> check -> radix recovery of the rows that failed the check (device-side: the
    recovery kernel skips the rows that passed), and returns (idx, val) CuPy arrays that the
    next call overwrites. The result is the exact top-k, bit for bit (CONTRACT.md §3);
    ``plan.stats()`` gives threshold, count and failed (a host copy). ``kernels``: "v1"
    (block threshold, table_topk.cu's filter, select_bitonic) or "v2" (table_v2.py's threshold,
    filter and shared-memory select); check and recovery are the same. ``sampling`` (v2 only):
    "contract" (the statistics are the reference's) or "runs" (the same M samples in 64-byte runs:
    table_v2.py; threshold and count are then reference.stage_threshold(..., run)'s)."""

    def __init__(self, n, L, lo, hi, k, *, capacity=None, oversample=3.0, kernels="v2", sampling="contract"):
        if kernels not in DESIGNS:
            raise ValueError(f"argument 'kernels' must be one of {DESIGNS}, got {kernels!r}")
        self.runs = _v2.check_sampling(sampling)
        if self.runs and kernels != "v2":
            raise ValueError("argument 'sampling' = 'runs' needs kernels='v2'")
        self.kernels = kernels
        lo_h, hi_h = V.check_ranges(lo, hi, n, L)
        self.k, self.cap = check_topk_k(k)
        self.n, self.L = int(n), int(L)
        self.capacity = R.resolve_capacity(capacity, self.k, lo_h, hi_h, oversample)
        M, r = R.sample_plan(lo_h, hi_h, self.k, oversample)
        check_k_fits(self.k, bitonic_topk_smem_bytes)
        if kernels == "v2":
            check_k_fits(self.k, lambda kk: _v2.select_smem_bytes(kk, _v2.select_cap(self.capacity)))
        with launch_stream():
            self.lo, self.hi = cp.asarray(lo_h.astype(np.int32)), cp.asarray(hi_h.astype(np.int32))
            self.M, self.r = cp.asarray(M), cp.asarray(r)
            self.cand_idx = cp.empty((n, self.capacity), cp.int32)
            self.cand_val = cp.empty((n, self.capacity), cp.float32)
            self.count = cp.zeros(n, cp.int32)
            self.failed = cp.zeros(n, cp.uint8)
            self.rows = cp.empty(max(1, n), cp.int32)
            self.nfailed = cp.zeros(1, cp.int32)
            self.idx = cp.empty((n, self.k), cp.int32)
            self.val = cp.empty((n, self.k), cp.float32)
            self.T = cp.full(n, np.nan, cp.float32) if kernels == "v2" else None

    def __call__(self, scores):
        with launch_stream():
            s, cxx = table_array(scores)
            if s.shape != (self.n, self.L):
                raise ValueError(f"argument 'scores': planned for shape {(self.n, self.L)}, got {s.shape}")
            if self.kernels == "v2":
                _v2.staged_v2(s, cxx, self)
            else:
                self.nfailed.fill(0)
                self.T = block_threshold(R.TableSource(s), self.lo, self.hi, self.M, self.r)
                self.count.fill(0)
                launch_filter(s, cxx, self.lo, self.hi, self.T, self.capacity, self.cand_idx, self.cand_val,
                              self.count)
                self.select_only()
            launch(kernel("check.cu", "hytopk_check"), (min(-(-self.n // BLOCK), 1024),),
                   (np.int32(self.n), self.count, self.lo, self.hi, np.int32(self.k), np.int32(self.capacity),
                    self.failed, self.rows, self.nfailed))
            if self.kernels == "v2":        # the failed rows from check's device-side list
                _v2.launch_listed_topk(s, cxx, self.lo, self.hi, self.k, self.cap, self.rows, self.nfailed,
                                       self.idx, self.val)
            else:
                launch_topk(s, cxx, self.lo, self.hi, self.k, self.cap, self.idx, self.val, failed=self.failed)
            return self.idx, self.val

    def filter_only(self, scores):
        """The streaming filter alone on the last threshold (for timing)."""
        with launch_stream():
            s, cxx = table_array(scores)
            self.count.fill(0)
            (_v2.launch_filter if self.kernels == "v2" else launch_filter)(
                s, cxx, self.lo, self.hi, self.T, self.capacity, self.cand_idx, self.cand_val, self.count)
            return self.count

    def threshold_only(self, scores):
        """The threshold stage alone (for timing): v1 block_threshold, v2 table_v2's."""
        with launch_stream():
            s, cxx = table_array(scores)
            if self.kernels == "v2":
                _v2.launch_threshold(s, cxx, self.lo, self.hi, self.M, self.r, self.T, runs=self.runs)
            else:
                self.T = block_threshold(R.TableSource(s), self.lo, self.hi, self.M, self.r)
            return self.T

    def select_only(self):
        """The select stage alone on the last filter's candidates (for timing)."""
        with launch_stream():
            if self.kernels == "v2":
                _v2.launch_select(self.cand_idx, self.cand_val, self.count, self.k, self.idx, self.val)
            else:
                launch(kernel("select.cu", "hytopk_select_bitonic"), (self.n,),
                       (np.int32(self.n), self.cand_idx, self.cand_val, self.count, np.int32(self.capacity),
                        np.int32(self.k), self.idx, self.val), bitonic_topk_smem_bytes(self.k))
            return self.idx, self.val

    def stats(self) -> dict:
        return {"threshold": cp.asnumpy(self.T), "count": cp.asnumpy(self.count),
                "failed": cp.asnumpy(self.failed).astype(bool), "capacity": self.capacity}


def table_hytopk(scores, lo, hi, k, *, capacity=None, oversample=3.0, kernels="v2", sampling="contract"):
    """One-shot TableHyTopK: plan (host lo/hi) and run. Returns CuPy (idx, val)."""
    s, _ = table_array(scores)
    plan = TableHyTopK(s.shape[0], s.shape[1], lo, hi, k, capacity=capacity, oversample=oversample,
                       kernels=kernels, sampling=sampling)
    return plan(s)
