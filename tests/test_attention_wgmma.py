"""cupy.attend.wgmma2* without a GPU: the instantiation list and launch figures (the kernel's own
static_asserts check ATTEND_WGMMA2_SMEM and the thread count in the compile check)."""
from __future__ import annotations

import pytest

from workbench import instantiations as INST


def test_instantiations():
    assert INST.name_expressions("attend_wgmma2.cu") == [
        f"hytopk_attend_fwd_wgmma2{c}<{b}, {z}{'' if c else ', 1'}>" for z in ("false", "true") for c in ("", "c")
        for b in ("true", "false")] + [f"hytopk_attend_fwd_wgmma2<{b}, true, 2>" for b in ("true", "false")]
    assert INST.FILE_OPTIONS["attend_wgmma2.cu"] == ("-arch=sm_90a",)
    assert len(INST.geometry_asserts("attend_wgmma2.cu")) == 2


def test_launch_figures():
    # Q + two 64-key stages of 576 bf16 columns, two P tiles (64 x 32 bf16), row max / sum, masks,
    # 4 mbarriers, + 1 KiB to round the base up to a 1024-byte swizzle atom
    assert INST.ATTEND_WGMMA2_SMEM == (3 * 64 * 576 * 2 + 2 * 64 * 32 * 2 + 4 * 64 * 4 + 2 * 64 * 4 + 4 * 8
                                       + 1024) <= INST.ATTEND_SMEM_LIMIT
    assert INST.ATTEND_WGMMA_THREADS == 384 and INST.ATTEND_WGMMA_HEADS == 64


def test_version_3_instantiations():
    assert INST.name_expressions("attend_wgmma3.cu") == ["hytopk_attend_fwd_wgmma3<true, 1>", "hytopk_attend_fwd_wgmma3<false, 1>",
                                                         "hytopk_attend_fwd_wgmma3<true, 2>", "hytopk_attend_fwd_wgmma3<false, 2>"]
    assert INST.FILE_OPTIONS["attend_wgmma3.cu"] == ("-arch=sm_90a",)
    # Q + two 64-key stages + P_1's 64 x 64 tile (P_0 lives in stage 0's rope column tile), maxima, masks of
    # two pairs (the row sums end in Q's tile), 8 mbarriers, 1 KiB alignment
    assert INST.ATTEND_WGMMA3_SMEM == 3 * 64 * 576 * 2 + 64 * 64 * 2 + 2 * 64 * 4 + 2 * 2 * 64 * 4 + 8 * 8 + 1024 <= INST.ATTEND_SMEM_LIMIT
    assert INST.ATTEND_WGMMA3_THREADS == 384          # 2 consumer warpgroups + a producer warpgroup (setmaxnreg)
    assert len(INST.geometry_asserts("attend_wgmma3.cu")) == 3
    # the setmaxnreg budgets fill the launch's 168 x 384 registers exactly (48 for the producer hung the H200)
    assert sum(t * r for t, r in INST.ATTEND_WGMMA3_ROLES) == 168 * INST.ATTEND_WGMMA3_THREADS


def test_backward_instantiations_and_launch_figures():
    assert INST.name_expressions("attend_wgmma_bwd.cu") == ["hytopk_attend_bwd_wgmma<false, true, false>",
                                                             "hytopk_attend_bwd_wgmma<true, false, false>",
                                                             "hytopk_attend_bwd_wgmma<true, true, false>",
                                                             "hytopk_attend_bwd_wgmma<false, true, true>",
                                                             "hytopk_attend_bwd_wgmma<true, true, true>",
                                                             "hytopk_attend_bwd_pds",
                                                             *(f"hytopk_attend_bwd_dkv<{a}, {h}, {u}>"
                                                               for a in ("false", "true") for h in (64, 128)
                                                               for u in ("false", "true")),
                                                             "hytopk_attend_bwd_sp", "hytopk_attend_bwd_dqp",
                                                             "hytopk_attend_bwd_ring<false, true>",
                                                             "hytopk_attend_bwd_ring<false, false>",
                                                             "hytopk_attend_bwd_ring<true, true>",
                                                             "hytopk_attend_bwd_ring<true, false>"]
    # the ring (the dq pass's three passes in one launch): the dkv pass's write path, the largest role's
    # shared memory plus its 128 static bytes (the ticket) within the SM's 227 KiB
    assert INST.attend_wgmma_bwd_ring_name(True, False) == "hytopk_attend_bwd_ring<true, false>"
    lag, slots = INST.ATTEND_WGMMA_BWD_RING
    assert 0 <= lag < slots
    for dkv_smem in (INST.ATTEND_WGMMA_BWD_DKV_SMEM_BULK, INST.ATTEND_WGMMA_BWD_DKV_SMEM):
        assert max(INST.ATTEND_WGMMA_BWD_SP_SMEM, dkv_smem, INST.ATTEND_WGMMA_BWD_DQ_SMEM) + 128 <= 227 * 1024
    # both role sets fit the launch's registers (168 x 384)
    assert sum(t * r for t, r in INST.ATTEND_WGMMA_BWD_SP_ROLES) <= 168 * 384
    assert sum(t * r for t, r in INST.ATTEND_WGMMA_BWD_DKV_ROLES) <= 168 * 384
    # split: the first pass launches as the direct kernel; the second sums one or two head blocks
    assert INST.attend_wgmma_bwd_name(True, writes="split") == "hytopk_attend_bwd_pds"
    # (its key tiles in the 128-byte swizzle: the base rounded up to 1024 bytes, not 128)
    assert INST.attend_wgmma_bwd_smem("split") == INST.ATTEND_WGMMA_BWD_SMEM_PDS == \
        INST.ATTEND_WGMMA_BWD_SMEM + 896 <= 227 * 1024
    assert INST.attend_wgmma_bwd_dkv_name(True, 128, False) == "hytopk_attend_bwd_dkv<true, 128, false>"
    assert INST.attend_wgmma_bwd_dkv_name(False, 64) == \
        f"hytopk_attend_bwd_dkv<false, 64, {'true' if INST.ATTEND_WGMMA_BWD_DKV_BULK else 'false'}>"
    with pytest.raises(ValueError, match="hpad"):
        INST.attend_wgmma_bwd_dkv_name(True, 192)
    assert INST.ATTEND_WGMMA_BWD_DKV_SMEM <= 227 * 1024
    # bulk: Q and dO thirds, 2 stages of [P | dS], 8 consumer warps' 8 x 800-byte buffers, 4 mbarriers
    assert INST.ATTEND_WGMMA_BWD_DKV_SMEM_BULK == 2 * 128 * 192 * 2 + 2 * 32768 + 8 * 6400 + 32 + 128 <= 227 * 1024
    assert [INST.attend_wgmma_bwd_dkv_smem(u) for u in (False, True)] == [INST.ATTEND_WGMMA_BWD_DKV_SMEM,
                                                                        INST.ATTEND_WGMMA_BWD_DKV_SMEM_BULK]
    # the direct kernel's picks: part rows 16 bytes at a time, atomics float by float (measured faster);
    # staged: 16 bytes at a time both ways (vec ignored)
    assert INST.attend_wgmma_bwd_name(False) == "hytopk_attend_bwd_wgmma<false, true, false>"
    assert INST.attend_wgmma_bwd_name(True) == "hytopk_attend_bwd_wgmma<true, false, false>"
    assert INST.attend_wgmma_bwd_name(True, False, writes="staged") == "hytopk_attend_bwd_wgmma<true, true, true>"
    with pytest.raises(ValueError, match="argument 'writes'"):
        INST.attend_wgmma_bwd_name(True, writes="bulk")
    assert INST.FILE_OPTIONS["attend_wgmma_bwd.cu"] == ("-arch=sm_90a",)
    assert len(INST.geometry_asserts("attend_wgmma_bwd.cu")) == 9
    # the setmaxnreg budgets fill the 168 registers x 384 threads of the launch exactly, both splits
    assert sum(t * r for t, r in INST.ATTEND_WGMMA_BWD_ROLES) == 168 * 384
    assert sum(t * r for t, r in INST.ATTEND_WGMMA_BWD_ROLES_STAGED) == 168 * 384
    assert [INST.attend_wgmma_bwd_roles(w) for w in INST.ATTEND_WGMMA_BWD_WRITES] == [
        INST.ATTEND_WGMMA_BWD_ROLES, INST.ATTEND_WGMMA_BWD_ROLES_STAGED, INST.ATTEND_WGMMA_BWD_ROLES]
    assert sum(t * r for t, r in INST.ATTEND_WGMMA_BWD_DKV_ROLES) == 168 * 384
    # Q + dO + two 32-key stages + P and dS (64 x 32 bf16) + the stages' slot keys + 8 mbarriers + padding + a zero
    # [64][16] tile + 128 B alignment; staged: + one 16 x 64 float unit per consumer
    assert INST.ATTEND_WGMMA_BWD_SMEM == (64 * 576 * 2 + 64 * 512 * 2 + 2 * 32 * 576 * 2 + 2 * 64 * 32 * 2
                                          + 2 * 32 * 4 + 8 * 8 + 64 + 64 * 16 * 2 + 128) <= INST.ATTEND_SMEM_LIMIT
    assert INST.ATTEND_WGMMA_BWD_SMEM_STAGED == INST.ATTEND_WGMMA_BWD_SMEM + 2 * 16 * 64 * 4 <= INST.ATTEND_SMEM_LIMIT
    assert [INST.attend_wgmma_bwd_smem(w) for w in INST.ATTEND_WGMMA_BWD_WRITES] == [
        INST.ATTEND_WGMMA_BWD_SMEM, INST.ATTEND_WGMMA_BWD_SMEM_STAGED, INST.ATTEND_WGMMA_BWD_SMEM_PDS]
    assert INST.ATTEND_WGMMA_BWD_THREADS == 384


@pytest.mark.parametrize("kw,arg", [({"qpt": 3}, "qpt"), ({"qpt": True}, "qpt"), ({"prefetch": True}, "prefetch"),
                                    ({"prefetch": -1}, "prefetch"), ({"prefetch": 9}, "prefetch"),
                                    ({"prefetch": 1.0}, "prefetch"), ({"interleave": 1.0}, "interleave"),
                                    ({"interleave": 2}, "interleave")])
def test_version_3_refuses_bad_options_naming_them(kw, arg):
    """attend_forward_wgmma3's options are checked before anything else (no GPU needed past CuPy's import)."""
    pytest.importorskip("cupy")
    from workbench.families.cupy import attend_wgmma3
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        attend_wgmma3.attend_forward_wgmma3(None, None, None, None, **kw)
