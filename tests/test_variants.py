"""Every registered stage variant of every available family against the reference.

Family-agnostic: variants come from `workbench.registry.variants(stage)`,
inputs go in through `get_family(v.family).to_device`, results come back
through `.to_host`. A new variant (or a new family) is picked up with no edit
here. Families that cannot run in this process skip with their reason;
`gpu_only` variants skip when their family runs in the CUDA simulator.

Shapes: tiny under the Numba simulator (one Python thread per CUDA thread),
moderate elsewhere; the big fixed cases (L = 131072, k = 2048, H = 64,
D = 128) are marked `gpu`.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as R
import workbench
from reference import generate as G
from workbench import registry
from workbench.families import get_family
from workbench.harness.probes import shuffle_and_poison

from strategies import indexer_cases, selection_cases

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if SIM:     # keep the simulator run within CI's budget
    SEL = dict(max_n=3, max_L=80, max_k=8)
    IDX = dict(max_n=2, max_L=48, max_H=2, max_D=3, max_k=6)
    EXAMPLES = settings(max_examples=int(os.environ.get("HYTOPK_SIM_EXAMPLES", "4")))
else:
    SEL = dict(max_n=6, max_L=1024, max_k=48)
    IDX = dict(max_n=4, max_L=512, max_H=4, max_D=16, max_k=48)
    EXAMPLES = settings()


# ---------------------------------------------------------------- which variants run here
def _family_state(name):
    """(family object or None, reason it cannot run here)."""
    try:
        fam = get_family(name)
    except Exception as e:
        return None, str(e)
    ok, why = fam.available()
    return (fam, "") if ok else (None, f"family {name!r} unavailable: {why}")


def _params(stage, source=None):
    out = []
    for v in registry.variants(stage):
        if source is not None and source not in v.sources:
            continue
        out.append(pytest.param(v.name, id=v.name))
    return out or [pytest.param(None, id="none")]


def _variant(name):
    """The variant and its family, or skip with the reason."""
    if name is None:
        pytest.skip("no variant registered for this stage")
    v = registry.get(name)
    fam, why = _family_state(v.family)
    if fam is None:
        pytest.skip(why)
    if v.gpu_only and fam.simulated:
        pytest.skip(f"{name} is gpu_only and {v.family} runs in the CUDA simulator here")
    return v, fam


def _families():
    return [pytest.param(f, id=f) for f in registry.FAMILY_MODULES]


def _backend(name):
    fam, why = _family_state(name)
    if fam is None:
        pytest.skip(why)
    return workbench.backend(name)


# ---------------------------------------------------------------- helpers
def i32(x):
    return np.asarray(x, np.int32)


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def capacity_of(case):
    return case.capacity if case.capacity is not None else \
        R.default_capacity(case.k, case.lo, case.hi, case.oversample)


def table_problem(case):
    """(host score table, reference source, device-source builder) for a table case."""
    return case.scores, R.TableSource(case.scores), lambda fam: R.TableSource(fam.to_device(case.scores))


def indexer_problem(case):
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    return table, R.IndexerSource(case.q, case.w, case.keys), \
        lambda fam: R.IndexerSource(fam.to_device(case.q), fam.to_device(case.w), fam.to_device(case.keys))


def draw_problem(data, source):
    if source == "table":
        case = data.draw(selection_cases(**SEL), label="case")
        return case, table_problem(case)
    case = data.draw(indexer_cases(**IDX), label="case")
    return case, indexer_problem(case)


def reference_threshold(src, case):
    M, r = R.sample_plan(case.lo, case.hi, case.k, case.oversample)
    return M, r, R.stage_threshold(src, np.asarray(case.lo, np.int64), np.asarray(case.hi, np.int64), M, r)


SOURCES = ("table", "indexer")


# ---------------------------------------------------------------- stage tests
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", _params("threshold"))
@EXAMPLES
@given(data=st.data())
def test_threshold(name, source, data):
    v, fam = _variant(name)
    if source not in v.sources:
        pytest.skip(f"{name} does not take the {source} source")
    case, (_, ref_src, dev_src) = draw_problem(data, source)
    M, r, T_ref = reference_threshold(ref_src, case)
    T = fam.to_host(v(dev_src(fam), fam.to_device(i32(case.lo)), fam.to_device(i32(case.hi)),
                      fam.to_device(M), fam.to_device(r)))
    assert T.shape == T_ref.shape
    np.testing.assert_array_equal(R.order_keys(np.asarray(T, np.float32)), R.order_keys(T_ref))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", _params("filter"))
@EXAMPLES
@given(data=st.data())
def test_filter(name, source, data):
    v, fam = _variant(name)
    if source not in v.sources:
        pytest.skip(f"{name} does not take the {source} source")
    case, (table, ref_src, dev_src) = draw_problem(data, source)
    cap = capacity_of(case)
    _, _, T = reference_threshold(ref_src, case)
    lo, hi = np.asarray(case.lo, np.int64), np.asarray(case.hi, np.int64)
    ref_idx, _, ref_count = R.stage_filter(ref_src, lo, hi, T, cap)
    ci, cv, cnt = v(dev_src(fam), fam.to_device(i32(lo)), fam.to_device(i32(hi)), fam.to_device(T), cap)
    ci, cv, cnt = fam.to_host(ci), fam.to_host(cv), fam.to_host(cnt)
    assert ci.shape == (len(lo), cap) and cv.shape == (len(lo), cap)
    np.testing.assert_array_equal(cnt, ref_count)
    tkeys = R.order_keys(T)
    for t in range(len(lo)):
        m = min(int(cnt[t]), cap)
        pos, val = ci[t, :m].astype(np.int64), cv[t, :m]
        assert np.all((pos >= lo[t]) & (pos < hi[t])), "stored a position outside the context"
        np.testing.assert_array_equal(bits(val), bits(table[t, pos]))
        if cnt[t] <= cap:
            np.testing.assert_array_equal(np.sort(pos), ref_idx[t, :m])
        else:
            assert np.unique(pos).size == m, "stored a position twice"
            assert np.all(R.order_keys(table[t, pos]) >= tkeys[t]), "stored a failing position"


@pytest.mark.parametrize("name", _params("check"))
@EXAMPLES
@given(case=selection_cases(**SEL))
def test_check(name, case):
    v, fam = _variant(name)
    cap = capacity_of(case)
    lo, hi = np.asarray(case.lo, np.int64), np.asarray(case.hi, np.int64)
    src = R.TableSource(case.scores)
    _, _, T = reference_threshold(src, case)
    _, _, count = R.stage_filter(src, lo, hi, T, cap)
    failed_ref, rows_ref = R.stage_check(count, lo, hi, case.k, cap)
    failed, rows = v(fam.to_device(count), fam.to_device(i32(lo)), fam.to_device(i32(hi)), case.k, cap)
    np.testing.assert_array_equal(fam.to_host(failed).astype(bool), failed_ref)
    np.testing.assert_array_equal(np.sort(fam.to_host(rows)), rows_ref)




@pytest.mark.parametrize("name", _params("select"))
@EXAMPLES
@given(case=selection_cases(**SEL), seed=st.integers(0, 2**31 - 1))
def test_select(name, case, seed):
    """Exact top-k of stored candidates, whatever their storage order; the
    slots past min(count, capacity) are poisoned and must never be read."""
    v, fam = _variant(name)
    cap = capacity_of(case)
    lo, hi = np.asarray(case.lo, np.int64), np.asarray(case.hi, np.int64)
    src = R.TableSource(case.scores)
    _, _, T = reference_threshold(src, case)
    ci, cv, count = R.stage_filter(src, lo, hi, T, cap)
    idx_ref, val_ref = R.stage_select(ci, cv, count, case.k)
    shuffle_and_poison(ci, cv, count, cap, np.random.default_rng(seed))
    idx, val = v(fam.to_device(ci), fam.to_device(cv), fam.to_device(count), case.k)
    np.testing.assert_array_equal(fam.to_host(idx), idx_ref)
    np.testing.assert_array_equal(bits(fam.to_host(val)), bits(val_ref))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", _params("recover"))
@EXAMPLES
@given(data=st.data())
def test_recover(name, source, data):
    v, fam = _variant(name)
    if source not in v.sources:
        pytest.skip(f"{name} does not take the {source} source")
    case, (_, ref_src, dev_src) = draw_problem(data, source)
    n = len(case.lo)
    rows = np.asarray(data.draw(st.permutations(range(n)), label="order"), np.int32)
    rows = rows[:data.draw(st.integers(0, n), label="nrows")]
    lo, hi = np.asarray(case.lo, np.int64), np.asarray(case.hi, np.int64)
    idx_ref, val_ref = R.stage_recover(ref_src, lo, hi, rows, case.k)
    idx, val = v(dev_src(fam), fam.to_device(i32(lo)), fam.to_device(i32(hi)), fam.to_device(rows), case.k)
    np.testing.assert_array_equal(fam.to_host(idx), idx_ref)
    np.testing.assert_array_equal(bits(fam.to_host(val)), bits(val_ref))


@pytest.mark.parametrize("name", _params("dense"))
@EXAMPLES
@given(case=indexer_cases(**IDX))
def test_dense(name, case):
    v, fam = _variant(name)
    ref = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    out = v(fam.to_device(case.q), fam.to_device(case.w), fam.to_device(case.keys),
            fam.to_device(i32(case.lo)), fam.to_device(i32(case.hi)))
    np.testing.assert_array_equal(bits(fam.to_host(out)), bits(ref))


@pytest.mark.parametrize("name", _params("replay"))
@EXAMPLES
@given(case=indexer_cases(**IDX))
def test_replay(name, case):
    v, fam = _variant(name)
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    idx, _ = R.topk(table, case.lo, case.hi, case.k)
    ref = R.replay_scores(case.q, case.w, case.keys, idx)
    out = v(fam.to_device(case.q), fam.to_device(case.w), fam.to_device(case.keys), fam.to_device(idx))
    np.testing.assert_array_equal(bits(fam.to_host(out)), bits(ref))


@pytest.mark.parametrize("name", [p for s in registry.STAGES for p in _params(s)])
def test_edge_probes(name):
    """The contract's boundaries (a count at capacity, contexts of k and k + 1 keys, a -0.0/+0.0
    tie at the k-th, NaN candidates, keys just past hi...): the probes every stage check runs
    (workbench/harness/probes.py). tests/test_known_bad.py shows they reject the known-bad
    mutants of each stage."""
    from workbench.harness import probes
    v, fam = _variant(name)
    ok, why = probes.check_variant(v, fam)
    assert ok, why


# ---------------------------------------------------------------- whole pipeline
def assert_same_result(res, ref):
    np.testing.assert_array_equal(np.asarray(res.idx), ref.idx)
    np.testing.assert_array_equal(bits(np.asarray(res.val)), bits(ref.val))
    np.testing.assert_array_equal(R.order_keys(np.asarray(res.threshold, np.float32)), R.order_keys(ref.threshold))
    np.testing.assert_array_equal(res.count, ref.count)
    np.testing.assert_array_equal(res.failed, ref.failed)
    assert res.fell_back == ref.fell_back


def kwargs_of(case):
    return dict(capacity=case.capacity, oversample=case.oversample, max_failed=case.max_failed)


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=selection_cases(**SEL))
def test_pipeline_table(family, case):
    b = _backend(family)
    res = b.hytopk(case.scores, case.lo, case.hi, case.k, **kwargs_of(case))
    idx, val = R.topk(case.scores, case.lo, case.hi, case.k)
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))
    assert_same_result(res, R.hytopk(case.scores, case.lo, case.hi, case.k, **kwargs_of(case)))


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=indexer_cases(**IDX))
def test_pipeline_indexer(family, case):
    b = _backend(family)
    res = b.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k, **kwargs_of(case))
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    idx, val = R.topk(table, case.lo, case.hi, case.k)
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))
    assert_same_result(res, R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k,
                                             **kwargs_of(case)))


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=selection_cases(**SEL), chunk=st.integers(1, 4))
def test_pipeline_table_in_passes(family, case, chunk):
    b = _backend(family)
    res = b.hytopk(case.scores, case.lo, case.hi, case.k, query_chunk=chunk, **kwargs_of(case))
    # passes of `chunk` queries: the same result and statistics as one pass (the reference)
    assert_same_result(res, R.hytopk(case.scores, case.lo, case.hi, case.k, **kwargs_of(case)))


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=indexer_cases(**IDX), chunk=st.integers(1, 3))
def test_pipeline_indexer_in_passes(family, case, chunk):
    b = _backend(family)
    res = b.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k, query_chunk=chunk,
                           **kwargs_of(case))
    assert_same_result(res, R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k,
                                             **kwargs_of(case)))


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=selection_cases(**SEL))
def test_out_of_context_never_read(family, case):
    """Scores outside [lo, hi) are poisoned with +inf (would win if read) and
    NaN (sorts last); the results must equal the clean table's."""
    b = _backend(family)
    n, L = case.scores.shape
    inside = (np.arange(L)[None, :] >= case.lo[:, None]) & (np.arange(L)[None, :] < case.hi[:, None])
    poisoned = case.scores.copy()
    poisoned[~inside] = np.where(np.arange(L) % 2 == 0, np.float32(np.inf), np.float32(np.nan))[None, :].repeat(n, 0)[~inside]
    idx, val = R.topk(case.scores, case.lo, case.hi, case.k)
    res = b.hytopk(poisoned, case.lo, case.hi, case.k, **kwargs_of(case))
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))
    ti, tv = b.topk(poisoned, case.lo, case.hi, case.k)
    np.testing.assert_array_equal(ti, idx)
    np.testing.assert_array_equal(bits(tv), bits(val))


@pytest.mark.parametrize("family", _families())
@EXAMPLES
@given(case=indexer_cases(**IDX))
def test_indexer_keys_outside_every_context_never_read(family, case):
    """Key rows no query's context covers are set to NaN; nothing may change."""
    b = _backend(family)
    L = case.keys.shape[0]
    covered = np.zeros(L, bool)
    for a, z in zip(case.lo, case.hi):
        covered[a:z] = True
    keys = case.keys.copy()
    keys[~covered] = np.float32(np.nan)
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    idx, val = R.topk(table, case.lo, case.hi, case.k)
    res = b.hytopk_indexer(case.q, case.w, keys, case.lo, case.hi, case.k, **kwargs_of(case))
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))
    np.testing.assert_array_equal(bits(b.indexer_scores(case.q, case.w, keys, case.lo, case.hi)), bits(table))


# ---------------------------------------------------------------- bad input: same errors as the reference
def _bad_calls():
    s = np.zeros((2, 8), np.float32)
    lo, hi = np.array([0, 2], np.int32), np.array([8, 5], np.int32)
    q, w, keys = np.zeros((2, 2, 3), np.float32), np.zeros((2, 2), np.float32), np.zeros((8, 3), np.float32)
    return {
        "k0": ("hytopk", (s, lo, hi, 0), {}),
        "k_float": ("hytopk", (s, lo, hi, 2.0), {}),
        "lo_gt_hi": ("hytopk", (s, np.array([3, 2], np.int32), np.array([2, 5], np.int32), 2), {}),
        "hi_past_L": ("hytopk", (s, lo, np.array([9, 5], np.int32), 2), {}),
        "scores_f64": ("hytopk", (s.astype(np.float64), lo, hi, 2), {}),
        "scores_1d": ("hytopk", (s[0], lo, hi, 2), {}),
        "capacity_lt_k": ("hytopk", (s, lo, hi, 4), {"capacity": 3}),
        "oversample_nan": ("hytopk", (s, lo, hi, 2), {"oversample": float("nan")}),
        "max_failed_neg": ("hytopk", (s, lo, hi, 2), {"max_failed": -1}),
        "lo_wrong_len": ("topk", (s, lo[:1], hi, 2), {}),
        "w_shape": ("hytopk_indexer", (q, w[:, :1], keys, lo, hi, 2), {}),
        "keys_D": ("hytopk_indexer", (q, w, keys[:, :2], lo, hi, 2), {}),
        "idx_range": ("replay_scores", (q, w, keys, np.array([[0, 8], [1, -1]], np.int32)), {}),
        "idx_dtype": ("replay_scores", (q, w, keys, np.array([[0, 1], [1, -1]], np.int64)), {}),
    }


@pytest.mark.parametrize("family", _families())
@pytest.mark.parametrize("call", sorted(_bad_calls()))
def test_bad_input_same_error_as_reference(family, call):
    b = _backend(family)
    fn, args, kw = _bad_calls()[call]
    with pytest.raises(Exception) as want:
        getattr(R, fn)(*args, **kw)
    with pytest.raises(type(want.value)) as got:
        getattr(b, fn)(*args, **kw)
    assert str(got.value) == str(want.value)


# ---------------------------------------------------------------- big fixed cases (GPU)
def _gpu_family_or_skip(family):
    fam, why = _family_state(family)
    if fam is None:
        pytest.skip(why)
    if fam.simulated or family == "reference":
        pytest.skip(f"{family}: big fixed cases need a real GPU")
    return fam


BIG_TABLE = [("gaussian", "full"), ("relu_plateau", "causal_tail"), ("alias_on_samples", "varlen"),
             ("alias_between_samples", "full"), ("ties_at_kth", "edge"), ("specials", "random"),
             ("equal", "full")]


@pytest.mark.gpu
@pytest.mark.parametrize("family", [f for f in registry.FAMILY_MODULES if f != "reference"])
@pytest.mark.parametrize("score_family,lay", BIG_TABLE)
def test_big_table_pipeline(family, score_family, lay):
    _gpu_family_or_skip(family)
    b = workbench.backend(family)
    rng = np.random.default_rng(zlib.crc32(f"{score_family}/{lay}".encode()))
    n, L, k = 8, 131072, 2048
    lo, hi = G.layout(lay, n, L, k, rng)
    scores = G.score_table(score_family, n, L, k, rng, lo, hi)
    res = b.hytopk(scores, lo, hi, k)
    idx, val = R.topk(scores, lo, hi, k)
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["threshold", "filter", "recover", "select"])
def test_big_table_stages_all_variants(stage):
    """Every variant of the selection stages on one big adversarial table."""
    rng = np.random.default_rng(7)
    n, L, k = 4, 131072, 2048
    lo, hi = G.layout("varlen", n, L, k, rng)
    scores = G.score_table("ties_at_kth", n, L, k, rng, lo, hi)
    case = type("Case", (), dict(lo=lo, hi=hi, k=k, oversample=3.0, capacity=None))
    src = R.TableSource(scores)
    lo64, hi64 = lo.astype(np.int64), hi.astype(np.int64)
    cap = capacity_of(case)
    M, r, T = reference_threshold(src, case)
    ci, cv, count = R.stage_filter(src, lo64, hi64, T, cap)
    ran = 0
    for v in registry.variants(stage):
        if v.family == "reference":
            continue
        fam, _ = _family_state(v.family)
        if fam is None or fam.simulated:
            continue
        if stage in registry.SOURCE_STAGES and "table" not in v.sources:
            continue
        d = fam.to_device
        if stage == "threshold":
            out = fam.to_host(v(R.TableSource(d(scores)), d(i32(lo)), d(i32(hi)), d(M), d(r)))
            np.testing.assert_array_equal(R.order_keys(out), R.order_keys(T))
        elif stage == "filter":
            _, _, c2 = v(R.TableSource(d(scores)), d(i32(lo)), d(i32(hi)), d(T), cap)
            np.testing.assert_array_equal(fam.to_host(c2), count)
        elif stage == "select":
            idx_ref, val_ref = R.stage_select(ci, cv, count, k)
            idx, val = v(d(ci), d(cv), d(count), k)
            np.testing.assert_array_equal(fam.to_host(idx), idx_ref)
            np.testing.assert_array_equal(bits(fam.to_host(val)), bits(val_ref))
        else:
            rows = np.arange(n, dtype=np.int32)
            idx_ref, val_ref = R.stage_recover(src, lo64, hi64, rows, k)
            idx, val = v(R.TableSource(d(scores)), d(i32(lo)), d(i32(hi)), d(rows), k)
            np.testing.assert_array_equal(fam.to_host(idx), idx_ref)
            np.testing.assert_array_equal(bits(fam.to_host(val)), bits(val_ref))
        ran += 1
    if not ran:
        pytest.skip("no GPU family available")


@pytest.mark.gpu
@pytest.mark.parametrize("family", [f for f in registry.FAMILY_MODULES if f != "reference"])
def test_big_indexer_pipeline_dense_replay(family):
    _gpu_family_or_skip(family)
    b = workbench.backend(family)
    rng = np.random.default_rng(11)
    n, L, H, D, k = 2, 131072, 64, 128, 2048
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout("causal_tail", n, L, k, rng)
    table = R.indexer_scores(q, w, keys, lo, hi)
    np.testing.assert_array_equal(bits(b.indexer_scores(q, w, keys, lo, hi)), bits(table))
    idx, val = R.topk(table, lo, hi, k)
    res = b.hytopk_indexer(q, w, keys, lo, hi, k)
    np.testing.assert_array_equal(res.idx, idx)
    np.testing.assert_array_equal(bits(res.val), bits(val))
    np.testing.assert_array_equal(bits(b.replay_scores(q, w, keys, idx)),
                                  bits(R.replay_scores(q, w, keys, idx)))
