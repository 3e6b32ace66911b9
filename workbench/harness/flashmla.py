"""FlashMLA's sm90 sparse prefill forward as an external baseline for the sparse attention forward.

The library is built outside the package (``scripts/external/build_flashmla.sh`` writes
``.ext/libflashmla_sparse_fwd.so``; ``HYTOPK_FLASHMLA_LIB`` names another path) and called through
ctypes on torch tensors, on torch's current stream. Nothing here is needed by the workbench: where
the library is absent, ``available()`` is False and the benchmark leaves the row out.

    from workbench.harness import flashmla
    if flashmla.available():
        out, lse = flashmla.sparse_prefill(q, kv, idx, 576 ** -0.5)

Layout (DeepSeek-V3.2's MLA, one kv head): q [n, H, 576] bf16, kv [L, 576] bf16, idx [n, k] int32
(-1 and out-of-range slots skipped); out [n, H, 512] bf16, lse [n, H] float32 (natural log, +inf for
a query with no valid key, FlashMLA's convention). FlashMLA's limits: H a multiple of 64, k a
multiple of 128, sm_90a.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIB = ROOT / ".ext" / "libflashmla_sparse_fwd.so"
DQK, DV = 576, 512
_lib = None


def library_path() -> Path:
    return Path(os.environ.get("HYTOPK_FLASHMLA_LIB") or DEFAULT_LIB)


def available() -> bool:
    """True when the built library exists (whether it loads is checked by ``load``)."""
    return library_path().is_file()


def build_info() -> str | None:
    """What build_flashmla.sh recorded: FlashMLA's and CUTLASS's commits, nvcc's version."""
    info = library_path().with_suffix(".txt")
    return info.read_text().strip() if info.is_file() else None


def load():
    global _lib
    if _lib is None:
        path = library_path()
        if not path.is_file():
            raise FileNotFoundError(f"flashmla: no library at {path} (build it: scripts/external/build_flashmla.sh)")
        lib = ctypes.CDLL(str(path))
        fn = lib.hytopk_flashmla_sparse_fwd
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 4 + [ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
        _lib = lib
    return _lib


def check_args(q, kv, idx):
    """(n, H, L, k) of valid arguments; ValueError / TypeError naming the argument otherwise."""
    import torch
    for name, t, dtype, ndim in (("q", q, torch.bfloat16, 3), ("kv", kv, torch.bfloat16, 2), ("idx", idx, torch.int32, 2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashmla: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"flashmla: {name} must be {dtype}, got {t.dtype}")
        if t.dim() != ndim:
            raise ValueError(f"flashmla: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    for name, t in (("q", q), ("kv", kv), ("idx", idx)):
        if not t.is_cuda:
            raise ValueError(f"flashmla: {name} must be on a CUDA device, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"flashmla: {name} must be contiguous")
    n, H, d = q.shape
    if d != DQK or kv.shape[1] != DQK:
        raise ValueError(f"flashmla: q and kv need d_qk {DQK}, got q {tuple(q.shape)}, kv {tuple(kv.shape)}")
    if H % 64:
        raise ValueError(f"flashmla: heads must be a multiple of 64 (FlashMLA's head block), got {H}")
    if idx.shape[0] != n:
        raise ValueError(f"flashmla: idx must have q's {n} rows, got shape {tuple(idx.shape)}")
    k = idx.shape[1]
    if k <= 0 or k % 128:
        raise ValueError(f"flashmla: k (idx.shape[1]) must be a positive multiple of 128 (FlashMLA's), got {k}")
    if q.device != kv.device or q.device != idx.device:
        raise ValueError(f"flashmla: q, kv, idx must share a device, got {q.device}, {kv.device}, {idx.device}")
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        raise ValueError(f"flashmla: the sm90 kernel needs an sm_90 GPU, got {torch.cuda.get_device_name(q.device)}")
    if n * H * DQK >= 2 ** 31:
        raise ValueError(f"flashmla: q has {n * H * DQK} elements; FlashMLA's strides are int32")
    return n, H, kv.shape[0], k


def sparse_prefill(q, kv, idx, sm_scale: float):
    """FlashMLA's sparse prefill forward: (out [n, H, 512] bf16, lse [n, H] float32)."""
    import torch
    n, H, L, k = check_args(q, kv, idx)
    out = torch.empty(n, H, DV, device=q.device, dtype=torch.bfloat16)
    lse = torch.empty(n, H, device=q.device, dtype=torch.float32)
    max_logits = torch.empty_like(lse)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    stream = torch.cuda.current_stream(q.device).cuda_stream     # read at every launch (graphs, compile)
    rc = load().hytopk_flashmla_sparse_fwd(q.data_ptr(), kv.data_ptr(), idx.data_ptr(), out.data_ptr(),
                                           max_logits.data_ptr(), lse.data_ptr(), n, L, H, k, float(sm_scale),
                                           sms, stream)
    if rc != 0:
        raise RuntimeError(f"flashmla: the launch failed (code {rc})")
    return out, lse
