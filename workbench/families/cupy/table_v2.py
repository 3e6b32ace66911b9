"""The second design of the table path (issue 21): kernels_cuda/table_v2.cu, beside table.py's.

- ``cupy.threshold.table_v2``: stages 1-4 on a table, every sample load of a thread in flight.
- ``cupy.filter.table_v2``: stage 5 on a table, one block per (row, piece of PIECE_ELEMS
  elements): a two-compare range test on the raw bits, unchecked steps inside the context,
  shared-memory appends, one global atomic per block.
- ``cupy.select.smem``: stage 8 with each row's candidates read once into shared memory.
- ``fused_hytopk_v2(scores, lo, hi, k)``: one kernel per row (samples, threshold, one streaming
  read into shared memory, exact select); rows whose count under- or overflows are flagged and
  the radix top-k of table.py takes them in a second launch on the device (no host sync).
  FUSED_CLUSTER = 1: rows that fit the shared memory of a thread-block cluster go through
  hytopk_table_cluster instead (each row read from global memory once).
- ``launch_staged_v2``: the threshold -> filter -> select chain of TableHyTopK(kernels="v2").
Every result is the exact top-k, bit for bit (CONTRACT.md §3).

Sampling: "contract" takes the samples at CONTRACT.md §3.2's positions (the statistics then equal
the reference's); "runs" takes the same M samples as runs of 64 bytes (reference
``run_sample_positions``; threshold and counts are then that reference's, the top-k the same).
At 128K float32 keys the contract's samples touch every 64-byte burst of the row (half a table read
of DRAM traffic); runs touch 1/32 of them.
"""
from __future__ import annotations

import functools

import cupy as cp
import numpy as np

import reference as R

from ...instantiations import CLUSTER_CONFIGS, FUSED1_CONFIGS, FUSED_CONFIGS
from ...registry import register
from ._launch import (MAX_SAMPLES, bind, smem_optin, bitonic_topk_smem_bytes, check_k_fits, i32, kernel, launch,
                      launch_stream, next_pow2)
from ._shared import check_candidates, candidate_buffers, check_capacity

STREAM_BLOCK = 256          # table_v2.cu STREAM_BLOCK
SAMPLE_BLOCK = 512          # table_v2.cu SAMPLE_BLOCK (threshold, fused, select_smem)
PER_VEC = {"hytopk::TableSource": 4, "hytopk::TableBf16Source": 8}
STREAM_U = {"hytopk::TableSource": 4, "hytopk::TableBf16Source": 3}   # table_v2.cu StreamU: vectors per thread per step
PIECE_STEPS = 8             # steps per block: a piece is 256 x 16 x 8 = 32768 float32 / 256 x 24 x 8 bf16 elements
STAGE_MAX = 4096            # shared-memory stage of the filter (32 KiB; six blocks per SM still fit)
FUSED_SMEM_TARGET = 110 * 1024   # two 512-thread blocks per SM (the register bound) share its 228 KiB
# The fused kernel's launch configuration (the bench's --fused-sweep overrides these):
# threads per block and blocks per SM ((512, 2): hytopk_table_fused; others from
# instantiations.FUSED_CONFIGS: hytopk_table_fused_cfg), the shared-memory candidate cap (0: as many
# as FUSED_MIN_BLOCKS blocks per SM leave), and FUSED_AHEAD below.
# FUSED_THREADS = FUSED_MIN_BLOCKS = 0: FUSED_LAUNCH's choice for the sampling. With the contract's
# samples (1024, 1) measured fastest at 4096 x 131072 and 8192 x 1048576 float32, k = 2048 (run 3 of
# results/h200-2026-12-01: 1.33 / 9.84 ms against 1.40 / 10.67 ms for (512, 2), same indices); with the
# samples in runs (512, 2): 1.053 / 9.235 ms against 1.227 / 9.174 for (1024, 1) (run 1 of
# results/h200-2026-12-01-s4: a cheap sample phase, so two blocks per SM overlap one's select with the
# other's read)
FUSED_THREADS = 0
FUSED_MIN_BLOCKS = 0
FUSED_LAUNCH = {0: (1024, 1), 1: (512, 2)}     # runs flag -> (threads, blocks per SM)
# With the samples in runs, rows whose counts fit its cap: FUSED_SHORT, (512, 3): three 512-thread
# blocks an SM within 42 registers (4 vectors a thread a step, table_v2.cu FusedStream), cap 6144. A row
# spends ~20 of its ~37 us on the threshold and the select (no DRAM read: the phase trace of
# scripts/probe_fused_phases.py), so the DRAM rate follows the rows streaming at once: ~212 of 396 blocks
# against ~121 of 264 at (512, 2); the fused kernel 0.615 against 0.631 ms, the op 0.622 against 0.634
# at 4096 x 131072 float32, k = 2048 (results/h200-2026-12-02 run 2). Fit: the cap holds the expected
# count of a full row of L keys, L r / M rounded down by coarse (x 9/8), plus FUSED_SHORT_SIGMAS of its
# spread (~1/sqrt(r) of it): 128K-key rows at k = 2048, not 256K or 1M (those stay on (512, 2)).
# float32 tables only (FUSED_SHORT_SOURCES): the bf16 build spills at 42 registers, not measured.
FUSED_SHORT = (512, 3)
FUSED_SHORT_SOURCES = ("hytopk::TableSource",)
FUSED_SHORT_SIGMAS = 6.0
FUSED_CAP = 0
# 1: the v2 selects (select_smem, the fused kernel's select) rank the kept without a sort
# (hytopk_select_fast.cuh block_select_fast); 0: key select + register bitonic sort (as before)
SELECT_FAST = 1
SELECT_CAP_MAX = 8192       # candidates select_smem holds in shared memory
# L2 prefetch distance of the streaming reads, in block steps (0: none; the bench times both):
# the filter's registers already hold 96 KB per SM, the fused kernel's 64 KB per block (float32:
# 8 vectors a thread; one step ahead: 0.664 ms at 4096 x 131072, two 0.668, none 0.732; H200
# 2026-12-01 s6 run 3)
FILTER_AHEAD = 1
FUSED_AHEAD = 1
# 1: the fused kernel reads each row once where it can (hytopk_table_fused1: a provisional threshold
# T0 from 1024 of the contract's samples, one stream collecting key >= T0, the contract's K* from the
# collected samples; a row whose T0 fails is read again with K*): same outputs, counts and flagged
# rows. Instantiated at FUSED1_CONFIGS ((1024, 1)). 0 until measured on the H200.
FUSED_ONE_READ = 0
# the one-read plan's margin in standard deviations of T0's fraction (table_v2.cu table_fused1_body):
# rows whose plan has less read twice from the start (4096 x 131072, k = 2048: 4.5; 1M keys: 1.5)
FUSED_ONE_READ_Z = 3.0
# 1: rows that fit the shared memory of a cluster go through hytopk_table_cluster (each row read once:
# every block of a cluster of CLUSTER_SIZE[dtype] bulk-copies its slice into shared memory, the next
# row's copy in flight; samples, threshold, filter and select from shared memory): same outputs and
# counts as the fused kernel (its own cap). Longer rows keep the fused kernel. 0 until measured.
FUSED_CLUSTER = 0
CLUSTER_SIZE = {"hytopk::TableSource": 8, "hytopk::TableBf16Source": 4}   # blocks per cluster (instantiations.CLUSTER_CONFIGS)
CLUSTER_THREADS = 512       # threads per block (~100-115 registers; 1024 spill at 64: instantiations.CLUSTER_CONFIGS)
# 1: each row's select is shared: its leader stages the candidates (the fast select's histogram and bins)
# while the others select the next row's threshold, then every block of the cluster ranks 1/C of them;
# 0: the leader selects the whole row
CLUSTER_SHARE = 1
CLUSTER_GRID = 0            # clusters in the persistent grid (0: SMs // CLUSTER_SIZE, one block per SM)
CLUSTER_HEADER_WORDS = 16   # table_v2.cu CLUSTER_HEADER_WORDS: mbarriers and slots between the slice buffers and the rest
CLUSTER_SKIP_SELECT = 0     # 1: the bench's diagnostic (rows left unwritten: never exact): the cluster kernel without its selects
SAMPLINGS = ("contract", "runs")
RUN_ELEMS = {"hytopk::TableSource": 16, "hytopk::TableBf16Source": 32}   # hytopk_table.cuh SampleRun: 64 bytes


def check_sampling(sampling) -> int:
    """The kernels' runs flag of a sampling name (argument 'sampling')."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"argument 'sampling' must be one of {SAMPLINGS}, got {sampling!r}")
    return int(sampling == "runs")


def _file():
    return "table_v2.cu"


def sort_slots(k: int, threads: int = SAMPLE_BLOCK) -> int:
    """table_v2.cu sort_slots_v2: the register sort pads to at least one word per thread."""
    return max(next_pow2(k), threads)


def fused_smem_words(k: int, cap: int, threads: int = SAMPLE_BLOCK) -> int:
    """table_v2.cu table_fused_smem_words."""
    return 256 + 6 + 3 * sort_slots(k, threads) + 2 * cap


def select_smem_bytes(k: int, cap: int) -> int:
    """table_v2.cu select_smem_words, in bytes."""
    return 4 * (256 + 4 + 3 * sort_slots(k) + 2 * cap)


def _limit() -> int:
    return smem_optin()


def fused_launch(runs: int = 0, k: int | None = None, L: int | None = None, oversample: float = 3.0,
                 min_rank: int = 0, cxx: str = "hytopk::TableSource") -> tuple[int, int]:
    """(threads, blocks per SM) of the fused kernel: FUSED_THREADS / FUSED_MIN_BLOCKS when set (the
    bench's sweep), else FUSED_SHORT where the samples are in runs, the table source is one of
    FUSED_SHORT_SOURCES and a row of L keys fits its cap (short_fits), else FUSED_LAUNCH for the sampling."""
    if FUSED_THREADS > 0 and FUSED_MIN_BLOCKS > 0:
        return int(FUSED_THREADS), int(FUSED_MIN_BLOCKS)
    if (runs and FUSED_SHORT and cxx in FUSED_SHORT_SOURCES and k is not None and L is not None
            and short_fits(int(k), int(L), float(oversample), int(min_rank))):
        return FUSED_SHORT
    return FUSED_LAUNCH[int(bool(runs))]


def short_fits(k: int, L: int, oversample: float, min_rank: int = 0) -> bool:
    """Whether FUSED_SHORT's cap holds a full row's expected count (reference.sample_plan at c = L:
    L r / M, x 9/8 for the coarse threshold) plus FUSED_SHORT_SIGMAS / sqrt(r) of it."""
    M, r = _full_row_plan(k, L, oversample, min_rank)
    if M <= 0:
        return True                       # c <= k: nothing collected
    expected = L * r / M * 9 / 8
    return expected * (1 + FUSED_SHORT_SIGMAS / r ** 0.5) <= cap_for(k, *FUSED_SHORT)


@functools.lru_cache(maxsize=256)
def _full_row_plan(k: int, L: int, oversample: float, min_rank: int) -> tuple[int, int]:
    """(M, r) of a context of L keys (reference.sample_plan); cached: on every launch's path (the
    module constants short_fits reads are not, so editing them takes effect)."""
    M, r = R.sample_plan([0], [int(L)], int(k), float(oversample), int(min_rank))
    return int(M[0]), int(r[0])


def fused_cap(k: int, runs: int = 0, L: int | None = None, oversample: float = 3.0, min_rank: int = 0,
              cxx: str = "hytopk::TableSource") -> int:
    """Candidates the fused kernel collects in shared memory at its launch (fused_launch's arguments)."""
    return cap_for(k, *fused_launch(runs, k, L, oversample, min_rank, cxx))


def cap_for(k: int, threads: int, blocks: int) -> int:
    """The candidate cap at (threads, blocks): FUSED_CAP when set (within the opt-in limit), else as
    many as keep `blocks` blocks per SM, else what the opt-in limit leaves; at least MAX_SAMPLES / 2
    (its samples live there)."""
    fixed = 256 + 6 + 3 * sort_slots(k, threads)
    target = FUSED_SMEM_TARGET * 2 // max(1, blocks)
    cap = (target // 4 - fixed) // 2 // 256 * 256
    if FUSED_CAP > 0:
        cap = min(int(FUSED_CAP), (_limit() // 4 - fixed) // 2)
    elif cap < MAX_SAMPLES // 2 and blocks > 2:     # a small block: the samples' floor
        cap = MAX_SAMPLES // 2
    if cap < MAX_SAMPLES // 2:
        cap = (_limit() // 4 - fixed) // 2
    if cap < MAX_SAMPLES // 2:
        raise ValueError(f"argument 'k' = {k}: too large for fused_hytopk_v2 (its samples and sort buffers need "
                         f"{4 * fused_smem_words(k, MAX_SAMPLES // 2, threads)} bytes of shared memory, this device has "
                         f"{_limit()}); use method='radix'")
    return min(cap, 16384)


NULL = np.uint64(0)          # a null pointer argument


def launch_threshold(s, cxx, lo, hi, M, r, T, zero_count=NULL, zero_one=NULL, runs=0):
    """The threshold kernel; zero_count ([n] int32) and zero_one ([1] int32), when given, are
    zeroed by it for the launches that follow; runs = 1: the samples in runs (check_sampling)."""
    n, L = s.shape
    launch(kernel(_file(), f"hytopk_table_threshold<{cxx}>"), (n,),
           (s, np.int64(L), np.int32(n), lo, hi, M, r, T, zero_count, zero_one, np.int32(runs)), 0,
           threads=SAMPLE_BLOCK)


def filter_geometry(s, cxx, capacity):
    """(pieces per row, vectors per piece, stage entries) of the filter for this table."""
    n, L = s.shape
    P = PER_VEC[cxx]
    piece_vecs = STREAM_BLOCK * STREAM_U[cxx] * PIECE_STEPS
    aligned_rows = s.data.ptr % 16 == 0 and L % P == 0
    span = L // P if aligned_rows else (L - 1) // P + 2       # vectors a context can touch
    pieces = max(1, -(-span // piece_vecs))
    return pieces, piece_vecs, min(int(capacity), STAGE_MAX)


def launch_filter(s, cxx, lo, hi, T, capacity, cand_idx, cand_val, count):
    """The streaming filter (count must be zeroed)."""
    n, L = s.shape
    pieces, piece_vecs, stage = filter_geometry(s, cxx, capacity)
    launch(kernel(_file(), f"hytopk_table_filter_pieces<{cxx}>"), (n * pieces,),
           (s, np.int64(L), np.int32(n), lo, hi, T, np.int32(capacity), np.int32(pieces), np.int64(piece_vecs),
            np.int32(stage), np.int32(int(s.data.ptr % 16 == 0)), np.int32(FILTER_AHEAD), cand_idx, cand_val, count),
           4 * (2 * stage + 2), threads=STREAM_BLOCK)


def select_cap(capacity: int) -> int:
    return min(int(capacity), SELECT_CAP_MAX)


def launch_select(cand_idx, cand_val, count, k, idx, val):
    n, capacity = cand_idx.shape
    cap = select_cap(capacity)
    launch(kernel(_file(), "hytopk_select_smem"), (n,),
           (np.int32(n), cand_idx, cand_val, count, np.int32(capacity), np.int32(k), np.int32(cap), idx, val,
            np.int32(SELECT_FAST)), select_smem_bytes(k, cap), threads=SAMPLE_BLOCK)


def launch_fused(s, cxx, lo, hi, k, oversample, count, flagged, nflagged, idx, val, runs=0, min_rank=0, coarse=0):
    """The fused kernel at fused_launch's configuration and its cap (cap_for); the rows it cannot
    finish go to flagged[0 .. nflagged) (zeroed before);
    runs = 1: the samples in runs (not with FUSED_ONE_READ: that kernel finds the contract's samples
    among what it collected); min_rank > 0: the threshold's rank at least min(M, min_rank)
    (reference.sample_plan's min_rank; not the contract's); coarse > 0: the threshold rounded down at
    the first radix level whose digit holds at most max(1, r // coarse) samples (reference.coarse_key)."""
    n, L = s.shape
    threads, blocks = fused_launch(runs, k, L, oversample, min_rank, cxx)
    cap = cap_for(k, threads, blocks)
    if (min_rank or coarse) and (FUSED_ONE_READ and not runs):
        raise ValueError("arguments 'min_rank' / 'coarse': not with table_v2.FUSED_ONE_READ = 1 (the contract's plan)")
    if FUSED_ONE_READ and not runs:
        if (threads, blocks) not in FUSED1_CONFIGS:
            raise ValueError(f"table_v2.FUSED_THREADS / FUSED_MIN_BLOCKS = {(threads, blocks)}: the one-read kernel "
                             f"(FUSED_ONE_READ = 1) is instantiated at {list(FUSED1_CONFIGS)} only")
        launch(kernel(_file(), f"hytopk_table_fused1<{cxx}, {threads}, {blocks}>"), (n,),
               (s, np.int64(L), np.int32(n), lo, hi, np.int32(k), np.int32(cap), np.int32(int(s.data.ptr % 16 == 0)),
                np.int32(FUSED_AHEAD), np.float64(oversample), np.int32(SELECT_FAST), np.float64(FUSED_ONE_READ_Z),
                count, flagged, nflagged, idx, val),
               4 * fused_smem_words(k, cap, threads), threads=threads)
        return
    if (threads, blocks) == (SAMPLE_BLOCK, 2):
        name = f"hytopk_table_fused<{cxx}>"
    elif (threads, blocks) in FUSED_CONFIGS:
        name = f"hytopk_table_fused_cfg<{cxx}, {threads}, {blocks}>"
    else:
        raise ValueError(f"table_v2.FUSED_THREADS / FUSED_MIN_BLOCKS = {(threads, blocks)}: not instantiated; "
                         f"known: {[(SAMPLE_BLOCK, 2)] + list(FUSED_CONFIGS)}")
    launch(kernel(_file(), name), (n,),
           (s, np.int64(L), np.int32(n), lo, hi, np.int32(k), np.int32(cap), np.int32(int(s.data.ptr % 16 == 0)),
            np.int32(FUSED_AHEAD), np.float64(oversample), np.int32(SELECT_FAST), np.int32(runs), np.int32(min_rank),
            np.int32(coarse), count, flagged, nflagged, idx, val),
           4 * fused_smem_words(k, cap, threads), threads=threads)


def cluster_geometry(L: int, cxx: str, k: int, C: int | None = None, threads: int | None = None):
    """(C, threads, buffer words, cap) of hytopk_table_cluster for rows of up to L elements, or None
    when two slice buffers (ceil(L / C) elements rounded up to a vector, + one vector) and a candidate
    area of at least MAX_SAMPLES / 2 (the samples live there) do not fit the opt-in shared memory."""
    C = int(CLUSTER_SIZE[cxx] if C is None else C)
    threads = int(CLUSTER_THREADS if threads is None else threads)
    P = PER_VEC[cxx]
    S = -(-(-(-int(L) // C)) // P) * P
    buf_words = -(-(S + P) * (16 // P) // 16) * 4
    fixed = 256 + 6 + 3 * sort_slots(k, threads)
    cap = min(16384, (_limit() // 4 - 2 * buf_words - CLUSTER_HEADER_WORDS - fixed) // 2 // 256 * 256)
    if cap < MAX_SAMPLES // 2:
        return None
    return C, threads, buf_words, cap


def cluster_smem_bytes(k: int, cap: int, buf_words: int, threads: int) -> int:
    """table_v2.cu table_cluster_smem_words, in bytes."""
    return 4 * (2 * buf_words + CLUSTER_HEADER_WORDS + fused_smem_words(k, cap, threads))


def launch_cluster(s, cxx, lo, hi, k, oversample, count, flagged, nflagged, idx, val) -> bool:
    """hytopk_table_cluster over every row when the table's rows fit a cluster (cluster_geometry),
    listing the rows it cannot finish like the fused kernel; False (nothing launched) otherwise."""
    from ._launch import device_limits
    n, L = s.shape
    geo = cluster_geometry(L, cxx, k)
    if geo is None:
        return False
    C, threads, buf_words, cap = geo
    share = bool(CLUSTER_SHARE)
    if (C, threads, share) not in CLUSTER_CONFIGS:
        raise ValueError(f"table_v2.CLUSTER_SIZE / CLUSTER_THREADS / CLUSTER_SHARE = {(C, threads, share)}: the "
                         f"cluster kernel is instantiated at {list(CLUSTER_CONFIGS)} only")
    clusters = int(CLUSTER_GRID) if CLUSTER_GRID > 0 else max(1, device_limits()[0] // C)
    clusters = max(1, min(n, clusters))
    launch(kernel(_file(), f"hytopk_table_cluster<{cxx}, {C}, {threads}, {str(share).lower()}>"), (clusters * C,),
           (s, np.int64(L), np.int32(n), lo, hi, np.int32(k), np.int32(cap), np.int32(buf_words),
            np.int32(int(s.data.ptr % 16 == 0)), np.float64(oversample), np.int32(SELECT_FAST),
            np.int32(int(CLUSTER_SKIP_SELECT)), count, flagged, nflagged, idx, val),
           cluster_smem_bytes(k, cap, buf_words, threads), threads=threads)
    return True


def launch_listed_topk(s, cxx, lo, hi, k, topk_cap, rows, nrows, idx, val):
    """table_topk.cu's radix top-k of the rows in rows[0 .. *nrows) (device-side count), each to
    its own output row, on a grid of two blocks per SM striding over the list."""
    from .table import TOPK_BLOCK, device_limits, topk_smem_words
    n, L = s.shape
    sms, _ = device_limits()
    launch(kernel("table_topk.cu", f"hytopk_table_topk_listed<{cxx}>"), (max(1, min(n, 2 * sms)),),
           (s, np.int64(L), np.int32(n), rows, nrows, lo, hi, np.int32(k), np.int32(topk_cap),
            np.int32(int(s.data.ptr % 16 == 0)), idx, val), 4 * topk_smem_words(k, topk_cap), threads=TOPK_BLOCK)


def _table(source, name):
    src = bind(source)
    if src.kind != "table":
        raise TypeError(f"argument 'source': {name} takes a table source")
    return src


@register("threshold", "cupy.threshold.table_v2", sources=("table",), gpu_only=True,
          notes="r-th best of M samples, every sample load of a thread in flight")
def threshold_table_v2(source, lo, hi, M, r):
    with launch_stream():
        src = _table(source, "cupy.threshold.table_v2")
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        T = cp.empty(src.n, cp.float32)
        launch_threshold(src.args[0], src.cxx, lo, hi, M, r, T)
        return T


@register("filter", "cupy.filter.table_v2", sources=("table",), gpu_only=True,
          notes="one block per (row, piece): range test on raw bits, shared-memory appends, one atomic per block")
def filter_table_v2(source, lo, hi, T, capacity):
    capacity = check_capacity(capacity)
    with launch_stream():
        src = _table(source, "cupy.filter.table_v2")
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(src.n, capacity)
        launch_filter(src.args[0], src.cxx, lo, hi, T, capacity, cand_idx, cand_val, count)
        return cand_idx, cand_val, count


@register("select", "cupy.select.smem", gpu_only=True,
          notes="each row's candidates read once into shared memory, then radix_bitonic's select")
def select_smem(cand_idx, cand_val, count, k):
    k = check_k_fits(k, bitonic_topk_smem_bytes)
    with launch_stream():
        cand_idx, cand_val, count, n, capacity = check_candidates(cand_idx, cand_val, count)
        if select_smem_bytes(k, select_cap(capacity)) > _limit():
            raise ValueError(f"argument 'k' = {k}: its sort buffers and {select_cap(capacity)} candidates do not fit "
                             f"in shared memory; use cupy.select.radix_bitonic")
        idx = cp.empty((n, k), cp.int32)
        val = cp.empty((n, k), cp.float32)
        launch_select(cand_idx, cand_val, count, k, idx, val)
        return idx, val


def fused_v2(s, cxx, lo, hi, k, topk_cap, oversample, count, idx, val, runs=0, min_rank=0, coarse=0):
    """hytopk_table_fused (or, FUSED_CLUSTER = 1, contract sampling and rows that fit a cluster,
    hytopk_table_cluster), then the radix top-k over the rows it listed (device-side: no sync)."""
    n = s.shape[0]
    flagged = cp.empty(max(1, n), cp.int32)
    nflagged = cp.zeros(1, cp.int32)
    cluster = FUSED_CLUSTER and not (runs or min_rank or coarse) and n > 0     # the contract's plan only
    if not (cluster and launch_cluster(s, cxx, lo, hi, k, oversample, count, flagged, nflagged, idx, val)):
        launch_fused(s, cxx, lo, hi, k, oversample, count, flagged, nflagged, idx, val, runs, min_rank, coarse)
    launch_listed_topk(s, cxx, lo, hi, k, topk_cap, flagged, nflagged, idx, val)


def staged_v2(s, cxx, plan):
    """TableHyTopK(kernels="v2"): threshold (which also zeroes the filter's counts and the check's
    counter) -> filter -> select into plan's buffers; STAGED_CHUNKS > 1: overlapped (staged_v2_overlap)."""
    if plan.n == 0:
        return
    if STAGED_CHUNKS > 1 and plan.n >= 2 * STAGED_CHUNKS:
        staged_v2_overlap(s, cxx, plan, int(STAGED_CHUNKS))
        return
    launch_threshold(s, cxx, plan.lo, plan.hi, plan.M, plan.r, plan.T, plan.count, plan.nfailed, plan.runs)
    launch_filter(s, cxx, plan.lo, plan.hi, plan.T, plan.capacity, plan.cand_idx, plan.cand_val, plan.count)
    launch_select(plan.cand_idx, plan.cand_val, plan.count, plan.k, plan.idx, plan.val)


# The staged path in row chunks on three streams forked from the launch stream (issue 21: threshold and
# select overlapped with the filter): the threshold and the select are latency-bound, the filter reads
# at memory speed, so chunk c's threshold and chunk c - 2's select run beside chunk c - 1's filter. The
# threshold and select streams have the highest priority: their blocks take the SM slots the filter's
# blocks free, the filter fills the rest. Results are the sequential path's bit for bit (same kernels
# per row); the streams join the launch stream before the check. CUDA-graph capture sees a fork and a
# join (events recorded on the capturing stream).
STAGED_CHUNKS = 0           # > 1: staged_v2_overlap with this many row chunks (the bench's table_hytopk_v2[overlap N])
_SIDE_STREAMS: dict = {}


def side_streams():
    """(threshold, filter, select) streams of the current device, created once."""
    dev = cp.cuda.Device().id
    if dev not in _SIDE_STREAMS:
        # CUDA clamps a priority to the device's range: -1000 is the highest there is, 0 the default (lowest);
        # non-blocking (flag 1): no implicit sync with the legacy default stream. Kept for the process's life.
        _SIDE_STREAMS[dev] = tuple(cp.cuda.ExternalStream(cp.cuda.runtime.streamCreateWithPriority(1, p), dev)
                                   for p in (-1000, 0, -1000))
    return _SIDE_STREAMS[dev]


def staged_v2_overlap(s, cxx, plan, chunks):
    """staged_v2 over `chunks` row chunks: threshold on one stream, filter on a second (after that chunk's
    threshold), select on a third (after that chunk's filter), the launch stream waiting for the last."""
    main = cp.cuda.get_current_stream()
    streams = side_streams()
    fork = cp.cuda.Event(disable_timing=True)
    fork.record(main)
    for st in streams:
        st.wait_event(fork)
    bounds = [plan.n * c // chunks for c in range(chunks + 1)]
    for c in range(chunks):
        rows = slice(bounds[c], bounds[c + 1])
        with streams[0]:
            launch_threshold(s[rows], cxx, plan.lo[rows], plan.hi[rows], plan.M[rows], plan.r[rows], plan.T[rows],
                             plan.count[rows], plan.nfailed if c == 0 else NULL, plan.runs)
            thr = cp.cuda.Event(disable_timing=True)
            thr.record(streams[0])
        streams[1].wait_event(thr)
        with streams[1]:
            launch_filter(s[rows], cxx, plan.lo[rows], plan.hi[rows], plan.T[rows], plan.capacity, plan.cand_idx[rows],
                          plan.cand_val[rows], plan.count[rows])
            filt = cp.cuda.Event(disable_timing=True)
            filt.record(streams[1])
        streams[2].wait_event(filt)
        with streams[2]:
            launch_select(plan.cand_idx[rows], plan.cand_val[rows], plan.count[rows], plan.k, plan.idx[rows],
                          plan.val[rows])
    done = cp.cuda.Event(disable_timing=True)
    done.record(streams[2])                      # the select stream's last follows every launch before it
    main.wait_event(done)

