"""Issue 19 on the CPU: bad arguments fail early, name the argument and the allowed range, and
allocate nothing first; the documented edge results hold. The same probes run through the
reference, every backend usable here (tests/test_numba_arguments.py: Numba in the simulator;
tests/test_arguments_gpu.py: CuPy and Numba on a GPU) and the torch ops."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import reference as R
import workbench
from workbench import registry
from workbench.families import get_family

from _argument_probes import (ERROR_PROBES, HOST_ONLY_PROBES, SUCCESS_PROBES, IDX, KEYS, LO, HI, Q, S, TARGET, W,
                              check_torch_documented, names_the_argument, no_big_allocation, torch_error_probes,
                              usable_backend)

ALL_ERRORS = {**ERROR_PROBES, **HOST_ONLY_PROBES}


def _ident(x):
    return x


def _usable_backend(family):
    return usable_backend(family)


# ------------------------------------------------------------------ the reference

@pytest.mark.parametrize("probe", sorted(ALL_ERRORS))
def test_reference_rejects_early(probe):
    call, exc, arg = ALL_ERRORS[probe]
    with no_big_allocation(), pytest.raises(exc) as e:
        call(R, _ident)
    assert names_the_argument(str(e.value), arg), str(e.value)


def test_k_message_says_the_allowed_range():
    for k in (0, 2**31):
        with pytest.raises(ValueError) as e:
            R.hytopk(S, LO, HI, k)
        assert "'k'" in str(e.value) and "[1, 2147483647]" in str(e.value) and f"got {k}" in str(e.value)


@pytest.mark.parametrize("probe", sorted(SUCCESS_PROBES))
def test_reference_documented_results(probe):
    tracemalloc.start()
    try:
        SUCCESS_PROBES[probe](R, _ident, np.asarray)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{probe}: {peak} bytes traced"


@pytest.mark.parametrize("call, arg", [
    (lambda: R.default_capacity(4, LO, HI, float("nan")), "oversample"),
    (lambda: R.default_capacity(4, LO, HI, 0.0), "oversample"),
    (lambda: R.default_capacity(4, LO, HI, float("inf")), "oversample"),
    (lambda: R.default_capacity(0, LO, HI), "k"),
    (lambda: R.default_capacity(-3, LO, HI), "k"),
    (lambda: R.default_capacity(2**31, LO, HI), "k"),
    (lambda: R.default_capacity(4.0, LO, HI), "k"),
    (lambda: R.default_capacity(4, LO - 1, HI), "lo"),
    (lambda: R.default_capacity(4, HI, LO), "lo'/'hi"),
    (lambda: R.default_capacity(4, LO[:2], HI), "hi"),
])
def test_default_capacity_rejects_bad_arguments(call, arg):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert names_the_argument(str(e.value), arg), str(e.value)


def test_default_capacity_never_exceeds_the_longest_context():
    assert R.default_capacity(4, LO, HI) <= 50
    assert R.default_capacity(64, LO, HI) == 64            # c <= k everywhere: k


# ------------------------------------------------------------------ every backend usable here

@pytest.mark.parametrize("family", list(registry.FAMILY_MODULES))
@pytest.mark.parametrize("probe", sorted(ALL_ERRORS))
def test_backend_same_error_as_reference(family, probe, monkeypatch):
    b = _usable_backend(family)
    call, exc, arg = ALL_ERRORS[probe]
    with pytest.raises(exc) as want:
        call(R, _ident)
    moved = []
    monkeypatch.setattr(b.family, "to_device", lambda x: moved.append(x) or x)
    with no_big_allocation(), pytest.raises(exc) as got:
        call(b, _ident)
    assert str(got.value) == str(want.value)
    assert not moved, "arguments were moved to the device before they were checked"


@pytest.mark.parametrize("family", list(registry.FAMILY_MODULES))
@pytest.mark.parametrize("probe", sorted(SUCCESS_PROBES))
def test_backend_documented_results(family, probe):
    SUCCESS_PROBES[probe](_usable_backend(family), _ident, np.asarray)


PUBLIC_API = ("order_keys", "topk", "hytopk", "indexer_scores", "hytopk_indexer", "replay_scores", "indexer_kl_loss")


def test_backend_copies_the_public_api_name_for_name():
    for name in PUBLIC_API:
        assert name in R.__all__
        assert callable(getattr(workbench.Backend, name, None)), f"Backend lacks {name}"


def test_numba_backend_without_gpu_or_simulator_fails_at_construction():
    if not registry.load_family("numba"):
        pytest.skip(f"numba not installed: {registry.load_error('numba')}")
    ok, _ = get_family("numba").available()
    if ok:
        pytest.skip("a GPU or the CUDA simulator is here: the numba backend is usable")
    with pytest.raises(RuntimeError) as e:
        workbench.backend("numba")
    msg = str(e.value)
    assert "numba" in msg and "NUMBA_ENABLE_CUDASIM=1" in msg, msg


# ------------------------------------------------------------------ the torch ops on CPU

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("probe", sorted(torch_error_probes("cpu")))
def test_torch_ops_reject_early(probe):
    call, exc, arg = torch_error_probes("cpu")[probe]
    with no_big_allocation(), pytest.raises(exc) as e:
        call()
    assert names_the_argument(str(e.value), arg), str(e.value)


def test_torch_ops_documented_results():
    check_torch_documented("cpu")


def test_torch_target_rules_are_the_reference_rules():
    """Same message from the reference and the torch op for every bad target."""
    import workbench.torch as wt
    from _argument_probes import BAD_TARGETS
    T = torch.from_numpy
    for name, bad in BAD_TARGETS.items():
        with pytest.raises(ValueError) as want:
            R.indexer_kl_loss(Q, W, KEYS, IDX, bad)
        with pytest.raises(ValueError) as got:
            wt.indexer_kl_loss(T(Q), T(W), T(KEYS), T(IDX), T(np.ascontiguousarray(bad)))
        assert str(got.value) == str(want.value), name


def test_torch_meta_everywhere_still_traces():
    """All inputs on meta is shape propagation, not a mismatch."""
    import workbench.torch as wt
    m = [torch.from_numpy(x).to("meta") for x in (Q, W, KEYS, LO, HI)]
    idx, val = wt.select(*m, 4)
    assert idx.device.type == "meta" and tuple(idx.shape) == (3, 4)
    out = wt.replay_scores(m[0], m[1], m[2], torch.from_numpy(IDX).to("meta"))
    assert out.device.type == "meta" and tuple(out.shape) == IDX.shape


def test_torch_valid_target_dtypes_still_work():
    """float16 / bfloat16 / float32 / float64 targets are fine (the same loss)."""
    import workbench.torch as wt
    T = torch.from_numpy
    want = wt.indexer_kl_loss(T(Q), T(W), T(KEYS), T(IDX), T(TARGET))
    for dt in (torch.float64, torch.float16, torch.bfloat16):
        got = wt.indexer_kl_loss(T(Q), T(W), T(KEYS), T(IDX), T(TARGET).to(dt))
        assert abs(float(got) - float(want)) < 5e-2


def test_torch_target_rules_hold_under_torch_compile():
    """Traced: no host sync, so the value rules become device-side asserts with the same message."""
    import workbench.torch as wt
    from _argument_probes import BAD_TARGETS
    T = torch.from_numpy
    fn = torch.compile(lambda *a: wt.indexer_kl_loss(*a) * 1.0, fullgraph=True, backend="aot_eager")
    assert float(fn(T(Q), T(W), T(KEYS), T(IDX), T(TARGET))) > 0
    for name in ("nan", "negative", "nonzero_at_padding"):
        with pytest.raises(ValueError) as want:
            R.indexer_kl_loss(Q, W, KEYS, IDX, BAD_TARGETS[name])
        with pytest.raises(RuntimeError) as got:
            fn(T(Q), T(W), T(KEYS), T(IDX), T(BAD_TARGETS[name]))
        assert str(want.value) in str(got.value), name
