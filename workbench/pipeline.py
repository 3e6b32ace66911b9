"""One HyTopK driver for every family: the stages of docs/CONTRACT.md §3 wired together.

Each family supplies stage variants (see `registry.STAGES`) and array moves
(`families.Family`); this module runs them in order, exactly like
`reference.run_stages`, so a family never re-implements the control flow.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields

import numpy as np

import reference as R
from reference import dtypes as DT
from reference import validate as V
from reference.fp8 import e4m3_bits_to_float32

from . import registry
from .arrays import common_kind, to_kind, to_numpy
from .bf16 import bf16_bits_to_float32
from .families import Family, get_family

STAGE_ORDER = ("threshold", "filter", "check", "select", "recover")


@dataclass
class StageSet:
    family: Family
    threshold: registry.Variant
    filter: registry.Variant
    check: registry.Variant
    select: registry.Variant
    recover: registry.Variant
    dense: registry.Variant | None = None
    replay: registry.Variant | None = None


def stage_set(family: str, chosen: dict | None = None, bf16: bool = False, kind: str | None = None) -> StageSet:
    """The family's default variant per stage, overridden by ``chosen``: its record's stage set
    for the input kind (``kind`` "float32" | "bf16" | "fp8", or ``bf16=True``; reference.dtypes:
    the input kinds), the float32 one where it has none for that kind (Family.stage_defaults)."""
    fam = get_family(family)
    kind = kind or ("bf16" if bf16 else "float32")
    defaults = fam.stage_defaults(kind)
    for stage, name in (chosen or {}).items():
        if stage not in registry.STAGES:
            raise ValueError(f"argument 'variants': unknown stage {stage!r}; stages are {sorted(registry.STAGES)}")
        v = registry.get(name)
        if v.stage != stage or v.family != family:
            raise ValueError(f"argument 'variants': {name!r} is a {v.family} {v.stage} variant, "
                             f"not a {family} {stage} variant")
    defaults.update(chosen or {})
    picked = {}
    for stage in (f.name for f in fields(StageSet) if f.name != "family"):   # the pipeline's stages only
        name = defaults.get(stage)
        if name is None:
            cands = [v for v in registry.variants(stage, family) if not v.gpu_only] or \
                registry.variants(stage, family)
            picked[stage] = cands[0] if cands else None
        else:
            picked[stage] = registry.get(name)
    return StageSet(fam, **picked)


SCRATCH_BYTES = 26 << 20      # default bound on one pass's selection scratch (see query_chunk_for): 2 lanes of
                              # it measured 0.028-0.034 of the 128K table with 32 MiB, so this keeps the peak under 1/32
SCRATCH_PER_TABLE = 40        # ... or table / (40 x lanes) per pass where that is more (peak < table / 32)
SCRATCH_CAP = 1 << 30         # ... but never more than this per pass


def pass_scratch_bytes(n: int, L: int, lanes: int = 2) -> int:
    """One pass's scratch budget: SCRATCH_BYTES, or more on large problems, where a fixed
    budget means hundreds of passes (127 at 32768 x 256K) whose launches and host work add
    up: the [n, L] float32 table's bytes / SCRATCH_PER_TABLE, split over the lanes that run
    at once (so the peak stays under 1/32 of the table HyTopK never writes), at most SCRATCH_CAP."""
    share = (4 * int(n) * int(L)) // (SCRATCH_PER_TABLE * max(1, int(lanes)))
    return int(max(SCRATCH_BYTES, min(SCRATCH_CAP, share)))


def check_query_chunk(query_chunk):
    if isinstance(query_chunk, bool) or not isinstance(query_chunk, (int, np.integer)) or query_chunk < 1:
        raise ValueError(f"argument 'query_chunk' must be a positive int, got {query_chunk!r}")
    return int(query_chunk)


def query_chunk_for(n: int, capacity: int, m_max: int, query_chunk=None, k: int = 0, scratch_bytes=None) -> int:
    """Queries per pass. ``query_chunk`` if given; else as many as keep a pass's scratch
    (the candidate buffer, capacity x 8 B per query, the sampled scores and positions,
    M x 8 B, and the pass's selection, k x 8 B) within ``scratch_bytes`` (default
    SCRATCH_BYTES; see pass_scratch_bytes), spread evenly over
    the passes and rounded up to a multiple of 8 (the tiled kernels take 4 or 8 queries
    per block) where that still fits."""
    if query_chunk is not None:
        return check_query_chunk(query_chunk)
    per_query = 8 * int(capacity) + 8 * int(m_max) + 8 * int(k) + 16
    fit = max(1, int(SCRATCH_BYTES if scratch_bytes is None else scratch_bytes) // per_query)
    if fit >= n:
        return max(1, n)
    passes = -(-n // fit)
    even = -(-n // passes)
    return min(fit, -(-even // 8) * 8) if fit >= 8 else fit


def _spans(n: int, chunk: int) -> list:
    return [(a, min(n, a + chunk)) for a in range(0, n, chunk)] or [(0, 0)]


def _rows(source, a, b):
    """The score source of queries a .. b-1 (row slices: views, no copies)."""
    if isinstance(source, R.TableSource):
        return R.TableSource(source.scores[a:b])
    if isinstance(source, R.Fp8IndexerSource):
        return R.Fp8IndexerSource(source.q[a:b], source.w[a:b], source.keys, source.kscale)
    return R.IndexerSource(source.q[a:b], source.w[a:b], source.keys)


class SelectionPlan:
    """The host work of one selection layout, done once; each call only launches kernels.

    ``backend.plan(lo, hi, k, ...)`` validates the ranges and arguments, computes the sample
    plan (M, r), the capacity and the passes, and puts lo/hi/M/r on the device. Calling the
    plan with ``(q, w, keys[, kscale])`` (or ``plan.table(scores)``) runs threshold, filter and
    select of every pass with no wait for the GPU, then the check and the recovery:

    - eager (``capture_safe=False``): the check's failed count comes to the host (the one
      sync) and only the failed queries are recovered;
    - ``capture_safe=True`` (default while torch captures a CUDA graph): nothing waits for or
      reads from the host; the family checks, recovers up to ``max_failed`` queries and runs
      the fallback in fixed-size launches on the device (Family.recover_on_device).

    Both give the same bits. A plan is tied to the values of lo and hi it was made with and
    to n; it takes any key count L >= max(hi) and any input dtype (the stage set follows it).
    """

    def __init__(self, backend: "Backend", lo, hi, k, *, L=None, capacity=None, oversample=3.0, max_failed=64,
                 query_chunk=None, lanes=2, thresholds_first=True):
        lo_h, hi_h = V.check_ranges(lo, hi, None, L)
        self.n = int(lo_h.shape[0])
        self.max_hi = int(hi_h.max()) if self.n else 0
        self.L = self.max_hi if L is None else int(L)
        V.check_selection_args((self.n, self.L), lo_h, hi_h, k, capacity, oversample, max_failed)
        if query_chunk is not None:
            check_query_chunk(query_chunk)
        self.backend, self.family = backend, backend.family
        self.k, self.oversample, self.max_failed = int(k), float(oversample), int(max_failed)
        self.lo_h, self.hi_h = lo_h, hi_h
        self.capacity = R.resolve_capacity(capacity, self.k, lo_h, hi_h, self.oversample)
        self.M, self.r = R.sample_plan(lo_h, hi_h, self.k, self.oversample)
        c_max = int((hi_h - lo_h).max()) if self.n else 0
        budget, m_max = pass_scratch_bytes(self.n, self.L, lanes), int(R.num_samples(c_max))
        # thresholds_first: every query's threshold before the passes (in chunks whose sampled
        # scores fit the budget; one launch when the threshold keeps its samples on chip), so the
        # passes hold only candidates and selections: larger passes, no threshold tail per pass
        self.thresholds_first = bool(thresholds_first)
        chunk = query_chunk_for(self.n, self.capacity, 0 if self.thresholds_first else m_max, query_chunk,
                                self.k, budget)
        self.passes = _spans(self.n, chunk)
        self.threshold_spans = _spans(self.n, max(1, budget // (8 * max(1, m_max) + 16)))
        self.lanes = max(1, int(lanes)) if len(self.passes) > 1 else 1
        fam = self.family
        # host arrays go to the device once (a copy from pageable memory waits for the stream)
        self.lo_d, self.hi_d = fam.to_device(lo_h.astype(np.int32)), fam.to_device(hi_h.astype(np.int32))
        self.M_d, self.r_d = fam.to_device(self.M), fam.to_device(self.r)
        self.uploads: dict = {}                 # the family's device constants of this layout (call_scope)

    def __repr__(self):
        return (f"SelectionPlan({self.backend.name!r}, n={self.n}, k={self.k}, capacity={self.capacity}, "
                f"passes={len(self.passes)}, max_failed={self.max_failed})")

    # ---- calls -------------------------------------------------------------
    def __call__(self, q, w, keys, *, kscale=None, capture_safe=None) -> "PlanResult":
        b = self.backend
        n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
        self._check_inputs(("q", n), ("keys", L))
        src = b._source(*b._indexer_args(q, w, keys, kscale, dts))
        return self.run(b.stages_for_kind(dts.kind), src, capture_safe)

    def table(self, scores, *, capture_safe=None) -> "PlanResult":
        n, L = V.check_scores(scores)
        self._check_inputs(("scores", n), ("scores", L))
        (s,) = self.backend._dev(("scores", self.backend._table(scores)))      # bf16: as the family takes it
        return self.run(self.backend.stages, R.TableSource(s), capture_safe)

    def _check_inputs(self, rows, keys):
        (rname, n), (kname, L) = rows, keys
        if n != self.n:
            raise ValueError(f"argument '{rname}' has {n} query rows; this plan was made for n = {self.n} "
                             f"(make a plan for the new layout: backend.plan(lo, hi, k, ...))")
        if L < self.max_hi:
            raise ValueError(f"argument '{kname}' has L = {L} keys; this plan's contexts reach hi = {self.max_hi}")

    def run(self, st: StageSet, source, capture_safe=None) -> "PlanResult":
        """The stages on a family-native source (no argument checks: __call__ and table do them)."""
        fam = st.family
        if capture_safe is None:
            capture_safe = _torch_capturing()
        if capture_safe and not fam.capture_safe:
            raise RuntimeError(f"family {fam.name!r} cannot run a selection without host syncs "
                               f"(CUDA-graph capture); use the 'cupy' backend")
        with fam.call_scope(self.lo_h, self.hi_h, self.M, uploads=self.uploads):
            T, count, idx, val = self._passes(st, source)
            if capture_safe:
                failed, fell_back, nfailed = fam.recover_on_device(
                    st.recover, source, self.lo_d, self.hi_d, count, self.k, self.capacity, self.max_failed, idx, val)
                return PlanResult(self, idx, val, T, count, failed, fell_back, nfailed)
            failed, fell_back, nfailed = self._recover(st, source, count, idx, val)
            return PlanResult(self, idx, val, T, count, failed, fell_back, nfailed)

    def _passes(self, st, source):
        """Threshold, filter and select of every pass, round-robin over the family's lanes
        (streams), no wait for the GPU; each pass's rows placed into the full outputs."""
        fam = st.family
        T = self._thresholds(st, source) if self.thresholds_first else None
        if len(self.passes) == 1:
            return _select_pass(st, source, self.lo_d, self.hi_d, self.M_d, self.r_d, self.k, self.capacity, T)
        n = self.n
        idx, val = fam.empty_selection(n, self.k)
        count = fam.empty((n,), np.int32)
        T_all = fam.empty((n,), np.float32) if T is None else T

        def one(a, b):
            part_src = _rows(source, a, b)
            out = _select_pass(st, part_src, self.lo_d[a:b], self.hi_d[a:b], self.M_d[a:b],
                               self.r_d[a:b], self.k, self.capacity, None if T is None else T[a:b])
            for dst, part in zip((T_all, count, idx, val), out):
                if dst is not T:
                    fam.place(dst, a, part)
            del out                                # this pass's scratch goes back to the pool,
            fam.release(getattr(part_src, "q", None))    # and what the family prepared from its rows
        # the first pass on the launch stream: what it prepares for the whole call (keys in a core's
        # layout, uploads) is then ready before the lanes fork from that stream
        one(*self.passes[0])
        with fam.lanes(self.lanes) as lanes:
            for p, (a, b) in enumerate(self.passes[1:]):
                with lanes[p % len(lanes)]:
                    one(a, b)
        return T_all, count, idx, val

    def _thresholds(self, st, source):
        """Every query's threshold, in spans whose sampled scores fit one pass's budget."""
        spans = self.threshold_spans
        if len(spans) == 1:
            return st.threshold(source, self.lo_d, self.hi_d, self.M_d, self.r_d)
        T = st.family.empty((self.n,), np.float32)
        for a, b in spans:
            part_src = _rows(source, a, b)
            st.family.place(T, a, st.threshold(part_src, self.lo_d[a:b], self.hi_d[a:b], self.M_d[a:b], self.r_d[a:b]))
            st.family.release(getattr(part_src, "q", None))
        return T

    def _recover(self, st, source, count, idx, val):
        """The eager check (the one host sync) and the recovery of the failed queries, at most
        max_failed rows per recovery call (more than max_failed: every query, CONTRACT.md §3.7)."""
        fam = st.family
        failed, rows = st.check(count, self.lo_d, self.hi_d, self.k, self.capacity)
        redo = np.asarray(fam.to_host(rows), np.int32)
        nfailed = int(redo.size)
        fell_back = redo.size > self.max_failed
        if fell_back:
            redo = np.arange(self.n, dtype=np.int32)
        step = max(1, self.max_failed)
        for s in range(0, redo.size, step):
            part = fam.to_device(redo[s:s + step])
            ridx, rval = st.recover(source, self.lo_d, self.hi_d, part, self.k)
            fam.scatter_rows(idx, val, part, ridx, rval)
        return failed, fell_back, nfailed


@dataclass
class PlanResult:
    """A plan call's result: idx/val and the statistics as family-native device arrays (nothing
    copied to the host); ``host()`` gives the reference.HyTopKResult. ``fell_back`` and
    ``nfailed`` are host values after an eager call, device arrays after a capture-safe one."""
    plan: SelectionPlan
    idx: object
    val: object
    threshold: object
    count: object
    failed: object
    fell_back: object
    nfailed: object

    def host(self) -> R.HyTopKResult:
        fam, p = self.plan.family, self.plan
        fell_back = self.fell_back if isinstance(self.fell_back, bool) else bool(fam.to_host(self.fell_back)[0])
        return R.HyTopKResult(self.idx, self.val, fam.to_host(self.threshold).astype(np.float32),
                              fam.to_host(self.count).astype(np.int32), fam.to_host(self.failed).astype(bool),
                              fell_back, p.M, p.r, int(p.capacity))


def _torch_capturing() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
                and torch.cuda.is_current_stream_capturing())


def _select_pass(st, source, lo, hi, M, r, k, capacity, T=None):
    """Threshold (unless given), filter and exact select of one pass's queries (the driver adds
    no wait): (T, count, idx, val). The select of a query that failed the check is replaced
    by its recovery afterwards."""
    if T is None:
        T = st.threshold(source, lo, hi, M, r)
    cand_idx, cand_val, count = st.filter(source, lo, hi, T, capacity)
    idx, val = st.select(cand_idx, cand_val, count, k)
    return T, count, idx, val


class Backend:
    """The reference's public API on one family's kernels.

    Accepts host NumPy arrays (copied in, results copied back) or device
    arrays (CuPy, torch CUDA tensors, Numba device arrays: zero-copy) and
    returns results of the same kind as its inputs. q/keys float32, bf16 or fp8 e4m3
    (+ ``kscale``), w float32 or bf16 (reference.dtypes); see ``_indexer_args`` for
    what each family is handed.
    """

    def __init__(self, family: str, chosen: dict | None = None):
        self.name = family
        self.chosen = chosen
        self.stages = stage_set(family, chosen)
        self.family = self.stages.family
        ok, why = self.family.available()
        if not ok:                              # say what to do now, not at the first launch
            raise RuntimeError(f"backend {family!r} is unavailable here: {why}")
        self._kind_stages = {"float32": self.stages}
        self._plans: dict = {}

    def stages_for(self, x) -> StageSet:
        """The stage set for inputs like ``x``: DEFAULTS_BF16 for bf16 (torch.bfloat16 / uint16 bits),
        DEFAULTS_FP8 for fp8 e4m3 (torch.float8_e4m3fn / uint8 bits), where the family has them."""
        return self._stages_for_dtype(V.dtype_name(x))

    def _stages_for_dtype(self, dtype: str) -> StageSet:
        return self.stages_for_kind(DT.Q_DTYPES.get(dtype, "float32"))

    def stages_for_kind(self, kind: str) -> StageSet:
        if kind not in self._kind_stages:
            self._kind_stages[kind] = stage_set(self.name, self.chosen, kind=kind)
        return self._kind_stages[kind]

    order_keys = staticmethod(R.order_keys)

    def __repr__(self):
        def names(st):
            return {s: getattr(st, s).name for s in registry.STAGES if getattr(st, s)}
        f32 = names(self.stages)
        extra = ""
        for kind in ("bf16", "fp8"):
            other = names(self.stages_for_kind(kind))
            if other != f32:
                extra += f", {kind}={ {s: n for s, n in other.items() if f32.get(s) != n} }"
        return f"Backend({self.name!r}, {f32}{extra})"

    def _dev(self, *xs):
        out = []
        for name, x in xs:
            if hasattr(x, "__cuda_array_interface__") or type(x).__module__.startswith("cupy"):
                V.check_contiguous(name, x)
            if V.dtype_name(x) == "uint16" and not self.family.takes_bf16_bits:
                x = bf16_bits_to_float32(x)          # raw bf16 bits: exact widening for float32 families
            out.append(self.family.to_device(x))
        return out

    def _indexer_args(self, q, w, keys, kscale, dts):
        """(q, w, keys, kscale) as the family takes them, on its device. Every widening is exact:
        bf16 w with float32 q/keys or fp8 q/keys -> float32 (one weight dtype per core); bf16 q/keys
        (and w) -> float32 for families without bf16 kernels; fp8: torch.float8_e4m3fn viewed as its
        uint8 bits for families that read e4m3 bits (``takes_fp8_bits``: the CuPy wgmma core, the
        reference), else decoded to float32 values (Numba), kscale passed beside. float32 w with bf16
        or fp8 q/keys is passed through unchanged."""
        fam = self.family
        if dts.w == "bf16" and (dts.kind != "bf16" or not fam.takes_bf16_bits):
            w = _widen_bf16(w)
        if dts.kind == "bf16" and not fam.takes_bf16_bits:
            q, keys = _widen_bf16(q), _widen_bf16(keys)
        if dts.kind == "fp8":
            conv = _fp8_bits if getattr(fam, "takes_fp8_bits", True) else _fp8_values
            q, keys = conv(q), conv(keys)
        args = self._dev(("q", q), ("w", w), ("keys", keys))
        return (*args, self._dev(("kscale", kscale))[0] if dts.kind == "fp8" else None)

    def _source(self, q, w, keys, kscale):
        return R.Fp8IndexerSource(q, w, keys, kscale) if kscale is not None else R.IndexerSource(q, w, keys)

    def _out(self, x, kind):
        """A result back in the caller's kind; host copies go through the family (its stream)."""
        return self.family.to_host(x) if kind == "numpy" else to_kind(x, kind)

    def _check_select(self, shape, lo, hi, k, capacity, oversample, max_failed, query_chunk):
        """Every argument of a selection, before anything moves to the device: host (lo, hi)."""
        lo_h, hi_h = V.check_selection_args(shape, lo, hi, k, capacity, oversample, max_failed)
        if query_chunk is not None:
            check_query_chunk(query_chunk)
        return lo_h, hi_h

    def plan(self, lo, hi, k, *, L=None, capacity=None, oversample=3.0, max_failed=64, query_chunk=None,
             lanes=2, thresholds_first=True) -> SelectionPlan:
        """The host work of a selection layout, once (SelectionPlan): call the plan with
        (q, w, keys[, kscale]) or plan.table(scores) per step. ``L``: the key count the ranges
        are checked against (default max(hi); a call takes any L >= max(hi)). ``thresholds_first``:
        every query's threshold before the passes (False: each pass samples its own; same result)."""
        return SelectionPlan(self, lo, hi, k, L=L, capacity=capacity, oversample=oversample,
                             max_failed=max_failed, query_chunk=query_chunk, lanes=lanes,
                             thresholds_first=thresholds_first)

    def _plan_for(self, lo_h, hi_h, L, k, capacity, oversample, max_failed, query_chunk) -> SelectionPlan:
        """A cached plan for host ranges (the last few layouts, keyed by their bytes)."""
        key = (lo_h.tobytes(), hi_h.tobytes(), int(L), int(k), capacity, float(oversample), int(max_failed),
               query_chunk)
        plan = self._plans.pop(key, None)
        if plan is None:
            plan = self.plan(lo_h, hi_h, k, L=L, capacity=capacity, oversample=oversample, max_failed=max_failed,
                             query_chunk=query_chunk)
        self._plans[key] = plan
        while len(self._plans) > self.PLANS_KEPT:
            self._plans.pop(next(iter(self._plans)))
        return plan

    PLANS_KEPT = 4

    def _select(self, source, lo_h, hi_h, L, k, capacity, oversample, max_failed, query_chunk, kind, stages=None):
        plan = self._plan_for(lo_h, hi_h, L, k, capacity, oversample, max_failed, query_chunk)
        res = plan.run(stages or self.stages, source, capture_safe=False).host()
        res.idx, res.val = self._out(res.idx, kind), self._out(res.val, kind)
        return res

    def _table(self, scores):
        """A float32 or bf16 table as the family takes it: bf16 (torch.bfloat16 / uint16 bits)
        as is for families with bf16 table kernels, else widened exactly to float32."""
        if V.dtype_name(scores) in ("bfloat16", "uint16") and not self.family.takes_bf16_bits:
            return _widen_bf16(scores)
        return scores

    def hytopk(self, scores, lo, hi, k, *, capacity=None, oversample=3.0, max_failed=64, query_chunk=None):
        """``query_chunk``: queries per pass (default: as many as keep the scratch within
        pipeline.SCRATCH_BYTES); the selection does not depend on it. ``scores``: float32, or
        bf16 (the answer of the table widened exactly to float32)."""
        shape = V.check_scores(scores)
        lo_h, hi_h = self._check_select(shape, lo, hi, k, capacity, oversample, max_failed, query_chunk)
        kind = common_kind(scores, lo, hi)
        (s,) = self._dev(("scores", self._table(scores)))
        return self._select(R.TableSource(s), lo_h, hi_h, shape[1], k, capacity, oversample, max_failed, query_chunk,
                            kind)

    def hytopk_indexer(self, q, w, keys, lo, hi, k, *, kscale=None, capacity=None, oversample=3.0, max_failed=64,
                       query_chunk=None):
        n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
        lo_h, hi_h = self._check_select((n, L), lo, hi, k, capacity, oversample, max_failed, query_chunk)
        kind = common_kind(q, w, keys, lo, hi, kscale)
        src = self._source(*self._indexer_args(q, w, keys, kscale, dts))
        return self._select(src, lo_h, hi_h, L, k, capacity, oversample, max_failed, query_chunk, kind,
                            self.stages_for_kind(dts.kind))

    def topk(self, scores, lo, hi, k):
        """Exact top-k of every query (the recovery path over all rows); float32 or bf16 scores."""
        n, L = V.check_scores(scores)
        lo_h, hi_h = V.check_ranges(lo, hi, n, L)
        k = V.check_k(k)
        kind = common_kind(scores, lo, hi)
        s, lo_d, hi_d, rows = self._dev(("scores", self._table(scores)), ("lo", lo_h.astype(np.int32)),
                                        ("hi", hi_h.astype(np.int32)),
                                        ("rows", np.arange(n, dtype=np.int32)))
        idx, val = self.stages.recover(R.TableSource(s), lo_d, hi_d, rows, k)
        return self._out(idx, kind), self._out(val, kind)

    def indexer_scores(self, q, w, keys, lo, hi, *, kscale=None):
        n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
        lo_h, hi_h = V.check_ranges(lo, hi, n, L)
        kind = common_kind(q, w, keys, lo, hi, kscale)
        qd, wd, kd, sd = self._indexer_args(q, w, keys, kscale, dts)
        lo_d, hi_d = self._dev(("lo", lo_h.astype(np.int32)), ("hi", hi_h.astype(np.int32)))
        extra = {"kscale": sd} if sd is not None else {}
        return self._out(self.stages_for_kind(dts.kind).dense(qd, wd, kd, lo_d, hi_d, **extra), kind)

    def replay_scores(self, q, w, keys, idx, *, kscale=None):
        n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
        k = V.check_idx(idx, n, L)
        kind = common_kind(q, w, keys, idx, kscale)
        if L == 0:                  # no keys: every slot is padding (check_idx), no kernel to launch
            return self._out(self.family.to_device(np.full((n, k), -np.inf, np.float32)), kind)
        qd, wd, kd, sd = self._indexer_args(q, w, keys, kscale, dts)
        (idx_d,) = self._dev(("idx", idx))
        extra = {"kscale": sd} if sd is not None else {}
        return self._out(self.stages_for_kind(dts.kind).replay(qd, wd, kd, idx_d, **extra), kind)

    LOSS_DTYPES = ("float32", "float64", "bfloat16", "uint16")

    def indexer_kl_loss(self, q, w, keys, idx, target, reduction="sum"):
        """reference.indexer_kl_loss under the same checks: (loss, dq, dw, dkeys) with float64
        gradients, returned in the inputs' array kind. The loss and its gradients are the
        reference's float64 computation on host copies (bf16 inputs widened exactly); the
        device-side training loss is workbench.torch.indexer_kl_loss."""
        n, H, D, L = V.check_indexer_inputs(q, w, keys, dtypes=self.LOSS_DTYPES)
        V.check_idx(idx, n, L)
        V.check_target(target, idx)
        kind = common_kind(q, w, keys, idx, target)

        def host(x, dtype):
            if V.dtype_name(x) == "uint16":
                x = bf16_bits_to_float32(x)
            elif V.dtype_name(x) in ("bfloat16", "float16"):
                x = x.float() if hasattr(x, "float") else x.astype(np.float32)
            return np.asarray(to_numpy(x), dtype)
        dt = np.float64 if V.dtype_name(q) == "float64" else np.float32      # bf16 widens exactly to float32
        loss, dq, dw, dkeys = R.indexer_kl_loss(host(q, dt), host(w, dt), host(keys, dt),
                                                np.asarray(to_numpy(idx)), host(target, np.float64), reduction)
        return (loss, *(to_kind(g, kind) for g in (dq, dw, dkeys)))


def _is_torch(x) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


def _widen_bf16(x):
    """bf16 (torch.bfloat16 or uint16 bits, any array kind) -> float32 values (exact)."""
    if _is_torch(x):
        import torch
        x = x.detach()
        return (x if x.dtype == torch.bfloat16 else x.view(torch.bfloat16)).float()
    if V.dtype_name(x) == "float32":
        return x
    a = x if hasattr(x, "view") and not hasattr(x, "copy_to_host") else to_numpy(x)
    return bf16_bits_to_float32(a.view(np.uint16) if a.dtype != np.uint16 else a)


def _fp8_bits(x):
    """fp8 e4m3 as uint8 bits of the same array kind (torch.float8_e4m3fn is viewed, not copied)."""
    if _is_torch(x):
        import torch
        return x.detach().view(torch.uint8)
    return x


def _fp8_values(x):
    """fp8 e4m3 (torch.float8_e4m3fn or uint8 bits) -> float32 values (exact), same array kind."""
    if _is_torch(x):
        import torch
        return x.detach().float() if x.dtype != torch.uint8 else x.detach().view(torch.float8_e4m3fn).float()
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    return e4m3_bits_to_float32(x)


def backend(name: str = "reference", variants: dict | None = None) -> Backend:
    """``workbench.backend("reference" | "numba" | "cupy")``; ``variants`` picks a
    variant per stage by name (default: the family's DEFAULTS)."""
    if name not in registry.FAMILY_MODULES:
        raise ValueError(f"argument 'name': unknown backend {name!r}; choose from {sorted(registry.FAMILY_MODULES)}")
    return Backend(name, variants)
