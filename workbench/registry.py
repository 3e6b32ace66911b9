"""One registry of stage variants for every family (reference, numba, cupy).

A variant of a stage obeys the stage's signature (STAGES below, the same as the
reference stage function) on its family's device arrays. Tests and the
`compare` harness iterate over `variants(...)`, so adding a variant is one
decorated function in its family's module and nothing else.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Callable

@dataclass(frozen=True)
class Work:
    """The sizes a stage's work model reads (compare fills it from its workload)."""
    n: int                  # queries
    L: int                  # keys
    H: int
    D: int
    k: int
    elem_bytes: int         # bytes per q / keys element as given (bf16 2, float32 4)
    sum_c: float            # context entries over all queries
    sum_M: float            # samples over all queries
    stored: float           # candidates stored (min(count, capacity) summed)
    sum_c_rows: float       # context entries of the recovered rows
    scale_bytes: int = 0    # bytes of scales per key row (fp8 e4m3: a float32 per key)

    @property
    def hd2(self) -> float:
        """FLOPs of one score: 2 H D."""
        return 2.0 * self.H * self.D

    @property
    def keys_bytes(self) -> float:
        return float(self.L * (self.D * self.elem_bytes + self.scale_bytes))


@dataclass(frozen=True)
class StageCard:
    """Everything about one stage, in one place. Its variants obey ``signature``; tests and
    compare call them with the arguments named in ``args`` (``source``: a score source, one row
    per kind in ``sources``), check them with ``check`` and rate them with ``work``. Adding a
    stage is a card here plus its variants (and, for inputs compare does not have yet, an
    ``inputs`` builder)."""
    name: str
    signature: str                          # documentation; every variant obeys it
    args: tuple                             # argument names in call order
    reference: str                          # "module:function", the NumPy stage (the executable spec)
    check: str                              # "module:function", the harness check: (out, E, oracle, lo, hi, rows) -> (ok, why)
    work: Callable = field(compare=False, repr=False)   # (Work, source) -> (flops, bytes) of one call
    sources: tuple = ()                     # score sources when args has "source" ("table", "indexer")
    inputs: str = ""                        # "module:function" (workload) -> {name: torch tensor}: extra inputs
    role: str = "stage"                     # "stage": a step of the HyTopK pipeline (STAGES); "floor": a
    #                                         baseline the stages are rated against (FLOORS: its rows are baselines)
    row: Callable | None = field(default=None, compare=False, repr=False)   # (variant, source) -> (kind,
    #                                         stage, name, source) of its compare row; None: a stage row

    def row_of(self, v, source) -> tuple:
        """(kind, stage, name, source) of the compare row of variant ``v`` on ``source``."""
        return self.row(v, source) if self.row else ("stage", self.name, v.name, source)

    def reference_fn(self) -> Callable:
        return _resolve(self.reference)

    def check_fn(self) -> Callable:
        return _resolve(self.check)

    def inputs_fn(self) -> Callable | None:
        return _resolve(self.inputs) if self.inputs else None


def _resolve(path: str) -> Callable:
    mod, _, attr = path.partition(":")
    return getattr(importlib.import_module(mod), attr)


_CHECKS = "workbench.harness.checks"
_BUILD = "workbench.harness.sources"
_SRC = ("table", "indexer")


@dataclass(frozen=True)
class SourceKind:
    """One kind of score source a source stage takes: how compare builds it from the workload's
    arrays and what its inputs weigh. Adding an input encoding is one entry in SOURCES (plus the
    ``sources`` of the cards and variants that take it)."""
    name: str
    build: str                  # "module:function" (family arrays by name) -> the source a variant takes
    needs_table: bool = False   # needs the [n, L] table (compare skips it when the table is too large)
    elem_bytes: int | None = None   # bytes per q / keys element when not the preset's dtype (fp8: 1)
    scale_bytes: int = 0        # bytes of scales per key row
    float32: bool = False       # q, w, keys reach the builder as float32 (it re-encodes them)
    encode: str = ""            # "module:function" (host q, w, keys, seed) -> pipeline inputs {q, w, keys,
    #                             kscale} as torch tensors on the device; "": the workload's own arrays
    usable: str = ""            # "module:function" (variant) -> (ok, why): the variant can take it here; "": yes

    def build_fn(self) -> Callable:
        return _resolve(self.build)

    def usable_by(self, v) -> tuple[bool, str]:
        return _resolve(self.usable)(v) if self.usable else (True, "")

    def sized(self, w: Work) -> Work:
        """The work sizes with this source's element and scale bytes."""
        if self.elem_bytes is None:
            return w
        return dataclasses.replace(w, elem_bytes=self.elem_bytes, scale_bytes=self.scale_bytes)


SOURCES: dict[str, SourceKind] = {s.name: s for s in (
    SourceKind("table", f"{_BUILD}:table", needs_table=True),
    SourceKind("indexer", f"{_BUILD}:indexer"),
    # the preset's inputs (small integers) as fp8 e4m3 with per-key scales: the same scores bit for bit
    SourceKind("indexer_fp8", f"{_BUILD}:indexer_fp8", elem_bytes=1, scale_bytes=4, float32=True,
               encode=f"{_BUILD}:encode_fp8", usable=f"{_BUILD}:fp8_usable"),
)}


def _scores(flops_indexer, bytes_indexer, bytes_table):
    """Work of a stage that scores: FLOPs and bytes for an indexer source (its bytes sized by
    SourceKind.sized), bytes for a table."""
    return lambda w, source: ((0.0, bytes_table(w)) if source == "table" else (flops_indexer(w), bytes_indexer(w)))


def _floor_row(v, source) -> tuple:
    """The score-only floor's rows keep their baseline names (earlier JSON stays comparable):
    ``score-only`` for the SIMT core, ``score-only-<core>[-fp8]`` for the others."""
    parts = v.name.split(".", 2)
    core = parts[2] if len(parts) > 2 else None          # "reference.score_only": the family's one floor
    fp8 = "_fp8" if source == "indexer_fp8" else ""
    stage = "score-only" if core == "simt" and not fp8 else f"score-only-{core or v.family}" + fp8.replace("_", "-")
    return "baseline", stage, f"{v.family} score_only" + (f"[{core}{fp8}]" if core else "") + " (checksum)", None


STAGES: dict[str, StageCard] = {c.name: c for c in (
    StageCard("threshold", "(source, lo, hi, M, r) -> T float32[n]", ("source", "lo", "hi", "M", "r"),
              "reference:stage_threshold", f"{_CHECKS}:threshold",
              _scores(lambda w: w.hd2 * w.sum_M, lambda w: w.sum_M * w.D * w.elem_bytes, lambda w: 4 * w.sum_M),
              sources=_SRC),
    StageCard("filter", "(source, lo, hi, T, capacity) -> (cand_idx int32[n,cap], cand_val float32[n,cap], "
              "count int32[n])", ("source", "lo", "hi", "T", "capacity"),
              "reference:stage_filter", f"{_CHECKS}:filter_",
              _scores(lambda w: w.hd2 * w.sum_c, lambda w: w.keys_bytes + 8 * w.stored,
                      lambda w: 4 * w.sum_c + 8 * w.stored), sources=_SRC + ("indexer_fp8",)),
    StageCard("check", "(count, lo, hi, k, capacity) -> (failed bool/uint8[n], rows int32[nf])",
              ("count", "lo", "hi", "k", "capacity"), "reference:stage_check", f"{_CHECKS}:check",
              lambda w, source: (0.0, 12.0 * w.n)),
    StageCard("select", "(cand_idx, cand_val, count, k) -> (idx int32[n,k], val float32[n,k])",
              ("cand_idx", "cand_val", "count", "k"), "reference:stage_select", f"{_CHECKS}:select",
              lambda w, source: (0.0, 8 * w.stored + 8.0 * w.n * w.k)),
    StageCard("recover", "(source, lo, hi, rows, k) -> (idx int32[len(rows),k], val float32[len(rows),k])",
              ("source", "lo", "hi", "rows", "k"), "reference:stage_recover", f"{_CHECKS}:recover",
              _scores(lambda w: w.hd2 * w.sum_c_rows, lambda w: w.keys_bytes, lambda w: 4 * w.sum_c_rows),
              sources=_SRC),
    StageCard("dense", "(q, w, keys, lo, hi[, kscale]) -> scores float32[n, L] (-inf outside the context)",
              ("q", "w", "keys", "lo", "hi"), "reference:indexer_scores", f"{_CHECKS}:dense",
              lambda w, source: (w.hd2 * w.sum_c, 4.0 * w.n * w.L + w.keys_bytes)),
    StageCard("replay", "(q, w, keys, idx[, kscale]) -> scores float32[n, k] (-inf where idx = -1)",
              ("q", "w", "keys", "idx"), "reference:replay_scores", f"{_CHECKS}:replay",
              lambda w, source: (w.hd2 * w.n * w.k, float(w.n * w.k * w.D * w.elem_bytes))),
)}
SOURCE_STAGES = tuple(name for name, card in STAGES.items() if card.sources)   # take a score source

# Floors: stages outside the pipeline whose rows are the baselines the stage rows are rated
# against. Compare runs them like any stage (their card's arguments, check and work model).
FLOORS: dict[str, StageCard] = {c.name: c for c in (
    StageCard("score_only", "(source, lo, hi) -> checksum uint64[1] (or its int64 view): the wrapping sum of "
              "the order keys of every in-context score (the scoring of a fused filter, nothing selected)",
              ("source", "lo", "hi"), "reference:stage_score_only", f"{_CHECKS}:score_only",
              lambda w, source: (w.hd2 * w.sum_c, w.keys_bytes), sources=("indexer", "indexer_fp8"),
              role="floor", row=_floor_row),
)}
CARDS = collections.ChainMap(STAGES, FLOORS)   # every card (a live view): compare and register read these


# Sparse attention over the selected keys (docs/CONTRACT.md §8): stages of their own, outside the
# HyTopK pipeline (pipeline.StageSet and the selection harness iterate over STAGES only;
# a card per attention stage would let compare take them too).
ATTENTION_STAGES = {
    "attend": "(q [n,Hq,Dqk], k [L,Hkv,Dqk], v [L,Hkv,Dv], idx int32[n,kk], scale) -> (out [n,Hq,Dv], lse float32[n,Hq])",
    "attend_backward": "(dout [n,Hq,Dv], q, k, v, idx, scale) -> (dq [n,Hq,Dqk], dk [L,Hkv,Dqk], dv [L,Hkv,Dv] | None)",
}
# where each family's record (families.Family: its stage sets, preference, stream adapter...) lives;
# importing the module registers the family's variants
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
    sources: tuple = ("table", "indexer")   # for stages that take a source (the card's sources): which it accepts
    gpu_only: bool = False          # needs a real GPU (warp intrinsics): never run in the simulator
    notes: str = ""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_VARIANTS: dict[str, Variant] = {}
_LOAD_ERRORS: dict[str, str] = {}


def register(stage: str, name: str, *, sources=("table", "indexer"), gpu_only=False, notes=""):
    """Decorator: ``@register("select", "numba.select.block")``. The family is the name's prefix."""
    if stage not in CARDS and stage not in ATTENTION_STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {sorted(CARDS) + sorted(ATTENTION_STAGES)}")
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


def record(family: str):
    """The family's record (families.Family), or None when it cannot load here."""
    if family not in FAMILY_MODULES or not load_family(family):
        return None
    return importlib.import_module(FAMILY_MODULES[family]).FAMILY


def preference() -> tuple[str, ...]:
    """The families the torch ops may launch, best first (their records' ``preference``);
    a family that cannot load here is left out (load_error says why)."""
    ranked = [(r.preference, f) for f in FAMILY_MODULES
              if (r := record(f)) is not None and r.preference is not None]
    return tuple(f for _, f in sorted(ranked))


def variants(stage: str | None = None, family: str | None = None, *, load=True) -> list[Variant]:
    if load:
        for fam in ([family] if family else FAMILY_MODULES):
            load_family(fam)
    return [v for v in _VARIANTS.values()
            if (stage is None or v.stage == stage) and (family is None or v.family == family)]


def variant_stage(name: str) -> str | None:
    """The stage of a registered variant (of the families loaded so far), None if unknown."""
    v = _VARIANTS.get(name)
    return v.stage if v else None


def get(name: str) -> Variant:
    load_family(name.split(".", 1)[0])
    try:
        return _VARIANTS[name]
    except KeyError:
        raise KeyError(f"no variant named {name!r}; known: {sorted(_VARIANTS)}") from None
