"""Which kernels the CUDA implementations of the ops launch.

Preference: the families in the order of their records' ``preference`` (CuPy, then Numba),
each with the winners file's variants, then the pure-torch path (workbench.torch.scoring).
``HYTOPK_TORCH_BACKEND`` (a family name or torch) forces one. Families are handed torch CUDA tensors and
return torch tensors (zero-copy through DLPack / __cuda_array_interface__).
"""
from __future__ import annotations

import contextlib
import os

import torch

_chosen: dict[str, object] = {}
_reasons: dict[str, str] = {}


def _winners(family: str, shape: dict | None) -> dict | None:
    """Variant names per stage for ``family`` from the winners file entry nearest
    ``shape`` ({"L", "H", "D", "k"}), or None (the family's default stages)."""
    try:
        from workbench.harness import winners
    except ImportError:
        return None
    try:
        table = winners.load(shape or {})
    except Exception as e:          # unreadable winners file: say why, use the default stages
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
    from workbench import registry
    forced = os.environ.get("HYTOPK_TORCH_BACKEND", "").strip().lower()
    choices = tuple(f for f in registry.FAMILY_MODULES if f != "reference") + ("torch",)
    if forced and forced not in choices:
        raise ValueError(f"HYTOPK_TORCH_BACKEND must be one of {choices}, got {forced!r}")
    order = () if forced == "torch" else ((forced,) if forced else registry.preference())
    for fam in choices[:-1]:
        if not forced and registry.load_error(fam):            # cannot load here: no record, but say why
            _reasons[fam] = registry.load_error(fam)
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


def kernel_inputs(q, w, keys, kscale=None):
    """The op's tensors as the Backend takes them: detached (kernels take raw memory; CAI/DLPack
    refuse tensors that require grad) and contiguous, dtypes unchanged. float32 w beside bf16 /
    fp8 q and keys, fp8 e4m3 tensors and their kscale go through as they are: the Backend
    (workbench.pipeline.Backend._indexer_args) makes the exact widenings a family needs and
    hands fp8 inputs to its fp8 stage set (Family.defaults["fp8"]) as an Fp8IndexerSource."""
    out = [x.detach().contiguous() for x in (q, w, keys)]
    return (*out, None if kscale is None else kscale.detach().contiguous())


@contextlib.contextmanager
def on_torch_stream(b, device: torch.device):
    """Run family launches on PyTorch's current stream of ``device``, read now (at every call)."""
    with torch.cuda.device(device):
        ptr = torch.cuda.current_stream(device).cuda_stream
        scope = b.family.stream_scope(ptr, device.index if device.index is not None else torch.cuda.current_device())
        if scope is not None:
            with scope:
                yield
        elif ptr == 0:                                    # torch is on the legacy default stream too
            yield
        else:                                             # order by hand around the family's own stream
            torch.cuda.current_stream(device).synchronize()
            yield
            b.family.synchronize()
