"""Compile every Numba kernel (GPU-only warp variants included) to PTX for
sm_90 without a GPU: catches typing errors in kernels the simulator cannot run.
Skipped under the simulator (it replaces cuda.jit) and when NVVM is missing."""
from __future__ import annotations

import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX compile check needs the real numba-cuda compiler, not the simulator",
                allow_module_level=True)
cuda = pytest.importorskip("numba.cuda")
from numba import types as T  # noqa: E402

F2, I2, I1, U1, F1, I64 = (T.float32[:, ::1], T.int32[:, ::1], T.int32[::1], T.uint8[::1],
                           T.float32[::1], T.int64)
SRC = (F2, F2, F2)


def _kernels(cfg=None):
    from workbench.families.numba import check, common, filter as F, recover, rows, select, threshold, tile
    cfg = cfg or tile.current()
    sel = (F2, I2, I1, I64, I2, F2, I2, I2)
    jobs = {"pack_scaled_keys": (common._pack_kernel, (F2, F1, F2))}
    for fl in ("block", "warp"):
        jobs[f"select_{fl}"] = (select.select_kernel(fl), sel)
        jobs[f"threshold_{fl}"] = (threshold.threshold_kernel(fl), (F2, I1, I1, F1))
        jobs[f"check_{fl}"] = (check.check_kernel(fl), (I1, I1, I1, I64, I64, U1, I1, I1))
    # table rows: one kernel per position; indexer rows: the tiled scorer, per HG (1: tiny H, the GPU HG)
    jobs["sample_table"] = (threshold.sample_kernel("table"), SRC + (I1, I1, I1, F2))
    jobs["materialise_table"] = (recover.materialise_kernel("table"), SRC + (I1, I1, I1, F2, I2, I1))
    for fl in ("block", "warp"):
        jobs[f"filter_{fl}_table"] = (F.filter_kernel("table", fl), SRC + (I1, I1, F1, I64, I2, F2, I1))
    for hg in HGS:
        hg = min(hg, cfg.hg)
        jobs[f"dense_tiled_hg{hg}"] = (rows.score_rows_kernel("dense", hg, cfg), SRC + (I1, I1, F2, I64))
        jobs[f"replay_tiled_hg{hg}"] = (rows.score_rows_kernel("replay", hg, cfg), SRC + (I2, I2, F2, I64))
        jobs[f"sample_tiled_hg{hg}"] = (threshold.sample_tiled_kernel(hg, cfg), SRC + (I64, I1, I1, I1, F2))
        jobs[f"materialise_tiled_hg{hg}"] = (recover.materialise_tiled_kernel(hg, cfg),
                                             SRC + (I64, I1, I1, I1, F2, I2, I1))
        for fl in ("block", "warp"):
            jobs[f"filter_{fl}_tiled_hg{hg}"] = (F.filter_tiled_kernel(fl, hg, cfg),
                                                 SRC + (I64, I1, I1, F1, I64, I2, F2, I1))
    return jobs


HGS = (1, 8)
TILED = [f"{s}_tiled_hg{hg}" for hg in HGS for s in ("dense", "replay", "sample", "materialise",
                                                       "filter_block", "filter_warp")]
NAMES = ["select_block", "select_warp", "threshold_block", "threshold_warp", "check_block", "check_warp",
         "pack_scaled_keys", "sample_table", "materialise_table", "filter_block_table",
         "filter_warp_table"] + TILED


class _SM90:
    compute_capability = (9, 0)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_compiles_for_sm90(name, monkeypatch):
    import numba.cuda.dispatcher as disp
    # device functions ask the current device for its compute capability; there is none here
    monkeypatch.setattr(disp, "get_current_device", lambda: _SM90())
    ptx = _ptx(name)
    assert ".entry" in ptx


def _ptx(name, cfg=None):
    return _compile(*_kernels(cfg)[name])


def _compile(kernel, sig):
    bounds = kernel.targetoptions.get("launch_bounds")          # the tile shape's, as the kernel is built
    try:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0), **({"launch_bounds": bounds} if bounds else {}))
    except Exception as e:      # NVVM not installed is an environment problem, not a kernel bug
        if "NVVM" in type(e).__name__ or "libNVVM" in str(e):
            pytest.skip(f"NVVM unavailable: {e}")
        raise
    return ptx


@pytest.mark.parametrize("name", [n for n in TILED if n.endswith("hg8")])
def test_tiled_scorer_fits_sm90(name, monkeypatch, tmp_path):
    """The GPU shape of the tiled scorer (HG = 8: 64 dots per thread) in registers, not local
    memory, and its static shared memory under the 48 KiB a kernel gets without opt-in (ptxas -v).
    NVVM may emit a newer PTX ISA than this ptxas reads; the resource report does not depend on it."""
    _fits_sm90(name, None, monkeypatch, tmp_path)


def _sweep():
    from workbench.families.numba import tile
    return tile.SWEEP


@pytest.mark.parametrize("cfg", _sweep(), ids=lambda c: c.label)
def test_every_sweep_shape_fits_sm90(cfg, monkeypatch, tmp_path):
    """Every shape bench_numba_scorer.py --sweep times compiles (dense at the model's HG: H = 64
    spread over the shape's warps) without spills, in 48 KiB of static shared memory."""
    from workbench.families.numba import rows
    job = (rows.score_rows_kernel("dense", cfg.heads_per_warp(64), cfg), SRC + (I1, I1, F2, I64))
    _fits_sm90("dense_tiled", cfg, monkeypatch, tmp_path, job=job)


def _fits_sm90(name, cfg, monkeypatch, tmp_path, job=None):
    import re
    import shutil
    import subprocess
    from workbench import compile_check as CC
    import numba.cuda.dispatcher as disp
    nvcc = CC.find_nvcc()
    ptxas = shutil.which("ptxas") or (nvcc and shutil.which("ptxas", path=os.path.dirname(nvcc)))
    if not ptxas:
        pytest.skip("ptxas not found")
    monkeypatch.setattr(disp, "get_current_device", lambda: _SM90())
    ptx = _ptx(name, cfg) if job is None else _compile(*job)
    ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", ver)
    if m and int(m.group(1)) >= 12:        # CUDA 12.x/13.x ptxas reads PTX ISA (major - 4).minor
        ptx = re.sub(r"^\.version \d+\.\d+", f".version {int(m.group(1)) - 4}.{m.group(2)}", ptx, flags=re.M)
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    res = subprocess.run([ptxas, "-arch=sm_90", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"ptxas cannot read this PTX: {res.stderr.strip()[:200]}")
    rep = CC.parse_ptxas(res.stderr)
    assert rep, res.stderr
    for r in rep:
        assert not r.spills, f"{name} spills: {res.stderr}"
        assert r.smem <= 48 * 1024, f"{name} uses {r.smem} bytes of static shared memory"
