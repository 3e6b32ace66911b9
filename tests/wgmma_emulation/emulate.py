"""The Hopper wgmma attention forwards (kernels_cuda/attend_wgmma2.cu: wgmma2 and its swizzled tile
wgmma2s; attend_wgmma3.cu: wgmma3) and the MLA backward (attend_wgmma_bwd.cu) run on the CPU: their real source, compiled with g++ and
HYTOPK_EMU_PTX against wgmma_emu.h (CPU versions of every PTX wrapper of the headers: mbarriers,
named barriers, cp.async, wgmma.mma_async with its descriptors and fragments), one std::thread per
CUDA thread (tests/table_emulation/cuda_emu.h), driven case by case by driver.cpp.

    build(out_dir) -> the driver's path (needs g++ with C++20)
    forward(driver, q, kv, idx, scale=None, version="wgmma2", out_dtype="float32", prefetch=0) -> (out, lse)
    backward(driver, q, kv, idx, dout, lse, delta, scale=None, atomic=False, t0=0, count=None) -> (dq, out)

q: uint16 bf16 bits [n, Hq, 576]; kv: uint16 bf16 bits [L, stride >= 576] (MLA's shared rows, V =
the first 512 columns); idx int32 [n, kk] in [-1, L). out: float32 [n, Hq, 512] (or uint16 bf16
bits), lse float32 [n, Hq]. An emulation error (a deadlock, an out-of-bounds shared or global
access, an mbarrier misuse, a wgmma operand changed in flight, a kernel trap) raises EmulationError
with the driver's report. The 2-CTA cluster kernels (wgmma2c / wgmma2sc) are not emulated.

forward's env: HYTOPK_EMU_STALL_S (the watchdog, default 10 s), HYTOPK_EMU_JITTER / HYTOPK_EMU_SEED
(random short sleeps at synchronisation points: other interleavings), HYTOPK_EMU_TIMER_DIV
(%globaltimer's slow-down, default 8: the kernels' trap timeouts).

A new wgmma kernel: every PTX use in a wrapper of the headers (guarded by HYTOPK_EMU_PTX, a CPU
version in wgmma_emu.h: a new wgmma shape or layout goes through emu::wg::mma), an entry point in
_ENTRY (its launch through emu::wg::launch) and a declaration + dispatch in driver.cpp."""
from __future__ import annotations

import math
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import reference.attention as RA
from workbench import instantiations as INST
from table_emulation.emulate import _inline, inline_text

HERE = Path(__file__).resolve().parent
CORE = HERE.parent / "table_emulation"
KERNELS = HERE.parent.parent / "kernels_cuda"
VERSIONS = ("wgmma2", "wgmma2s", "wgmma2sp", "wgmma3", "wgmma3p")   # *p: a query pair per block
DQK, DV = 576, 512


class EmulationError(RuntimeError):
    """The emulated kernel failed: the driver's report (stderr) is the message."""


_ENTRY = {
    "attend_wgmma2.cu": """
void emu_attend_wgmma2(bool ob, bool swz, int qpt, const bf16_t* q, const bf16_t* kv, long long ks, const int* idx,
                       const int* lens, const int* mult, int kk, int n, long long L, int Hq, float sl2, void* out,
                       float* lse) {
    const int nhb = (Hq + ROWS - 1) / ROWS;
    const unsigned blocks = qpt == 2 ? (unsigned)((n + 1) / 2) : (unsigned)(n * nhb);
    emu::wg::launch(blocks, THREADS, LAUNCH_SMEM, [&] {
        if (qpt == 2 && ob) hytopk_attend_fwd_wgmma2<true, true, 2>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
        else if (qpt == 2) hytopk_attend_fwd_wgmma2<false, true, 2>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
        else if (ob && swz) hytopk_attend_fwd_wgmma2<true, true, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
        else if (ob) hytopk_attend_fwd_wgmma2<true, false, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
        else if (swz) hytopk_attend_fwd_wgmma2<false, true, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
        else hytopk_attend_fwd_wgmma2<false, false, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, sl2, out, lse);
    });
}
""",
    "attend_wgmma3.cu": """
void emu_attend_wgmma3(bool ob, int qpt, int opts, const bf16_t* q, const bf16_t* kv, long long ks, const int* idx,
                       const int* lens, const int* mult, int kk, int n, long long L, int Hq, float sl2, void* out,
                       float* lse) {
    const int nhb = (Hq + ROWS - 1) / ROWS;
    const unsigned blocks = qpt == 2 ? (unsigned)((n + 1) / 2) : (unsigned)(n * nhb);
    emu::wg::launch(blocks, THREADS, LAUNCH_SMEM, [&] {
        const int p = opts & 0xff, il = opts >> 8;        // the prefetch distance, interleave
        if (qpt == 2 && ob) hytopk_attend_fwd_wgmma3<true, 2>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, p, il, sl2, out, lse);
        else if (qpt == 2) hytopk_attend_fwd_wgmma3<false, 2>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, p, il, sl2, out, lse);
        else if (ob) hytopk_attend_fwd_wgmma3<true, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, p, il, sl2, out, lse);
        else hytopk_attend_fwd_wgmma3<false, 1>(q, kv, ks, idx, lens, mult, kk, n, L, Hq, nhb, p, il, sl2, out, lse);
    });
}
""",
    "attend_wgmma_bwd.cu": """
void emu_attend_wgmma_bwd(int atomic, const bf16_t* q, const bf16_t* kv, long long ks, const int* idx, int kk, int n,
                          int t0, int count, long long L, int Hq, float scale, float sl2, const bf16_t* dout,
                          const float* lse, const float* delta, float* dq, float* out) {
    const int nhb = (Hq + ROWS - 1) / ROWS;
    // atomic: bit 0, bit 1: 16-byte writes, bit 2: staged (the producer writes dK/dV), bit 3: split (two passes)
    if (!(atomic & 8)) emu::wg::launch((unsigned)(count * nhb), THREADS, (atomic & 4) ? LAUNCH_SMEM_STAGED : LAUNCH_SMEM, [&] {
#define HYTOPK_EMU_BWD(A, V, S) hytopk_attend_bwd_wgmma<A, V, S>(q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, dout, lse, delta, dq, out)
        if (atomic == 5) HYTOPK_EMU_BWD(true, true, true);
        else if (atomic == 4) HYTOPK_EMU_BWD(false, true, true);
        else if (atomic == 3) HYTOPK_EMU_BWD(true, true, false);
        else if (atomic == 1) HYTOPK_EMU_BWD(true, false, false);
        else if (atomic == 2) HYTOPK_EMU_BWD(false, true, false);
        else HYTOPK_EMU_BWD(false, false, false);
#undef HYTOPK_EMU_BWD
    });
    if (!(atomic & 8)) return;
    // split (bit 3): the first pass's P / dS blocks into a scratch (0xCD bytes before), then the second
    const int nt = (kk + 63) / 64, hpad = nhb * 64;
    // bit 16: the dq pass's three passes in one launch over a ring of P / dS slots (bits 17-23: the lag,
    // 24-30: the ring's slots; hytopk_attend_bwd_ring), flags zeroed
    if ((atomic & (1 << 16)) && (atomic & 32) && hpad == 128) {
        const int lag = (atomic >> 17) & 127, ring = (atomic >> 24) & 127;
        const size_t rb = (size_t)ring * nt * 2 * hpad * 64 * 2;
        std::vector<unsigned char> rstore(rb + 256, 0xCD), fstore((size_t)(1 + 2 * ring) * 4 + 256, 0);
        bf16_t* rpds = reinterpret_cast<bf16_t*>(rstore.data() + (256 - reinterpret_cast<uintptr_t>(rstore.data()) % 256) % 256);
        int* flags = reinterpret_cast<int*>(fstore.data() + (256 - reinterpret_cast<uintptr_t>(fstore.data()) % 256) % 256);
        emu::wg::global_buffer(rpds, rb, "pds ring");
        emu::wg::global_buffer(flags, (size_t)(1 + 2 * ring) * 4, "ring flags");
        const bool bulk = atomic & 16;
        const int sm = std::max(sp::LAUNCH_SMEM, std::max(bulk ? dkv::LAUNCH_SMEM_BULK : dkv::LAUNCH_SMEM, dqp::LAUNCH_SMEM));
        emu::wg::launch((unsigned)count * 8u, 384, sm, [&] {
#define HYTOPK_EMU_RING(A, B) hytopk_attend_bwd_ring<A, B>(q, kv, ks, idx, kk, n, t0, count, L, Hq, scale, sl2, dout, lse, delta, rpds, out, dq, flags, lag, ring)
            if (atomic & 1) { if (bulk) HYTOPK_EMU_RING(true, true); else HYTOPK_EMU_RING(true, false); }
            else { if (bulk) HYTOPK_EMU_RING(false, true); else HYTOPK_EMU_RING(false, false); }
#undef HYTOPK_EMU_RING
        });
        return;
    }
    std::vector<unsigned char> store((size_t)count * nt * 2 * hpad * 64 * 2 + 256, 0xCD);
    bf16_t* pds = reinterpret_cast<bf16_t*>(store.data() + (256 - reinterpret_cast<uintptr_t>(store.data()) % 256) % 256);
    emu::wg::global_buffer(pds, (size_t)count * nt * 2 * hpad * 64 * 2, "pds");
    // bit 5: with a dq pass (the first pass without dq, Q / dO in registers; dq from a third)
    const bool dqpass = (atomic & 32) && hpad == 128;   // (two head blocks only; else the first pass above)
    if (dqpass) emu::wg::launch((unsigned)(count * nhb), sp::THREADS, sp::LAUNCH_SMEM, [&] {
        hytopk_attend_bwd_sp(q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, dout, lse, delta, pds);
    });
    else emu::wg::launch((unsigned)(count * nhb), THREADS, LAUNCH_SMEM_PDS, [&] {
        hytopk_attend_bwd_pds(q, kv, ks, idx, kk, n, t0, L, Hq, nhb, scale, sl2, dout, lse, delta, dq, pds);
    });
    // bit 4: the second pass through the TMA's bulk operations
    const bool bulk = atomic & 16;
    emu::wg::launch((unsigned)(count * dkv::PARTS), dkv::THREADS, bulk ? dkv::LAUNCH_SMEM_BULK : dkv::LAUNCH_SMEM, [&] {
#define HYTOPK_EMU_DKV(A, H, B) hytopk_attend_bwd_dkv<A, H, B>(q, dout, pds, idx, kk, t0, L, Hq, out)
        const bool at = atomic & 1;
        if (hpad == 64 && at) { if (bulk) HYTOPK_EMU_DKV(true, 64, true); else HYTOPK_EMU_DKV(true, 64, false); }
        else if (hpad == 64) { if (bulk) HYTOPK_EMU_DKV(false, 64, true); else HYTOPK_EMU_DKV(false, 64, false); }
        else if (at) { if (bulk) HYTOPK_EMU_DKV(true, 128, true); else HYTOPK_EMU_DKV(true, 128, false); }
        else { if (bulk) HYTOPK_EMU_DKV(false, 128, true); else HYTOPK_EMU_DKV(false, 128, false); }
#undef HYTOPK_EMU_DKV
    });
    if (dqpass) emu::wg::launch((unsigned)(count * dqp::PARTS), dqp::THREADS, dqp::LAUNCH_SMEM, [&] {
        hytopk_attend_bwd_dqp(kv, ks, pds, idx, kk, t0, L, Hq, dq);
    });
}
""",
}


def kernel_source(name: str, source: str | None = None) -> str:
    """One .cu file (or `source`, its text: a scratch variant) with its headers inlined for the CPU:
    the dynamic shared memory from the emulator, and the entry point the driver calls."""
    seen: set = set()
    body = _inline(KERNELS / name, seen) if source is None else inline_text(source, seen)
    decl = "extern __shared__ __align__(128) unsigned char smem_raw[];"
    assert decl in body, f"{name}: the dynamic shared memory declaration changed"
    body = body.replace(decl, "unsigned char* smem_raw = emu::wg::win + emu::wg::win_lo;")
    return '#include "wgmma_emu.h"\n' + body + _ENTRY[name]


def compiler() -> str | None:
    """g++ if it has what the emulation needs (C++20), else None (the table emulation's probe)."""
    from table_emulation.emulate import compiler as probed
    return probed()


def build(out_dir, sources: dict | None = None) -> Path:
    """Compiles the driver and both kernel files (three translation units in parallel) into out_dir.
    sources: {"attend_wgmma3.cu": text} replaces a file's text (a scratch copy with a planted bug)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-std=c++20", "-O2", "-pthread", "-w", f"-I{HERE}", f"-I{CORE}"]
    units = [HERE / "driver.cpp"]
    for name in _ENTRY:
        src = out_dir / (Path(name).stem + "_emu.cpp")
        src.write_text(kernel_source(name, (sources or {}).get(name)))
        units.append(src)
    procs = [(u, subprocess.Popen([compiler(), *flags, "-c", str(u), "-o", str(out_dir / (u.stem + ".o"))],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for u in units]
    for u, p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"g++ failed on {u.name}:\n{err[-4000:]}")
    exe = out_dir / "wgmma_driver"
    subprocess.run([compiler(), "-pthread", *[str(out_dir / (u.stem + ".o")) for u in units], "-o", str(exe)],
                   check=True)
    return exe


def forward(driver, q, kv, idx, scale=None, *, version="wgmma2", out_dtype="float32", smem_off=0x410,
            timeout=900, env=None, prefetch=0, interleave=False):
    """(out, lse) of one forward of `version` on the CPU (module docstring); prefetch: version 3's
    L2 prefetch distance in pairs (0: none; the emulation checks its addresses, nothing else);
    interleave: version 3's interleaved slot order."""
    q = np.ascontiguousarray(q, np.uint16)
    kv = np.ascontiguousarray(kv, np.uint16)
    idx = np.ascontiguousarray(idx, np.int32)
    n, Hq, d = q.shape
    L, stride = kv.shape
    assert d == DQK and stride >= DQK and stride % 8 == 0 and idx.shape[0] == n
    kk = idx.shape[1]
    scale_log2 = np.float32(RA.check_scale(scale, DQK) / math.log(2.0))
    out_bf16 = out_dtype == "bfloat16"
    assert version in VERSIONS, version
    vnum = 3 if version.startswith("wgmma3") else 2
    swz = int(version in ("wgmma2s", "wgmma2sp")) if vnum == 2 else int(prefetch) | (int(bool(interleave)) << 8)
    qpt = 2 if version.endswith("p") else 1
    head = np.array([vnum, swz, int(out_bf16), n, Hq, kk, L, stride, smem_off, 0, qpt], np.int32)
    head[9] = scale_log2.view(np.int32)
    tail = b""
    if qpt == 2:                                  # the pairs' union (the wrapper's pair_union; its GPU tests)
        uidx, mult, count = RA.pair_union(np.where((idx >= 0) & (idx < L), idx, -1).astype(np.int32))
        tail = (np.ascontiguousarray(uidx, np.int32).tobytes() + np.ascontiguousarray(count, np.int32).tobytes()
                + np.ascontiguousarray(mult, np.int32).tobytes())
    b = _run(driver, head.tobytes() + q.tobytes() + kv.tobytes() + idx.tobytes() + tail, version, timeout, env)
    ob = n * Hq * DV * (2 if out_bf16 else 4)
    assert len(b) == ob + n * Hq * 4
    out = np.frombuffer(b, np.uint16 if out_bf16 else np.float32, n * Hq * DV).reshape(n, Hq, DV).copy()
    lse = np.frombuffer(b, np.float32, n * Hq, ob).reshape(n, Hq).copy()
    return out, lse


def backward(driver, q, kv, idx, dout, lse, delta, scale=None, *, atomic=False, vec=None, writes="direct", t0=0,
             count=None, smem_off=0x410, timeout=900, env=None, bulk=None, dq_pass=None, ring=None):
    """(dq, out) of hytopk_attend_bwd_wgmma (attend_wgmma_bwd.cu) on the CPU for queries t0 .. t0 +
    count - 1: dq float32 [n, Hq, 576] (rows of other queries stay NaN), out = the dkv atomics
    (float32 [L, 576], from zeros) or the part rows (float32 [count, nhb, kk, 576]; rows of masked
    slots stay NaN). dout: bf16 bits [n, Hq, 512]; lse, delta: float32 [n, Hq]. vec: the kernel's
    16-byte writes, else scalar ones (None: as the wrapper picks, instantiations.ATTEND_WGMMA_BWD_VEC);
    writes: "staged", the consumers hand dK/dV to the producer warpgroup, which writes them (vec
    ignored); "direct", the consumers write them; "split", two passes (bulk: the second through the
    TMA's bulk operations; None: instantiations.ATTEND_WGMMA_BWD_DKV_BULK; dq_pass: the first pass without
    dq, then dq from a third; None: instantiations.ATTEND_WGMMA_BWD_DQ_PASS; ring: with the dq pass,
    (lag, slots): its three passes in one launch of hytopk_attend_bwd_ring, lag clamped to count; None:
    the three launches, whatever instantiations.ATTEND_WGMMA_BWD_RING says)."""
    q = np.ascontiguousarray(q, np.uint16)
    kv = np.ascontiguousarray(kv, np.uint16)
    idx = np.ascontiguousarray(idx, np.int32)
    dout = np.ascontiguousarray(dout, np.uint16)
    n, Hq, d = q.shape
    L, stride = kv.shape
    kk = idx.shape[1]
    count = n - t0 if count is None else count
    assert d == DQK and stride >= DQK and stride % 8 == 0 and dout.shape == (n, Hq, DV) and 0 <= t0 < t0 + count <= n
    sc = np.float32(RA.check_scale(scale, DQK))
    scale_log2 = np.float32(sc / math.log(2.0))
    vec = INST.ATTEND_WGMMA_BWD_VEC[bool(atomic)] if vec is None else vec
    assert writes in INST.ATTEND_WGMMA_BWD_WRITES, writes
    mode = int(bool(atomic)) | {"direct": 2 if vec else 0, "staged": 4, "split": 8}[writes]   # emu_attend_wgmma_bwd's codes
    bulk = INST.ATTEND_WGMMA_BWD_DKV_BULK if bulk is None else bulk
    mode |= 16 if writes == "split" and bulk else 0
    dq_pass = INST.ATTEND_WGMMA_BWD_DQ_PASS if dq_pass is None else dq_pass
    mode |= 32 if writes == "split" and dq_pass else 0
    if ring:
        lag, slots = ring
        assert writes == "split" and dq_pass and 0 <= lag < slots < 128, ring
        mode |= (1 << 16) | (min(lag, count if count is not None else n - t0) << 17) | (slots << 24)
    assert writes != "split" or Hq <= INST.ATTEND_WGMMA_BWD_SPLIT_HEADS, Hq
    head = np.array([4, mode, 0, n, Hq, kk, L, stride, smem_off, 0, 1], np.int32)
    head[9] = scale_log2.view(np.int32)
    more = np.array([t0, count, 0], np.int32)      # the driver reads these after idx
    more[2] = sc.view(np.int32)
    payload = (head.tobytes() + q.tobytes() + kv.tobytes() + idx.tobytes() + more.tobytes() + dout.tobytes()
               + np.ascontiguousarray(lse, np.float32).tobytes() + np.ascontiguousarray(delta, np.float32).tobytes())
    b = _run(driver, payload, "wgmma_bwd", timeout, env)
    nhb = -(-Hq // 64)
    nq = n * Hq * DQK
    dq = np.frombuffer(b, np.float32, nq).reshape(n, Hq, DQK).copy()
    shape = (L, DQK) if atomic else (count, 1 if writes == "split" else nhb, kk, DQK)
    out = np.frombuffer(b, np.float32, int(np.prod(shape)), nq * 4).reshape(shape).copy()
    return dq, out


def _run(driver, payload, what, timeout, env):
    with tempfile.TemporaryDirectory() as tmp:
        fin, fout = Path(tmp) / "in", Path(tmp) / "out"
        fin.write_bytes(payload)
        run_env = dict(os.environ, **(env or {}))
        try:
            r = subprocess.run([str(driver), str(fin), str(fout)], capture_output=True, text=True, timeout=timeout,
                               env=run_env)
        except subprocess.TimeoutExpired as e:
            raise EmulationError(f"{what}: the emulation did not finish in {timeout} s (a deadlock the "
                                 f"watchdog missed?)\n{(e.stderr or '')[-4000:]}") from None
        if r.returncode:
            raise EmulationError(f"{what}: the driver exited {r.returncode}:\n{r.stderr[-6000:]}")
        return fout.read_bytes()
