"""Which kernels the CUDA implementations of the ops launch.

Preference: the winners file's variants of the "cupy" family, then "numba",
then the pure-torch path (workbench.torch.scoring). ``HYTOPK_TORCH_BACKEND``
(cupy | numba | torch) forces one. Families are handed torch CUDA tensors and
return torch tensors (zero-copy through DLPack / __cuda_array_interface__).
"""
from __future__ import annotations

import contextlib
import os

import torch

PREFERENCE = ("cupy", "numba")
_chosen: dict[str, object] = {}
_reasons: dict[str, str] = {}


def _winners(family: str, shape: dict | None) -> dict | None:
    """Variant names per stage for ``family`` from the winners file entry nearest
    ``shape`` ({"L", "H", "D", "k"}), or None (the family's DEFAULTS)."""
    try:
        from workbench.harness import winners
    except ImportError:
        return None
    try:
        table = winners.load(shape or {})
    except Exception as e:          # unreadable winners file: say why, use DEFAULTS
        _reasons[f"winners:{family}"] = f"{type(e).__name__}: {e}"
        return None
    if not isinstance(table, dict):
        return None
    if isinstance(table.get(family), dict):
        table = table[family]
    picked = {stage: name for stage, name in table.items()
              if isinstance(name, str) and name.startswith(family + ".")}
    return picked or None


def _load(family: str, need_replay: bool, shape: dict | None):
    from workbench import backend, registry
    if not registry.load_family(family):
        _reasons[family] = registry.load_error(family) or "failed to load"
        return None
    try:
        from workbench.families import get_family
        ok, why = get_family(family).available()
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        _reasons[family] = why
        return None
    try:
        b = backend(family, variants=_winners(family, shape))
    except Exception as e:
        _reasons[family] = f"{type(e).__name__}: {e}"
        return None
    missing = [s for s in ("threshold", "filter", "check", "select", "recover") if getattr(b.stages, s) is None]
    if need_replay and b.stages.replay is None:
        missing.append("replay")
    if missing:
        _reasons[family] = f"no variant for stage(s) {missing}"
        return None
    return b


def cuda_backend(purpose: str, shape: dict | None = None):
    """A workbench Backend for 'select' or 'replay' on CUDA, or None for the pure-torch path.
    ``shape`` ({"L", "H", "D", "k"}) picks the winners entry; choices are cached per shape."""
    key = (purpose, tuple(sorted((shape or {}).items())))
    if key in _chosen:
        return _chosen[key]
    forced = os.environ.get("HYTOPK_TORCH_BACKEND", "").strip().lower()
    if forced and forced not in PREFERENCE + ("torch",):
        raise ValueError(f"HYTOPK_TORCH_BACKEND must be one of {PREFERENCE + ('torch',)}, got {forced!r}")
    order = () if forced == "torch" else ((forced,) if forced else PREFERENCE)
    b = None
    for fam in order:
        b = _load(fam, need_replay=(purpose == "replay"), shape=shape)
        if b is not None:
            break
    _chosen[key] = b
    return b


def report(shape: dict | None = None) -> dict:
    """What each op launches on CUDA and why the others were skipped (for logs and bench JSON)."""
    out = {}
    for purpose in ("select", "replay"):
        b = cuda_backend(purpose, shape) if torch.cuda.is_available() else None
        out[purpose] = repr(b) if b is not None else "pure torch (workbench.torch.scoring)"
    out["skipped"] = dict(_reasons)
    return out


def reset():
    """Forget the choices (after editing kernels or the winners file)."""
    _chosen.clear()
    _reasons.clear()


def _torch_allocator(device: torch.device):
    """A CuPy allocator drawing from torch's caching allocator on torch's current stream: the
    kernels' scratch is then stream-ordered with torch's work, counted in torch's memory stats,
    and, during a CUDA-graph capture, taken from the graph's private pool (CuPy's own pool would
    cudaMalloc in the capture, or hand the graph's memory to someone else after it)."""
    import cupy
    dev = device.index if device.index is not None else torch.cuda.current_device()

    def alloc(size):
        t = torch.empty(max(int(size), 1), dtype=torch.uint8, device=dev)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), t.numel(), t, dev), 0)
    return alloc


def kernel_inputs(q, w, keys, kscale=None):
    """The op's tensors as the Backend takes them: detached (kernels take raw memory; CAI/DLPack
    refuse tensors that require grad) and contiguous, dtypes unchanged. float32 w beside bf16 /
    fp8 q and keys, fp8 e4m3 tensors and their kscale go through as they are: the Backend
    (workbench.pipeline.Backend._indexer_args) makes the exact widenings a family needs and
    hands fp8 inputs to its DEFAULTS_FP8 stages as an Fp8IndexerSource."""
    out = [x.detach().contiguous() for x in (q, w, keys)]
    return (*out, None if kscale is None else kscale.detach().contiguous())


@contextlib.contextmanager
def on_torch_stream(b, device: torch.device):
    """Run family launches on PyTorch's current stream of ``device``, read now (at every call)."""
    with torch.cuda.device(device):
        ptr = torch.cuda.current_stream(device).cuda_stream
        if b.name == "cupy":
            import cupy
            with cupy.cuda.Device(device.index or 0), cupy.cuda.ExternalStream(ptr), \
                    cupy.cuda.using_allocator(_torch_allocator(device)):
                yield
        elif b.name == "numba":
            hook = getattr(b.family, "use_stream", None)      # families may expose a stream hook
            if hook is not None:
                with hook(ptr):
                    yield
            elif ptr == 0:                                    # torch is on the legacy default stream too
                yield
            else:                                             # order by hand around numba's own stream
                torch.cuda.current_stream(device).synchronize()
                yield
                b.family.synchronize()
        else:
            yield
