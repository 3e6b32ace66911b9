"""The harness on a real GPU: the torch oracle on CUDA equals the reference, and
`compare` on a small GPU shape checks every row correct (all families present)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reference import generate as G
from workbench.harness.oracle import ReferenceOracle, TorchOracle, order_keys_t

from _cli_util import ROOT, run_cli

_REASON = None if torch.cuda.is_available() else "needs a CUDA GPU and driver (torch.cuda.is_available() is False)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


@pytest.mark.parametrize("lay", ["causal_tail", "varlen", "edge"])
def test_torch_oracle_on_cuda_equals_reference(lay):
    rng = np.random.default_rng(7)
    n, L, H, D, k = 16, 6000, 4, 32, 64
    q, w, keys = G.indexer_inputs(n, L, H, D, rng)
    lo, hi = G.layout(lay, n, L, k, rng)
    a = ReferenceOracle(q, w, keys, lo, hi).compute(k, None, 3.0)
    b = TorchOracle(q, w, keys, lo, hi, device="cuda").compute(k, None, 3.0)
    for f in ("T", "count", "failed", "select_idx", "select_val", "topk_idx", "topk_val"):
        x, y = getattr(a, f), getattr(b, f).cpu()
        if x.dtype == torch.float32:
            x, y = order_keys_t(x), order_keys_t(y)
        assert torch.equal(x.to(y.dtype), y), f


def test_compare_gpu_small_every_row_correct(tmp_path):
    out = tmp_path / "gpu.json"
    # --budget inf: every family's rows (under the default 50 s budget the CuPy rows, first in order,
    # used it all up and no Numba row ran: H200, 2026-12-01-s4 run 7)
    p = run_cli(["compare", "--preset", "gpu-small", "--json", str(out), "--repeats", "3", "--budget", "inf"], tmp_path,
                timeout=900)
    data = json.loads(out.read_text()) if out.exists() else None
    assert data is not None, p.stdout[-4000:] + p.stderr[-4000:]
    bad = [(r["name"], r["source"], r["detail"]) for r in data["rows"] if r["correct"] is not True]
    assert not bad, bad
    assert p.returncode == 0, p.stdout[-4000:]
    assert data["environment"]["gpu"].get("name")
    names = {r["name"].split(".")[0] for r in data["rows"] if r["kind"] == "stage"}
    assert {"numba", "cupy"} <= names, f"families that ran: {names}; skipped: {data['missing']}"
    assert {r["stage"] for r in data["rows"] if r["kind"] == "baseline"} >= {"torch", "dense+topk", "score-only"}
    # the floors (registry.FLOORS) and the fp8 source (registry.SOURCES) keep the rows earlier results name
    base = {(r["stage"], r["name"]) for r in data["rows"] if r["kind"] == "baseline"}
    assert {("score-only", "cupy score_only[simt] (checksum)"),
            ("score-only-mma_sync", "cupy score_only[mma_sync] (checksum)")} <= base, base
    if torch.cuda.get_device_capability() == (9, 0):
        assert {(f"score-only-{c}", f"cupy score_only[{c}] (checksum)") for c in ("wgmma", "wgmma_ws", "wgmma_ws2")} \
            | {(f"score-only-{c}-fp8", f"cupy score_only[{c}_fp8] (checksum)") for c in ("wgmma", "wgmma_ws")} <= base, base
        fp8 = {r["name"] for r in data["rows"] if r["kind"] == "stage" and r["source"] == "indexer_fp8"}
        assert {"cupy.filter.wgmma", "cupy.filter.wgmma_ws"} <= fp8, fp8


def test_watch_picks_up_an_edited_cuda_kernel_copy(tmp_path, monkeypatch):
    """The GPU path of `hytopk watch`: a copy of kernels_cuda/ in a temp folder
    ($HYTOPK_KERNEL_DIR), its check.cu edited wrong and back; each save is recompiled
    (the loader's key covers the file contents) and re-checked against the oracle."""
    import shutil

    from workbench.harness.watch import WatchLoop

    kdir = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels_cuda", kdir)
    monkeypatch.setenv("HYTOPK_KERNEL_DIR", str(kdir))
    kernel = kdir / "check.cu"
    original = kernel.read_text()
    good = "f = c > k && (count[t] > capacity || count[t] < k);"
    assert good in original, "the check kernel changed: update the edit below"
    loop = WatchLoop(stage="check", preset="gpu-small", say=lambda m: None)
    first = loop.on_change(kernel)
    assert first and all(o.correct for o in first)
    kernel.write_text(original.replace(good, "f = c > k;"))                  # every sampled query "fails"
    broken = loop.on_change(kernel)
    assert broken and not any(o.correct for o in broken)
    kernel.write_text(original)
    fixed = loop.on_change(kernel)
    assert fixed and all(o.correct for o in fixed)
