"""The warp-specialised wgmma core (kernels_cuda/hytopk_wgmma_ws.cuh + wgmma_ws.cu,
sm_90a) as variants: threshold, fused filter, dense table, recovery and replay,
plus the score-only floor. One producer warp feeds key stages through the bulk
copy (TMA) engine; four consumer warpgroups run the MMAs and the epilogues. All
stages call one score function, so their scores agree bit for bit, and a
pipeline of these stages is exact on its own scores.

Inputs, by the source:
  reference.IndexerSource          q, keys bf16 (float32 in: rounded to bf16 first);
                                   w float32 as given (bf16 w widened exactly)
  reference.fp8.Fp8IndexerSource   q, keys fp8 e4m3 bits, float32 w and per-key scales
Heads are zero-padded to 16/32/64, dims to 32 bytes (zeros add exactly +0). q and
keys are put once per call into the MMA's core-matrix layout (hytopk_ws_pretile),
so a stage of 128 keys is one contiguous bulk copy. Needs a Hopper GPU (sm_90a)."""
from __future__ import annotations

import functools

import cupy as cp
import numpy as np

import reference as R
from reference.fp8 import Fp8IndexerSource
from workbench import instantiations as INST

from ...geometry import (WsGeometry, WsGroupThresholdGeometry, WsReplayGeometry, WsThresholdGeometry,
                         WsThresholdV2Geometry)
from ...registry import register
from . import _scope
from ._launch import as_device, check_k_fits, chunks, i32, input_dtype, kernel, launch, launch_stream, pad_inputs
from ._shared import candidate_buffers, check_capacity, recover_rows, sample_scores, threshold_of_samples
from .wgmma import require_sm90

FILE = "wgmma_ws.cu"
NOTE = ("warp-specialised wgmma (sm_90a): a bulk-copy producer warp, 4 consumer warpgroups of m64n128, "
        "keys as A, (query, head) rows as B")
INPUTS = "(bf16 q/keys, float32 w; fp8 e4m3 from an Fp8IndexerSource)"


def _f32_weights(w):
    """float32 weights: float32 as given, bf16 bits widened exactly."""
    if w.dtype == cp.float32:
        return w
    if input_dtype(w) == "bfloat16":
        return (w.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)
    raise TypeError(f"argument 'w' must be float32 or bf16, got {w.dtype}")


@functools.lru_cache(maxsize=64)
def _geometries(H, D, eb, consumers, rounded):
    """(WsGeometry, WsReplayGeometry, module shapes) of a core shape: once per shape, not once per
    stage call (a planned call builds WsInputs per stage and pass; their host cost adds up)."""
    default = {rounded(*s) for s in INST.SHAPES}
    shapes = INST.SHAPES if (H, D) in default else ((H, D),)
    return WsGeometry(H, D, eb, consumers), WsReplayGeometry(H, D, eb), shapes


def _aligned(a):
    return a if a.data.ptr % 16 == 0 else a.copy()


class WsInputs:
    """Device inputs of the wgmma_ws kernels: q and keys as bf16 bits or e4m3 bits, padded to
    the core's shape; float32 w (and kscale for fp8); the core-matrix copies made on first use."""

    def __init__(self, source, consumers: int = 4):
        require_sm90()
        if isinstance(source, Fp8IndexerSource):
            q, w, keys, ks = (cp.ascontiguousarray(as_device(a)) for a in source)
            for name, a, dt in (("q", q, cp.uint8), ("keys", keys, cp.uint8), ("w", w, cp.float32),
                                ("kscale", ks, cp.float32)):
                if a.dtype != dt:
                    raise TypeError(f"argument '{name}' of an Fp8IndexerSource must be {np.dtype(dt).name}"
                                    f"{' (e4m3 bits)' if dt == cp.uint8 else ''}, got {a.dtype}")
            self._shapes_ok(q, w, keys)
            if ks.shape != (keys.shape[0],):
                raise ValueError(f"argument 'kscale': shape {ks.shape} is not [L] = ({keys.shape[0]},)")
            self.kind, eb, rounded = "ws_fp8", 1, INST.fp8_shape
        elif isinstance(source, R.IndexerSource):
            q, w, keys = (cp.ascontiguousarray(as_device(a)) for a in source)
            self._shapes_ok(q, w, keys)
            dq, dk = input_dtype(q), input_dtype(keys)
            if dq != dk:
                raise TypeError(f"arguments 'q', 'keys' must share one dtype (float32 or bf16), got {q.dtype}, {keys.dtype}")
            if dq == "float32":                                   # the core takes bf16: round to nearest even
                from ...bf16 import float32_to_bf16_bits
                q, keys = (float32_to_bf16_bits(a, cp) for a in (q, keys))
            q, keys = q.view(cp.uint16), keys.view(cp.uint16)
            w = _f32_weights(w)
            ks = cp.empty(1, cp.float32)      # not read by the bf16 kernels (no memset node per stage)
            self.kind, eb, rounded = ("ws" if consumers == 4 else "ws2"), 2, INST.tiled_shape
        else:
            raise TypeError(f"argument 'source': the wgmma_ws variants take an IndexerSource or an "
                            f"Fp8IndexerSource, got {type(source).__name__}")
        if consumers not in (2, 4) or (consumers == 2 and eb == 1):
            raise ValueError(f"argument 'consumers': 4 (bf16, fp8) or 2 (bf16), got {consumers}")
        self.n, H0, D0 = q.shape
        self.H, self.D = rounded(H0, D0)
        q, w, keys = pad_inputs(q, w, keys, self.H, self.D)
        self.q, self.w, self.keys, self.kscale = (_aligned(cp.ascontiguousarray(a)) for a in (q, w, keys, ks))
        self.L = self.keys.shape[0]
        self.geo, self.rgeo, self.shapes = _geometries(self.H, self.D, eb, consumers, rounded)
        self._qt = self._kt = None
        self._src_keys, self._src_q = source.keys, source.q

    @staticmethod
    def _shapes_ok(q, w, keys):
        if q.ndim != 3 or w.shape != q.shape[:2] or keys.ndim != 2 or keys.shape[1] != q.shape[2]:
            raise ValueError(f"arguments 'q', 'w', 'keys': shapes {q.shape}, {w.shape}, {keys.shape} "
                             "are not [n, H, D], [n, H], [L, D]")
        if q.shape[1] == 0 or q.shape[2] == 0:
            raise ValueError(f"argument 'q': needs at least one head and one dim, got shape {q.shape}")

    def fn(self, stage: str):
        """hytopk_<stage>_<kind>: kind ws (bf16, 4 consumers), ws2 (bf16, 2 consumers) or ws_fp8."""
        kind = "ws" if stage in ("dense", "score_rows", "replay", "threshold") and self.kind == "ws2" else self.kind
        return kernel(FILE, f"hytopk_{stage}_{kind}<{self.H}, {self.D}>", self.shapes)

    def _pretile(self, a, rows_out):
        """rows of `a` (2-D, 16-byte multiples) in the core-matrix layout, zero rows up to rows_out."""
        rows, row_bytes = a.shape[0], a.shape[1] * a.itemsize
        out = cp.empty(rows_out * row_bytes, cp.uint8)
        total = rows_out * row_bytes // 16
        if total:
            launch(kernel(FILE, "hytopk_ws_pretile", self.shapes), (min(chunks(total, 256), 132 * 32),),
                   (a, np.int64(rows), np.int32(row_bytes // 16), np.int64(rows_out), out))
        return out

    @property
    def qt(self):
        if self._qt is None:
            self._qt = self._prepared(self._src_q, ("q", self.kind == "ws_fp8", self.n, self.H, self.D),
                                      lambda: self._pretile(self.q.reshape(self.n * self.H, self.D), self.n * self.H))
        return self._qt

    @property
    def kt(self):
        if self._kt is None:                                      # padded to whole 128-key stages
            self._kt = self._prepared(self._src_keys, ("keys", self.kind == "ws_fp8", self.D, self.L),
                                      lambda: self._pretile(self.keys, chunks(self.L, WsGeometry.KT) * WsGeometry.KT))
        return self._kt

    @staticmethod
    def _prepared(src, tag, make):
        """The layout copy of the source array ``src``: made once per pipeline call (the inputs
        do not change inside one; entries hold their arrays, so an id is never reused)."""
        facts = _scope.current()
        hit = facts.prepared.get(id(src)) if facts is not None else None
        if hit is not None and hit[0] is src and hit[1] == tag:
            return hit[2]
        out = make()
        if facts is not None:
            facts.prepared[id(src)] = (src, tag, out)
        return out

    def head_args(self):
        return (self.qt, self.w, self.kt, self.kscale, np.int64(self.L))

    def runs(self, scan: bool = True) -> int:
        # a scan's union may start inside a stage: one stage more than L
        return chunks(self.L + (WsGeometry.KT if scan else 0), self.geo.block_keys)

    def launch_scan(self, stage, nq, args, scan=True):
        runs = self.runs(scan)
        launch(self.fn(stage), (self.geo.groups(nq) * runs,), (*self.head_args(), *args, np.int32(runs)),
               self.geo.smem, threads=self.geo.threads)

    def score_rows(self, part, lo, hi, buf, stride):
        """Recovery rows of the queries `part` into buf[len(part), stride] (_shared.recover_rows)."""
        self.launch_scan("score_rows", part.shape[0], (part, np.int32(part.shape[0]), lo, hi, buf, np.int64(stride)))

    def replay(self, idx):
        """[n, k] scores at idx (-inf where idx = -1) through the same score function."""
        idx = i32(idx, "idx")
        if idx.ndim != 2 or idx.shape[0] != self.n:
            raise ValueError(f"argument 'idx' must have shape ({self.n}, k), got {idx.shape}")
        k = idx.shape[1]
        out = cp.empty((self.n, k), cp.float32)
        if k and self.n:
            launch(self.fn("replay"), (self.n, chunks(k, self.rgeo.block_slots)),
                   (self.qt, self.w, self.keys, self.kscale, np.int64(self.L), np.int32(self.n), idx,
                    np.int32(k), out), self.rgeo.smem, threads=self.rgeo.threads)
        return out


    def threshold(self, lo, hi, M, r):
        """T [n]: the r-th best of each query's M samples, scored and selected in one kernel."""
        T = cp.empty(self.n, cp.float32)
        if self.n:
            g = WsThresholdGeometry(self.H, self.D, 1 if self.kind == "ws_fp8" else 2)
            launch(self.fn("threshold"), (self.n,),
                   (self.qt, self.w, self.keys, self.kscale, np.int64(self.L), np.int32(self.n), lo, hi, M, r, T),
                   g.smem, threads=g.threads)
        return T


    def threshold_group(self, lo, hi, M, r, nrows=256, lines=False):
        """T [n] by the grouped threshold kernel: G = nrows / H adjacent queries per block score the
        union of their sample positions with one MMA; the samples' bits go to an [n, mcap] scratch
        (mcap = num_samples(L): no contract query has more), then each query's r-th best. M must be
        the contract's (at most c, so a query's positions strictly increase; clamped to mcap)."""
        T = cp.empty(self.n, cp.float32)
        mcap = min(int(R.num_samples(int(self.L))), WsGroupThresholdGeometry.MAX_SAMPLES)
        if self.n and mcap > 0:
            g = WsGroupThresholdGeometry(self.H, self.D, 2, nrows, lines)
            scratch = cp.empty((self.n, mcap), cp.uint32)
            launch(kernel(FILE, f"{g.name}<{self.H}, {self.D}>", self.shapes), (g.groups(self.n),),
                   (self.qt, self.w, self.keys, self.kscale, np.int64(self.L), np.int32(self.n), lo, hi, M, r,
                    np.int32(mcap), scratch, T), g.smem, threads=g.threads)
        elif self.n:
            T.fill(cp.nan)
        return T

    def threshold_v2(self, lo, hi, M, r, swizzle=True):
        """T [n] by the v2 threshold kernel (wgmma_ws_threshold.cu, bf16): one block per query, a
        producer warp gathering 64-row key tiles (a quarter warp per 128-byte line), one consumer
        warpgroup scoring them, the r-th best in shared memory. Reads m = min(M, mcap) samples,
        mcap = num_samples(L) (no contract query has more)."""
        T = cp.empty(self.n, cp.float32)
        mcap = min(int(R.num_samples(int(self.L))), WsThresholdV2Geometry.MAX_SAMPLES)
        if self.n and mcap > 0:
            g = WsThresholdV2Geometry(self.H, self.D, mcap, swizzle)
            launch(kernel("wgmma_ws_threshold.cu", f"{g.name}<{self.H}, {self.D}>", self.shapes), (self.n,),
                   (self.qt, self.w, self.keys, np.int64(self.L), np.int32(self.n), lo, hi, M, r, np.int32(mcap), T),
                   g.smem, threads=g.threads)
        elif self.n:
            T.fill(cp.nan)
        return T


def _indexer(source, name, consumers=4):
    if not isinstance(source, (R.IndexerSource, Fp8IndexerSource)):
        raise TypeError(f"argument 'source': {name} takes the indexer source only (IndexerSource or Fp8IndexerSource)")
    return WsInputs(source, consumers)


def filter_source(source, lo, hi, T, capacity, consumers=4):
    capacity = check_capacity(capacity)
    with launch_stream():
        x = _indexer(source, "cupy.filter.wgmma_ws", consumers)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(x.n, capacity)
        x.launch_scan("filter", x.n, (np.int32(x.n), lo, hi, T, np.int32(capacity), cand_idx, cand_val, count))
        return cand_idx, cand_val, count


@register("filter", "cupy.filter.wgmma_ws", sources=("indexer",), gpu_only=True,
          notes=f"{NOTE}; on-chip threshold compare, candidates staged per warp in shared memory {INPUTS}")
def filter_ws(source, lo, hi, T, capacity):
    return filter_source(source, lo, hi, T, capacity)


@register("filter", "cupy.filter.wgmma_ws2", sources=("indexer",), gpu_only=True,
          notes="the wgmma_ws core with 2 consumer warpgroups of m64n256 (bf16): what the 4-consumer split buys")
def filter_ws2(source, lo, hi, T, capacity):
    if isinstance(source, Fp8IndexerSource):
        raise TypeError("argument 'source': cupy.filter.wgmma_ws2 takes the bf16 indexer source only")
    return filter_source(source, lo, hi, T, capacity, consumers=2)


def dense_source(source, lo, hi):
    """[n, L] float32 table of the core's scores (-inf outside the context)."""
    with launch_stream():
        x = _indexer(source, "dense")
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        out = cp.empty((x.n, x.L), cp.float32)
        x.launch_scan("dense", x.n, (np.int32(x.n), lo, hi, out), scan=False)
        return out


def _source(q, w, keys, kscale=None):
    """The indexer source of (q, w, keys): fp8 e4m3 bits when the key scales are given."""
    return Fp8IndexerSource(q, w, keys, kscale) if kscale is not None else R.IndexerSource(q, w, keys)


@register("dense", "cupy.dense.wgmma_ws", gpu_only=True, notes=f"{NOTE}, writing the table {INPUTS}")
def dense_ws(q, w, keys, lo, hi, kscale=None):
    return dense_source(_source(q, w, keys, kscale), lo, hi)


@register("recover", "cupy.recover.wgmma_ws", sources=("indexer",), gpu_only=True,
          notes=f"failed rows materialised by the wgmma_ws core (same bits as its filter), exact radix top-k {INPUTS}")
def recover_ws(source, lo, hi, rows, k):
    k = check_k_fits(k)
    with launch_stream():
        return recover_rows(_indexer(source, "cupy.recover.wgmma_ws"), lo, hi, rows, k)


def replay_source(source, idx):
    with launch_stream():
        return _indexer(source, "replay").replay(idx)


@register("replay", "cupy.replay.wgmma_ws", gpu_only=True,
          notes=f"gathered key tiles (cp.async) through the wgmma_ws score function: its filter's bits {INPUTS}")
def replay_ws(q, w, keys, idx, kscale=None):
    return replay_source(_source(q, w, keys, kscale), idx)


@register("threshold", "cupy.threshold.wgmma_ws", sources=("indexer",), gpu_only=True,
          notes=f"samples scored by the wgmma_ws core (its filter's own bits): when every query shares one "
                f"context (e.g. full attention) its samples are one key set, scored by the dense kernel; "
                f"else by the replay of each query's samples; r-th best by the block threshold's "
                f"in-shared-memory radix select {INPUTS}")
def threshold_ws(source, lo, hi, M, r):
    if not isinstance(source, (R.IndexerSource, Fp8IndexerSource)):
        raise TypeError("argument 'source': cupy.threshold.wgmma_ws takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        shared = _shared_plan(source, lo, hi, M)
        if shared is not None:
            s = _shared_sample_scores(source, lo.shape[0], *shared)
            M = cp.full(lo.shape[0], s.shape[1], cp.int32)
        else:
            s, M = sample_scores(source, lo, hi, M, replay_source)
        return threshold_of_samples(s, M, r)


@register("threshold", "cupy.threshold.wgmma_ws_fused", sources=("indexer",), gpu_only=True,
          notes=f"one warpgroup per query gathers its samples (3 cp.async stages) through the wgmma_ws score "
                f"function and radix-selects the r-th best in shared memory: one kernel, no [n, M] scores; a "
                f"context shared by every query takes the dense fast path of cupy.threshold.wgmma_ws {INPUTS}")
def threshold_ws_fused(source, lo, hi, M, r):
    if not isinstance(source, (R.IndexerSource, Fp8IndexerSource)):
        raise TypeError("argument 'source': cupy.threshold.wgmma_ws_fused takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        if _shared_plan(source, lo, hi, M) is not None:
            return threshold_ws(source, lo, hi, M, r)
        return _indexer(source, "cupy.threshold.wgmma_ws_fused").threshold(lo, hi, M, r)


def _sampled_threshold(source, lo, hi, M, r, name, max_samples, too_many, run):
    """The grouped and v2 thresholds' common path: fp8, or one context for all, goes to
    wgmma_ws_fused as before; so does a direct call (one sync) whose M the kernel cannot take
    (too_many(M, lo, hi, min(num_samples(L), max_samples)): not the contract's M); else
    run(_indexer(source, name), lo, hi, M, r)."""
    if not isinstance(source, (R.IndexerSource, Fp8IndexerSource)):
        raise TypeError(f"argument 'source': {name} takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        if isinstance(source, Fp8IndexerSource) or _shared_plan(source, lo, hi, M) is not None:
            return threshold_ws_fused(source, lo, hi, M, r)
        if _scope.current() is None and lo.shape[0]:
            mcap = min(int(R.num_samples(int(source.keys.shape[0]))), max_samples)
            if bool(too_many(M, lo, hi, mcap).any()):
                return threshold_ws_fused(source, lo, hi, M, r)
        return run(_indexer(source, name), lo, hi, M, r)


def _threshold_group(source, lo, hi, M, r, nrows, name, lines=False):
    # an M above c repeats positions (the union merge needs them distinct), one above
    # num_samples(L) does not fit the scratch
    return _sampled_threshold(source, lo, hi, M, r, name, WsGroupThresholdGeometry.MAX_SAMPLES,
                              lambda M, lo, hi, mcap: M > cp.minimum(cp.maximum(hi - lo, 0), mcap),
                              lambda x, lo, hi, M, r: x.threshold_group(lo, hi, M, r, nrows, lines))


_GROUP_NOTE = ("adjacent queries per block (G = {g}): each 64-sample chunk's positions merged into their "
               "union (causal neighbours share most), 64-row key tiles cut across chunks and gathered "
               "with cp.async {st} deep, one m64n{n}k16 MMA per tile for all G queries (the filter's "
               "score path: same bits), sample bits to an [n, num_samples(L)] scratch, then the r-th "
               "best by the in-shared-memory radix select; bf16 (fp8 and a shared context: as "
               "cupy.threshold.wgmma_ws_fused)")


@register("threshold", "cupy.threshold.wgmma_ws_group", sources=("indexer",), gpu_only=True,
          notes=_GROUP_NOTE.format(g="256 / H, at most 8", st=6, n=256) + "; one block per SM")
def threshold_ws_group(source, lo, hi, M, r):
    return _threshold_group(source, lo, hi, M, r, 256, "cupy.threshold.wgmma_ws_group")


@register("threshold", "cupy.threshold.wgmma_ws_group128", sources=("indexer",), gpu_only=True,
          notes=_GROUP_NOTE.format(g="128 / H, at most 8", st=4, n=128) + "; two blocks per SM")
def threshold_ws_group128(source, lo, hi, M, r):
    return _threshold_group(source, lo, hi, M, r, 128, "cupy.threshold.wgmma_ws_group128")


@register("threshold", "cupy.threshold.wgmma_ws_group128_lines", sources=("indexer",), gpu_only=True,
          notes=_GROUP_NOTE.format(g="128 / H, at most 8", st=4, n=128) + "; two blocks per SM; copies by whole "
                "128-byte lines (a quarter warp per row; the A/B of issue 14's gather fix on the grouped design)")
def threshold_ws_group128_lines(source, lo, hi, M, r):
    return _threshold_group(source, lo, hi, M, r, 128, "cupy.threshold.wgmma_ws_group128_lines", lines=True)


def _shared_plan(source, lo, hi, M):
    """(lo0, c0, M0) when every query has the context [lo0, lo0 + c0) and M0 samples (M0 the
    contract's num_samples(c0), or 0), else None. Inside a pipeline call the host ranges
    decide (no sync); a direct stage call checks on the device (one sync)."""
    n = lo.shape[0]
    if n == 0:
        return None
    facts = _scope.current()
    if facts is not None:                            # in a pipeline call: its host ranges decide
        return facts.shared
    a, b, c, d, e, f = (int(x) for x in cp.stack([lo.min(), lo.max(), hi.min(), hi.max(), M.min(), M.max()]).get())
    if a != b or c != d or e != f:
        return None
    return a, c - a, e


def _shared_sample_scores(source, n, lo0, c0, M0):
    """[n, M0] sample scores when every query samples the same positions: the M0 sampled keys
    gathered once, scored by the dense kernel for every query (the filter's bits: the score
    of a key does not depend on where it sits)."""
    M0 = min(int(M0), int(R.num_samples(int(source.keys.shape[0]))))
    if M0 <= 0 or c0 <= 0:
        return cp.zeros((n, 0), cp.float32)
    pos = _shared_positions(lo0, c0, M0)
    keys = as_device(source.keys)[pos]
    if isinstance(source, Fp8IndexerSource):
        sub = Fp8IndexerSource(source.q, source.w, keys, as_device(source.kscale)[pos])
    else:
        sub = R.IndexerSource(source.q, source.w, keys)
    return dense_source(sub, cp.zeros(n, cp.int32), cp.full(n, M0, cp.int32))


def _shared_positions(lo0, c0, M0):
    """The shared sample positions on the device: uploaded once per selection plan (a
    pageable host copy waits for the stream, and a CUDA-graph capture forbids it)."""
    facts = _scope.current()
    key = ("shared_positions", lo0, c0, M0)
    if facts is not None and key in facts.uploads:
        return facts.uploads[key]
    pos = cp.asarray(R.sample_positions(lo0, c0, M0))
    if facts is not None:
        facts.uploads[key] = pos
    return pos


def score_only_ws(source, lo, hi, consumers=4):
    """The floor of the wgmma_ws variants: the core over every context, nothing written but
    the wrapping uint64 sum of the order keys (uint64[1], not synchronised)."""
    with launch_stream():
        x = _indexer(source, "score_only", consumers)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        x.launch_scan("score_only", x.n, (np.int32(x.n), lo, hi, checksum))
        return checksum


def _threshold_v2(source, lo, hi, M, r, swizzle, name):
    # more samples than num_samples(L) do not fit the kernel's shared memory
    return _sampled_threshold(source, lo, hi, M, r, name, WsThresholdV2Geometry.MAX_SAMPLES,
                              lambda M, lo, hi, mcap: M > mcap,
                              lambda x, lo, hi, M, r: x.threshold_v2(lo, hi, M, r, swizzle))


_V2_NOTE = ("one block per query: a producer warp steps the sample positions (no positions array, no "
            "division in the loop) and keeps 3 (2 at 8192 samples) gathered 64-row key tiles in flight with "
            "cp.async, a quarter warp per 128-byte line (the replay gather fetched every sector twice); one "
            "consumer warpgroup scores each tile with the filter's score path (same bits); the r-th best in "
            "shared memory; two blocks per SM. {layout}; bf16 (fp8 and a shared context: as "
            "cupy.threshold.wgmma_ws_fused)")


@register("threshold", "cupy.threshold.wgmma_ws_v2", sources=("indexer",), gpu_only=True,
          notes=_V2_NOTE.format(layout="Key tiles in the 128-byte swizzle (one shared-memory wavefront per "
                                       "quarter warp); D not a multiple of 64: no swizzle"))
def threshold_ws_v2(source, lo, hi, M, r):
    return _threshold_v2(source, lo, hi, M, r, True, "cupy.threshold.wgmma_ws_v2")


@register("threshold", "cupy.threshold.wgmma_ws_v2_noswizzle", sources=("indexer",), gpu_only=True,
          notes=_V2_NOTE.format(layout="Key tiles in the no-swizzle core-matrix layout of the other ws kernels "
                                       "(8 wavefronts per quarter warp)"))
def threshold_ws_v2_noswizzle(source, lo, hi, M, r):
    return _threshold_v2(source, lo, hi, M, r, False, "cupy.threshold.wgmma_ws_v2_noswizzle")
