"""One registry of stage variants for every family (reference, numba, cupy).

A variant of a stage obeys the stage's signature (STAGES below, the same as the
reference stage function) on its family's device arrays. Tests and the
`compare` harness iterate over `variants(...)`, so adding a variant is one
decorated function in its family's module and nothing else.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

# stage name -> signature (documentation; every variant of the stage obeys it)
STAGES = {
    "threshold": "(source, lo, hi, M, r) -> T float32[n]",
    "filter": "(source, lo, hi, T, capacity) -> (cand_idx int32[n,cap], cand_val float32[n,cap], count int32[n])",
    "check": "(count, lo, hi, k, capacity) -> (failed bool/uint8[n], rows int32[nf])",
    "select": "(cand_idx, cand_val, count, k) -> (idx int32[n,k], val float32[n,k])",
    "recover": "(source, lo, hi, rows, k) -> (idx int32[len(rows),k], val float32[len(rows),k])",
    "dense": "(q, w, keys, lo, hi[, kscale]) -> scores float32[n, L] (-inf outside the context)",
    "replay": "(q, w, keys, idx[, kscale]) -> scores float32[n, k] (-inf where idx = -1)",
}
# Sparse attention over the selected keys (docs/CONTRACT.md §8): stages of their own, outside the
# HyTopK pipeline (pipeline.StageSet and the selection harness iterate over STAGES only).
ATTENTION_STAGES = {
    "attend": "(q [n,Hq,Dqk], k [L,Hkv,Dqk], v [L,Hkv,Dv], idx int32[n,kk], scale) -> (out [n,Hq,Dv], lse float32[n,Hq])",
    "attend_backward": "(dout [n,Hq,Dv], q, k, v, idx, scale) -> (dq [n,Hq,Dqk], dk [L,Hkv,Dqk], dv [L,Hkv,Dv] | None)",
}
SOURCE_STAGES = ("threshold", "filter", "recover")     # take a TableSource / IndexerSource
FAMILY_MODULES = {
    "reference": "workbench.families.reference",
    "numba": "workbench.families.numba",
    "cupy": "workbench.families.cupy",
}


@dataclass(frozen=True)
class Variant:
    stage: str
    name: str                       # unique, "<family>.<stage>.<what>", e.g. "numba.select.block"
    family: str
    fn: Callable = field(compare=False, repr=False)
    sources: tuple = ("table", "indexer")   # for SOURCE_STAGES: which score sources it accepts
    gpu_only: bool = False          # needs a real GPU (warp intrinsics): never run in the simulator
    notes: str = ""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_VARIANTS: dict[str, Variant] = {}
_LOAD_ERRORS: dict[str, str] = {}


def register(stage: str, name: str, *, sources=("table", "indexer"), gpu_only=False, notes=""):
    """Decorator: ``@register("select", "numba.select.block")``. The family is the name's prefix."""
    if stage not in STAGES and stage not in ATTENTION_STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {sorted(STAGES) + sorted(ATTENTION_STAGES)}")
    family = name.split(".", 1)[0]
    if family not in FAMILY_MODULES:
        raise ValueError(f"variant name {name!r} must start with a family: {sorted(FAMILY_MODULES)}")

    def deco(fn):
        v = Variant(stage, name, family, fn, tuple(sources), gpu_only, notes or (fn.__doc__ or "").strip().split("\n")[0])
        _VARIANTS[name] = v
        return fn
    return deco


def load_family(family: str) -> bool:
    """Import a family's variant modules; False (with the reason kept) if it cannot load here."""
    if family in _LOAD_ERRORS:
        return False
    try:
        importlib.import_module(FAMILY_MODULES[family])
        return True
    except Exception as e:          # missing package, no driver, ...: say why, don't crash
        _LOAD_ERRORS[family] = f"{type(e).__name__}: {e}"
        return False


def load_error(family: str) -> str | None:
    return _LOAD_ERRORS.get(family)


def variants(stage: str | None = None, family: str | None = None, *, load=True) -> list[Variant]:
    if load:
        for fam in ([family] if family else FAMILY_MODULES):
            load_family(fam)
    return [v for v in _VARIANTS.values()
            if (stage is None or v.stage == stage) and (family is None or v.family == family)]


def get(name: str) -> Variant:
    load_family(name.split(".", 1)[0])
    try:
        return _VARIANTS[name]
    except KeyError:
        raise KeyError(f"no variant named {name!r}; known: {sorted(_VARIANTS)}") from None
