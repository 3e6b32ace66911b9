"""Named problem shapes for `hytopk compare` (docs/CONTRACT.md §7 and issue 5).

`tiny` is the CPU shape (reference + Numba simulator variants); the others are
the real-model shapes, run on a GPU and checked against the torch oracle.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from reference import generate


@dataclass(frozen=True)
class Preset:
    name: str
    n: int                  # queries
    L: int                  # keys
    H: int                  # indexer heads
    D: int                  # head dim
    k: int
    layout: str = "causal_tail"
    dtype: str = "bfloat16"  # q, w, keys as given to the variants
    oversample: float = 3.0
    max_failed: int = 64
    capacity: int | None = None
    gpu: bool = True         # needs a GPU (else: CPU, checked against the reference)
    seed: int = 0

    @property
    def shape_class(self) -> dict:
        return {"n": self.n, "L": self.L, "H": self.H, "D": self.D, "k": self.k, "layout": self.layout}

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS = {p.name: p for p in (
    # small enough for the CPU reference and the one-thread-per-CUDA-thread simulator;
    # c ranges over < k, = k and > k (sampled) with max_failed 1 so recovery and fallback paths run
    Preset("tiny", n=4, L=320, H=2, D=8, k=16, layout="causal_tail", dtype="float32",
           max_failed=1, gpu=False),
    # a quick GPU shape for the GPU tests and `hytopk watch` (not a model shape)
    Preset("gpu-small", n=256, L=16384, H=8, D=64, k=256),
    Preset("dsv32-32k", n=4096, L=32768, H=64, D=128, k=2048),
    Preset("dsv32-128k", n=4096, L=131072, H=64, D=128, k=2048),
    Preset("glm5-128k", n=4096, L=131072, H=32, D=128, k=2048),
    Preset("glm5-256k-allkeys", n=32768, L=262144, H=32, D=128, k=2048, layout="full"),
    Preset("dsv32-1m", n=8192, L=1048576, H=64, D=128, k=2048),
)}


def get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"argument 'preset': unknown preset {name!r}; choose from {sorted(PRESETS)}") from None


def default_preset(has_gpu: bool) -> str:
    return "dsv32-128k" if has_gpu else "tiny"


def make_inputs(p: Preset):
    """Host exact-arithmetic inputs (float32 small integers: every implementation's
    scores agree bit for bit) and the context ranges. Returns (q, w, keys, lo, hi)."""
    rng = np.random.default_rng(p.seed)
    q, w, keys = generate.indexer_inputs(p.n, p.L, p.H, p.D, rng, exact=True)
    lo, hi = generate.layout(p.layout, p.n, p.L, p.k, rng)
    if p.name == "tiny":
        # spread the context lengths over the interesting cases: empty, < k, k, sampled
        hi = np.linspace(p.L // 2, p.L, p.n).astype(np.int32)
        lo = np.zeros(p.n, np.int32)
        lo[0], hi[0] = 5, 5                       # empty context
        lo[1], hi[1] = 100, 100 + p.k - 3         # c < k: padded output
    return q, w, keys, lo, hi
