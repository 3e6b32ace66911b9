"""Shared plumbing of the CuPy family: device arrays in, the launch stream,
score-source binding (which template instantiation, padded tiny shapes) and
kernel launches through the hot-reloading loader."""
from __future__ import annotations

import functools
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import cupy as cp
import numpy as np

import reference as R
from reference import validate as V
from workbench import instantiations as INST

from ... import loader
from ...bf16 import float32_to_bf16_bits

BLOCK = 256
WARPS = BLOCK // 32
RADIX = 256
CHUNK = BLOCK * 16                 # keys per block in the SIMT scoring kernels
MAX_SAMPLES = 8192                 # threshold.cu
STATIC_SMEM_LIMIT = 48 * 1024
MAX_GRID_Y = 65535


def gpu_status() -> tuple[bool, str]:
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:           # no driver / no device
        return False, f"no CUDA device usable by CuPy ({type(e).__name__}: {e})"
    return (n > 0, "" if n > 0 else "no CUDA device found")


# ------------------------------------------------------------------ streams
def _torch_stream_ptr():
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_stream().cuda_stream


@contextmanager
def launch_stream():
    """The stream to launch on, read at every call: an explicit CuPy stream
    context wins; otherwise PyTorch's current stream when torch is in use."""
    cur = cp.cuda.get_current_stream()
    ptr = _torch_stream_ptr()
    if cur.ptr != 0 or not ptr:
        yield cur
        return
    with cp.cuda.ExternalStream(ptr) as s:
        yield s


# ------------------------------------------------------------------ arrays
def as_device(x):
    """NumPy (copied in), CuPy, torch CUDA tensors (bf16 viewed as int16 bits) or
    anything with __cuda_array_interface__ / __dlpack__ -> a CuPy array."""
    if isinstance(x, cp.ndarray):
        return x
    if isinstance(x, np.ndarray):
        return cp.asarray(x)
    if type(x).__module__.split(".")[0] == "torch":
        import torch
        if x.device.type != "cuda":
            return cp.asarray(x.detach().numpy() if x.dtype != torch.bfloat16
                              else x.detach().view(torch.int16).numpy().view(np.uint16))
        if x.dtype == torch.bfloat16:
            return cp.from_dlpack(x.detach().view(torch.int16)).view(cp.uint16)
        return cp.from_dlpack(x.detach())
    if hasattr(x, "__cuda_array_interface__"):
        return cp.asarray(x)
    if hasattr(x, "__dlpack__"):
        return cp.from_dlpack(x)
    return cp.asarray(np.asarray(x))


def input_dtype(x) -> str:
    """'float32' or 'bfloat16' (uint16/int16 arrays are bf16 bits)."""
    if x.dtype == cp.float32:
        return "float32"
    if x.dtype in (cp.uint16, cp.int16):
        return "bfloat16"
    raise TypeError(f"indexer inputs must be float32 or bf16 (uint16 bits / torch.bfloat16), got {x.dtype}")


def i32(x, name):
    a = as_device(x)
    if a.dtype != cp.int32:
        if a.dtype.kind not in "iu":
            raise TypeError(f"argument '{name}' must be an int32 array, got {a.dtype}")
        a = a.astype(cp.int32)
    return cp.ascontiguousarray(a)


def scalar_i32(v, name):
    v = int(v)
    if not -2**31 <= v < 2**31:
        raise ValueError(f"argument '{name}' = {v} does not fit in int32")
    return np.int32(v)


# ------------------------------------------------------------------ sources
@dataclass
class BoundSource:
    """A score source ready for launch: template argument + (p0, p1, p2, L)."""
    cxx: str                 # C++ source type, e.g. hytopk::IndexerSource<64, 128, float>
    args: tuple              # (p0, p1, p2, np.int64 L)
    n: int
    L: int
    smem_floats: int         # Src::SMEM_FLOATS
    shapes: tuple            # instantiation shapes of the module to load
    kind: str                # "table" | "indexer"
    q: object = None
    w: object = None
    keys: object = None
    H: int = 0
    D: int = 0
    dtype: str = ""


def instantiation_shape(H: int, D: int, *, mma: bool = False) -> tuple[tuple, tuple]:
    """(shape to run, module shapes): a shipped shape as is; up to TINY padded to
    TINY; anything else compiled on demand (rounded up to the mma tile for mma)."""
    if (H, D) in INST.SHAPES and (not mma or INST.mma_ok(H, D)):
        return (H, D), INST.SHAPES
    tH, tD = INST.TINY
    if H <= tH and D <= tD:
        return INST.TINY, INST.SHAPES
    shape = (-(-H // 8) * 8, -(-D // 16) * 16) if mma else (H, D)
    return shape, (shape,)


def pad_inputs(q, w, keys, H, D):
    """Zero-pad heads and dims (a zero head or dim adds exactly +0 to every sum)."""
    n, h0, d0 = q.shape
    if (h0, d0) == (H, D):
        return q, w, keys
    qp = cp.zeros((n, H, D), q.dtype)
    qp[:, :h0, :d0] = q
    wp = cp.zeros((n, H), w.dtype)
    wp[:, :h0] = w
    kp = cp.zeros((keys.shape[0], D), keys.dtype)
    kp[:, :d0] = keys
    return qp, wp, kp


def bind_indexer(q, w, keys, *, dtype=None, mma=False) -> BoundSource:
    q, w, keys = (cp.ascontiguousarray(as_device(a)) for a in (q, w, keys))
    dt = input_dtype(q)
    if input_dtype(w) != dt or input_dtype(keys) != dt:
        raise TypeError(f"arguments 'q', 'w', 'keys' must share one dtype, got {q.dtype}, {w.dtype}, {keys.dtype}")
    if dtype == "bfloat16" and dt == "float32":       # the tensor-core path takes bf16 only
        q, w, keys = (float32_to_bf16_bits(a, cp) for a in (q, w, keys))
        dt = "bfloat16"
    if dt == "bfloat16":
        q, w, keys = (a.view(cp.uint16) for a in (q, w, keys))
    n, H0, D0 = q.shape
    (H, D), shapes = instantiation_shape(H0, D0, mma=mma)
    q, w, keys = pad_inputs(q, w, keys, H, D)
    L = keys.shape[0]
    return BoundSource(INST.indexer_source(H, D, dt), (q, w, keys, np.int64(L)), n, L, H * D + H,
                       shapes, "indexer", q, w, keys, H, D, dt)


def table_array(scores, name="scores"):
    """A score table on the device, contiguous, and its C++ source type: float32 ->
    TableSource; bf16 (torch.bfloat16 / uint16 / int16 bits) -> TableBf16Source, whose
    scores are the bf16 values widened exactly to float32."""
    s = cp.ascontiguousarray(as_device(scores))
    if s.ndim != 2 or s.dtype not in (cp.float32, cp.uint16, cp.int16):
        raise TypeError(f"argument '{name}': table scores must be a 2-D float32 or bf16 (uint16 bits) array, "
                        f"got {s.dtype} {s.shape}")
    if s.dtype == cp.float32:
        return s, INST.TABLE
    return s.view(cp.uint16), INST.TABLE_BF16


def bind(source) -> BoundSource:
    """reference.TableSource / IndexerSource (any array kind) -> BoundSource."""
    if isinstance(source, R.TableSource):
        s, cxx = table_array(source.scores, "source")
        n, L = s.shape
        return BoundSource(cxx, (s, s, s, np.int64(L)), n, L, 0, INST.SHAPES, "table")
    if isinstance(source, R.IndexerSource):
        return bind_indexer(source.q, source.w, source.keys)
    raise TypeError(f"argument 'source' must be a reference.TableSource or IndexerSource, got {type(source).__name__}")


# ------------------------------------------------------------------ launches
def kernel(file: str, name: str, shapes=INST.SHAPES):
    """The compiled kernel `name` of `file` (module with every instantiation for `shapes`).
    On every launch's path: the name list is built once, the module found by a dict lookup,
    and the loader's staleness check (a stat of each included file) runs at most every
    LAUNCH_MAX_AGE_S: a pass loop of many launches no longer pays it per launch."""
    names, known = _names(file, tuple(map(tuple, shapes)))
    if name not in known:
        raise KeyError(f"{name!r} is not instantiated in {file}; known: {list(names)}")
    if RECORDER is not None and RECORDER.dry:
        return DryKernel(f"{file}:{name}")
    fn = loader.module(file, names, options=INST.FILE_OPTIONS.get(file, ())).function(name, max_age=LAUNCH_MAX_AGE_S)
    FN_NAMES[id(fn)] = f"{file}:{name}"      # CuPy's Function has no name: the recorder reads it here
    return fn


# ------------------------------------------------------------------ launch recording (tests, host-time probes)
class Recorder:
    """The launches issued while recording: (kernel, grid, threads, smem) per launch. ``dry``:
    kernels are neither compiled nor run (a CPU run of the launch sequence: its count and the
    host's Python cost per launch, with no GPU)."""

    def __init__(self, dry: bool = False):
        self.dry = dry
        self.launches: list = []

    def names(self) -> list:
        return [l[0] for l in self.launches]


class DryKernel:
    """What kernel() hands out in a dry recording: a name and the attribute launch() sets."""

    def __init__(self, name):
        self.name = name
        self.max_dynamic_shared_size_bytes = STATIC_SMEM_LIMIT


RECORDER: Recorder | None = None
FN_NAMES: dict = {}        # id(Function) -> "file:name" (the loader keeps each Function alive: ids stay unique)


@contextmanager
def record_launches(dry: bool = False):
    """``with record_launches() as rec:`` every launch() in the block is listed in rec.launches
    (dry=True: and not run; see Recorder)."""
    global RECORDER
    outer, RECORDER = RECORDER, Recorder(dry)
    try:
        yield RECORDER
    finally:
        RECORDER = outer


LAUNCH_MAX_AGE_S = 0.05     # a launch trusts a freshness check this young (edits show up within it)


@functools.lru_cache(maxsize=256)
def _names(file: str, shapes: tuple):
    names = tuple(INST.name_expressions(file, shapes))
    return names, frozenset(names)


MAX_GRID_X = 2**31 - 1


def launch(fn, grid, args, smem_bytes=0, threads=BLOCK):
    grid = tuple(int(g) for g in grid)
    if any(g <= 0 for g in grid):
        return
    if grid[0] > MAX_GRID_X or (grid[1:] and max(grid[1:]) > MAX_GRID_Y):
        raise ValueError(f"grid {grid} too large: context too long for one launch")
    smem_bytes = int(smem_bytes)
    if smem_bytes > STATIC_SMEM_LIMIT and fn.max_dynamic_shared_size_bytes < smem_bytes:
        fn.max_dynamic_shared_size_bytes = smem_bytes
    if RECORDER is not None:
        RECORDER.launches.append((FN_NAMES.get(id(fn), getattr(fn, "name", str(fn))), grid, int(threads), smem_bytes))
        if RECORDER.dry:
            return
    fn(grid, (int(threads),), args, shared_mem=smem_bytes)


def chunks(length: int, chunk: int) -> int:
    return max(1, math.ceil(length / chunk))


def exact_topk_smem_bytes(k: int) -> int:
    return 4 * (RADIX + 4 + WARPS * RADIX + 6 * k)


def check_k_fits(k: int, smem_bytes=exact_topk_smem_bytes):
    """k, if the exact top-k buffers of k entries (smem_bytes(k)) fit this device's shared memory."""
    k = V.check_k(k)
    limit = cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if smem_bytes(k) > limit:
        lo, hi = 0, k                  # largest k that fits (smem_bytes grows with k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if smem_bytes(mid) <= limit else (lo, mid - 1)
        raise ValueError(f"argument 'k' = {k} needs {smem_bytes(k)} bytes of shared memory for its select buffers; "
                         f"this device has {limit}: at most k = {lo} here")
    return k


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def bitonic_topk_smem_bytes(k: int) -> int:
    """hytopk_radix.cuh bitonic_topk_smem_words(k), in bytes."""
    return 4 * (RADIX + 4 + 3 * next_pow2(k))
