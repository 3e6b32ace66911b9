"""`hytopk compare`: every registered variant of each stage on the same inputs,
then the end-to-end pipelines and the baselines of docs/CONTRACT.md §7.

Order of work: inputs and the oracle's answer; ceilings (GEMM rate, copy
bandwidth) measured in this run; each variant checked first, timed only when
correct; baselines; ratios; winners. A variant that cannot run here is listed
under `skipped` with the reason; one that raises or disagrees is a row with
correct = false.
"""
from __future__ import annotations

import difflib
import re
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from .. import registry
from ..families import get_family
from . import checks as C
from . import fastest_topk
from . import probes
from .doctor import environment
from .oracle import ReferenceOracle, TorchOracle
from .presets import Preset, default_preset, get as get_preset, make_inputs
from .timing import Timing, gemm_tflops, copy_gbps, gpu_available, make_timer

BASELINES = ("torch", "dense+topk", "score-only", "flop-bound")
TABLE_SOURCE_MAX_BYTES = 16 << 30     # table-source rows need the [n, L] table in memory
SLOW_ROW_MS = 250.0          # a row slower than this per call is timed by one warm call (after its checked call)
GPU_BUDGET_S = 50.0          # default time budget of the per-stage rows on GPU presets (main job <= 90 s)
CHUNK_BYTES = 4 << 30                 # scratch per chunk of the chunked baselines


@dataclass
class Row:
    kind: str                   # "stage" | "pipeline" | "baseline"
    stage: str                  # stage name, "hytopk_indexer"/"hytopk", or the baseline's name
    name: str                   # variant / backend / baseline
    source: str | None = None   # "table" | "indexer" for source stages
    correct: bool | None = None
    detail: str = ""
    time_ms: float | None = None  # the median
    spread: dict | None = None      # Timing.spread(): quantiles, min/max, repeats, the median's interval
    flops: float = 0.0
    bytes: float = 0.0
    peak_extra_bytes: int | None = None
    ratios: dict = field(default_factory=dict)
    tflops: float | None = None
    gbps: float | None = None

    @property
    def label(self):
        return f"{self.name}[{self.source}]" if self.source else self.name


@dataclass
class CompareResult:
    preset: dict
    device: str
    environment: dict
    ceilings: dict
    rows: list
    skipped: list               # [{"name", "stage", "reason"}]
    missing: dict               # family -> why it is not here
    notes: list
    winners: dict = field(default_factory=dict)
    wall_s: float | None = None     # the whole comparison, inputs and oracle included

    def to_json(self) -> dict:
        d = asdict(self)
        return d


class Workload:
    """One preset's inputs on the compare device, the oracle and its answer."""

    def __init__(self, preset: Preset, device: str):
        self.p, self.device = preset, device
        q, w, keys, lo, hi = make_inputs(preset)
        self.host = dict(q=q, w=w, keys=keys, lo=lo.astype(np.int32), hi=hi.astype(np.int32))
        self.lo_t = torch.as_tensor(lo, device=device).long()
        self.hi_t = torch.as_tensor(hi, device=device).long()
        self.oracle = (ReferenceOracle(q, w, keys, lo, hi) if not preset.gpu
                       else TorchOracle(q, w, keys, lo, hi, device=device))
        self.E = self.oracle.compute(preset.k, preset.capacity, preset.oversample)
        c = (hi.astype(np.int64) - lo)
        self.c = c
        nf = int(self.E.failed.sum())
        # recovery input: the rows that failed, else the first max_failed rows (a typical recovery load)
        rows = torch.nonzero(self.E.failed).flatten() if nf else torch.arange(min(preset.n, max(1, preset.max_failed)))
        self.rec_rows = rows.to(torch.int32)
        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[preset.dtype]
        self.dtype = dt
        self.dev = {k: torch.as_tensor(v, device=device) for k, v in self.host.items()}
        for name in ("q", "w", "keys"):
            self.dev[name] = self.dev[name].to(dt)
        self.table_ok = preset.n * preset.L * 4 <= TABLE_SOURCE_MAX_BYTES
        self._table = None

    def table(self) -> torch.Tensor:
        if self._table is None:
            o = self.oracle
            if isinstance(o, ReferenceOracle):
                self._table = torch.from_numpy(o.table)
            else:
                t = torch.empty((o.n, o.L), dtype=torch.float32, device=self.device)
                step = max(1, o._row_chunk())
                for a in range(0, o.n, step):
                    t[a:a + step] = o.scores_rows(a, min(o.n, a + step))
                self._table = t
        return self._table

    def stage_inputs(self) -> dict:
        E = self.E
        i32 = lambda x: torch.as_tensor(x, device=self.device).to(torch.int32)
        d = dict(self.dev)
        d.update(M=i32(E.M), r=i32(E.r), T=E.T.float().to(self.device), count=i32(E.count.cpu()),
                 cand_idx=E.cand_idx.to(self.device), cand_val=E.cand_val.to(self.device),
                 rows=self.rec_rows.to(self.device), idx=E.topk_idx.to(self.device))
        return d

    def dims(self) -> registry.Work:
        """The sizes the stage cards' work models read."""
        p, E = self.p, self.E
        rows = self.rec_rows.cpu().numpy()
        return registry.Work(n=p.n, L=p.L, H=p.H, D=p.D, k=p.k, elem_bytes=2 if p.dtype == "bfloat16" else 4,
                             sum_c=float(self.c.sum()), sum_M=float(np.sum(E.M)),
                             stored=float(torch.clamp(E.count, max=E.capacity).sum()),
                             sum_c_rows=float(self.c[rows].sum()) if rows.size else 0.0)

    # the work each row does, for the effective-rate columns: a stage's from its card
    def work(self, stage: str, source: str | None) -> tuple[float, float]:
        w = self.dims()
        if source in registry.SOURCES:
            w = registry.SOURCES[source].sized(w)
        if stage in registry.CARDS:
            return registry.CARDS[stage].work(w, source)
        if stage == "dense+topk":
            return w.hd2 * w.sum_c, 8.0 * w.n * w.L + w.keys_bytes
        return w.hd2 * w.sum_c, w.keys_bytes + 8.0 * w.n * w.k         # pipelines, torch baseline, floor


def family_usable(fam: str, device: str, preset: Preset) -> tuple[bool, str]:
    if not registry.load_family(fam):
        return False, f"not loaded: {registry.load_error(fam)}"
    rec = get_family(fam)
    if rec.runs_on == "host" and not rec.simulated and preset.gpu:
        return False, f"the {fam} family runs on the host: on the tiny preset only (large presets use the torch oracle)"
    if device == "cpu" and rec.runs_on == "gpu":
        why = "needs a GPU and the CUDA driver"
        return False, why + (" (or the simulator: start with NUMBA_ENABLE_CUDASIM=1)" if fam == "numba" else "")
    return rec.available()


def stage_call(stage: str, v: registry.Variant, fam, X: dict, source: str | None, k: int, cap: int):
    """(callable, args) for one stage variant on family-native inputs X: the card's arguments by
    name (``source``: the score source of kind ``source`` over X's arrays, registry.SOURCES)."""
    card = registry.CARDS[stage]
    named = dict(X, k=k, capacity=cap)
    if source is not None:
        named["source"] = registry.SOURCES[source].build_fn()(X)
    return v.fn, tuple(named[a] for a in card.args)


def stage_gate(v: registry.Variant, fam, source, out, ctx) -> tuple[bool, str]:
    """A stage row's check: its card's check on the workload's answer, then the stage's edge
    probes (harness/probes.py: the contract's boundaries the workload may not reach)."""
    ok, why = registry.CARDS[v.stage].check_fn()(out, **ctx)
    if ok:
        probed, probe_why = probes.check_variant(v, fam, source if registry.CARDS[v.stage].sources else None)
        if not probed:
            return False, probe_why
    return ok, why


def to_family(fam, d: dict, device: str) -> dict:
    """torch inputs -> the family's arrays (host NumPy on CPU; zero-copy on the GPU)."""
    out = {}
    for k, x in d.items():
        if device == "cpu":
            x = x.cpu()
            x = x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
        out[k] = fam.to_device(x)
    return out


def _as_torch_out(out, fam, device):
    if isinstance(out, tuple):
        return tuple(C.as_torch(x, fam, device) for x in out)
    return C.as_torch(out, fam, device)


class Runner:
    def __init__(self, wl: Workload, timer, repeats: int | None, progress: Callable | None = None):
        self.wl, self.timer = wl, timer
        self.repeats = repeats          # None: until the median is known or the row's budget ends (timing.py)
        self.rotations = 1 if timer.device == "cpu" else 2
        self.progress = progress or (lambda msg: None)

    def simulated(self, family: str) -> bool:
        return get_family(family).simulated and self.timer.device == "cpu"

    def _rotated(self, build: Callable[[int], tuple]) -> list:
        return [build(i) for i in range(self.rotations)]

    def measure(self, row: Row, fn, arg_sets, check: Callable, simulated=False) -> Row:
        """Check first; time only a correct result. A simulated row (Numba's CUDA
        simulator: seconds per call, timing meaningless) is timed by its checked call only."""
        watch_mem = self.timer.device == "cpu"
        try:
            if watch_mem:
                tracemalloc.start()
            t0 = time.perf_counter()
            out = fn(*arg_sets[0])
            self.timer.sync()
            elapsed = (time.perf_counter() - t0) * 1e3
            if watch_mem:
                row.peak_extra_bytes = int(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
            row.correct, row.detail = check(out)
            del out
        except Exception as e:          # a crash is a wrong variant, not a crashed run
            row.correct, row.detail = False, f"{type(e).__name__}: {e}"[:300]
        finally:
            if tracemalloc.is_tracing():
                tracemalloc.stop()
        if row.correct is False:
            return row
        if simulated:
            row.time_ms, row.spread = elapsed, Timing.of([elapsed]).spread()
            row.detail = row.detail or "CUDA simulator: one call timed, not a GPU time"
            return row
        if elapsed > SLOW_ROW_MS and self.repeats is None:
            # a slow row (a scalar scorer at 128K+ keys): its checked call was the warm-up, one more
            # call is its time (repeats would swamp the run: the main job's budget is 90 s)
            t = self.timer.time(fn, arg_sets, warmup=0, repeats=1)
            if t.median_ms > SLOW_ROW_MS:
                row.time_ms, row.spread = t.median_ms, t.spread()
                row.detail = row.detail or f"slow row (over {SLOW_ROW_MS:.0f} ms per call): one warm call timed"
                if row.kind == "pipeline" and not watch_mem:
                    row.peak_extra_bytes = self.timer.peak_extra_bytes(fn, arg_sets[0])
                return row
            # else the checked call was slow because it compiled (NVRTC, Numba's JIT): time it fully
        t = self.timer.time(fn, arg_sets, warmup=1 if self.timer.device == "cpu" else 2, repeats=self.repeats)
        row.time_ms, row.spread = t.median_ms, t.spread()
        if not watch_mem:
            row.peak_extra_bytes = self.timer.peak_extra_bytes(fn, arg_sets[0])
        return row

    def stage_row(self, stage, v: registry.Variant, source) -> Row:
        wl, E = self.wl, self.wl.E
        fam = get_family(v.family)
        card = registry.CARDS[stage]
        base = wl.stage_inputs()
        extra = card.inputs_fn()
        if extra is not None:                 # a stage whose inputs the workload does not hold yet
            base.update(extra(wl))
        kind = registry.SOURCES.get(source)
        if kind is not None and kind.needs_table:
            base["table"] = wl.table()
        if kind is not None and kind.float32:  # a source that re-encodes q, w, keys (fp8) starts from float32
            base.update({a: base[a].float() for a in ("q", "w", "keys")})

        def build(i):
            d = base if i == 0 else {k: (x.clone() if x.numel() > (1 << 18) else x) for k, x in base.items()}
            return stage_call(stage, v, fam, to_family(fam, d, wl.device), source, wl.p.k, E.capacity)[1]
        row = Row(*card.row_of(v, source))
        row.flops, row.bytes = wl.work(stage, source)
        ctx = dict(E=E, oracle=wl.oracle, lo=wl.lo_t, hi=wl.hi_t, rows=wl.rec_rows.to(wl.device))
        check = lambda out: stage_gate(v, fam, source, _as_torch_out(out, fam, wl.device), ctx)
        try:
            arg_sets = self._rotated(build)
        except Exception as e:
            row.correct, row.detail = False, f"input conversion failed: {type(e).__name__}: {e}"[:300]
            return row
        return self.measure(row, v.fn, arg_sets, check, simulated=self.simulated(v.family))

    def pipeline_row(self, fam_name: str, entry: str, chosen: dict | None = None, one_pass: bool = False,
                     source: str = "indexer") -> Row:
        """The family's pipeline: its default stages, or ``chosen`` = {stage: variant} (the fastest of this run);
        in passes of bounded scratch (the default) or ``one_pass`` over all n queries. ``source``: the
        indexer inputs as given, or re-encoded by their source kind (registry.SOURCES: fp8 e4m3 with
        a float32 scale per key; every score equals the oracle's, so the same answer checks it)."""
        import workbench
        wl, p, E = self.wl, self.wl.p, self.wl.E
        kind = registry.SOURCES[source]
        b = workbench.backend(fam_name, variants=chosen)
        tags = ", ".join(filter(None, ["fastest stages" if chosen else "", "one pass" if one_pass else ""]))
        row = Row("pipeline", entry, f"{fam_name}.{entry}" + (f"[{tags}]" if tags else ""),
                  source if kind.encode else None)      # a re-encoded input is labelled; the preset's own is not
        row.flops, row.bytes = wl.work(entry, source)

        def inputs(i):
            d = {k: v for k, v in wl.dev.items()}
            if entry == "hytopk":
                d["table"] = wl.table()
            if i:
                d = {k: x.clone() for k, x in d.items()}
            if wl.device == "cpu":
                d = {k: (x.float() if x.dtype == torch.bfloat16 else x).numpy() for k, x in d.items()}
            return d
        arg_sets = [(inputs(i),) for i in range(self.rotations)]
        kw = dict(capacity=E.capacity, oversample=p.oversample, max_failed=p.max_failed,
                  query_chunk=p.n if one_pass else None)
        if kind.encode:
            enc = registry._resolve(kind.encode)(wl.host, p.seed, wl.device)
            arg_sets = [(dict(arg_sets[0][0], **enc),)]
            kw.update(kscale=enc["kscale"], query_chunk=None)
        if entry == "hytopk":
            fn = lambda d: b.hytopk(d["table"], d["lo"], d["hi"], p.k, **kw)
        else:
            fn = lambda d: b.hytopk_indexer(d["q"], d["w"], d["keys"], d["lo"], d["hi"], p.k, **kw)

        def check(res):
            idx = C.as_torch(res.idx, b.family, wl.device)
            val = C.as_torch(res.val, b.family, wl.device)
            return C.selection(idx, val, E.topk_idx, E.topk_val, entry)
        row = self.measure(row, fn, arg_sets, check, simulated=self.simulated(fam_name))
        if chosen:
            row.detail = "; ".join(filter(None, [row.detail, ", ".join(f"{k}={v}" for k, v in chosen.items())]))
        return row

    def torch_baseline(self) -> Row:
        wl, p, E = self.wl, self.wl.p, self.wl.E
        row = Row("baseline", "torch", "torch: chunked einsum + torch.topk")
        row.flops, row.bytes = wl.work("torch", None)
        d = wl.dev
        B = max(1, CHUNK_BYTES // max(1, p.H * p.L * 6))
        fn = lambda q, w, keys: torch_indexer_topk(q, w, keys, wl.lo_t, wl.hi_t, p.k, B)
        # bf16 einsum rounds the dot products: compare the values within bf16 precision
        rtol = 0.0 if wl.dtype == torch.float32 else 2.0 ** -7
        check = lambda out: C.topk_values(out[1], out[0], E, wl.lo_t, wl.hi_t, rtol=rtol)
        return self.measure(row, fn, [(d["q"], d["w"], d["keys"])], check)

    def dense_topk_baseline(self, dense_row: Row) -> Row:
        wl, p, E = self.wl, self.wl.p, self.wl.E
        v = registry.get(dense_row.name)
        fam = get_family(v.family)
        X = to_family(fam, dict(wl.dev), wl.device)
        B = max(1, CHUNK_BYTES // max(1, 4 * p.L))

        def chunk(a, b):
            sl = to_family(fam, {"lo": wl.dev["lo"][a:b].contiguous(), "hi": wl.dev["hi"][a:b].contiguous(),
                                 "q": wl.dev["q"][a:b].contiguous(), "w": wl.dev["w"][a:b].contiguous()},
                           wl.device)
            return (C.as_torch(v.fn(sl["q"], sl["w"], X["keys"], sl["lo"], sl["hi"]), fam, wl.device),
                    wl.dev["lo"][a:b].contiguous(), wl.dev["hi"][a:b].contiguous())
        # the fastest exact top-k we have on this machine (torch.topk or the radix table top-k),
        # picked by timing both on the first chunk's table
        topk_name, topk = fastest_topk.fastest(*chunk(0, min(p.n, B)), p.k) if wl.device != "cpu" and p.n \
            else ("torch.topk", fastest_topk.torch_topk)
        row = Row("baseline", "dense+topk", f"{v.name} + {topk_name}")
        row.flops, row.bytes = wl.work("dense+topk", None)

        def fn():
            idx = torch.empty((p.n, p.k), dtype=torch.int64, device=wl.device)
            val = torch.empty((p.n, p.k), dtype=torch.float32, device=wl.device)
            for a in range(0, p.n, B):
                b = min(p.n, a + B)
                idx[a:b], val[a:b] = topk(*chunk(a, b), p.k)
            return idx, val
        check = lambda out: C.topk_values(out[1], out[0], E, wl.lo_t, wl.hi_t)
        return self.measure(row, fn, [()], check)


def fp8_pipeline_jobs(families, device: str, skipped: list, excluded) -> list:
    """The end-to-end fp8 rows (Runner.pipeline_row on the indexer_fp8 source), one per family with a pipeline row: every
    family but Numba in the simulator (one Numba pipeline row is enough there; tests/test_numba_dtypes.py
    covers its fp8 path) and a family whose record has no fp8 stage set (Family.defaults["fp8"])."""
    jobs = []
    for f in families:
        name = f"{f}.hytopk_indexer[indexer_fp8]"
        if excluded(name) or excluded("fp8"):
            skipped.append({"name": name, "stage": "hytopk_indexer", "reason": "excluded (--exclude)"})
        elif f == "numba" and device == "cpu":
            skipped.append({"name": name, "stage": "hytopk_indexer",
                            "reason": "CUDA simulator: one Numba pipeline row is enough (tests cover fp8)"})
        elif "fp8" not in get_family(f).defaults:
            skipped.append({"name": name, "stage": "hytopk_indexer",
                            "reason": f"the {f} family has no fp8 stage set yet"})
        else:
            jobs.append(("pipeline", "hytopk_indexer", f, "indexer_fp8"))
    return jobs


def torch_indexer_topk(q, w, keys, lo, hi, k, rows_per_chunk):
    """The PyTorch a user would write: scores by chunks of queries, then torch.topk."""
    n, L = q.shape[0], keys.shape[0]
    pos = torch.arange(L, device=q.device)
    idx = torch.empty((n, k), dtype=torch.int64, device=q.device)
    val = torch.empty((n, k), dtype=torch.float32, device=q.device)
    for a in range(0, n, rows_per_chunk):
        b = min(n, a + rows_per_chunk)
        s = torch.einsum("bhd,sd->bhs", q[a:b], keys).float().clamp_(min=0)
        s = torch.einsum("bhs,bh->bs", s, w[a:b].float())
        s.masked_fill_((pos[None, :] < lo[a:b, None]) | (pos[None, :] >= hi[a:b, None]), float("-inf"))
        val[a:b], idx[a:b] = torch.topk(s, k, dim=1)
    return idx, val


def check_run_args(repeats, budget_s):
    """repeats: None (default) or an int >= 1; budget_s: None (default), a number of seconds > 0,
    or inf (no limit). Checked before any work; no silent fallback to a default."""
    if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer))
                                or repeats < 1):
        raise ValueError(f"argument 'repeats' must be an int >= 1 (timed repeats per row), got {repeats!r}")
    if budget_s is not None:
        try:
            b = float(budget_s)
        except (TypeError, ValueError):
            raise ValueError(f"argument 'budget' must be a number of seconds > 0 or inf, got {budget_s!r}") from None
        if not b > 0:                               # also NaN
            raise ValueError(f"argument 'budget' must be > 0 seconds (inf: no limit), got {b:g}")


def run_compare(preset: str | None = None, stages=None, variant_names=None, repeats=None,
                say: Callable[[str], None] = print, progress_factory=None, families=None,
                budget_s: float | None = None, exclude=()) -> CompareResult:
    """Run the comparison; `say` prints notes, `progress_factory(total)` gives an advance(label) callable.
    ``exclude``: substrings; stage variants (and score-only floors) whose name contains one are
    skipped, while the pipelines and the other baselines still run (e.g. ("simt",) on the largest
    presets, where a scalar row takes seconds per call)."""
    check_run_args(repeats, budget_s)
    t_run = time.perf_counter()
    exclude = tuple(exclude or ())
    excluded = lambda name: any(_matches(x, name) for x in exclude)
    gpu = gpu_available()
    notes = []
    name = default_preset(gpu) if preset is None else preset      # '' is an unknown preset, not the default
    p = get_preset(name)
    if p.gpu and not gpu:
        notes.append(f"no GPU here: preset {name!r} needs one; running 'tiny' on the CPU instead")
        p = get_preset("tiny")
    device = "cuda" if p.gpu else "cpu"
    for n_ in notes:
        say(n_)
    stages = list(stages or registry.STAGES)
    for s in stages:
        if s not in registry.CARDS:
            raise ValueError(f"argument 'stage': unknown stage {s!r}; choose from {sorted(registry.CARDS)}")

    missing, usable = {}, {}
    for f in families or ():
        if f not in registry.FAMILY_MODULES:
            raise ValueError(f"argument 'family': unknown family {f!r}; choose from {sorted(registry.FAMILY_MODULES)}")
    for fam in registry.FAMILY_MODULES:
        ok, why = family_usable(fam, device, p) if not families or fam in families else (False, "not selected (--family)")
        usable[fam] = ok
        if not ok:
            missing[fam] = why
            say(f"family {fam}: skipped ({why})")

    wanted = wanted_variants(variant_names or (), missing)      # before any work: a wrong name fails fast
    say(f"preparing preset {p.name} (n={p.n}, L={p.L}, H={p.H}, D={p.D}, k={p.k}, {p.dtype}) on {device}")
    t_prep = time.perf_counter()
    wl = Workload(p, device)
    say(f"workload and oracle ready in {time.perf_counter() - t_prep:.1f} s")
    timer = make_timer(device)
    ceilings = {"gemm_tflops": gemm_tflops(timer), "copy_gbps": copy_gbps(timer)}
    ceilings["flop_bound_ms"] = wl.work("flop-bound", None)[0] / (ceilings["gemm_tflops"] * 1e12) * 1e3
    runner = Runner(wl, timer, repeats)

    jobs, skipped = stage_jobs(stages, wanted, excluded, usable, missing, device, wl.table_ok)
    # the floors (score-only) are baselines: they run whatever --stage/--variant pick (a --variant
    # naming a floor variant picks among them), ahead of no stage row and outside the time budget
    floors = [f for f in registry.FLOORS if f not in stages]
    floor_wanted = {n: x for n, x in wanted.items() if registry.variant_stage(n) in floors}
    floor_jobs, floor_skipped = stage_jobs(floors, floor_wanted, excluded, usable, missing, device, wl.table_ok)
    skipped += floor_skipped
    # under a time budget the families go in their records' order of preference (CuPy, the
    # headline, first), then the rest
    rank = {f: i for i, f in enumerate(registry.preference())}
    jobs.sort(key=lambda j: rank.get(j[2].family, len(rank)))
    pipes = [f for f in registry.FAMILY_MODULES if usable[f]] if not variant_names else []
    if set(stages) != set(registry.STAGES):
        pipes = []                       # a stage subset compares stages only
    for f in pipes:
        jobs.append(("pipeline", "hytopk_indexer", f, None))
        if device != "cpu":
            jobs.append(("pipeline", "hytopk_indexer", f, "fastest"))
            jobs.append(("pipeline", "hytopk_indexer", f, "fastest, one pass"))
        # the table pipeline runs the same stages; in the simulator one pipeline row is enough
        if wl.table_ok and not (f == "numba" and device == "cpu"):
            jobs.append(("pipeline", "hytopk", f, None))
    jobs += fp8_pipeline_jobs(pipes, device, skipped, excluded)
    jobs += [("baseline", b, None, None) for b in ("torch", "dense+topk")] + floor_jobs

    advance = progress_factory(len(jobs)) if progress_factory else (lambda label: None)
    live = device != "cpu"          # GPU runs are long: a line per row as it lands (logs show progress)
    if budget_s is None and device != "cpu":
        budget_s = GPU_BUDGET_S
        say(f"per-stage rows get {budget_s:.0f} s (--budget to change; --budget inf for no limit)")
    t_start = time.perf_counter()
    rows: list[Row] = []
    for kind, s, v, src in jobs:
        label = f"{s}: {v.name if kind == 'stage' else v or s}" + (f"[{src}]" if src else "")
        advance(label)
        if kind == "stage" and budget_s is not None and time.perf_counter() - t_start > budget_s:
            # pipelines and baselines always run; per-stage rows stop at the time budget
            skipped.append({"name": v.name, "stage": s, "reason": f"time budget ({budget_s:.0f} s) used up"})
            continue
        if kind in ("stage", "floor"):
            rows.append(runner.stage_row(s, v, src))
        elif kind == "pipeline" and src in registry.SOURCES:
            rows.append(runner.pipeline_row(v, s, source=src))
        elif kind == "pipeline" and src in ("fastest", "fastest, one pass"):
            chosen = fastest_of_family(rows, v)
            if chosen:
                rows.append(runner.pipeline_row(v, s, chosen, one_pass=src != "fastest"))
        elif kind == "pipeline":
            rows.append(runner.pipeline_row(v, s))
        elif s == "torch":
            rows.append(runner.torch_baseline())
        elif s == "dense+topk":
            dense = [r for r in rows if r.stage == "dense" and r.correct and r.time_ms is not None]
            if not dense:
                dense_all = [v for v in registry.variants("dense", load=False) if usable.get(v.family)
                             and (not wanted or v.name in wanted)
                             and not (v.gpu_only and device == "cpu")]
                if dense_all:
                    dense = [runner.stage_row("dense", dense_all[0], None)]
            dense = [r for r in dense if r.correct]
            if dense:
                rows.append(runner.dense_topk_baseline(min(dense, key=lambda r: r.time_ms)))
            else:
                notes.append("baseline dense+topk: no correct dense variant here")
        if rows and live:
            r = rows[-1]
            t = f"{r.time_ms:.4g} ms" if r.time_ms else "-"
            say(f"  {r.label}: {'ok' if r.correct else 'WRONG'} {t} (+{time.perf_counter() - t_start:.0f} s)"
                + ("" if r.correct else f"  {r.detail}"))
    advance(None)

    base_t = {r.stage: r.time_ms for r in rows if r.kind == "baseline" and r.time_ms}
    base_t["flop-bound"] = ceilings["flop_bound_ms"]
    for r in rows:
        if r.time_ms:
            r.ratios = {b: r.time_ms / t for b, t in base_t.items() if t}
            r.tflops = r.flops / (r.time_ms * 1e-3) / 1e12 if r.flops else None
            r.gbps = r.bytes / (r.time_ms * 1e-3) / 1e9 if r.bytes else None
        if r.source == "indexer_fp8" and r.time_ms:                    # issue 7: fp8 fused rate / bf16 fused rate
            bf16 = [x for x in rows if x.name == r.name and x.kind == r.kind and x.source in ("indexer", None)
                    and x.correct and x.time_ms]
            if bf16:
                r.ratios["fp8_rate_vs_bf16"] = bf16[0].time_ms / r.time_ms
        if r.kind == "pipeline" and r.peak_extra_bytes is not None:    # issue 7's memory target: <= 1/16
            r.ratios["peak_memory_vs_table"] = r.peak_extra_bytes / (4.0 * p.n * p.L)
    res = CompareResult(p.as_dict(), device, environment(), ceilings, rows, skipped, missing, notes)
    res.winners = pick_winners(rows)
    res.wall_s = time.perf_counter() - t_run
    return res


def stage_jobs(stages, wanted: dict, excluded, usable: dict, missing: dict, device: str, table_ok: bool):
    """(jobs, skipped): a (kind, stage, variant, source) job per row to run, one per source the
    stage's card lists and the variant takes (kind: the card's role, "stage" or "floor"); a
    {"name", "stage", "reason"} per row that cannot run here (excluded by its name or its row's
    label, family unavailable, gpu_only in the simulator, a table too large, a source kind that
    cannot run here)."""
    jobs, skipped = [], []
    for s in stages:
        card = registry.CARDS[s]
        for v in registry.variants(s, load=False):
            if wanted and v.name not in wanted:
                continue
            why = ("excluded (--exclude)" if excluded(v.name)
                   else missing.get(v.family, "family unavailable") if not usable.get(v.family, False)
                   else "gpu_only: needs a real GPU (not the simulator)" if v.gpu_only and device == "cpu" else None)
            if why:
                skipped.append({"name": v.name, "stage": s, "reason": why})
                continue
            for src in ([x for x in v.sources if x in card.sources] if card.sources else [None]):
                if wanted.get(v.name) and src not in wanted[v.name]:
                    continue                     # --variant name[source]: that row only
                kind = registry.SOURCES.get(src)
                ok_src = kind.usable_by(v) if kind is not None else (True, "")
                _, _, row_name, row_src = card.row_of(v, src)
                label = f"{row_name}[{row_src}]" if row_src else row_name
                why = ("excluded (--exclude)" if excluded(label)
                       else "table source: [n, L] table too large" if kind is not None and kind.needs_table and not table_ok
                       else ok_src[1] if not ok_src[0] else None)
                if why:
                    skipped.append({"name": label, "stage": s, "reason": why})
                    continue
                jobs.append((card.role, s, v, src))
    return jobs, skipped


def _matches(pattern: str, name: str) -> bool:
    """--exclude: a substring of the name, or a regular expression found in it ('wgmma$': the
    names that end in wgmma, not wgmma_ws)."""
    if pattern in name:
        return True
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def wanted_variants(names, missing: dict) -> dict:
    """--variant names as the table prints them, ``name`` or ``name[source]``, as {name: the
    sources asked for, or None for every row of it}. A name that cannot run is an error that
    says why: its family is not available here (with the reason), or it is a pipeline row, or
    it is unknown (with the closest names)."""
    wanted: dict = {}
    for raw in names:
        m = re.fullmatch(r"\s*([^\[\]\s]+)(?:\[([^\[\]]+)\])?\s*", raw)
        if not m:
            raise ValueError(f"argument 'variant': cannot read {raw!r}; write it as the table prints it, "
                             "e.g. reference.filter or reference.filter[table]")
        name, src = m.groups()
        if src is None:
            wanted[name] = None
        elif wanted.get(name, set()) is not None:
            wanted.setdefault(name, set()).add(src)
    known = {v.name: v for v in registry.variants(load=False)}
    for name, sources in wanted.items():
        fam = name.split(".", 1)[0]
        v = known.get(name)
        if v is None and fam in registry.FAMILY_MODULES and (fam in missing or registry.load_error(fam)):
            raise ValueError(f"argument 'variant': {name!r} is a {fam} variant, and the {fam} family is not "
                             f"available here ({missing.get(fam) or registry.load_error(fam)})")
        if v is None and re.fullmatch(r"\w+\.hytopk(_indexer)?", name):
            raise ValueError(f"argument 'variant': {name!r} is a pipeline row, not a stage variant: the pipelines "
                             "run when no --variant is given (--family picks whose)")
        if v is None:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
            raise ValueError(f"argument 'variant': unknown variant {name!r}; "
                             + (f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"))
        rows = set(v.sources) if v.stage in registry.SOURCE_STAGES else set()
        if sources and not sources <= rows:
            raise ValueError(f"argument 'variant': {name} has no row " + ", ".join(f"[{x}]" for x in sorted(sources - rows))
                             + (f"; its rows: {', '.join(f'{name}[{x}]' for x in sorted(rows))}" if rows
                                else f" (a {v.stage} variant has one row: {name})"))
    return wanted


def fastest_of_family(rows, family: str) -> dict:
    """{stage: fastest correct variant of ``family``} among this run's stage rows
    (indexer source preferred for the source stages); {} if it adds nothing to the defaults."""
    best = {}
    for r in rows:
        if r.kind != "stage" or r.correct is not True or r.time_ms is None or not r.name.startswith(family + "."):
            continue
        if r.stage in registry.SOURCE_STAGES and r.source != "indexer":
            continue
        if r.stage not in best or r.time_ms < best[r.stage][1]:
            best[r.stage] = (r.name, r.time_ms)
    return {s: n for s, (n, _) in best.items()}


def pick_winners(rows) -> dict:
    """Fastest correct variant per stage (indexer source preferred: the real use),
    per (stage, source), and the fastest correct end-to-end backend."""
    best: dict = {}
    for r in rows:
        if r.kind != "stage" or r.correct is not True or r.time_ms is None:
            continue
        key = f"{r.stage}[{r.source}]" if r.source else r.stage
        if key not in best or r.time_ms < best[key][1]:
            best[key] = (r.name, r.time_ms)
    stages = {}
    for s in registry.STAGES:
        pick = best.get(f"{s}[indexer]") or best.get(s) or best.get(f"{s}[table]")
        if pick:
            stages[s] = pick[0]
    pipes = [r for r in rows if r.kind == "pipeline" and r.correct and r.time_ms is not None
             and r.source != "indexer_fp8"]          # the fp8 rows take other inputs: not a winner
    pipe = min(pipes, key=lambda r: r.time_ms).name if pipes else None
    return {"stages": stages, "by_source": {k: {"variant": n, "time_ms": t} for k, (n, t) in best.items()},
            "pipeline": pipe}
