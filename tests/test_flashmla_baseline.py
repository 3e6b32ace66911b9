"""The external FlashMLA baseline (workbench/harness/flashmla.py): its argument checks name the
argument (everywhere torch imports), and, where the library is built and an sm_90 GPU is present,
its output matches the float32 torch path of the sparse attention (so the benchmark's flashmla row
computes the same function as ours), padding, duplicates and a query with no valid key included."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.harness import flashmla  # noqa: E402


def _args(n=4, H=64, L=256, k=128, dtype=torch.bfloat16, device="cpu"):
    q = torch.zeros(n, H, 576, dtype=dtype, device=device)
    kv = torch.zeros(L, 576, dtype=dtype, device=device)
    idx = torch.zeros(n, k, dtype=torch.int32, device=device)
    return q, kv, idx


@pytest.mark.parametrize("which, change, error, words", [
    ("q", lambda t: t.float(), TypeError, "q must be torch.bfloat16"),
    ("kv", lambda t: t[None], ValueError, "kv must have 2 dims"),
    ("idx", lambda t: t.long(), TypeError, "idx must be torch.int32"),
    ("q", lambda t: t.tolist(), TypeError, "q must be a torch tensor"),
    ("q", lambda t: t, ValueError, "q must be on a CUDA device"),
])
def test_check_args_names_the_argument(which, change, error, words):
    args = dict(zip(("q", "kv", "idx"), _args()))
    args[which] = change(args[which])
    with pytest.raises(error, match=words):
        flashmla.check_args(args["q"], args["kv"], args["idx"])


def test_missing_library_is_unavailable_and_load_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("HYTOPK_FLASHMLA_LIB", str(tmp_path / "none.so"))
    monkeypatch.setattr(flashmla, "_lib", None)
    assert not flashmla.available()
    assert flashmla.build_info() is None
    with pytest.raises(FileNotFoundError, match="build_flashmla.sh"):
        flashmla.load()


GPU = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
                              and flashmla.available()),
                         reason="needs an sm_90 GPU and the built FlashMLA library (scripts/external/build_flashmla.sh)")


@GPU
@pytest.mark.parametrize("H, k", [(64, 128), (128, 256)])
def test_shape_limits_are_refused_on_the_gpu(H, k):
    q, kv, idx = _args(H=H, k=k, device="cuda")
    with pytest.raises(ValueError, match="heads must be a multiple of 64"):
        flashmla.check_args(q[:, :H - 16].contiguous(), kv, idx)
    with pytest.raises(ValueError, match="k .* multiple of 128"):
        flashmla.check_args(q, kv, idx[:, :k - 64].contiguous())
    with pytest.raises(ValueError, match="idx must have q's"):
        flashmla.check_args(q, kv, idx[:-1])


@GPU
@pytest.mark.parametrize("H, L, k", [(64, 4096, 256), (128, 1000, 384)])
def test_matches_the_float32_path(H, L, k):
    from workbench.torch.attention import torch_forward
    g = torch.Generator(device="cuda").manual_seed(H + k)
    n = 48
    q = (torch.randn(n, H, 576, device="cuda", generator=g) * 0.5).bfloat16()
    kv = torch.randn(L, 576, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, L, (n, k), device="cuda", generator=g, dtype=torch.int32)
    idx[1::3, k // 2:] = -1                          # padding
    idx[2::3, : k // 4] = idx[2::3, k // 4: k // 2]  # duplicates (a key counts twice)
    idx[5] = -1                                      # no valid key: out 0
    scale = 576 ** -0.5
    out, lse = flashmla.sparse_prefill(q, kv, idx, scale)
    ref, ref_lse = torch_forward(q, kv[:, None, :], kv[:, None, :512], idx, scale)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert bool((out[5] == 0).all())
    live = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[live], ref_lse[live], atol=1e-3, rtol=1e-3)
    assert bool(torch.isinf(lse[5]).all())           # FlashMLA: +inf for no valid key (ours: -inf)
