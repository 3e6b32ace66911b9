"""Issue 21 on the CPU: torch.ops.hytopk.topk (reference path, opcheck, fake tensors, errors),
the pure-torch exact top-k (the op's no-CuPy path and the GPU tests' oracle) against the
reference on the adversarial families, bf16 tables, and the table kernels' registration in the
instantiation list. The kernels themselves: tests/test_table_topk_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import reference as R
import workbench.torch as wt
from workbench import instantiations as INST
from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from workbench.torch.table_topk import exact_topk_torch, order_keys_torch

from strategies import selection_cases


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


@settings(max_examples=30)
@given(selection_cases(max_n=6, max_L=700, max_k=80))
def test_op_and_torch_path_equal_reference(case):
    ri, rv = R.topk(case.scores, case.lo, case.hi, case.k)
    i, v = wt.topk(T(case.scores), T(case.lo), T(case.hi), case.k)
    assert np.array_equal(i.numpy(), ri) and same_bits(v.numpy(), rv)
    ti, tv = exact_topk_torch(T(case.scores), T(case.lo).int(), T(case.hi).int(), case.k, chunk=3)
    assert np.array_equal(ti.numpy(), ri) and same_bits(tv.numpy(), rv)


def test_order_keys_torch_match_the_contract():
    x = np.array([np.nan, -np.nan, -np.inf, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, np.finfo(np.float32).max, np.inf],
                 np.float32)
    assert np.array_equal(order_keys_torch(T(x)).numpy(), R.order_keys(x).astype(np.int64))


def test_bf16_table_is_the_widened_float32_table():
    rng = np.random.default_rng(3)
    s = rng.standard_normal((4, 500)).astype(np.float32)
    s[:, ::7] = 0.0
    s[:, 1::11] = -0.0
    s[1, 5] = np.nan
    bits = float32_to_bf16_bits(s, np)
    wide = bf16_bits_to_float32(bits)
    lo, hi = np.array([0, 3, 100, 250]), np.array([500, 400, 101, 250])
    tb = T(bits.view(np.int16)).view(torch.bfloat16)
    i, v = wt.topk(tb, T(lo), T(hi), 64)
    ri, rv = R.topk(wide, lo, hi, 64)
    assert np.array_equal(i.numpy(), ri) and same_bits(v.numpy(), rv)


def test_opcheck_and_fake_tensor():
    s = torch.randn(5, 300)
    s[:, 10:40] = 0.0
    lo = torch.tensor([0, 5, 299, 0, 100], dtype=torch.int32)
    hi = torch.tensor([300, 300, 300, 0, 117], dtype=torch.int32)
    for table in (s, s.bfloat16()):
        for k in (1, 16, 512):
            torch.library.opcheck(torch.ops.hytopk.topk.default, (table, lo, hi, k))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fs, flo, fhi = (mode.from_tensor(x) for x in (s, lo, hi))
        i, v = torch.ops.hytopk.topk(fs, flo, fhi, 2048)
        assert i.shape == (5, 2048) and i.dtype == torch.int32 and v.dtype == torch.float32
    m = torch.ops.hytopk.topk(s.to("meta"), lo.to("meta"), hi.to("meta"), 7)
    assert m[0].shape == (5, 7)


@pytest.mark.parametrize("bad,match", [
    (dict(scores=torch.zeros(3, 4, dtype=torch.float64)), "scores"),
    (dict(scores=torch.zeros(12)), "scores"),
    (dict(k=0), "k"),
    (dict(lo=torch.tensor([0, 0])), "lo"),
    (dict(lo=torch.tensor([0, 5, 0])), "lo"),
    (dict(hi=torch.tensor([4, 4, 5])), "hi"),
    (dict(lo=torch.zeros(3, dtype=torch.float32)), "lo"),
])
def test_errors_name_the_argument(bad, match):
    args = dict(scores=torch.zeros(3, 4), lo=torch.zeros(3, dtype=torch.int32), hi=torch.full((3,), 4), k=2)
    args.update(bad)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        wt.topk(args["scores"], args["lo"], args["hi"], args["k"])


def test_table_kernels_are_instantiated_for_both_table_dtypes():
    names = INST.name_expressions("table_topk.cu")
    for kern in ("hytopk_table_filter", "hytopk_table_topk"):
        for src in (INST.TABLE, INST.TABLE_BF16):
            assert f"{kern}<{src}>" in names
    for f in ("threshold.cu", "filter.cu"):          # the bf16 table source reaches the SIMT stages too
        assert f"hytopk_threshold<{INST.TABLE_BF16}>" in INST.name_expressions("threshold.cu")
        assert f"hytopk_filter<{INST.TABLE_BF16}>" in INST.name_expressions("filter.cu")


def test_backend_takes_bf16_tables_as_their_float32_widening():
    import workbench
    rng = np.random.default_rng(9)
    s = rng.standard_normal((4, 900)).astype(np.float32)
    s[:, ::5] = 0.0
    bits = float32_to_bf16_bits(s, np)                  # bf16 rounds many values onto ties
    wide = bf16_bits_to_float32(bits)
    lo, hi = np.array([0, 10, 400, 899]), np.array([900, 800, 460, 899])
    ri, rv = R.topk(wide, lo, hi, 50)
    b = workbench.backend("reference")
    for table in (bits, T(bits.view(np.int16)).view(torch.bfloat16)):
        i, v = b.topk(table, lo, hi, 50)
        assert np.array_equal(np.asarray(i), ri) and same_bits(np.asarray(v), rv)
        res = b.hytopk(table, lo, hi, 50)
        assert np.array_equal(np.asarray(res.idx), ri) and same_bits(np.asarray(res.val), rv)
    with pytest.raises(TypeError, match="scores"):
        b.topk(s.astype(np.float64), lo, hi, 50)


def test_dense_topk_baseline_falls_back_to_torch_topk_on_cpu():
    from workbench.harness import fastest_topk
    assert list(fastest_topk.candidates("cpu")) == ["torch.topk"]
    tab = torch.randn(3, 100)
    name, fn = fastest_topk.fastest(tab, torch.zeros(3, dtype=torch.int32), torch.full((3,), 100), 5)
    assert name == "torch.topk"
    idx, val = fn(tab, None, None, 5)
    assert torch.equal(val, torch.topk(tab, 5, dim=1).values)


def test_reference_takes_bf16_tables_as_their_float32_widening():
    rng = np.random.default_rng(10)
    s = rng.standard_normal((3, 400)).astype(np.float32)
    bits = float32_to_bf16_bits(s, np)
    wide = bf16_bits_to_float32(bits)
    lo, hi = np.array([0, 5, 100]), np.array([400, 395, 100])
    want = R.topk(wide, lo, hi, 30)
    for table in (bits, T(bits.view(np.int16)).view(torch.bfloat16)):
        got = R.topk(table, lo, hi, 30)
        assert np.array_equal(got[0], want[0]) and same_bits(got[1], want[1])
        res = R.hytopk(table, lo, hi, 30)
        assert np.array_equal(res.idx, want[0]) and same_bits(res.val, want[1])
    assert R.table_float32(bits).dtype == np.float32
