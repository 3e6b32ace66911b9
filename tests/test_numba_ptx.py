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


def _kernels():
    from workbench.families.numba import check, common, filter as F, recover, rows, select, threshold
    sel = (F2, I2, I1, I64, I2, F2, I2, I2)
    jobs = {"pack_scaled_keys": (common._pack_kernel, (F2, F1, F2))}
    for fl in ("block", "warp"):
        jobs[f"select_{fl}"] = (select.select_kernel(fl), sel)
        jobs[f"threshold_{fl}"] = (threshold.threshold_kernel(fl), (F2, I1, I1, F1))
        jobs[f"check_{fl}"] = (check.check_kernel(fl), (I1, I1, I1, I64, I64, U1, I1, I1))
    for staged, tag in ((False, "block"), (True, "smem")):
        jobs[f"dense_{tag}"] = (rows.score_rows_kernel("dense", staged), (F2, F2, F2, I1, I1, F2, I64))
        jobs[f"replay_{tag}"] = (rows.score_rows_kernel("replay", staged), (F2, F2, F2, I2, I2, F2, I64))
    for kind in KINDS:
        jobs[f"sample_{kind}"] = (threshold.sample_kernel(kind), SRC + (I1, I1, I1, F2))
        for fl in ("block", "warp"):
            jobs[f"filter_{fl}_{kind}"] = (F.filter_kernel(kind, fl), SRC + (I1, I1, F1, I64, I2, F2, I1))
        jobs[f"materialise_{kind}"] = (recover.materialise_kernel(kind), SRC + (I1, I1, I1, F2, I2, I1))
    return jobs


KINDS = ("table", "indexer", "indexer_fp8")
NAMES = ["select_block", "select_warp", "threshold_block", "threshold_warp", "check_block", "check_warp",
         "dense_block", "dense_smem", "replay_block", "replay_smem", "pack_scaled_keys"] + \
    [f"{s}_{k}" for k in KINDS for s in ("sample", "filter_block", "filter_warp", "materialise")]


class _SM90:
    compute_capability = (9, 0)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_compiles_for_sm90(name, monkeypatch):
    import numba.cuda.dispatcher as disp
    # device functions ask the current device for its compute capability; there is none here
    monkeypatch.setattr(disp, "get_current_device", lambda: _SM90())
    kernel, sig = _kernels()[name]
    try:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    except Exception as e:      # NVVM not installed is an environment problem, not a kernel bug
        if "NVVM" in type(e).__name__ or "libNVVM" in str(e):
            pytest.skip(f"NVVM unavailable: {e}")
        raise
    assert ".entry" in ptx
