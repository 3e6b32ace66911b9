"""Run workbench.families.cupy.attend on the CPU with Python emulations of the attend.cu kernels
(their documented semantics): checks the wrappers' argument order and types against the kernel
signatures, the union / strides / padding / chunked reduction plumbing, against the reference.

Run in a subprocess (tests/test_attention.py): the stand-in `cupy` here must never reach the
process of the other tests. Prints one "ok" line per case; any mismatch raises.
"""
import math
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))          # the stand-in cupy / cupyx first
from reference import attention as RA
from workbench.families.cupy import attend as CA
from workbench.bf16 import float32_to_bf16_bits, bf16_bits_to_float32

SRC = (ROOT / "kernels_cuda" / "attend.cu").read_text() + (ROOT / "kernels_cuda" / "attend_wgmma_bwd.cu").read_text()
def sig(kernel):
    m = re.search(kernel + r"\((.*?)\)\s*\{", SRC, re.S)
    params = [p.strip() for p in m.group(1).split(",")]
    return params
def kind(p):
    if "*" in p: return "ptr"
    if p.startswith("long long"): return "i64"
    if p.startswith("int"): return "i32"
    if p.startswith("float"): return "f32"
    raise ValueError(p)
def check(kernel, args):
    ps = sig(kernel)
    assert len(ps) == len(args), (kernel, len(ps), len(args))
    for p, a in zip(ps, args):
        k = kind(p)
        if k == "ptr": assert isinstance(a, np.ndarray) or (isinstance(a, np.uint64) and a == 0), (p, type(a))
        elif k == "i64": assert isinstance(a, np.int64), (p, type(a))
        elif k == "i32": assert isinstance(a, np.int32), (p, type(a))
        elif k == "f32": assert isinstance(a, np.float32), (p, type(a))
def f(b): return bf16_bits_to_float32(np.asarray(b).view(np.uint16)).astype(np.float64)
def rows_of(arr, stride, H, D, L):
    base = arr.view(np.uint16)
    return np.lib.stride_tricks.as_strided(base, shape=(L, H, D), strides=(stride * 2, D * 2, 2)) if L else np.zeros((0, H, D), np.uint16)

def pds_offsets(hpad, nt):
    """[hpad, nt * 64] offsets of (head, slot) in one query's P (dS: + hpad * 64) of the split's scratch
    [64-key block][P | dS][hpad][64] in 8 x 8 core matrices (attend_wgmma_bwd.cu: put_pds)."""
    h_, j_ = np.meshgrid(np.arange(hpad), np.arange(nt * 64), indexing="ij")
    return (h_ // 8) * 512 + ((j_ % 64) // 8) * 64 + (h_ % 8) * 8 + j_ % 8 + (j_ // 64) * 2 * hpad * 64

class Fn:
    calls = {}                                                   # kernel name -> launches
    ds_float = {}      # (scratch address, query) -> the dS hytopk_attend_bwd_sp made, unrounded (for _dqp)
    def __init__(self, name): self.name = name; self.max_dynamic_shared_size_bytes = 0
    def __call__(self, grid, block, args, shared_mem=0):
        kern = self.name.split("<")[0]
        Fn.calls[kern] = Fn.calls.get(kern, 0) + 1
        check(kern, args)
        tp = [x.strip() for x in self.name.split("<")[1].rstrip(">").split(",")] if "<" in self.name else []
        if kern.startswith("hytopk_attend_fwd"):                 # the launch's shared memory = the Shape's
            from workbench import instantiations as INST
            MT, NK, DQK, DV, QPT = map(int, tp[:5])
            assert shared_mem == INST.attend_smem(MT, DQK, DV, QPT, tp[5] == "true", nk=NK), (self.name, shared_mem)
        getattr(self, kern)(tp, grid, args)
    def hytopk_attend_fwd(self, tp, grid, a):
        MT, NK, DQK, DV, QPT = map(int, tp[:5]); SH = tp[5] == "true"; OB = tp[6] == "true"
        q, k, ks, v, vs, lst, lens, mult, U, n, L, Hq, Hkv, hb, sl2, out, lse = a
        Kr = f(rows_of(k, int(ks), Hkv, DQK, int(L))); Vr = f(rows_of(k if SH else v, int(ks if SH else vs), Hkv, DV, int(L)))
        qf = f(q); G = Hq // Hkv; nhb = -(-G // hb)
        assert grid[1] == Hkv * nhb and 16 * MT >= QPT * hb
        for x in range(grid[0]):
            ln = min(int(U), int(lens[x])) if isinstance(lens, np.ndarray) else int(U)
            for y in range(grid[1]):
                g, hbi = divmod(y, nhb)
                for r in range(QPT * hb):
                    t = x * QPT + r // hb; hh = hbi * hb + r % hb
                    if hh >= G or t >= n: continue
                    h = g * G + hh; i = r // hb
                    s_l, w_l = [], []
                    for j in range(ln):
                        s = lst[x, j] if lst.ndim == 2 else lst.reshape(-1, U)[x, j]
                        if s < 0 or s >= L: continue
                        w = mult[x, j, i] if isinstance(mult, np.ndarray) else 1
                        if w > 0: s_l.append(s); w_l.append(w)
                    o = out.reshape(-1, Hq, DV)
                    if not s_l:
                        o[t, h] = 0; lse[t, h] = -np.inf; continue
                    s_a = np.array(s_l); w_a = np.array(w_l, float)
                    lg = Kr[s_a, g] @ qf[t, h] * float(sl2)
                    m = lg.max(); p = w_a * np.exp2(lg - m); l = p.sum()
                    val = (p @ Vr[s_a, g]) / l
                    o[t, h] = float32_to_bf16_bits(val.astype(np.float32)) if OB else val
                    lse[t, h] = (m + math.log2(l)) * math.log(2)
    def hytopk_attend_pair_union(self, tp, grid, a):
        idx, n, kk, L, N, uidx, mult, count = a
        assert N >= 2 * kk and N >= 256 and N & (N - 1) == 0 and grid[0] == (n + 1) // 2
        u, m, c = RA.pair_union(np.where((idx >= 0) & (idx < L), idx, -1).astype(np.int32))
        uidx[:], mult[:], count[:] = u, m, c
    def hytopk_attend_pair_union_bits(self, tp, grid, a):
        idx, n, kk, L, W, N, uidx, mult, count = a
        assert int(W) == -(-int(L) // 32) and CA.union_bits_fit(int(L), int(kk))
        self.hytopk_attend_pair_union([], grid, (idx, n, kk, L, N, uidx, mult, count))
    def hytopk_attend_fwd_acc2(self, tp, grid, a):
        self.hytopk_attend_fwd(tp, grid, a)
    def hytopk_attend_pair_union_reg(self, tp, grid, a):
        idx, n, kk, L, uidx, mult, count = a
        R = int(tp[0])
        assert R in (1, 2, 4, 8, 16) and 256 * R >= 2 * kk and (R == 1 or 128 * R < 2 * kk)
        self.hytopk_attend_pair_union([], grid, (idx, n, kk, L, np.int32(256 * R), uidx, mult, count))
    def hytopk_attend_delta(self, tp, grid, a):
        do, o, rows, DV, delta = a
        ob = tp[0] == "true"
        of = f(o) if ob else np.asarray(o, float)
        delta[:] = (f(do).reshape(rows, DV) * of.reshape(rows, DV)).sum(1)
    def hytopk_attend_bwd_hb2(self, tp, grid, a):
        *a, flags = a
        Hq, Hkv, hb = int(a[10]), int(a[11]), int(a[12]); nhb = -(-(Hq // Hkv) // hb)
        assert grid[1] == 1 and grid[0] % (Hkv * nhb) == 0 and flags.size >= 1 + grid[0] // nhb * -(-nhb // 2)
        assert not flags.any()                                 # zeroed: the work counter and the pair flags
        self.hytopk_attend_bwd(tp + ["hb2"], (grid[0] // (Hkv * nhb), Hkv * nhb), a)
    def hytopk_attend_bwd(self, tp, grid, a):
        MT, NK, DQK, DV = map(int, tp[:4]); SH = tp[4] == "true"; AT = tp[5] == "true"; HB2 = tp[5] == "hb2"
        q, k, ks, v, vs, idx, U, n, t0, L, Hq, Hkv, hb, scale, sl2, do, lse, delta, dq, dk, dv, part = a
        Kr = f(rows_of(k, int(ks), Hkv, DQK, int(L))); Vr = f(rows_of(k if SH else v, int(ks if SH else vs), Hkv, DV, int(L)))
        qf, dof = f(q), f(do); G = Hq // Hkv; nhb = -(-G // hb); W = DQK + (0 if SH else DV)
        for tl in range(grid[0]):
            t = t0 + tl
            for y in range(grid[1]):
                g, hbi = divmod(y, nhb)
                contrib = {}
                for hh in range(hbi * hb, min(G, hbi * hb + hb)):
                    h = g * G + hh
                    for j in range(U):
                        s = idx[t, j]
                        if s < 0 or s >= L or lse[t, h] == -np.inf: continue
                        p = np.exp2(Kr[s, g] @ qf[t, h] * float(sl2) - lse[t, h] * 1.4426950408889634)
                        dp = dof[t, h] @ Vr[s, g]
                        ds = p * (dp - delta[t * Hq + h]) * float(scale)
                        dq[t, h] += ds * Kr[s, g]
                        c = contrib.setdefault(j, np.zeros(W))
                        c[:DQK] += ds * qf[t, h]
                        if SH: c[:DV] += p * dof[t, h]
                        else: c[DQK:] += p * dof[t, h]
                for j, c in contrib.items():
                    s = idx[t, j]
                    if AT:
                        dk.reshape(-1, DQK)[s * Hkv + g] += c[:DQK]
                        if not SH: dv.reshape(-1, DV)[s * Hkv + g] += c[DQK:]
                    elif HB2:                                          # the odd head block adds the even one's
                        r = ((tl * Hkv + g) * -(-nhb // 2) + hbi // 2) * U + j
                        part[r] = part[r] + c if hbi % 2 else c
                    else:
                        part[((tl * Hkv + g) * nhb + hbi) * U + j] = c
    def hytopk_attend_bwd_wgmma(self, tp, grid, a):
        from workbench import instantiations as INST
        # attend_wgmma_bwd.cu: MLA 576 / 512, 64 heads per block, grid (queries of the chunk) x nhb
        q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, do, lse, delta, dq, out = a
        assert int(nhb) == -(-int(Hq) // 64) and grid[0] % int(nhb) == 0 and grid[1:] in ((), (1,))
        assert q.shape[-1] == 576 and do.shape[-1] == 512 and int(t0) + grid[0] // int(nhb) <= int(n)
        assert self.name in tuple(INST.attend_wgmma_bwd_name(a, writes=w) for a in (False, True)
                                  for w in INST.ATTEND_WGMMA_BWD_WRITES), self.name
        self.hytopk_attend_bwd(["4", "32", "576", "512", "true", tp[0]], (grid[0] // int(nhb), int(nhb)),
                               (q, kv, ks, kv, ks, idx, kk, n, t0, L, Hq, np.int32(1), np.int32(64), scale, sl2, do,
                                lse, delta, dq, out, out, out))
    def hytopk_attend_bwd_pds(self, tp, grid, a):
        # the split backward's first pass: dq as the one-pass kernel, P and dS (bf16) into the scratch
        # [tl][64-key block][P | dS][nhb * 64][64] in 8 x 8 core matrices (attend_wgmma_bwd.cu: put_pds)
        q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, do, lse, delta, dq, pds = a
        self.hytopk_attend_bwd_wgmma(["true"], grid, (q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, do, lse, delta, dq,
                                                      np.zeros(max(int(L), 1) * 576)))
        self._fill_pds(grid, (q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, do, lse, delta, pds))
    def hytopk_attend_bwd_sp(self, tp, grid, a):
        # the dq pass's first pass: P and dS as the first pass above, no dq (two head blocks)
        assert int(a[9]) == 2, "the dq pass takes two head blocks"
        Fn.ds_float.update(self._fill_pds(grid, a))
    def hytopk_attend_bwd_dqp(self, tp, grid, a):
        # the dq pass's third: dq = dS K per query (two head blocks), dS unrounded as the one-pass
        # semantics keep it (the kernels' dq is the same bits either way: tests/test_attention_wgmma_emulation.py)
        kv, ks, pds, idx, kk, t0, L, Hq, dq = a
        kk, t0, Hq, L = int(kk), int(t0), int(Hq), int(L)
        assert grid[0] % 3 == 0
        count = grid[0] // 3
        Kr = f(rows_of(kv, int(ks), 1, 576, L))[:, 0]
        for tl in range(count):
            t = t0 + tl
            D = Fn.ds_float.pop((pds.ctypes.data, t))[:Hq]
            acc = np.zeros((Hq, 576))
            for j in range(kk):
                s_ = idx[t, j]
                if 0 <= s_ < L: acc += np.outer(D[:, j], Kr[s_])
            dq[t] = acc
    def hytopk_attend_bwd_ring(self, tp, grid, a):
        # the dq pass's three passes in one launch over ring slots of P / dS (attend_wgmma_bwd.cu): the
        # same floats as sp, dkv and dqp one after the other; flags zeroed by the wrapper, lag < slots
        (q, kv, ks, idx, kk, n, t0, count, L, Hq, scale, sl2, do, lse, delta, pds, out, dq, flags, lag, ring) = a
        count, kk, ring, lag = int(count), int(kk), int(ring), int(lag)
        nt = -(-kk // 64)
        assert grid[0] == 8 * count and 0 <= lag < ring and lag <= count and int(t0) + count <= int(n)
        assert flags.dtype == np.int32 and flags.size == 1 + 2 * ring and not flags.any(), "ring flags not zeroed"
        assert pds.dtype == np.uint16 and pds.size >= ring * nt * 2 * 128 * 64
        scratch = np.zeros(count * nt * 2 * 128 * 64, np.uint16)
        Fn.ds_float.update(self._fill_pds((2 * count,), (q, kv, ks, idx, kk, n, t0, L, Hq, np.int32(2), scale, sl2, do,
                                                        lse, delta, scratch)))
        self.hytopk_attend_bwd_dkv([tp[0], "128", tp[1]], (3 * count,), (q, do, scratch, idx, kk, t0, L, Hq, out))
        self.hytopk_attend_bwd_dqp([], (3 * count,), (kv, ks, scratch, idx, kk, t0, L, Hq, dq))
        flags[0] = 8 * count                          # the tickets taken (the kernel leaves them)
    def _fill_pds(self, grid, a):
        # P and dS (bf16) into the scratch [tl][64-key block][P | dS][nhb * 64][64], 8 x 8 core matrices
        q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, do, lse, delta, pds = a
        nhb, kk, t0, Hq, L = int(nhb), int(kk), int(t0), int(Hq), int(L)
        count, hpad, nt = grid[0] // nhb, nhb * 64, -(-kk // 64)
        assert grid[0] % nhb == 0 and pds.dtype == np.uint16 and pds.size >= count * nt * 2 * hpad * 64
        Kr = f(rows_of(kv, int(ks), 1, 576, L))[:, 0]
        qf, dof = f(q), f(do)
        P, D = np.zeros((count, hpad, nt * 64)), np.zeros((count, hpad, nt * 64))
        for tl in range(count):
            t = t0 + tl
            for j in range(kk):
                s = idx[t, j]
                if s < 0 or s >= L: continue
                for h in range(Hq):
                    if lse[t, h] == -np.inf: continue
                    p = np.exp2(Kr[s] @ qf[t, h] * float(sl2) - lse[t, h] * 1.4426950408889634)
                    P[tl, h, j] = p
                    D[tl, h, j] = p * (dof[t, h] @ Kr[s, :512] - delta[t * Hq + h]) * float(scale)
        off = pds_offsets(hpad, nt)
        for tl in range(count):
            base = tl * nt * 2 * hpad * 64
            pds[base + off] = float32_to_bf16_bits(P[tl].astype(np.float32))
            pds[base + hpad * 64 + off] = float32_to_bf16_bits(D[tl].astype(np.float32))
        return {(pds.ctypes.data, t0 + tl): D[tl] for tl in range(count)}
    def hytopk_attend_bwd_dkv(self, tp, grid, a):
        # the split backward's second pass: dKV rows of all the query's heads from the bf16 P / dS
        AT, hpad = tp[0] == "true", int(tp[1])
        q, do, pds, idx, kk, t0, L, Hq, out = a
        kk, t0, Hq, L = int(kk), int(t0), int(Hq), int(L)
        assert grid[0] % 3 == 0 and hpad == 64 * -(-Hq // 64)
        count, nt = grid[0] // 3, -(-kk // 64)
        qf, dof = f(q), f(do)
        off = pds_offsets(hpad, nt)
        o = out.reshape(-1, 576)
        for tl in range(count):
            t, base = t0 + tl, tl * nt * 2 * hpad * 64
            P, D = f(pds[base + off])[:Hq], f(pds[base + hpad * 64 + off])[:Hq]
            for j in range(kk):
                s = idx[t, j]
                if s < 0 or s >= L: continue
                row = D[:, j] @ qf[t]
                row[:512] += P[:, j] @ dof[t]
                if AT: o[s] += row
                else: o[tl * kk + j] = row
    def hytopk_attend_bwd_dq(self, tp, grid, a):
        MT, NK, DQK, DV, QPT = map(int, tp[:5]); SH = tp[5] == "true"
        q, k, ks, v, vs, lst, lens, mult, U, n, L, Hq, Hkv, hb, scale, sl2, do, lse, delta, dq = a
        Kr = f(rows_of(k, int(ks), Hkv, DQK, int(L))); Vr = f(rows_of(k if SH else v, int(ks if SH else vs), Hkv, DV, int(L)))
        qf, dof = f(q), f(do); G = int(Hq) // int(Hkv); nhb = -(-G // int(hb))
        assert grid[1] == int(Hkv) * nhb and 16 * MT >= QPT * int(hb)
        assert (QPT == 1) == (not isinstance(mult, np.ndarray)) and grid[0] == -(-int(n) // QPT)
        for x in range(grid[0]):
            ln = min(int(U), int(lens[x])) if isinstance(lens, np.ndarray) else int(U)
            for y in range(grid[1]):
                g, hbi = divmod(y, nhb)
                for r in range(QPT * int(hb)):
                    t = x * QPT + r // int(hb); hh = hbi * int(hb) + r % int(hb)
                    if hh >= G or t >= int(n): continue
                    h = g * G + hh; i = r // int(hb)
                    for j in range(ln):
                        s = lst.reshape(-1, int(U))[x, j]
                        w = mult[x, j, i] if isinstance(mult, np.ndarray) else 1
                        if s < 0 or s >= L or w == 0 or lse[t, h] == -np.inf: continue
                        p = np.exp2(Kr[s, g] @ qf[t, h] * float(sl2) - lse[t, h] * 1.4426950408889634)
                        ds = w * p * (dof[t, h] @ Vr[s, g] - delta[t * int(Hq) + h]) * float(scale)
                        dq[t, h] += ds * Kr[s, g]
    def hytopk_attend_dkv_keys(self, tp, grid, a):
        DQK, DV = map(int, tp)
        q, k, ks, v, vs, do, lse, delta, entry, starts, U, L, Hq, Hkv, scale, sl2, dk, dv = a
        assert DQK % 64 == 0 and DV % 64 == 0 and grid[0] == -(-(int(L) * int(Hkv)) // 8)
        assert entry.dtype == np.int32 and starts.dtype == np.int64 and starts.size == int(L) + 1
        Kr = f(rows_of(k, int(ks), Hkv, DQK, int(L))); Vr = f(rows_of(v, int(vs), Hkv, DV, int(L)))
        qf, dof = f(q).reshape(-1, DQK), f(do).reshape(-1, DV); G = int(Hq) // int(Hkv)
        for j in range(int(L)):
            es = entry[starts[j]:starts[j + 1]]
            assert np.all(np.diff(es) > 0)                      # ascending entry ids: the fixed order
            for g in range(int(Hkv)):
                ak, av = np.zeros(DQK), np.zeros(DV)
                for e in es:
                    t = int(e) // int(U)
                    for gg in range(G):
                        r = t * int(Hq) + g * G + gg
                        if lse.ravel()[r] == -np.inf: continue
                        p = np.exp2(Kr[j, g] @ qf[r] * float(sl2) - lse.ravel()[r] * 1.4426950408889634)
                        ds = p * (dof[r] @ Vr[j, g] - delta[r]) * float(scale)
                        ak += ds * qf[r]; av += p * dof[r]
                dk.reshape(-1, DQK)[j * int(Hkv) + g] = ak; dv.reshape(-1, DV)[j * int(Hkv) + g] = av
    def hytopk_attend_dkv_reduce_warp(self, tp, grid, a):
        W, nseg = int(a[1]), int(a[7])
        assert grid[0] == -(-nseg // 8) and 0 < W <= 128 * int(tp[1]) and W % 4 == 0
        self.hytopk_attend_dkv_reduce(tp, (nseg,), a)
    def hytopk_attend_dkv_reduce(self, tp, grid, a):
        part, W, DQK, DV, order, starts, dst_row, nseg, dk, dv = a
        assert grid[0] == nseg
        for i in range(nseg):
            acc = np.zeros(W)
            for e in range(starts[i], starts[i + 1]): acc += part[order[e]]
            r = dst_row[i]
            dk.reshape(-1, DQK)[r] += acc[:DQK]
            if W > DQK: dv.reshape(-1, DV)[r] += acc[DQK:]

CA._fn = lambda name: Fn(name)
from workbench.families.cupy import attend_wgmma_bwd as AWB
AWB._fn = lambda name, writes="direct", **kw: Fn(name)
AWB.require_sm90 = lambda: None
from types import SimpleNamespace as _NS
from workbench.families.cupy import attend_wgmma2 as AW2
# the real check, its alignment test reading numpy's pointer (cupy's k.data.ptr)
AWB.unsupported = lambda b: AW2.unsupported(_NS(**{**vars(b), "k": _NS(data=_NS(ptr=b.k.__array_interface__["data"][0]))}))
CA._shares_rows = lambda k, v: (k.__array_interface__["data"][0] == v.__array_interface__["data"][0] and k.size > 0
                                and k.strides[:2] == v.strides[:2] and k.strides[2] == v.strides[2] == 2)
from tests.test_attention import make_idx

def bf(x):
    b = float32_to_bf16_bits(np.ascontiguousarray(x, np.float32)); return b, f(b)
def close(a, b, tol=1e-4):
    a, b = np.asarray(a, float), np.asarray(b, float)
    fin = np.isfinite(b); assert np.array_equal(np.isfinite(a), fin)
    err = np.abs(a[fin] - b[fin]).max() if fin.any() else 0
    assert err <= tol * max(1.0, np.abs(b[fin]).max() if fin.any() else 1), err

rng = np.random.default_rng(0)
for (mla, Hq, Hkv, Dqk, Dv, n, L, kk, kind_) in [(True, 8, 1, 32, 16, 5, 40, 13, "shared"), (True, 80, 1, 48, 32, 3, 30, 9, "dups"),
                                                 (False, 6, 2, 24, 8, 7, 25, 10, "empty"), (False, 4, 4, 16, 16, 4, 20, 6, "disjoint"),
                                                 (True, 3, 1, 16, 16, 3, 0, 4, "pad_only"),
                                                 (False, 4, 2, 64, 64, 5, 30, 9, "dups")]:
    qb, qh = bf(rng.standard_normal((n, Hq, Dqk)))
    if mla:
        kvb, kvh = bf(rng.standard_normal((L, Dqk)))
        k, v = kvb[:, None, :], kvb[:, None, :Dv]; kh, vh = kvh[:, None, :], kvh[:, None, :Dv]
    else:
        (k, kh), (v, vh) = bf(rng.standard_normal((L, Hkv, Dqk))), bf(rng.standard_normal((L, Hkv, Dv)))
    idx = make_idx(rng, n, L, kk, kind_)
    ro, rl = RA.attend(qh, kh, vh, idx)
    for qpt, acc, wide in ((1, 1, False), (2, 1, False), (1, 2, False), (2, 2, False), (2, 1, True), (1, 1, True)):
        for od in ("float32", "bfloat16"):
            out, lse = CA.attend_forward(qb, k, v, idx, None, qpt=qpt, out_dtype=od, acc=acc, wide=wide)
            close(f(out) if od == "bfloat16" else out, ro, 1e-2 if od == "bfloat16" else 1e-5); close(lse, rl, 1e-5)
    dob, doh = bf(rng.standard_normal((n, Hq, Dv)))
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    out, lse = CA.attend_forward(qb, k, v, idx, None, out_dtype="float32")
    modes = ((True, 1), (False, 1), (True, 2))
    if not mla and Dqk % 64 == 0 and Dv % 64 == 0 and Hq // Hkv <= CA.KEY_MAJOR_MAX_G:
        modes += ((True, 3), (False, None))                  # key-major: explicit, and the default here
    keys_before = Fn.calls.get("hytopk_attend_dkv_keys", 0)
    for det, ver in modes:
        for sb in (None, 1):
            dq, dk, dv = CA.attend_backward(dob, qb, k, v, idx, out, lse, None, deterministic=det, scratch_bytes=sb,
                                            version=ver)
            close(dq, rq, 1e-4)
            if mla and L: assert dv is None; close(dk[:, 0], RA.mla_dkv(rk, rv), 1e-4)
            elif mla: assert dk.shape[0] == 0
            else: close(dk, rk, 1e-4); close(dv, rv, 1e-4)
    assert Fn.calls.get("hytopk_attend_dkv_keys", 0) - keys_before == (4 if len(modes) > 3 else 0)   # 3 and None, 2 scratch sizes
    print("ok", mla, Hq, Hkv, Dqk, Dv, kind_)

# version 4 (the wgmma MLA backward, attend_wgmma_bwd.py): its launches, chunks and part-row reduction;
# 80 heads = two head blocks (the second partly zero rows); other layouts are refused by name
for Hq, kind_ in ((80, "dups"), (8, "empty")):
    n, L, kk = 3, 24, 9
    qb, qh = bf(rng.standard_normal((n, Hq, 576)) * 0.1)
    kvb, kvh = bf(rng.standard_normal((L, 576)))
    k, v = kvb[:, None, :], kvb[:, None, :512]
    idx = make_idx(rng, n, L, kk, kind_)
    dob, doh = bf(rng.standard_normal((n, Hq, 512)))
    rq, rk, rv = RA.attend_backward(doh, qh, kvh[:, None, :], kvh[:, None, :512], idx)
    out, lse = CA.attend_forward(qb, k, v, idx, None, out_dtype="float32")
    dq_pass = Hq > 64 and AWB.INST.ATTEND_WGMMA_BWD_DQ_PASS     # two head blocks: sp, dkv, dqp (the ring: one launch)
    ring = dq_pass and bool(AWB.INST.ATTEND_WGMMA_BWD_RING)
    for writes in ("staged", "split"):
        AWB.WRITES = writes
        before = {x: Fn.calls.get(x, 0) for x in ("hytopk_attend_bwd_wgmma", "hytopk_attend_bwd_pds", "hytopk_attend_bwd_dkv",
                                                  "hytopk_attend_bwd_sp", "hytopk_attend_bwd_dqp", "hytopk_attend_bwd_ring")}
        for det, sb in ((True, None), (True, 1), (False, None)):
            dq, dk, dv = CA.attend_backward(dob, qb, k, v, idx, out, lse, None, deterministic=det, scratch_bytes=sb,
                                            version=4)
            assert dv is None
            close(dq, rq, 1e-4)
            # split: P and dS in bf16 (as the one-pass kernel's MMAs take them; the semantics here keep floats)
            close(dk[:, 0], RA.mla_dkv(rk, rv), 1e-4 if writes == "staged" else 2e-2)
        launched = {x: Fn.calls.get(x, 0) - c for x, c in before.items()}
        want = {"hytopk_attend_bwd_wgmma": 1 + n + 1} if writes == "staged" else \
               {"hytopk_attend_bwd_ring": 1 + n + 1} if ring else \
               {"hytopk_attend_bwd_sp" if dq_pass else "hytopk_attend_bwd_pds": 1 + n + 1,
                "hytopk_attend_bwd_dkv": 1 + n + 1} | ({"hytopk_attend_bwd_dqp": 1 + n + 1} if dq_pass else {})
        assert {x: c for x, c in launched.items() if c} == want, (writes, launched)
        print("ok version 4", writes, Hq, kind_)
    AWB.WRITES = "auto"
qb, _ = bf(rng.standard_normal((2, 4, 64))); kvb, _ = bf(rng.standard_normal((10, 64)))
out, lse = CA.attend_forward(qb, kvb[:, None, :], kvb[:, None, :32], np.zeros((2, 3), np.int32), None, out_dtype="float32")
try:
    CA.attend_backward(bf(rng.standard_normal((2, 4, 32)))[0], qb, kvb[:, None, :], kvb[:, None, :32],
                       np.zeros((2, 3), np.int32), out, lse, None, version=4)
    raise AssertionError("version 4 took d_qk 64")
except ValueError as e:
    assert "d_qk 576" in str(e) and "'k', 'v'" in str(e), e
print("ok version 4 refusal")
# L = 0: only padding may be selected (the part-row reduction trusts every idx >= 0 to be a key row)
try:
    CA.attend_forward(qb, kvb[:0, None, :], kvb[:0, None, :32], np.zeros((2, 3), np.int32), None)
    raise AssertionError("L = 0 took idx 0")
except ValueError as e:
    assert "argument 'idx'" in str(e) and "L = 0" in str(e), e
print("ok empty context refusal")
