"""The table kernels of kernels_cuda/table_v2.cu (and table_topk.cu's radix fallback) run on the
CPU: their real source, compiled with g++ against cuda_emu.h (one std::thread per CUDA thread,
blocks one after another, __syncthreads and every warp collective as a barrier rendezvous), driven
case by case by driver.cpp, checked against the reference.

    build(out_dir) -> the driver's path (needs g++ with C++20)
    check_case(driver, scores, lo, hi, k, capacity, T=None, offset=0, bf16=False)

check_case runs fused_v2 (the fused kernel + the radix kernel on its flagged rows, with the contract's
samples and with the samples in runs (reference run_sample_positions); the one-read
fused kernel hytopk_table_fused1 and the cluster kernel hytopk_table_cluster (C = 2 and 4 blocks of
128 threads, run together by emu::launch_cluster, the ranking shared and not) checked against it by
the driver and its final output against the reference), the v2
threshold, the v2 filter (on T, or the contract's threshold) and select_smem (on the filter's
output; with the fast select and without) with the launch geometry of workbench/families/cupy/table_v2.py, and asserts each
against the reference (bit for bit where the contract says so). offset: the table's base
pointer that many elements past 16-byte alignment."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import reference as R
from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent.parent / "kernels_cuda"


def _inline(path: Path, seen: set) -> str:
    return inline_text(path.read_text(), seen)


def inline_text(text: str, seen: set) -> str:
    """text with its includes from kernels_cuda/ inlined (each header once), #pragma once dropped."""
    out = []
    for line in text.splitlines():
        m = re.match(r'#include "(.+)"', line)
        if m:
            p = KERNELS / m.group(1)
            if p not in seen:
                seen.add(p)
                out.append(_inline(p, seen))
            continue
        if line.strip() != "#pragma once":
            out.append(line)
    return "\n".join(out)


def kernel_source() -> str:
    """table_topk.cu and table_v2.cu with their headers inlined, dynamic shared memory from the
    emulator."""
    seen: set = set()
    src = '#include "cuda_emu.h"\n' + _inline(KERNELS / "table_topk.cu", seen) + "\n" + _inline(KERNELS / "table_v2.cu", seen)
    return (src.replace("extern __shared__ __align__(16) u32 smem[];", "u32* smem = emu::dyn_smem();")
               .replace('extern "C" __global__', "__global__"))


_CXX20: list = []


def compiler() -> str | None:
    """g++ when it builds what the emulations need (C++20 <barrier>, std::atomic_ref), else None:
    the emulation tests skip only then; any other build failure fails them."""
    if not _CXX20:
        gxx, ok = shutil.which("g++"), False
        if gxx:
            probe = ("#include <atomic>\n#include <barrier>\nint main() { unsigned long long x = 0; "
                     "std::atomic_ref<unsigned long long>(x).store(1); std::barrier<> b(1); b.arrive_and_wait(); }\n")
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "probe.cpp"
                src.write_text(probe)
                ok = subprocess.run([gxx, "-std=c++20", "-pthread", str(src), "-o", str(Path(tmp) / "probe")],
                                    capture_output=True).returncode == 0
        _CXX20.append(gxx if ok else None)
    return _CXX20[0]


def build(out_dir) -> Path:
    out_dir = Path(out_dir)
    (out_dir / "kernels_emu.inc").write_text(kernel_source())
    exe = out_dir / "table_driver"
    subprocess.run([compiler(), "-std=c++20", "-O2", "-pthread", "-w", f"-I{out_dir}", f"-I{HERE}",
                    str(HERE / "driver.cpp"), "-o", str(exe)], check=True)
    return exe


def _same(i, v, ri, rv) -> bool:
    return np.array_equal(i, ri) and np.array_equal(v.view(np.uint32), np.asarray(rv, np.float32).view(np.uint32))


def check_case(driver, s, lo, hi, k, capacity, T=None, offset=0, bf16=False, stats=None, cluster_only=False,
               every_cluster=False):
    """The checks of the module docstring (the driver also checks the one-read fused kernel and the
    cluster kernel against the fused kernel: same listed rows and counts, the finished rows bit for
    bit; here the cluster kernel's final outputs, its listed rows done by the radix kernel, against the
    reference). stats (a dict), when given, gets "one_read": the rows the one-read kernel finished
    reading once, [at 1024 threads with z = -1 (the one-read plan forced on every row), at 512 threads
    with z = 3], and "runs_count" / "runs_failed": the run-sampled fused kernel's counts and listed rows.
    cluster_only: only the fused kernel and the cluster kernel at C = 8 (128 threads) run
    (long rows). The cluster kernel runs at C = 2 (two clusters, ranking shared) and C = 4 (one
    cluster, not shared); every_cluster: also C = 4 shared and C = 2 not. Returns (count, failed)."""
    n, L = s.shape
    lo, hi = np.asarray(lo, np.int32), np.asarray(hi, np.int32)
    table, wide = np.ascontiguousarray(s, np.float32), np.ascontiguousarray(s, np.float32)
    if bf16:
        table = float32_to_bf16_bits(table, np)
        wide = bf16_bits_to_float32(table)
    M, r = R.sample_plan(lo, hi, k, 3.0)
    Tref = R.stage_threshold(R.TableSource(wide), lo, hi, M, r)
    T = Tref if T is None else np.asarray(T, np.float32)
    with tempfile.TemporaryDirectory() as d:
        fin, fout = Path(d) / "in", Path(d) / "out"
        with open(fin, "wb") as f:
            mode = int(cluster_only) | 2 * int(every_cluster)
            f.write(np.array([n, L, k, int(bf16), capacity, offset, mode], np.int32).tobytes())
            for a in (lo, hi, M, r):
                f.write(np.asarray(a, np.int32).tobytes())
            f.write(T.tobytes())
            f.write(table.tobytes())
        subprocess.run([str(driver), str(fin), str(fout)], check=True)
        b = fout.read_bytes()
    at = 0

    def take(dt, shape):
        nonlocal at
        a = np.frombuffer(b, dt, int(np.prod(shape)), at).reshape(shape)
        at += a.nbytes
        return a
    exact = R.topk(wide, lo, hi, k)

    def check_runs():
        """run_runs of driver.cpp: the fused kernel and the threshold with the samples in runs."""
        ui, uv, ucount, ufailed = take(np.int32, (n, k)), take(np.float32, (n, k)), take(np.int32, (n,)), take(np.uint8, (n,))
        if stats is not None:
            stats["runs_count"], stats["runs_failed"] = ucount.copy(), ufailed.copy()
        uT = take(np.float32, (n,))
        pi, pv = take(np.int32, (n, k)), take(np.float32, (n, k))
        pcount, pfailed = take(np.int32, (n,)), take(np.uint8, (n,))
        assert at == len(b)
        if stats is not None:
            stats["plan_count"], stats["plan_failed"] = pcount.copy(), pfailed.copy()
        # table_topk's plan (oversample 1.5, min_rank 48, coarse 8: reference.coarse_key)
        assert _same(pi, pv, *exact), "fused_v2 (table_topk's plan): not the exact top-k"
        Mp, rp = R.sample_plan(lo, hi, k, 1.5, 48)
        Tp = R.stage_threshold(R.TableSource(wide), lo, hi, Mp, rp, 32 if bf16 else 16, 8)
        _, _, above_p = R.stage_filter(R.TableSource(wide), lo, hi, Tp, 1)
        want_p = np.where(Mp > 0, above_p, R.hytopk(wide, lo, hi, k).count)
        assert np.array_equal(pcount, want_p), "fused_v2 (table_topk's plan): counts differ from the reference's"
        assert _same(ui, uv, *exact), "fused_v2 (runs): not the exact top-k"
        run = 32 if bf16 else 16
        Truns = R.stage_threshold(R.TableSource(wide), lo, hi, M, r, run)
        assert np.array_equal(R.order_keys(uT), R.order_keys(Truns)), "threshold v2 (runs): keys differ from the reference"
        _, _, above = R.stage_filter(R.TableSource(wide), lo, hi, Truns, 1)
        want = np.where(M > 0, above, R.hytopk(wide, lo, hi, k).count)
        assert np.array_equal(ucount, want), "fused_v2 (runs): counts differ from the reference's"
    if cluster_only:
        fi, fv, fcount, ffailed = take(np.int32, (n, k)), take(np.float32, (n, k)), take(np.int32, (n,)), take(np.uint8, (n,))
        c8 = [(take(np.int32, (n, k)), take(np.float32, (n, k))) for _ in range(2)]   # shared ranking, not
        check_runs()
        assert _same(fi, fv, *exact), "fused_v2: not the exact top-k"
        for (ci8, cv8), share in zip(c8, (True, False)):
            assert _same(ci8, cv8, *exact), f"cluster (C = 8, share {share}): not the exact top-k"
        assert np.array_equal(fcount, R.hytopk(wide, lo, hi, k).count), "fused_v2: counts differ from the contract's"
        return fcount, ffailed
    variants = ((2, True), (4, False)) + (((4, True), (2, False)) if every_cluster else ())   # (C, shared)
    clusters = [(take(np.int32, (n, k)), take(np.float32, (n, k))) for _ in variants]
    fi, fv, fcount, ffailed = take(np.int32, (n, k)), take(np.float32, (n, k)), take(np.int32, (n,)), take(np.uint8, (n,))
    one_read = take(np.int32, (2,))
    if stats is not None:
        stats["one_read"] = one_read.tolist()
    T2 = take(np.float32, (n,))
    ci, cv, cnt = take(np.int32, (n, capacity)), take(np.float32, (n, capacity)), take(np.int32, (n,))
    si, sv = take(np.int32, (n, k)), take(np.float32, (n, k))          # fast = 1
    si0, sv0 = take(np.int32, (n, k)), take(np.float32, (n, k))        # fast = 0
    check_runs()

    assert _same(fi, fv, *exact), "fused_v2: not the exact top-k"
    for (cli, clv), (C, share) in zip(clusters, variants):
        assert _same(cli, clv, *exact), f"cluster (C = {C}, share {share}): not the exact top-k"
    assert np.array_equal(fcount, R.hytopk(wide, lo, hi, k).count), "fused_v2: counts differ from the contract's"
    assert np.array_equal(R.order_keys(T2), R.order_keys(Tref)), "threshold v2: keys differ from the contract's"
    ri, rv, rc = R.stage_filter(R.TableSource(wide), lo, hi, T, capacity)
    assert np.array_equal(cnt, rc), "filter v2: counts"
    for t in range(n):
        m = min(int(rc[t]), capacity)
        got = sorted(zip(ci[t, :m].tolist(), cv[t, :m].view(np.uint32).tolist()))
        if rc[t] <= capacity:
            assert got == sorted(zip(ri[t, :m].tolist(), rv[t, :m].view(np.uint32).tolist())), f"filter v2: row {t}"
        else:                          # overflow: capacity distinct true candidates with their bits
            pos = np.array([p for p, _ in got])
            assert len(set(pos.tolist())) == capacity and ((pos >= lo[t]) & (pos < hi[t])).all(), f"row {t}"
            assert np.array_equal(wide[t, pos].view(np.uint32), np.array([x for _, x in got], np.uint32))
            assert (R.order_keys(wide[t, pos]) >= R.order_keys(T[t:t + 1])[0]).all()
        assert (ci[t, m:] == -1).all(), f"filter v2: row {t} written past its count"
    sel = R.stage_select(ci, cv, cnt, k)
    assert _same(si, sv, *sel), "select_smem (fast select)"
    assert _same(si0, sv0, *sel), "select_smem (key select + sort)"
    return fcount, ffailed
