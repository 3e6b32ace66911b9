"""torch.ops.hytopk.sparse_attention: attention over each query's selected keys only
(docs/CONTRACT.md §8), with its backward, fake kernels and autograd.

    out, lse = torch.ops.hytopk.sparse_attention(q, kv, v, idx, d_v=-1, scale=None, deterministic=None)

Layouts: GQA: kv = k [L, Hkv, Dqk], v [L, Hkv, Dv]; MLA (DeepSeek-V3.2 / GLM-5): kv [L, Dqk], the
one shared latent row per key, v = None and d_v its value width (V = kv[:, :d_v], as FlashMLA).
idx [n, kk] int32, -1 = padding; the selection is replayed as given, never recomputed. out has
q's dtype, lse (natural log of the softmax denominator, -inf for a query with no key) float32.

CPU: the float64 reference (reference.attention), rounded. CUDA: bf16 inputs run the CuPy
kernels on PyTorch's current stream: MLA rows of d_qk 576 / d_v 512 on Hopper take the wgmma
forward (HYTOPK_ATTEND_WGMMA=0 turns it off): `wgmma2sp` (attend_wgmma2.cu, a query pair per block)
up to PAIR_MAX_HEADS heads, `wgmma3` above (attend_wgmma3.cu; HYTOPK_ATTEND_WGMMA3=0: `wgmma2s`); everything else `pair` (kernels_cuda/attend.cu) when
a kv head has at most PAIR_MAX_HEADS query heads, else `one`; other dtypes, graph capture or no CuPy
take a chunked pure-torch path. Those MLA rows' backward runs on wgmma too (attend_wgmma_bwd.cu;
HYTOPK_ATTEND_BWD_WGMMA=0 turns it off), everything else attend.cu's. ``deterministic`` (None = torch.are_deterministic_algorithms_enabled()) picks
the fixed-order dK/dV reduction of the backward (bitwise reproducible) over float atomics.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor

from reference import attention as RA

PAIR_MAX_HEADS = 32          # query heads per kv head up to which two queries share a block (wgmma2sp: 2 x 32 rows)
# the sm_90a forward for MLA (run 6 of results/h200-2026-12-01: 10.8 ms against one's 41.2 ms at
# 128 heads, n 8192, k 2048)
WGMMA_FORWARD = os.environ.get("HYTOPK_ATTEND_WGMMA", "1") != "0"
# above PAIR_MAX_HEADS, version 3 (FlashMLA's schedule) rather than wgmma2s (run 2 of
# results/h200-2026-12-02-s4: 9.67 against 11.17 ms at 128 heads, n 8192, k 2048); other rounding.
# Up to it wgmma2sp, not version 3's pair kernel wgmma3p: at best a tie (alternating rounds, runs 4
# and 6 of results/h200-2026-12-02-s6: 3.43 / 3.49 ms against 3.47 / 3.54 at 8 / 16 heads, then
# 1.00x / 0.99x); version 3 at 128 heads: 0.70-0.72 of the GEMM, 0.97-1.01x FlashMLA's (run 6)
WGMMA3_FORWARD = os.environ.get("HYTOPK_ATTEND_WGMMA3", "1") != "0"
# the backward of those MLA rows on wgmma too (attend_wgmma_bwd.cu, attend_backward version 4; run 6
# of results/h200-2026-12-02-s3, n 8192: 128 heads atomics 48.8 ms against the mma.sync kernel's
# 113.6, deterministic 94.5 against 220.1; 16 heads 25.4 against 41.1, 46.5 against 76.7); off,
# versions 1 / 3
WGMMA_BACKWARD = os.environ.get("HYTOPK_ATTEND_BWD_WGMMA", "1") != "0"
TORCH_CHUNK = 64             # queries per gathered block of the pure-torch path


def _views(kv, v, d_v):
    """(k [L, Hkv, Dqk], v [L, Hkv, Dv], mla) of the op's arguments."""
    if v is None:
        torch._check(kv.dim() == 2, lambda: f"argument 'kv': MLA's shared kv must be 2-D [L, Dqk], got {kv.dim()}-D")
        torch._check(1 <= d_v <= kv.shape[1], lambda: f"argument 'd_v' must lie in [1, {kv.shape[1]}], got {d_v}")
        return kv[:, None, :], kv[:, None, :d_v], True
    return kv, v, False


def _check(q, kv, v, idx, d_v, scale, *, values=True):
    k, vv, mla = _views(kv, v, d_v)
    for name, x in (("q", q), ("kv", kv), ("v", v), ("idx", idx)):
        if x is not None and x.device != q.device:
            raise ValueError(f"argument '{name}' is on {x.device}, expected {q.device} like 'q'")
    dts = ("float32", "bfloat16", "float16", "float64")
    RA.check_attention_args(q, k, vv, idx, idx_values=values, dtypes=dts)
    if (v is not None and v.dtype != kv.dtype) or kv.dtype != q.dtype:
        raise TypeError(f"arguments 'q', 'kv', 'v' must share one dtype, got {q.dtype}, {kv.dtype}, "
                        f"{None if v is None else v.dtype}")
    RA.check_scale(scale, q.shape[2])
    return k, vv, mla


def _np(x):
    return x.detach().to(torch.float64).contiguous().numpy()


def _use_kernels(q) -> bool:
    if q.device.type != "cuda" or q.dtype != torch.bfloat16 or torch.cuda.is_current_stream_capturing():
        return False
    if os.environ.get("HYTOPK_TORCH_BACKEND", "") == "torch":
        return False
    try:
        from workbench.families.cupy import attend as _  # noqa: F401
        return True
    except Exception:
        return False


def _wgmma_applies(q, k, vv) -> bool:
    """MLA's shared rows at the wgmma forward's dims (attend_wgmma2.unsupported), on Hopper."""
    from workbench.instantiations import ATTEND_WGMMA_DIMS
    return (WGMMA_FORWARD and k.dim() == 3 and k.shape[1] == 1 and (k.shape[2], vv.shape[2]) == ATTEND_WGMMA_DIMS
            and vv.data_ptr() == k.data_ptr() and vv.stride() == k.stride() and k.stride(2) == 1
            and k.stride(0) % 8 == 0 and k.data_ptr() % 16 == 0
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def _kernel_forward(q, k, vv, idx, sc):
    """The CuPy forward for this layout (module docstring): (out, lse) as CuPy arrays."""
    from workbench.families.cupy import attend as CA
    heads = q.shape[1] // k.shape[1]
    if _wgmma_applies(q, k, vv):                  # MLA on Hopper: a query pair per block up to 32 heads, else version 3
        from workbench.families.cupy import attend_wgmma2 as AW2
        pair = heads <= PAIR_MAX_HEADS and idx.shape[1] < AW2.PAIR_MAX_K
        if not pair and WGMMA3_FORWARD:
            from workbench.families.cupy import attend_wgmma3 as AW3
            return AW3.attend_forward_wgmma3(q, k, vv, idx, sc)
        return AW2.attend_forward_wgmma2(q, k, vv, idx, sc, swz=True, qpt=2 if pair else 1)
    return CA.attend_forward(q, k, vv, idx, sc, qpt=2 if heads <= PAIR_MAX_HEADS else 1)


def _torch_tensor(x, like):
    """A CuPy result as a torch tensor (DLPack, no copy; uint16 bf16 bits -> torch.bfloat16)."""
    bf = str(x.dtype) in ("uint16", "int16")
    out = torch.from_dlpack(x.view("int16") if bf else x)
    return out.view(torch.bfloat16) if bf else out


# --------------------------------------------------------------------------- pure torch (chunked)

def torch_forward(q, k, v, idx, scale):
    """out float32 [n, Hq, Dv], lse float32 [n, Hq]: gathers at most TORCH_CHUNK queries' keys at a time."""
    n, Hq, Dqk = q.shape
    L, Hkv, Dv = v.shape
    G = Hq // Hkv
    out = q.new_zeros((n, Hq, Dv), dtype=torch.float32)
    lse = q.new_full((n, Hq), float("-inf"), dtype=torch.float32)
    for a in range(0, n if L else 0, TORCH_CHUNK):
        b = min(n, a + TORCH_CHUNK)
        ic = idx[a:b].long()
        valid = ic >= 0
        safe = ic.clamp(min=0)
        s = torch.einsum("cagd,ckad->cagk", q[a:b].float().view(b - a, Hkv, G, Dqk), k[safe].float()) * scale
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        ls = torch.logsumexp(s, dim=-1, keepdim=True)
        p = torch.where(torch.isfinite(ls), torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0)), 0.0)
        out[a:b] = torch.einsum("cagk,ckad->cagd", p, v[safe].float()).reshape(b - a, Hq, Dv)
        lse[a:b] = ls.reshape(b - a, Hq)
    return out, lse


def torch_backward(dout, q, k, v, idx, out, lse, scale):
    """dq, dk, dv float32 by the same formulas as reference.attention.attend_backward."""
    n, Hq, Dqk = q.shape
    L, Hkv, Dv = v.shape
    G = Hq // Hkv
    dq = torch.zeros((n, Hq, Dqk), dtype=torch.float32, device=q.device)
    dk = torch.zeros((L, Hkv, Dqk), dtype=torch.float32, device=q.device)
    dv = torch.zeros((L, Hkv, Dv), dtype=torch.float32, device=q.device)
    for a in range(0, n if L else 0, TORCH_CHUNK):
        b = min(n, a + TORCH_CHUNK)
        c = b - a
        ic = idx[a:b].long()
        valid = ic >= 0
        safe = ic.clamp(min=0)
        kg, vg = k[safe].float(), v[safe].float()
        qc = q[a:b].float().view(c, Hkv, G, Dqk)
        do = dout[a:b].float().view(c, Hkv, G, Dv)
        ls = lse[a:b].view(c, Hkv, G, 1)
        s = torch.einsum("cagd,ckad->cagk", qc, kg) * scale
        ok = valid[:, None, None, :] & torch.isfinite(ls)
        p = torch.where(ok, torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0)), 0.0)
        dp = torch.einsum("cagd,ckad->cagk", do, vg)
        delta = (do * out[a:b].float().view(c, Hkv, G, Dv)).sum(-1, keepdim=True)
        ds = p * (dp - delta) * scale
        dq[a:b] = torch.einsum("cagk,ckad->cagd", ds, kg).reshape(c, Hq, Dqk)
        gk = torch.einsum("cagk,cagd->ckad", ds, qc)[valid]
        gv = torch.einsum("cagk,cagd->ckad", p, do)[valid]
        dk.index_add_(0, safe[valid], gk)
        dv.index_add_(0, safe[valid], gv)
    return dq, dk, dv


# --------------------------------------------------------------------------- the op

@torch.library.custom_op("hytopk::sparse_attention", mutates_args=())
def sparse_attention_op(q: Tensor, kv: Tensor, v: Optional[Tensor], idx: Tensor, d_v: int = -1,
                        scale: Optional[float] = None, deterministic: Optional[bool] = None) -> tuple[Tensor, Tensor]:
    """softmax(scale q.k) v over each query's valid selected slots: (out [n, Hq, Dv] in q's dtype, lse float32)."""
    capturing = q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    kernels = _use_kernels(q)          # the CuPy wrapper checks idx's range on the device itself
    k, vv, mla = _check(q, kv, v, idx, d_v, scale, values=not capturing and not kernels)
    sc = RA.check_scale(scale, q.shape[2])
    if q.device.type == "cpu":
        out, lse = RA.attend(_np(q), _np(k), _np(vv), idx.numpy(), sc)
        return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).to(torch.float32)
    if kernels:
        out, lse = _kernel_forward(q.detach(), k.detach(), vv.detach(), idx.contiguous(), sc)
        return _torch_tensor(out, q).contiguous(), _torch_tensor(lse, q).contiguous()
    out, lse = torch_forward(q.detach(), k.detach(), vv.detach(), idx, sc)
    return out.to(q.dtype), lse


@sparse_attention_op.register_fake
def _sparse_attention_fake(q, kv, v, idx, d_v=-1, scale=None, deterministic=None):
    torch._check(q.dim() == 3 and idx.dim() == 2, lambda: "arguments 'q', 'idx' must be 3-D, 2-D")
    dv = d_v if v is None else v.shape[2]
    return q.new_empty((q.shape[0], q.shape[1], dv)), q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("hytopk::sparse_attention_backward", mutates_args=())
def sparse_attention_backward_op(dout: Tensor, q: Tensor, kv: Tensor, v: Optional[Tensor], idx: Tensor,
                                 out: Tensor, lse: Tensor, d_v: int, scale: Optional[float],
                                 deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dq in q's dtype, dkv in kv's dtype, dv in v's dtype; MLA: an empty dv, its part is in dkv)."""
    k, vv, mla = _check(q, kv, v, idx, d_v, scale, values=False)
    sc = RA.check_scale(scale, q.shape[2])
    if q.device.type == "cpu":
        dq, dk, dv = (torch.from_numpy(x) for x in RA.attend_backward(_np(dout), _np(q), _np(k), _np(vv),
                                                                      idx.numpy(), sc))
    elif _use_kernels(q):
        from workbench.families.cupy import attend as CA
        version = 4 if WGMMA_BACKWARD and _wgmma_applies(q, k, vv) else None
        dq, dk, dv = CA.attend_backward(dout.detach().to(torch.bfloat16).contiguous(), q.detach(), k.detach(),
                                        vv.detach(), idx.contiguous(), out.detach(), lse.detach(), sc,
                                        deterministic=deterministic, version=version)
        dq, dk = _torch_tensor(dq, q), _torch_tensor(dk, q)
        dv = None if dv is None else _torch_tensor(dv, q)
        if mla:                                   # shared rows: the kernels' dk is already the whole dkv
            return dq.to(q.dtype), dk[:, 0].to(kv.dtype), q.new_empty((0,))
    else:
        dq, dk, dv = torch_backward(dout.detach(), q.detach(), k.detach(), vv.detach(), idx, out.detach(),
                                    lse.detach(), sc)
    if mla:
        dkv = dk[:, 0].clone()
        dkv[:, :dv.shape[2]] += dv[:, 0]
        return dq.to(q.dtype), dkv.to(kv.dtype), q.new_empty((0,))
    return dq.to(q.dtype), dk.to(kv.dtype), dv.to(v.dtype)


@sparse_attention_backward_op.register_fake
def _sparse_attention_backward_fake(dout, q, kv, v, idx, out, lse, d_v, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(kv), (q.new_empty((0,)) if v is None else torch.empty_like(v))


def _setup(ctx, inputs, output):
    q, kv, v, idx, d_v, scale, det = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)          # lse is a by-product for the backward and the KL target
    ctx.save_for_backward(q, kv, v, idx, out, lse)
    ctx.d_v, ctx.scale = d_v, scale
    ctx.deterministic = torch.are_deterministic_algorithms_enabled() if det is None else bool(det)


def _grad(ctx, dout, dlse):
    q, kv, v, idx, out, lse = ctx.saved_tensors
    dq, dkv, dv = torch.ops.hytopk.sparse_attention_backward(dout.contiguous(), q, kv, v, idx, out, lse, ctx.d_v,
                                                             ctx.scale, ctx.deterministic)
    return dq, dkv, (None if v is None else dv), None, None, None, None


sparse_attention_op.register_autograd(_grad, setup_context=_setup)


def sparse_attention(q, kv, idx, *, v=None, d_v=None, scale=None, deterministic=None):
    """(out, lse): GQA with ``v`` ([L, Hkv, Dv]; kv = k [L, Hkv, Dqk]); MLA with ``d_v`` (kv [L, Dqk])."""
    if v is None and d_v is None:
        raise ValueError("argument 'd_v': MLA's shared kv needs its value width (or pass 'v' for GQA)")
    return torch.ops.hytopk.sparse_attention(q, kv, v, idx, -1 if d_v is None else int(d_v), scale, deterministic)


def attention_probs(q, k, idx, lse, scale=None, chunk=TORCH_CHUNK):
    """Detached softmax probabilities at the selected slots, [n, Hq, kk] float32 (0 on padding),
    from the forward's lse: gathers at most ``chunk`` queries' keys at a time."""
    n, Hq, Dqk = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    sc = RA.check_scale(scale, Dqk)
    out = torch.zeros((n, Hq, idx.shape[1]), dtype=torch.float32, device=q.device)
    with torch.no_grad():
        for a in range(0, n if k.shape[0] else 0, chunk):
            b = min(n, a + chunk)
            ic = idx[a:b].long()
            valid = ic >= 0
            s = torch.einsum("cagd,ckad->cagk", q[a:b].float().view(b - a, Hkv, G, Dqk), k[ic.clamp(min=0)].float()) * sc
            ls = lse[a:b].float().view(b - a, Hkv, G, 1)
            ok = valid[:, None, None, :] & torch.isfinite(ls)
            p = torch.where(ok, torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0)), 0.0)
            out[a:b] = p.reshape(b - a, Hq, -1)
    return out


__all__ = ["sparse_attention", "attention_probs", "torch_forward", "torch_backward", "PAIR_MAX_HEADS"]
