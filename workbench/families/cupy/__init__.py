"""The CuPy family: raw CUDA C++ kernels of kernels_cuda/ loaded with NVRTC
(workbench.loader: hot reload, header-aware cache key), one module per stage.

Imports (and registers its variants) wherever CuPy imports; without a GPU the
family reports itself unavailable and refuses to move arrays to the device.
"""
from __future__ import annotations

import contextlib
import sys

import cupy as cp
import numpy as np

from .. import Family
from . import _scope
from ._launch import BLOCK, as_device, chunks, gpu_status, kernel, launch, launch_stream
from ._shared import ROWS_PER_PASS
from .check import check_on_device
from . import attend, attend_wgmma2, attend_wgmma3, attend_wgmma_bwd, check, dense, filter, recover, replay, select, table, table_v2, threshold, mma_sync, wgmma, wgmma_ws  # noqa: F401  (register variants)
from .score_only import score_only
from .table import TableHyTopK, fused_hytopk, table_hytopk, table_topk
from .mma_sync import score_only_mma_sync

# filter and recover: the dispatching variants of table.py (a table source gets the streaming
# filter and the radix top-k of whole rows, an indexer source the SIMT filter and materialise)
FLOAT32 = {
    "threshold": "cupy.threshold.block",
    "filter": "cupy.filter.auto",
    "check": "cupy.check.atomic",
    "select": "cupy.select.fast",
    "recover": "cupy.recover.auto",
    "dense": "cupy.dense.simt",
    "replay": "cupy.replay.simt",
}
# bf16 inputs (torch.bfloat16 / uint16 bits): a tensor-core core loses nothing there, so it is
# the default (the threshold too: its samples get the filter's own bits). On Hopper (sm_90a)
# the warp-specialised wgmma core, elsewhere the mma_sync core; float32 inputs keep the
# exact SIMT scorer above.
MMA_SYNC_BF16 = dict(FLOAT32, threshold="cupy.threshold.mma_sync", filter="cupy.filter.mma_sync",
                  recover="cupy.recover.mma_sync", dense="cupy.dense.mma_sync", replay="cupy.replay.mma_sync")
WS_BF16 = dict(FLOAT32, threshold="cupy.threshold.wgmma_ws", filter="cupy.filter.wgmma_ws",
               recover="cupy.recover.wgmma_ws", dense="cupy.dense.wgmma_ws", replay="cupy.replay.wgmma_ws")


def _hopper() -> bool:
    try:
        return cp.cuda.runtime.getDeviceCount() > 0 and cp.cuda.Device().compute_capability == "90"
    except Exception:
        return False


class CupyFamily(Family):
    name = "cupy"
    preference = 0              # the torch ops' first choice
    takes_bf16_bits = True

    def stream_scope(self, ptr, device=0):
        """CuPy launches on the current CuPy stream: make ``ptr`` that stream (and draw scratch
        from torch's allocator on it)."""
        return _on_stream(ptr, device)

    def available(self):
        return gpu_status()

    def to_device(self, x):
        ok, why = gpu_status()
        if not ok:
            raise RuntimeError(f"backend 'cupy' needs a CUDA GPU: {why}")
        with launch_stream():
            return as_device(x)

    def to_host(self, x):
        if isinstance(x, cp.ndarray):
            with launch_stream() as s:       # the stream the kernels ran on (torch side streams don't sync)
                out = x.get(stream=s)
                s.synchronize()
            return out
        return np.asarray(x)

    def synchronize(self):
        with launch_stream() as s:
            s.synchronize()

    def empty(self, shape, dtype):
        return cp.empty(shape, dtype)

    def place(self, dst, start, src):
        with launch_stream():
            super().place(dst, start, as_device(src))

    def call_scope(self, lo_h=None, hi_h=None, M_h=None, uploads=None):
        """Keys put into the wgmma_ws core's layout once per pipeline call, not once per pass;
        whether every query shares one context (the wgmma_ws threshold's fast path); the longest
        context (recovery buffers without a sync); a plan's uploads (_scope.CallFacts)."""
        return _scope.call_scope(lo_h, hi_h, M_h, uploads)

    def release(self, x):
        """Drop the call's layout copy of ``x`` (a pass's q rows: 1/passes of q each, which would
        otherwise all live until the call ends). Its memory returns to the pool of the stream
        that made it, so later work on other streams cannot reuse it early."""
        facts = _scope.current()
        if facts is not None:
            facts.prepared.pop(id(x), None)

    @contextlib.contextmanager
    def lanes(self, count):
        """``count`` streams forked from the launch stream and joined back at exit (events only:
        no host wait, capturable): the driver runs its passes round-robin on them, so one pass's
        tail overlaps the next pass's start."""
        with launch_stream() as main:
            streams = _lane_streams(count)
            forked = cp.cuda.Event(disable_timing=True)
            forked.record(main)
            for s in streams:
                s.wait_event(forked)
            try:
                yield [_on_lane(s) for s in streams]
            finally:
                for s in streams:
                    done = cp.cuda.Event(disable_timing=True)
                    done.record(s)
                    main.wait_event(done)

    capture_safe = True

    def recover_on_device(self, recover, source, lo, hi, count, k, capacity, max_failed, idx, val):
        """Check, recovery and fallback with no host sync (CUDA-graph capture): the check kernel
        counts the failed queries on the device; one launch fills the recovery slots of every
        chunk (S slots each, chunks covering every query): slot e holds a failed query (at most
        max_failed) or, when more failed, query e (CONTRACT.md §3.7), or -1 (kernels return at
        once). Each chunk is then a rows launch and a select writing straight into idx/val (a
        rows recovery takes the outputs: _scope.CallFacts.recovery_out), or, for a recovery
        that returns its rows (the table source), its launches and one scatter. The chunks
        exist only to bound the scratch (S rows x the longest context, at most one pass's
        budget): 2 launches each. Returns device (failed bool[n], fell_back bool[1], nfailed int32[1])."""
        with launch_stream():
            n = int(count.shape[0])
            failed, rows, nfailed = check_on_device(count, lo, hi, k, capacity)
            fell_back = cp.empty(1, cp.uint8)            # written by the slots kernel
            facts = _scope.current()
            S = _recovery_chunk(n, _scope.longest_context())
            nchunks = chunks(n, S)
            slots = cp.empty(nchunks * S, cp.int32)
            # chunk 0 of nchunks * S slots = every chunk's slots at once (the kernel grid-strides)
            launch(kernel("device_recovery.cu", "hytopk_recovery_slots"), (min(chunks(slots.shape[0], BLOCK), 1024),),
                   (np.int32(n), nfailed, rows, np.int32(max_failed), np.int32(0), np.int32(slots.shape[0]), slots,
                    fell_back))
            saved = (facts.recovery_rows, facts.recovery_out) if facts is not None else None
            if facts is not None:
                facts.recovery_rows = S                  # one materialisation per chunk
                facts.recovery_out = (idx, val)
            try:
                c = 0
                while c < nchunks:
                    ridx, rval = recover(source, lo, hi, slots[c * S:(c + 1) * S], k)
                    if ridx is None:                     # wrote into idx/val: the other chunks in one call
                        if c + 1 < nchunks:
                            recover(source, lo, hi, slots[(c + 1) * S:], k)
                        break
                    launch(kernel("device_recovery.cu", "hytopk_scatter_slots"), (S, chunks(k, BLOCK)),
                           (slots[c * S:(c + 1) * S], np.int32(S), np.int32(k), ridx, rval, idx, val))
                    c += 1
            finally:
                if facts is not None:
                    facts.recovery_rows, facts.recovery_out = saved
            return failed.astype(cp.bool_), fell_back.astype(cp.bool_), nfailed

    def append_rows(self, dst_idx, dst_val, width, stored, total, src_idx, src_val, count, offset):
        if dst_idx.device.type != "cuda":
            return False
        n, src_w = int(src_idx.shape[0]), int(src_idx.shape[1]) if src_idx.dim() == 2 else 0
        if n == 0 or src_w == 0:
            total += count.to(total.dtype)
            return True
        with launch_stream():
            cnt = as_device(count.int())             # int32 (no copy when it is already)
            launch(kernel("device_recovery.cu", "hytopk_append_rows"), (n,),
                   (np.int32(n), np.int32(src_w), as_device(src_idx.contiguous()), as_device(src_val.contiguous()),
                    cnt, np.int32(offset), np.int32(width), np.int32(dst_idx.stride(0)),
                    as_device(dst_idx), as_device(dst_val), as_device(stored), as_device(total)))
        return True

    def scatter_rows(self, dst_idx, dst_val, rows, src_idx, src_val):
        with launch_stream():
            rows = as_device(rows)
            dst_idx[rows] = src_idx
            dst_val[rows] = src_val


RECOVERY_SCRATCH_BYTES = 128 << 20


def _recovery_chunk(n: int, longest: int | None) -> int:
    """Slots per chunk of the device-side recovery: as many rows as a materialisation of
    RECOVERY_SCRATCH_BYTES holds, or of one pass's budget on large problems
    (pipeline.pass_scratch_bytes over the longest context: table / 80), at least
    ROWS_PER_PASS, at most n: every chunk is 2 launches whether it holds a query or not, so
    fewer chunks mean a smaller CUDA graph (32768 x 256K: 81 chunks, not 256)."""
    from ...pipeline import pass_scratch_bytes
    longest = max(1, longest or 1)
    fit = max(RECOVERY_SCRATCH_BYTES, pass_scratch_bytes(n, longest)) // (4 * longest)
    return int(max(1, min(max(n, 1), max(ROWS_PER_PASS, fit))))


_LANES: dict = {}


def _lane_streams(count):
    """Non-blocking streams of the current device, made once (creating streams per call
    would cost host time, and a stream made during a capture is not wanted)."""
    dev = cp.cuda.Device().id
    have = _LANES.setdefault(dev, [])
    while len(have) < count:
        have.append(cp.cuda.Stream(non_blocking=True))
    return have[:count]


class _on_lane:
    """Launch on ``stream`` (re-enterable: one per lane, entered once per pass): CuPy's current
    stream, and torch's too while torch is in use (so torch-allocated scratch is tied to the
    stream that uses it)."""

    def __init__(self, stream):
        self.stream = stream
        self._stack = []

    def __enter__(self):
        es = contextlib.ExitStack()
        es.enter_context(self.stream)
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            es.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(self.stream.ptr)))
        self._stack.append(es)
        return self

    def __exit__(self, *exc):
        return self._stack.pop().__exit__(*exc)



@contextlib.contextmanager
def _on_stream(ptr, device):
    """CuPy's current stream is ``ptr`` (PyTorch's current stream), and the kernels' scratch comes
    from torch's caching allocator on it: stream-ordered with torch's work, counted in torch's
    memory stats, and during a CUDA-graph capture taken from the graph's private pool (CuPy's
    own pool would cudaMalloc in the capture, or hand the graph's memory to someone else after it)."""
    with cp.cuda.Device(device), cp.cuda.ExternalStream(ptr), cp.cuda.using_allocator(_torch_allocator(device)):
        yield


def _torch_allocator(device: int):
    import torch

    def alloc(size):
        t = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(t.data_ptr(), t.numel(), t, device), 0)
    return alloc


# fp8 e4m3 q/keys with per-key scales (the Backend hands them over as uint8 bits + kscale): only the
# wgmma_ws core computes them (off Hopper its inputs say so: it needs sm_90a)
# bf16 on Hopper: the one-kernel sampled threshold (wgmma_ws_threshold.cu; run 4 of results/h200-2026-12-01:
# 1.68 vs 2.34 ms at dsv32-128k, bit-equal); fp8 keeps wgmma_ws (v2 hands fp8 to the fused kernel)
WS_BF16_V2 = dict(WS_BF16, threshold="cupy.threshold.wgmma_ws_v2")
FAMILY = CupyFamily(defaults={"float32": FLOAT32, "bf16": WS_BF16_V2 if _hopper() else MMA_SYNC_BF16, "fp8": WS_BF16})

__all__ = ["FAMILY", "score_only", "score_only_mma_sync", "CupyFamily", "table_topk", "table_hytopk",
           "fused_hytopk", "TableHyTopK"]
