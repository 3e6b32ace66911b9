"""How compare builds each kind of score source (registry.SOURCES names these functions).

A stage variant that takes a source gets the one its row names, built from the family's
arrays: the [n, L] table, the indexer inputs as given (float32 or bf16), or the same inputs
as fp8 e4m3. The preset's inputs are small integers, exact in e4m3, so every source gives the
oracle's scores bit for bit and one answer checks every row.
"""
from __future__ import annotations

import numpy as np

import reference as R


def table(X: dict):
    return R.TableSource(X["table"])


def indexer(X: dict):
    return R.IndexerSource(X["q"], X["w"], X["keys"])


def indexer_fp8(X: dict):
    """e4m3 bits of q and keys with key scales of 1 (float32 inputs: SourceKind.float32)."""
    from reference.fp8 import exact_fp8_source
    return exact_fp8_source(X["q"], X["w"], X["keys"])


def encode_fp8(host: dict, seed: int, device: str) -> dict:
    """The pipelines' fp8 inputs: e4m3 q and keys with power-of-two key scales
    (reference.dtypes.encode_exact), float32 weights. On the GPU, torch.float8_e4m3fn tensors,
    as a PyTorch user hands them over; on the CPU, the host arrays."""
    import torch
    from reference.dtypes import encode_exact
    q8, w, k8, ks = encode_exact(host["q"], host["w"], host["keys"], "fp8", rng=np.random.default_rng(seed))
    d = dict(q=q8, w=w, keys=k8, kscale=ks)
    if device != "cpu":
        d = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in d.items()}
        d["q"], d["keys"] = d["q"].view(torch.float8_e4m3fn), d["keys"].view(torch.float8_e4m3fn)
    return d


def fp8_usable(v) -> tuple[bool, str]:
    """Variant ``v`` can take fp8 here: the CuPy family's fp8 rows run on the wgmma cores (a
    Hopper GPU); the reference decodes e4m3 in NumPy anywhere."""
    if v.family != "cupy":
        return True, ""
    try:
        from ..families.cupy import wgmma
        wgmma.require_sm90()
        return True, ""
    except Exception as e:
        return False, f"fp8 rows need the wgmma core on a Hopper GPU: {type(e).__name__}: {e}"
