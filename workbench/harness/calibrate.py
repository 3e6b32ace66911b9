"""`hytopk calibrate`: how often HyTopK's check fails, as a function of
oversample, capacity and the sample-count bounds, over the adversarial score
families. This is what justifies the defaults (oversample 3, capacity from
reference.default_capacity, M in [4096, 8192]).

Only the threshold and the candidate count matter, so each setting runs the
threshold and filter stages alone (the reference stages on CPU, the fastest
GPU variants on a GPU) and derives overflow / underflow / fallback from the
counts; the capacity sweep reuses one set of counts.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

import reference as R
from reference import generate, sampling

DEFAULT_BOUNDS = (sampling.MIN_SAMPLES, sampling.MAX_SAMPLES)


@contextlib.contextmanager
def sample_bounds(lo: int, hi: int):
    """Temporarily change the sample-count clamp that reference.sampling.num_samples
    applies (the reference functions read the module constants at call time)."""
    old = sampling.MIN_SAMPLES, sampling.MAX_SAMPLES
    sampling.MIN_SAMPLES, sampling.MAX_SAMPLES = int(lo), int(hi)
    try:
        yield
    finally:
        sampling.MIN_SAMPLES, sampling.MAX_SAMPLES = old


@dataclass
class Engine:
    """Runs threshold + filter and returns the true candidate counts (host int64)."""
    name: str
    threshold: Callable
    filter: Callable
    to_device: Callable
    to_host: Callable

    def counts(self, table, lo, hi, M, r, k) -> np.ndarray:
        d = self.to_device
        src = R.TableSource(table)
        T = self.threshold(src, d(lo), d(hi), d(M), d(r))
        _, _, count = self.filter(src, d(lo), d(hi), T, int(k))   # buffer of k: only the count is used
        return np.asarray(self.to_host(count), np.int64)


def pick_engine(gpu: bool) -> Engine:
    """The reference stages on CPU; on a GPU the recorded winners, else the first GPU variants."""
    if gpu:
        from .. import registry
        from ..families import get_family
        from . import winners
        chosen = {}
        try:
            chosen = winners.load("dsv32-128k")
        except Exception:
            pass
        for fam in ("cupy", "numba"):
            if not registry.load_family(fam):
                continue
            th = [v for v in registry.variants("threshold", fam) if "table" in v.sources]
            fi = [v for v in registry.variants("filter", fam) if "table" in v.sources]
            if th and fi:
                pick = lambda vs, s: next((v for v in vs if v.name == chosen.get(s)), vs[0])
                t, f = pick(th, "threshold"), pick(fi, "filter")
                F = get_family(fam)
                return Engine(f"{t.name} + {f.name}", t.fn, f.fn, F.to_device, F.to_host)
    return Engine("reference.threshold + reference.filter", R.stage_threshold, R.stage_filter,
                  lambda x: x, np.asarray)


def rates(counts, sampled, k, capacity):
    c = counts[sampled]
    if c.size == 0:
        return 0.0, 0.0, 0.0
    over = float(np.mean(c > capacity))
    under = float(np.mean(c < k))
    return over, under, float(np.mean((c > capacity) | (c < k)))


def _positive(name, v, none_ok=True):
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"argument '{name}' must be an int >= 1, got {v!r}")
    return int(v)


def run(n=None, L=None, k=None, draws=2, families=None, layout="full", quick=False, gpu=None,
        oversamples=None, capacity_factors=None, bounds=None, max_failed=None,
        say: Callable[[str], None] = print, progress_factory=None) -> dict:
    from .timing import gpu_available
    # sizes: None means the default; anything else must be a positive int (0 is not "default")
    n, L, k, draws = (_positive(name, v, none_ok=name != "draws")
                      for name, v in (("n", n), ("L", L), ("k", k), ("draws", draws)))
    gpu = gpu_available() if gpu is None else gpu
    # CPU defaults keep r (the threshold rank) at the real shape's value: L=16384, k=64 -> M=4096, r=48
    n = n if n is not None else (4096 if gpu else (16 if quick else 64))
    L = L if L is not None else (131072 if gpu else (8192 if quick else 16384))
    k = k if k is not None else (2048 if gpu else (32 if quick else 64))
    families = list(families or generate.SCORE_FAMILIES)
    for f in families:
        if f not in generate.SCORE_FAMILIES:
            raise ValueError(f"argument 'family': unknown score family {f!r}; choose from {generate.SCORE_FAMILIES}")
    if k >= L:
        raise ValueError(f"argument 'k' must be < L = {L}, got {k}")
    oversamples = list(oversamples or ((2.0, 3.0, 4.0) if quick else (1.5, 2.0, 3.0, 4.0, 6.0)))
    capacity_factors = list(capacity_factors or (1.0, 1.25, 1.5, 2.0, 3.0))
    bounds = list(bounds or (((1024, 2048), DEFAULT_BOUNDS) if quick else
                             ((1024, 2048), (2048, 4096), DEFAULT_BOUNDS)))
    # the default max_failed (64) is for 4096 queries; keep the same fraction at reduced n
    max_failed = max_failed if max_failed is not None else max(1, round(64 * n / 4096))
    engine = pick_engine(gpu)
    scale = "full scale (GPU)" if gpu else "reduced scale (CPU reference)"
    say(f"calibrate: {scale}, {engine.name}; n={n} L={L} k={k} layout={layout}, {draws} draws per setting")

    settings = [("oversample", os_, DEFAULT_BOUNDS) for os_ in oversamples]
    settings += [("bounds", 3.0, b) for b in bounds if tuple(b) != DEFAULT_BOUNDS]
    total = len(families) * draws * len(settings)
    advance = progress_factory(total) if progress_factory else (lambda label: None)
    acc: dict = {}
    for fam in families:
        for d in range(draws):
            rng = np.random.default_rng(1000 * d + generate.SCORE_FAMILIES.index(fam))
            lo, hi = generate.layout(layout, n, L, k, rng)
            table = generate.score_table(fam, n, L, k, rng, lo, hi)
            dev_table = engine.to_device(table)
            lo64, hi64 = lo.astype(np.int64), hi.astype(np.int64)
            for kind, os_, b in settings:
                advance(f"{fam} draw {d}: {kind} oversample={os_} bounds={b[0]}-{b[1]}")
                with sample_bounds(*b):
                    M, r = R.sample_plan(lo64, hi64, k, os_)
                    cap = R.default_capacity(k, lo64, hi64, os_)
                    counts = engine.counts(dev_table, lo, hi, M, r, k)
                sampled = (hi64 - lo64) > k
                acc.setdefault((fam, os_, tuple(b)), []).append((counts, sampled, cap, M, r))
    advance(None)

    out = {"params": {"n": n, "L": L, "k": k, "draws": draws, "layout": layout, "scale": scale,
                      "engine": engine.name, "max_failed": max_failed, "oversample_default": 3.0,
                      "bounds_default": list(DEFAULT_BOUNDS)},
           "oversample": [], "capacity": [], "bounds": []}

    def summary(runs, cap=None):
        ov, un, fa, fb = [], [], [], []
        for counts, sampled, cap0, M, r in runs:
            o, u, f = rates(counts, sampled, k, cap if cap is not None else cap0)
            ov.append(o), un.append(u), fa.append(f)
            nfail = int(np.sum(((counts > (cap or cap0)) | (counts < k)) & sampled))
            fb.append(nfail > max_failed)
        mean_count = float(np.mean([np.mean(c[s]) for c, s, *_ in runs if s.any()] or [0.0]))
        return dict(overflow_rate=float(np.mean(ov)), underflow_rate=float(np.mean(un)),
                    fail_rate=float(np.mean(fa)), fallback_rate=float(np.mean(fb)),
                    mean_count_over_k=mean_count / k)

    for fam in families:
        for os_ in oversamples:
            runs = acc[(fam, os_, DEFAULT_BOUNDS)]
            out["oversample"].append(dict(family=fam, oversample=os_, capacity=int(runs[0][2]),
                                          r=int(np.max(runs[0][4])), **summary(runs)))
        base = acc.get((fam, 3.0, DEFAULT_BOUNDS))
        if base:
            caps = sorted({int(np.ceil(f * 3.0 * k)) for f in capacity_factors} | {int(base[0][2])})
            for cap in caps:
                s = summary(base, cap)
                out["capacity"].append(dict(family=fam, capacity=cap, capacity_over_k=cap / k,
                                            is_default=cap == int(base[0][2]),
                                            overflow_rate=s["overflow_rate"], fail_rate=s["fail_rate"]))
        for b in bounds:
            runs = acc.get((fam, 3.0, tuple(b)))
            if runs:
                out["bounds"].append(dict(family=fam, min_samples=b[0], max_samples=b[1],
                                          M=int(np.max(runs[0][3])), r=int(np.max(runs[0][4])), **summary(runs)))
    return out


def table(cal: dict):
    from rich.table import Table
    p = cal["params"]
    oss = sorted({r["oversample"] for r in cal["oversample"]})
    t = Table(title=f"hytopk calibrate — failed-query rate (overflow/underflow) by oversample; {p['scale']}, "
                    f"n={p['n']} L={p['L']} k={p['k']}, fallback when > {p['max_failed']} fail")
    t.add_column("family")
    for o in oss:
        t.add_column(f"os={o:g}", justify="right")
    t.add_column("fallback@3", justify="right")
    for fam in dict.fromkeys(r["family"] for r in cal["oversample"]):
        rs = {r["oversample"]: r for r in cal["oversample"] if r["family"] == fam}
        cells = [f"{rs[o]['fail_rate']:.3f} ({rs[o]['overflow_rate']:.2f}/{rs[o]['underflow_rate']:.2f})" for o in oss]
        fb = rs.get(3.0, {}).get("fallback_rate")
        t.add_row(fam, *cells, "–" if fb is None else f"{fb:.2f}")
    return t
