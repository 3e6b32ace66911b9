"""How the CUDA ops choose kernels: winners file per family, fallbacks with reasons."""
import json

import pytest

torch = pytest.importorskip("torch")

from workbench.torch import dispatch          # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    dispatch.reset()
    yield
    dispatch.reset()


def test_winners_are_filtered_per_family(tmp_path, monkeypatch):
    f = tmp_path / "winners.json"
    entry = {"stages": {"filter": "cupy.filter.simt", "select": "numba.select.block"},
             "shape": {"n": 8, "L": 4096, "H": 4, "D": 16, "k": 64}}
    f.write_text(json.dumps({"version": 1, "entries": {"p": entry}}))
    monkeypatch.setenv("HYTOPK_WINNERS", str(f))
    shape = {"L": 5000, "H": 4, "D": 16, "k": 64}
    assert dispatch._winners("cupy", shape) == {"filter": "cupy.filter.simt"}
    assert dispatch._winners("numba", shape) == {"select": "numba.select.block"}
    assert dispatch._winners("cupy", {"L": 5000, "H": 8, "D": 16, "k": 64}) is None   # no entry fits


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_without_gpu_the_pure_torch_path_is_chosen_and_reasons_are_kept():
    assert dispatch.cuda_backend("select", {"L": 10, "H": 1, "D": 1, "k": 1}) is None
    rep = dispatch.report()
    assert rep["select"].startswith("pure torch") and set(rep["skipped"]) >= {"cupy", "numba"}


def test_forced_backend_is_validated(monkeypatch):
    monkeypatch.setenv("HYTOPK_TORCH_BACKEND", "triton")
    with pytest.raises(ValueError, match="HYTOPK_TORCH_BACKEND"):
        dispatch.cuda_backend("select")
    monkeypatch.setenv("HYTOPK_TORCH_BACKEND", "torch")
    dispatch.reset()
    assert dispatch.cuda_backend("replay") is None
