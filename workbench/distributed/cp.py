"""Context-parallel HyTopK over the lightning indexer (issues 8, 15).

Every rank holds some query rows and a shard of the keys (see sharding.py).
The stages are the single-GPU pipeline's: ``workbench.pipeline.Backend``
picks them by input dtype (float32, bf16, fp8 e4m3 + per-key ``kscale``;
``Backend.stages_for_kind``) and hands each family its inputs as the
pipeline does (``Backend._indexer_args``), so every kernel the pipeline
gains reaches CP with no second code path. Per call, on every rank:

1. **Sampled keys first.** A query's threshold reads only its M sample keys.
   The positions come from ``reference.sample_plan``/``sample_positions``;
   the rank fetches the keys (and fp8 scales) at the union of its queries'
   sample positions from their owners (a sparse all-to-all, planned once)
   into a scratch [L, D] array, and runs the family's own threshold stage on
   it, so T is the single-process T bit for bit.
2. **Filter on a ring.** The key shards circulate (their own CUDA stream,
   comm.ring_pass); while the next shard is in flight the family's filter
   stage runs on the current one (its piece ranges shifted to start at 0),
   and the candidates are appended to a per-query buffer of the
   single-process capacity. ``count`` adds up to the true count. A query
   whose count fits the capacity has all its candidates stored; one that
   does not fails the check, exactly as on one process.
3. **Check, select, recover locally.** The number of failed queries is
   summed over the ranks, so ``fell_back`` is the single-process decision.
   Failed queries (or, after a fall-back, all of them) get their exact
   top-k from a second ring pass: the family's recovery stage on each shard,
   merged shard by shard with its select stage (top-k of a union = top-k of
   the members' top-ks; memory: rows x 2k).

Per-key preparation (the wgmma_ws core's pre-tiled keys) is made once per
arriving shard piece and released when the ring moves on (Family.release);
the whole call runs in the family's call_scope (the threshold's shared-context
fast path). The output and the statistics equal the same family's
single-process pipeline bit for bit whenever a key's score does not depend on
how the keys are blocked: the scoring cores compute each (query, key) dot
product alone, whatever tile or offset the key sits at.

Memory per rank, besides the inputs: the scratch [L, D] sample-key array
(only sampled rows written), the candidate buffer [n_local, capacity + 1],
one filter output [n_local, capacity] per shard piece at a time and two key
shards (the one filtered, the one arriving).

The host work of this rank's queries is the pipeline's ``SelectionPlan``
(issue 14: sample plan, device ranges, per-layout uploads); the per-call
driving is the ring here. Converging further means a plan whose ``run``
takes a key shard (threshold on the sample scratch, filter per piece, one
check/select/recover): then SelectionPlan's passes and lanes reach CP too.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import reference as R
from reference import validate as V

from reference import dtypes as DT

from .. import registry
from ..arrays import kind_of
from ..families import Family
from ..pipeline import Backend
from .comm import Comm, exchange, ring_pass
from .sharding import Sharding

SAMPLE_PLAN_CHUNK = 1 << 22          # sample positions materialised at a time while planning


@dataclass
class CPResult:
    """The selection of this rank's query rows (global ids ``rows``)."""
    rows: np.ndarray                 # int64 [n_local]
    idx: torch.Tensor                # int32 [n_local, k], rank order, -1 padding
    val: torch.Tensor                # float32 [n_local, k], -inf padding
    threshold: np.ndarray            # float32 [n_local]
    count: np.ndarray                # int32 [n_local]
    failed: np.ndarray               # bool [n_local]
    fell_back: bool                  # global decision (failed queries summed over ranks)
    num_samples: np.ndarray          # int32 [n_local] M
    rank: np.ndarray                 # int32 [n_local] r
    capacity: int
    failed_total: int                # failed queries over all ranks
    timings: dict = field(default_factory=dict)


def as_torch(x, device):
    """Family array (NumPy, CuPy, Numba device array, torch) -> torch tensor on ``device``, zero-copy where possible."""
    if isinstance(x, torch.Tensor):
        return x
    kind = kind_of(x)
    if kind == "numpy":
        return torch.from_numpy(np.ascontiguousarray(x)).to(device)
    if kind == "cupy":
        return torch.from_dlpack(x)
    return torch.as_tensor(x, device=device)       # __cuda_array_interface__


def union_of_samples(lo, hi, M) -> np.ndarray:
    """Sorted distinct sample positions of a set of queries (reference.sample_positions)."""
    pairs = {(int(a), int(b - a), int(m)) for a, b, m in zip(lo, hi, M) if m > 0}
    out, batch, size = [], [], 0
    for a, c, m in sorted(pairs):
        batch.append(R.sample_positions(a, c, m))
        size += m
        if size >= SAMPLE_PLAN_CHUNK:        # bound memory when contexts are all distinct
            out.append(np.unique(np.concatenate(batch)))
            batch, size = [], 0
    if batch:
        out.append(np.unique(np.concatenate(batch)))
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)


@dataclass
class _Piece:
    a: int                           # global key range [a, b)
    b: int
    off: int                         # first row in the owner's shard
    lo_rel: np.ndarray               # local queries' context clipped to the piece, shifted to 0
    hi_rel: np.ndarray
    lo_dev: object = None            # the same as family device arrays
    hi_dev: object = None

    def hits(self, rows=None) -> bool:
        lo, hi = (self.lo_rel, self.hi_rel) if rows is None else (self.lo_rel[rows], self.hi_rel[rows])
        return bool(np.any(lo < hi))


@dataclass
class CallInputs:
    """One call's inputs on this rank: torch tensors on the rank's device in the form they travel
    in (bf16 as torch.bfloat16, fp8 e4m3 as uint8 bits), the input kinds, the stage set the
    single-GPU pipeline picks for them, and q, w as the family takes them."""
    q: torch.Tensor
    w: torch.Tensor
    shard: tuple                     # (keys,) or (keys, kscale): what circulates on the ring
    dts: DT.IndexerDtypes
    stages: object                   # pipeline.StageSet
    qd: object = None                # family-native q, w
    wd: object = None


def _torch_form(x, device):
    """A torch tensor on ``device``, contiguous: NumPy uint16 bf16 bits -> torch.bfloat16,
    fp8 e4m3 -> its uint8 bits (gathers and the wire take every dtype then)."""
    if not isinstance(x, torch.Tensor):
        a = np.ascontiguousarray(x)
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
    else:
        t = x.detach()
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    return t.to(device).contiguous()


class ContextParallelHyTopK:
    """Context-parallel HyTopK for one set of context ranges, planned once, called per step.

    ``lo``/``hi`` are the global context ranges (every rank passes the same);
    ``sharding`` says which query rows and key pieces each rank holds.
    Calling it with this rank's ``q[n_local, H, D]``, ``w[n_local, H]`` and
    key shard ``keys[shard_len, D]`` (and ``kscale[shard_len]`` for fp8 e4m3
    keys; torch tensors on this rank's device, or NumPy arrays with gloo)
    returns this rank's `CPResult`. The stage set is the single-GPU
    pipeline's for the input dtype (``variants`` overrides stages as in
    ``workbench.backend``). Collective: every rank of ``group`` must call it
    together.
    """

    def __init__(self, lo, hi, k, sharding: Sharding, *, capacity=None, oversample=3.0,
                 max_failed=64, backend="reference", variants=None, group=None, device=None):
        if not isinstance(sharding, Sharding):
            raise TypeError(f"argument 'sharding' must be a Sharding, got {type(sharding).__name__}")
        n, L = sharding.n, sharding.L
        lo_h, hi_h = V.check_selection_args((n, L), lo, hi, k, capacity, oversample, max_failed)
        if backend not in registry.FAMILY_MODULES:
            raise ValueError(f"argument 'backend': unknown family {backend!r}; "
                             f"choose from {sorted(registry.FAMILY_MODULES)}")
        self.comm = Comm(group, device)
        if sharding.world_size != self.comm.world_size:
            raise ValueError(f"argument 'sharding' is for {sharding.world_size} ranks; "
                             f"the process group has {self.comm.world_size}")
        self.sharding, self.k = sharding, int(k)
        self.oversample, self.max_failed = float(oversample), int(max_failed)
        # the single-process capacity: computed over every query, not just ours
        self.capacity = R.resolve_capacity(capacity, self.k, lo_h, hi_h, self.oversample)
        self.pipeline = Backend(backend, variants)          # stage sets per dtype, dtype handling
        self.stages = self.pipeline.stages                  # float32's (bf16/fp8: stages_for_kind)
        self.family = self.pipeline.family
        self.backend = backend
        me = self.comm.rank
        self.rows = sharding.query_rows[me]
        self.lo, self.hi = lo_h[self.rows], hi_h[self.rows]
        # the single-GPU pipeline's plan of our queries (issue 14): sample plan, ranges on the
        # device, and the family's per-layout uploads (kept across calls); its capacity and passes
        # are unused: the capacity is the global one, and the ring filters all our queries at once
        self.plan = self.pipeline.plan(self.lo, self.hi, self.k, L=L, oversample=self.oversample,
                                       max_failed=self.max_failed)
        self.M, self.r = self.plan.M, self.plan.r
        self.shard_rows = [sharding.shard_len(p) for p in range(self.comm.world_size)]
        self._plan_pieces()
        self._plan_samples()
        self._scratch = None

    # ---- planning (once) -------------------------------------------------
    def _dev(self, x):
        return self.family.to_device(x)

    def _plan_pieces(self):
        lo, hi = self.lo, self.hi
        self.pieces = []
        for p in range(self.comm.world_size):
            mine = []
            for a, b, off in self.sharding.piece_offsets(p):
                lo_rel = (np.clip(lo, a, b) - a).astype(np.int32)
                hi_rel = (np.clip(hi, a, b) - a).astype(np.int32)
                piece = _Piece(a, b, off, lo_rel, hi_rel)
                piece.lo_dev, piece.hi_dev = self._dev(lo_rel), self._dev(hi_rel)
                mine.append(piece)
            self.pieces.append(mine)
        pl = self.plan
        self.lo_dev, self.hi_dev, self.M_dev, self.r_dev = pl.lo_d, pl.hi_d, pl.M_d, pl.r_d

    def _plan_samples(self):
        """Who sends which key rows to whom, per call, for the thresholds."""
        comm, P, dev = self.comm, self.comm.world_size, self.comm.device
        pos = union_of_samples(self.lo, self.hi, self.M)
        owner, row = self.sharding.owner_of(pos)
        self.sample_pos = [torch.as_tensor(pos[owner == o], device=dev) for o in range(P)]
        want = [torch.as_tensor(row[owner == o], device=dev) for o in range(P)]
        counts = comm.all_gather_counts([w.numel() for w in want])          # [requester, owner]
        got = exchange(comm, want, [(int(counts[p, comm.rank]),) for p in range(P)], torch.int64)
        self.serve_rows = got        # serve_rows[p]: rows of my shard that rank p needs
        self.samples_fetched = int(pos.size)

    # ---- one call ----------------------------------------------------------
    def prepare(self, q, w, keys, kscale=None) -> CallInputs:
        """This rank's inputs checked (the pipeline's dtype rules), on its device, with their stage set."""
        n_loc, H, D, Ls, dts = DT.check_indexer_args(q, w, keys, kscale)
        if n_loc != len(self.rows):
            raise ValueError(f"argument 'q' has {n_loc} query rows; this rank holds {len(self.rows)}")
        if Ls != self.shard_rows[self.comm.rank]:
            raise ValueError(f"argument 'keys' has {Ls} rows; this rank's shard has "
                             f"{self.shard_rows[self.comm.rank]}")
        dev = self.comm.device
        q, w = _torch_form(q, dev), _torch_form(w, dev)
        shard = self.shard_form(keys, kscale)
        keys = shard[0]
        call = CallInputs(q, w, shard, dts, self.pipeline.stages_for_kind(dts.kind))
        call.qd, call.wd, _, _ = self._family_args(call, keys[:1], None if kscale is None else shard[1][:1],
                                                   call.q, call.w)
        return call

    def shard_form(self, keys, kscale=None) -> tuple:
        """A key shard (and its fp8 scales) in the form it circulates in: (keys,) or (keys, kscale)."""
        dev = self.comm.device
        return (_torch_form(keys, dev),) if kscale is None else (_torch_form(keys, dev), _torch_form(kscale, dev))

    def _family_args(self, call, keys, kscale, q=None, w=None):
        """(q, w, keys, kscale) as the family takes them (Backend._indexer_args: the pipeline's rules).
        Without q/w only keys/kscale are wanted: one query row rides along (no empty arrays)."""
        q = call.q[:1] if q is None else q
        w = call.w[:1] if w is None else w
        return self.pipeline._indexer_args(q, w, keys, kscale, call.dts)

    def _source(self, call, keys, kscale):
        """The score source of the local queries over ``keys`` (a shard piece or the sample scratch)."""
        _, _, kd, sd = self._family_args(call, keys, kscale)
        return self.pipeline._source(call.qd, call.wd, kd, sd)

    def scope(self):
        """The family's call scope over this rank's queries (what the pipeline opens per call)."""
        return self.family.call_scope(self.lo, self.hi, self.M, uploads=self.plan.uploads)

    def __call__(self, q, w, keys, kscale=None) -> CPResult:
        # Every family launches on PyTorch's current stream, so its kernels, our torch
        # ops and the NCCL waits (which make that stream wait) are ordered.
        call = self.prepare(q, w, keys, kscale)
        with self.scope():
            return self._run(call)

    def _run(self, call) -> CPResult:
        times, clock = {}, _Clock(self.comm.device)
        T = self.threshold(call)
        times["threshold_s"] = clock.lap()
        cand_idx, cand_val, count = self.filter_ring(call, T)
        times["filter_ring_s"] = clock.lap()
        st = call.stages
        count_dev = self._dev(count)
        failed, rows = st.check(count_dev, self.lo_dev, self.hi_dev, self.k, self.capacity)
        # the select runs on a lane while the host waits for the check and every rank's failure
        # count (a fallback discards it: every query then takes the exact ring)
        with self.family.lanes(1) as (lane,):
            with lane:
                sel = st.select(self._dev(cand_idx), self._dev(cand_val), count_dev, self.k)
            failed = self.family.to_host(failed).astype(bool)
            rows_h = self.family.to_host(rows).astype(np.int64)
            total = self.comm.all_sum(rows_h.size)
        fell_back = total > self.max_failed
        dev = self.comm.device
        if fell_back:
            idx, val = self.exact_ring(call, np.arange(len(self.rows)), max(1, self.max_failed))
        else:
            idx, val = as_torch(sel[0], dev), as_torch(sel[1], dev)
            if total:                       # every rank joins the ring, failed rows or not
                ridx, rval = self.exact_ring(call, np.sort(rows_h), max(1, rows_h.size))
                sel = torch.as_tensor(np.sort(rows_h), device=dev)
                idx[sel], val[sel] = ridx, rval
        times["select_recover_s"] = clock.lap()
        T_h = self.family.to_host(T).astype(np.float32)
        return CPResult(self.rows, idx, val, T_h, count.cpu().numpy().astype(np.int32), failed,
                        bool(fell_back), self.M, self.r, self.capacity, int(total), times)

    # ---- stages ------------------------------------------------------------
    def fetch_samples(self, call) -> tuple:
        """Scratch [L, D] keys (and [L] scales) holding every sample position our queries read."""
        comm, P = self.comm, self.comm.world_size
        want = tuple((t.dtype, tuple(t.shape[1:])) for t in call.shard)
        if self._scratch is None or tuple((t.dtype, tuple(t.shape[1:])) for t in self._scratch) != want:
            self._scratch = tuple(torch.zeros((self.sharding.L,) + shape, dtype=dt, device=comm.device)
                                  for dt, shape in want)
        for part, scratch in zip(call.shard, self._scratch):
            send = [part[self.serve_rows[p]] for p in range(P)]
            got = exchange(comm, send, [(p.numel(),) + tuple(part.shape[1:]) for p in self.sample_pos], part.dtype)
            for o in range(P):
                if got[o].shape[0]:
                    scratch[self.sample_pos[o]] = got[o]
        return self._scratch

    def threshold(self, call):
        sampled = self.fetch_samples(call)
        src = self._source(call, sampled[0], sampled[1] if len(sampled) > 1 else None)
        return call.stages.threshold(src, self.lo_dev, self.hi_dev, self.M_dev, self.r_dev)

    def _piece_sources(self, call, owner, shard, rows=None):
        """[(piece, source)] of the pieces of ``owner``'s shard that some local query (of ``rows``) reads."""
        parts = shard if isinstance(shard, tuple) else (shard,)
        out = []
        for pc in self.pieces[owner]:
            if not pc.hits(rows):
                continue
            cut = [t[pc.off:pc.off + pc.b - pc.a] for t in parts]
            out.append((pc, self._source(call, cut[0], cut[1] if len(cut) > 1 else None)))
        return out

    @contextlib.contextmanager
    def _shard_sources(self, call, owner, shard, rows=None):
        """The piece sources of a shard on the ring; what the family prepared from their keys
        (the wgmma_ws core's layout copy, made once per piece) is released when the ring moves
        on (Family.release), so a rank never holds the layout of every shard at once."""
        sources = self._piece_sources(call, owner, shard, rows)
        try:
            yield sources
        finally:
            for _, src in sources:
                self.family.release(src.keys)

    def filter_ring(self, call, T, *, exchange_keys=True, shards=None, events=None):
        """Candidates of every local query over every shard: (idx, val [n, capacity], count int32 [n])."""
        n, cap, dev = len(self.rows), self.capacity, self.comm.device
        on_device = dev.type == "cuda" and type(self.family).append_rows is not Family.append_rows
        buf = _Appender(n, cap, dev, self.family if on_device else None)

        pending = []       # torch path: a piece's output is appended once the next piece's filter is queued

        def on_shard(owner, shard):
            with self._shard_sources(call, owner, shard) as sources:
                for pc, src in sources:
                    ci, cv, cnt = call.stages.filter(src, pc.lo_dev, pc.hi_dev, T, cap)
                    if on_device:           # the family's append kernel: no host sync, no torch temporaries
                        buf.append(as_torch(ci, dev), as_torch(cv, dev), as_torch(cnt, dev), offset=pc.a)
                        continue
                    pending.append(_Pending(as_torch(ci, dev), as_torch(cv, dev), as_torch(cnt, dev), pc.a))
                    while len(pending) > 1:
                        pending.pop(0).into(buf)

        ring_pass(self.comm, call.shard, self.shard_rows, on_shard,
                  exchange_keys=exchange_keys, shards=shards, events=events)
        while pending:
            pending.pop(0).into(buf)
        idx, val = buf.result()
        return idx, val, buf.total.to(torch.int32)

    def exact_ring(self, call, rows, chunk):
        """Exact top-k of the local query rows ``rows`` over their whole contexts (a ring pass)."""
        k, dev = self.k, self.comm.device
        rows = np.asarray(rows, np.int64)
        run_idx = torch.full((rows.size, k), -1, dtype=torch.int32, device=dev)
        run_val = torch.full((rows.size, k), -np.inf, dtype=torch.float32, device=dev)
        run_cnt = torch.zeros(rows.size, dtype=torch.int64, device=dev)
        st = call.stages

        def on_shard(owner, shard):
            with self._shard_sources(call, owner, shard, rows) as sources:   # every chunk: one preparation
                for pc, src in sources:
                    for c0 in range(0, rows.size, chunk):
                        sub = rows[c0:c0 + chunk]
                        if not pc.hits(sub):
                            continue
                        pidx, pval = st.recover(src, pc.lo_dev, pc.hi_dev, self._dev(sub.astype(np.int32)), k)
                        pidx, pval = as_torch(pidx, dev), as_torch(pval, dev)
                        s = slice(c0, c0 + sub.size)
                        merged = _Appender(sub.size, 2 * k, dev)
                        merged.append(run_idx[s], run_val[s], run_cnt[s])
                        merged.append(torch.where(pidx >= 0, pidx + pc.a, pidx), pval, (pidx >= 0).sum(1))
                        cidx, cval = merged.result()
                        nidx, nval = st.select(self._dev(cidx), self._dev(cval),
                                               self._dev(merged.total.to(torch.int32)), k)
                        run_idx[s], run_val[s] = as_torch(nidx, dev), as_torch(nval, dev)
                        run_cnt[s] = torch.clamp(merged.total, max=k)

        ring_pass(self.comm, call.shard, self.shard_rows, on_shard)
        return run_idx, run_val


class _Appender:
    """Per-row buffers of ``width`` slots that new entries are appended to.

    Entry j of row t of a batch is meaningful when j < min(count[t], its width);
    it lands in slot stored[t] + j, or in a trash column past the end when
    that is full (one scatter, no host sync). With a ``family`` whose append_rows
    kernel does it (CuPy), one launch per batch and no trash column; then slots
    past min(total, width) stay unset, and stored == min(total, width) per row."""

    def __init__(self, n, width, device, family=None):
        self.width, self.family = width, family
        if family is not None:              # the family's kernel: no trash column, and slots past
            self.idx = torch.empty((n, width), dtype=torch.int32, device=device)    # stored are never read
            self.val = torch.empty((n, width), dtype=torch.float32, device=device)
        else:
            self.idx = torch.full((n, width + 1), -1, dtype=torch.int32, device=device)
            self.val = torch.full((n, width + 1), -np.inf, dtype=torch.float32, device=device)
        self.stored = torch.zeros(n, dtype=torch.int64, device=device)
        self.total = torch.zeros(n, dtype=torch.int64, device=device)

    def append(self, idx, val, count, *, offset=0, limit=None):
        """``offset`` is added to the stored indices; ``limit`` (a host int) bounds every row's
        meaningful entries, so only that many columns are read (the filter's capacity is
        mostly padding)."""
        if self.family is not None and limit is None and \
                self.family.append_rows(self.idx, self.val, self.width, self.stored, self.total, idx, val, count, offset):
            return                          # one kernel, reading only the stored entries
        count = count.to(torch.int64)
        self.total = self.total + count
        cols = idx.shape[1] if limit is None else max(0, min(int(limit), idx.shape[1]))
        if cols == 0 or idx.shape[0] == 0:
            return
        idx, val = idx[:, :cols], val[:, :cols]
        j = torch.arange(cols, device=idx.device)
        dest = self.stored[:, None] + j[None, :]
        ok = (j[None, :] < torch.clamp(count, max=cols)[:, None]) & (dest < self.width)
        dest = torch.where(ok, dest, torch.full_like(dest, self.width))
        self.idx.scatter_(1, dest, idx.to(torch.int32) + offset if offset else idx.to(torch.int32))
        self.val.scatter_(1, dest, val.to(torch.float32))
        self.stored = torch.clamp(self.stored + ok.sum(1), max=self.width)

    def result(self):
        if self.family is not None:         # slots past min(total, width) unset: a select reads none
            return self.idx, self.val
        return self.idx[:, :self.width].contiguous(), self.val[:, :self.width].contiguous()


class _Pending:
    """A filter output waiting to be appended, with the largest count of its rows on its way to
    the host (an async copy + event): the append reads only that many columns, and reading the
    bound waits for this filter alone, not for the ones queued after it."""

    def __init__(self, idx, val, count, offset):
        self.idx, self.val, self.count, self.offset = idx, val, count, offset
        if count.numel() == 0:
            self.limit, self.ready = torch.zeros((), dtype=torch.int64), None
            return
        bound = torch.clamp(count, max=idx.shape[1]).max()
        if bound.device.type == "cuda":
            self.limit = bound.to("cpu", non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.limit, self.ready = bound, None

    def into(self, buf: "_Appender"):
        if self.ready is not None:
            self.ready.synchronize()
        buf.append(self.idx, self.val, self.count, offset=self.offset, limit=int(self.limit))


class _Clock:
    """Wall-clock laps (synchronising the GPU first, so a lap covers its kernels)."""

    def __init__(self, device):
        self.device = device
        self.t = time.perf_counter()

    def lap(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


def gather_result(res: CPResult, sharding: Sharding, *, dst=0, group=None):
    """Assemble the global ``reference.HyTopKResult`` on rank ``dst`` (None elsewhere).

    ``fell_back`` and ``capacity`` are global already; the per-query arrays are
    put back in global query order. Collective."""
    import torch.distributed as dist
    part = dict(rows=res.rows, idx=res.idx.cpu().numpy(), val=res.val.cpu().numpy(),
                threshold=res.threshold, count=res.count, failed=res.failed,
                M=res.num_samples, r=res.rank, fell_back=res.fell_back, capacity=res.capacity)
    me = dist.get_rank(group)
    parts = [None] * dist.get_world_size(group) if me == dst else None
    dist.gather_object(part, parts, dst=dst, group=group)
    if me != dst:
        return None
    n, k = sharding.n, res.idx.shape[1]
    out = R.HyTopKResult(np.full((n, k), -1, np.int32), np.full((n, k), -np.inf, np.float32),
                         np.full(n, np.nan, np.float32), np.zeros(n, np.int32), np.zeros(n, bool),
                         False, np.zeros(n, np.int32), np.zeros(n, np.int32), res.capacity)
    for p in parts:
        rows = p["rows"]
        out.idx[rows], out.val[rows], out.threshold[rows] = p["idx"], p["val"], p["threshold"]
        out.count[rows], out.failed[rows] = p["count"], p["failed"]
        out.num_samples[rows], out.rank[rows] = p["M"], p["r"]
    if len({(p["fell_back"], p["capacity"]) for p in parts}) != 1:
        raise RuntimeError("ranks disagree on fell_back/capacity: " +
                           str([(p["fell_back"], p["capacity"]) for p in parts]))
    out.fell_back = parts[0]["fell_back"]
    return out
