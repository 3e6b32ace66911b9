"""The template instantiations we ship: one list shared by the CuPy wrappers
(NVRTC name expressions) and the CI compile check (explicit instantiations).

A kernel template is instantiated per score source: the table source, and the
indexer source for each (H, D) shape and input dtype below. Other shapes are
either zero-padded up to TINY (small test shapes) or compiled on demand.
"""
from __future__ import annotations

from functools import lru_cache

TINY = (8, 16)                               # (H, D): the test shape (smaller inputs are padded to it)
SHAPES = (TINY, (32, 128), (64, 128))        # + GLM-5 (H=32) and DeepSeek-V3.2 (H=64), D=128
DTYPES = ("float32", "bfloat16")
C_TYPES = {"float32": "float", "bfloat16": "hytopk::bf16_bits"}
TABLE = "hytopk::TableSource"
TABLE_BF16 = "hytopk::TableBf16Source"       # a bf16 table (raw bits), widened exactly to float32
TABLES = (TABLE, TABLE_BF16)
# (threads, blocks per SM) of table_v2.cu's hytopk_table_fused_cfg (table_v2.py FUSED_THREADS /
# FUSED_MIN_BLOCKS, bench_table_topk.py --fused-sweep); (512, 2) is hytopk_table_fused itself
FUSED_CONFIGS = ((256, 3), (256, 4), (512, 3), (1024, 1))
# (threads, blocks per SM) of table_v2.cu's one-read hytopk_table_fused1 (table_v2.py FUSED_ONE_READ;
# (512, 2) would spill 4 bytes for bf16)
FUSED1_CONFIGS = ((1024, 1),)
# (cluster size C, threads, shared ranking) of table_v2.cu's hytopk_table_cluster (table_v2.py
# FUSED_CLUSTER, CLUSTER_SIZE, CLUSTER_THREADS, CLUSTER_SHARE): both table sources at each (1024 threads
# spill 8-24 bytes at 64 registers)
CLUSTER_CONFIGS = ((8, 512, True), (4, 512, True), (8, 512, False), (4, 512, False))

# file -> (kernel, what it is instantiated over)
#   "table+indexer": every source; "indexer": indexer sources only; "tables": the table sources only;
#   "mma": (H, D) only (bf16 tensor-core path); "mma_sync" and "wgmma": (H, D) rounded up by
#   tiled_shape (the tensor-core tile shape of the mma_sync and wgmma bf16 cores); "wgmma_fp8": by fp8_shape; "plain": not a template
KERNELS = {
    "threshold.cu": (("hytopk_threshold", "table+indexer"), ("hytopk_sample_positions", "plain")),
    "filter.cu": (("hytopk_filter", "table+indexer"),),
    "check.cu": (("hytopk_check", "plain"),),
    "device_recovery.cu": (("hytopk_recovery_slots", "plain"), ("hytopk_scatter_slots", "plain"),
                           ("hytopk_append_rows", "plain")),
    "select.cu": (("hytopk_select", "plain"), ("hytopk_select_bitonic", "plain"))
                 + tuple((f"hytopk_select_smem_e{e}", "plain") for e in (1, 2, 4, 8, 16))
                 + (("hytopk_select_fast", "plain"),),
    "recover.cu": (("hytopk_score_rows", "indexer"), ("hytopk_select_rows", "plain"), ("hytopk_select_rows_to", "plain")),
    "table_topk.cu": (("hytopk_table_filter", "tables"), ("hytopk_table_topk", "tables"),
                      ("hytopk_table_topk_listed", "tables"), ("hytopk_table_ranges_ok", "plain")),
    "table_v2.cu": (("hytopk_table_threshold", "tables"), ("hytopk_table_filter_pieces", "tables"),
                    ("hytopk_table_fused", "tables"), ("hytopk_select_smem", "plain"),
                    ("hytopk_table_fused_cfg", "tables_cfg"), ("hytopk_table_fused1", "tables_cfg1"),
                    ("hytopk_table_cluster", "tables_cluster")),
    "dense.cu": (("hytopk_dense", "indexer"),),
    "replay.cu": (("hytopk_replay", "indexer"),),
    "score_only.cu": (("hytopk_score_only", "indexer"),),
    "mma_sync.cu": (("hytopk_filter_mma_sync", "mma_sync"), ("hytopk_dense_mma_sync", "mma_sync"),
                 ("hytopk_score_rows_mma_sync", "mma_sync"), ("hytopk_score_only_mma_sync", "mma_sync"),
                 ("hytopk_replay_mma_sync", "mma_sync")),
    "wgmma.cu": tuple((f"hytopk_{k}_{kind}", kind) for kind in ("wgmma", "wgmma_fp8")
                      for k in ("filter", "dense", "score_rows", "score_only")),
    "wgmma_ws.cu": tuple((f"hytopk_{k}_{kind}", over) for kind, over in (("ws", "wgmma"), ("ws_fp8", "wgmma_fp8"))
                         for k in ("filter", "dense", "score_rows", "score_only", "replay", "threshold"))
                   + (("hytopk_filter_ws2", "wgmma"), ("hytopk_score_only_ws2", "wgmma"), ("hytopk_ws_pretile", "plain"),
                      ("hytopk_threshold_group_ws", "wgmma"), ("hytopk_threshold_group128_ws", "wgmma"),
                      ("hytopk_threshold_group128_lines_ws", "wgmma")),
    "wgmma_ws_threshold.cu": tuple((f"hytopk_threshold_v2{v}_ws", "wgmma") for v in ("", "s3", "_ns", "s3_ns")),
    "attend.cu": (("hytopk_attend_fwd", "attend"), ("hytopk_attend_bwd", "attend"), ("hytopk_attend_delta", "attend"), ("hytopk_attend_pair_union", "attend"),
                  ("hytopk_attend_dkv_reduce", "attend"), ("hytopk_attend_pair_union_reg", "attend"),
                  ("hytopk_attend_bwd_hb2", "attend"), ("hytopk_attend_dkv_reduce_warp", "attend"),
                  ("hytopk_attend_fwd_acc2", "attend"), ("hytopk_attend_bwd_dq", "attend"),
                  ("hytopk_attend_dkv_keys", "attend"), ("hytopk_attend_pair_union_bits", "attend")),
    "attend_wgmma2.cu": (("hytopk_attend_fwd_wgmma2", "attend_wgmma"), ("hytopk_attend_fwd_wgmma2c", "attend_wgmma")),
    "attend_wgmma3.cu": (("hytopk_attend_fwd_wgmma3", "attend_wgmma"),),
    "attend_wgmma_bwd.cu": (("hytopk_attend_bwd_wgmma", "attend_wgmma"),),
}
# files that need an arch-specific target (wgmma exists on sm_90a only): NVRTC options, nvcc -gencode
FILE_OPTIONS = {"wgmma.cu": ("-arch=sm_90a",), "wgmma_ws.cu": ("-arch=sm_90a",),
                "wgmma_ws_threshold.cu": ("-arch=sm_90a",), "attend_wgmma2.cu": ("-arch=sm_90a",),
                "attend_wgmma3.cu": ("-arch=sm_90a",), "attend_wgmma_bwd.cu": ("-arch=sm_90a",)}


def nvcc_target(file: str, arch: str) -> str:
    """nvcc's target for `file`: its FILE_OPTIONS arch as -gencode (nvcc's -arch=sm_90a shorthand
    also runs a plain sm_90 pass that rejects wgmma), else -arch=sm_<arch>."""
    for opt in FILE_OPTIONS.get(file, ()):
        if opt.startswith("-arch=sm_"):
            sm = opt.split("sm_", 1)[1]
            return f"-gencode=arch=compute_{sm},code=sm_{sm}"
    return f"-arch=sm_{arch}"
TILED_HEADS = (16, 32, 64)                   # the tensor-core cores' H (hytopk_mma_sync.cuh); fewer heads are zero-padded


# ---- sparse attention (attend.cu): templates over (rows, key tile, head dims, queries per block, ...)
# shipped: MLA (DeepSeek-V3.2 / GLM-5: d_qk 576 = 512 latent + 64 rope, V = the first 512 columns of
# the shared kv row) and a GQA head dim of 128; other dims compile on demand (attend_* names)
ATTEND_SHIPPED = ((576, 512, True), (128, 128, False))
ATTEND_ROWS = (16, 32, 64)                      # MMA rows per block: 1, 2 or 4 m16 tiles


def _b(x) -> str:
    return "true" if x else "false"


def attend_nk(mt: int) -> int:
    """Keys per gathered tile: every warp takes whole n8 tiles of logits (NK / (8 / mt) >= 8);
    64 rows of MLA (d_qk 576) leave room for two 32-key stages."""
    return 64 if mt == 1 else 32


ATTEND_SMEM_LIMIT = 227 * 1024                  # opt-in shared memory per block on Hopper


def attend_smem(mt, dqk, dv, qpt, shared, backward=False, nk=None) -> int:
    """Bytes of dynamic shared memory of an attend block: hytopk_attend.cuh Shape::FWD_SMEM / BWD_SMEM
    (nk: keys per tile, attend_nk(mt) unless given)."""
    nk, rows, nsplit = nk or attend_nk(mt), 16 * mt, 8 // mt
    qs = dqk + 8
    kb = nk * qs * 2
    vb = 0 if shared else nk * (dv + 8) * 2
    pb = rows * (nk + 8) * 2
    if not backward:
        return rows * qs * 2 + 2 * kb + 2 * vb + pb + 2 * nsplit * rows * 4 + 2 * nk * qpt * 4
    return rows * qs * 2 + rows * (dv + 8) * 2 + 2 * kb + 2 * vb + 2 * pb + 2 * rows * 4 + 2 * nk * qpt * 4


def attend_static_asserts() -> list[str]:
    """attend_smem (the wrapper's launch figure) against the header's Shape, for every shipped shape."""
    out = []
    for dqk, dv, shared in ATTEND_SHIPPED:
        for mt in (1, 2, 4):
            for qpt in (1, 2):
                S = f"hytopk::attend::Shape<{mt}, {attend_nk(mt)}, {dqk}, {dv}, {qpt}, {_b(shared)}>"
                for field, bwd in (("FWD_SMEM", False), ("BWD_SMEM", True)):
                    want = attend_smem(mt, dqk, dv, qpt, shared, bwd)
                    out.append(f'static_assert({S}::{field} == {want}, "instantiations.attend_smem drifted from '
                               f'hytopk_attend.cuh {field}");')
        nk = attend_wide_nk(2, dqk, dv, 2, shared)                 # the _nk64 variants' shape
        S = f"hytopk::attend::Shape<2, {nk}, {dqk}, {dv}, 2, {_b(shared)}>"
        out.append(f'static_assert({S}::FWD_SMEM == {attend_smem(2, dqk, dv, 2, shared, nk=nk)}, '
                   f'"instantiations.attend_smem drifted from hytopk_attend.cuh FWD_SMEM");')
    return out


def attend_fwd_name(mt, dqk, dv, qpt, shared, out_bf16, nk=None) -> str:
    return (f"hytopk_attend_fwd<{int(mt)}, {int(nk or attend_nk(mt))}, {int(dqk)}, {int(dv)}, {int(qpt)}, "
            f"{_b(shared)}, {_b(out_bf16)}>")


def attend_fwd_acc2_name(mt, dqk, dv, qpt, shared, out_bf16, nk=None) -> str:
    """hytopk_attend_fwd_acc2: two logit accumulators (d_qk a multiple of 32)."""
    return attend_fwd_name(mt, dqk, dv, qpt, shared, out_bf16, nk).replace("hytopk_attend_fwd<",
                                                                           "hytopk_attend_fwd_acc2<")


def attend_wide_nk(mt, dqk, dv, qpt, shared):
    """The `_nk64` variants' key tile: 64 keys where that fits in shared memory (32 rows of MLA: two
    64-key stages, 189 KB), else attend_nk(mt)."""
    return 64 if attend_smem(mt, dqk, dv, qpt, shared, nk=64) <= ATTEND_SMEM_LIMIT else attend_nk(mt)


def attend_bwd_name(mt, dqk, dv, shared, atomic) -> str:
    return f"hytopk_attend_bwd<{int(mt)}, {attend_nk(mt)}, {int(dqk)}, {int(dv)}, {_b(shared)}, {_b(atomic)}>"


def attend_bwd_dq_name(mt, dqk, dv, qpt, shared) -> str:
    """hytopk_attend_bwd_dq: dq alone (the query-major half of the key-major backward); qpt 2: a
    query pair over its union, as the forward's `pair`."""
    return f"hytopk_attend_bwd_dq<{int(mt)}, {attend_nk(mt)}, {int(dqk)}, {int(dv)}, {int(qpt)}, {_b(shared)}>"


def attend_dkv_keys_name(dqk, dv) -> str:
    """hytopk_attend_dkv_keys: key-major dK / dV (head dims multiples of 64)."""
    return f"hytopk_attend_dkv_keys<{int(dqk)}, {int(dv)}>"


def attend_bwd_hb2_name(mt, dqk, dv, shared) -> str:
    return f"hytopk_attend_bwd_hb2<{int(mt)}, {attend_nk(mt)}, {int(dqk)}, {int(dv)}, {_b(shared)}>"


ATTEND_REDUCE_RC = (1, 2, 3, 4, 5, 6, 8)        # float4 chunks per lane of hytopk_attend_dkv_reduce_warp


def attend_reduce_warp_name(shared, W):
    """hytopk_attend_dkv_reduce_warp for part rows of W floats, or None past 1024 columns."""
    need = -(-(int(W) // 4) // 32)
    rc = next((r for r in ATTEND_REDUCE_RC if r >= need), None)
    return None if rc is None else f"hytopk_attend_dkv_reduce_warp<{_b(shared)}, {rc}>"


# attend_wgmma2.cu: MLA only (d_qk 576, d_v 512, shared kv), 64 heads per block, out bf16 or float32;
# shared memory: Q + two 64-key stages of 576 bf16 columns, two P tiles (64 x 32 bf16), row max /
# sum, masks, 4 mbarriers, + 1 KiB to round the base up to a 1024-byte swizzle atom; cluster: the 2-CTA kernel; swz: the 128-byte-swizzled
# key tile (full-sector gather)
ATTEND_WGMMA_DIMS = (576, 512)
ATTEND_WGMMA_HEADS = 64
ATTEND_WGMMA_THREADS = 384
ATTEND_WGMMA2_SMEM = 73728 * 3 + 2 * 4096 + 4 * 64 * 4 + 2 * 64 * 4 + 32 + 1024   # attw2::LAUNCH_SMEM (static_assert)


def attend_wgmma2_name(out_bf16, cluster, swz, qpt=1) -> str:
    """qpt 2: a query pair per block over its union (the plain kernel only)."""
    if cluster:
        return f"hytopk_attend_fwd_wgmma2c<{_b(out_bf16)}, {_b(swz)}>"
    return f"hytopk_attend_fwd_wgmma2<{_b(out_bf16)}, {_b(swz)}, {int(qpt)}>"


# attend_wgmma3.cu: version 3 (a pair of 64-key tiles per step, one per warpgroup; FlashMLA's sm90 schedule):
# Q + two 64-key stages + P_1's tile (P_0 lives in stage 0's rope tile) + maxima + masks (two pair parities)
# + 8 mbarriers + 1 KiB to round the base up to 1024 B
ATTEND_WGMMA3_SMEM = 73728 * 3 + 8192 + 2 * 64 * 4 + 4 * 64 * 4 + 8 * 8 + 1024     # attw3::LAUNCH_SMEM (static_assert)
ATTEND_WGMMA3_THREADS = 384                                                # 2 consumer warpgroups + 1 producer warpgroup (setmaxnreg)
ATTEND_WGMMA3_ROLES = ((128, 40), (256, 232))      # (threads, setmaxnreg): the producer, the consumers


# attend_wgmma3's L2 prefetch distance (pairs of key tiles ahead) by default: none. Run 3 of
# results/h200-2026-12-02-s5 (one process, n 8192, k 2048): one query at 16 heads 5.14 / 5.06 / 5.14 ms
# at 0 / 1 / 2 pairs ahead, 128 heads 10.65 / 10.71, the query pair at 16 heads 3.98 / 4.36 / 4.31
# (run 2's 10 % gain at 16 heads was the first row of its process). A knob to measure with.
ATTEND_WGMMA3_PREFETCH = 0


def attend_wgmma3_interleave(qpt) -> bool:
    """attend_wgmma3's slot order by default: 64 consecutive slots per tile (False) or tile t of T
    taking slots t, t + T, ... (True). True for the query pair, whose union lists are sorted by key:
    run 5 of results/h200-2026-12-02-s5 (alternating rounds, n 8192, k 2048) wgmma3p 3.86 against
    4.13 ms at 16 heads, 3.77 against 4.10 at 8; the one-query lists (any order) gain nothing
    (4.72 / 4.70 ms)."""
    return qpt == 2


def attend_wgmma3_name(out_bf16, qpt=1) -> str:
    """qpt 2: a query pair per block over its union (wgmma3p)."""
    return f"hytopk_attend_fwd_wgmma3<{_b(out_bf16)}, {int(qpt)}>"


# attend_wgmma_bwd.cu: the MLA backward (dims as ATTEND_WGMMA_DIMS, 64 heads per block): Q + dO + two
# 32-key stages + P and dS tiles (64 x 32 bf16) + the stages' slot keys + 4 mbarriers + 96 B to a 128-byte
# boundary + a zero [64][16] bf16 tile + 128 B to round the base up
ATTEND_WGMMA_BWD_SMEM = 73728 + 65536 + 2 * 36864 + 2 * 4096 + 2 * 32 * 4 + 8 * 8 + 64 + 2048 + 128   # attwb::LAUNCH_SMEM
# staged: + one 16-slot x 64-column float unit per consumer (attwb::LAUNCH_SMEM_STAGED)
ATTEND_WGMMA_BWD_SMEM_STAGED = ATTEND_WGMMA_BWD_SMEM + 2 * 16 * 64 * 4
# split's first pass (hytopk_attend_bwd_pds): the same, its base rounded up to 1024 B (swizzled key tiles)
ATTEND_WGMMA_BWD_SMEM_PDS = ATTEND_WGMMA_BWD_SMEM - 128 + 1024   # attwb::LAUNCH_SMEM_PDS
# how dK/dV leave the block: the consumers write them (direct), or the producer warpgroup does (staged;
# the TMA's bulk operations instead were slower: commit cd2ef35, results/h200-2026-12-03-s8)
ATTEND_WGMMA_BWD_WRITES = ("direct", "staged", "split")
# split: the first pass (hytopk_attend_bwd_pds) launches as the direct kernel; the second
# (hytopk_attend_bwd_dkv): Q and dO thirds [128][192] bf16 each, 4 stages of P and dS blocks
# [128][64] bf16, 8 mbarriers, 128 B to round the base up (attwb::dkv::LAUNCH_SMEM)
ATTEND_WGMMA_BWD_DKV_SMEM = 2 * 128 * 192 * 2 + 4 * 2 * 128 * 64 * 2 + 8 * 8 + 128
# bulk: the rows leave by the TMA's bulk operations (cp.reduce.async.bulk .add.f32 / cp.async.bulk)
# from a staging buffer of 8 rows x 800 bytes per consumer warp; 2 stages (attwb::dkv::LAUNCH_SMEM_BULK)
ATTEND_WGMMA_BWD_DKV_SMEM_BULK = 2 * 128 * 192 * 2 + 2 * 2 * 128 * 64 * 2 + 8 * 8 * 800 + 4 * 8 + 128
ATTEND_WGMMA_BWD_DKV_BULK = True        # the second pass's default: atomics 43.3 ms against 47.0, deterministic
                                        # 57.2 against 59.1 (results/h200-2026-12-04-s11 run 1)
ATTEND_WGMMA_BWD_DKV_ROLES = ((128, 40), (256, 232))
ATTEND_WGMMA_BWD_DKV_THREADS = 384
ATTEND_WGMMA_BWD_SPLIT_HEADS = 128      # the second pass sums at most two head blocks
# split with a dq pass (DQ_PASS, two head blocks): the first pass hytopk_attend_bwd_sp (two 64-key
# stages, two float P buffers [32][128], the stages' slot keys, 4 mbarriers, 96 B to a 128-byte boundary,
# a zero [64][16] bf16 tile, 1024 B to round the base up to the swizzle's atom: attwb::sp::LAUNCH_SMEM),
# the third hytopk_attend_bwd_dqp (4 stages of a dS block [128][64] and a key-row third [64][192] bf16,
# 8 mbarriers, 1024 B: attwb::dqp::LAUNCH_SMEM); both 384 threads (setmaxnreg: SP_ROLES, DKV_ROLES)
ATTEND_WGMMA_BWD_SP_SMEM = 2 * 64 * 576 * 2 + 2 * 32 * 128 * 4 + 2 * 64 * 4 + 4 * 8 + 96 + 2048 + 1024
ATTEND_WGMMA_BWD_DQ_SMEM = 4 * (128 * 64 * 2 + 64 * 192 * 2) + 8 * 8 + 1024
ATTEND_WGMMA_BWD_SP_ROLES = ((128, 56), (256, 224))   # the dq-pass first pass: its producer holds 8 slot keys
ATTEND_WGMMA_BWD_DQ_PASS = True         # two head blocks: the dq pass (atomics 40.43 ms against 41.87, deterministic
                                        # 57.19 against 58.72, the same bits: results/h200-2026-12-04-s13 run 6)
# the dq pass's three passes in one launch (hytopk_attend_bwd_ring), (lag, slots): query t's first pass
# beside the second and third passes of query t - lag, P / dS in slot t % slots (128 MiB at k 2048, against
# the three launches' 4 GiB scratch): atomics 36.66 ms against 40.36, deterministic 50.41 against 53.33,
# the same bits (results/h200-2026-12-04-s14 run 2); None: the three launches
ATTEND_WGMMA_BWD_RING = (32, 128)
ATTEND_WGMMA_BWD_THREADS = 384
ATTEND_WGMMA_BWD_ROLES = ((128, 40), (256, 232))   # (threads, setmaxnreg): the producer, the consumers
ATTEND_WGMMA_BWD_ROLES_STAGED = ((128, 88), (256, 208))   # staged: the producer also writes dK/dV
ATTEND_WGMMA_BWD_VEC = {False: True, True: False}    # atomic -> 16-byte writes (scalar atomics measured faster;
                                                     # scalar part rows are not built or measured)


def _bwd_writes(writes: str) -> str:
    if writes not in ATTEND_WGMMA_BWD_WRITES:
        raise ValueError(f"argument 'writes': {writes!r} is not one of {ATTEND_WGMMA_BWD_WRITES}")
    return writes


def attend_wgmma_bwd_name(atomic, vec=None, writes="direct") -> str:
    """atomic: dK/dV by float atomics into dkv; else the per-(query, head block, slot) part rows.
    vec: 16-byte writes, else scalar ones; None: the faster of the two on the H200 for that mode
    (ATTEND_WGMMA_BWD_VEC). writes (ATTEND_WGMMA_BWD_WRITES): "staged", the consumers hand dK/dV to
    the producer warpgroup through shared memory, which writes them (16 bytes at a time, whole
    256-byte row pieces; vec ignored)."""
    if _bwd_writes(writes) == "split":
        return "hytopk_attend_bwd_pds"
    staged = writes == "staged"
    vec = True if staged else ATTEND_WGMMA_BWD_VEC[bool(atomic)] if vec is None else vec
    return f"hytopk_attend_bwd_wgmma<{_b(atomic)}, {_b(vec)}, {_b(staged)}>"


def attend_wgmma_bwd_smem(writes="direct") -> int:
    """The launch's dynamic shared memory for a write path."""
    return {"direct": ATTEND_WGMMA_BWD_SMEM, "staged": ATTEND_WGMMA_BWD_SMEM_STAGED,
            "split": ATTEND_WGMMA_BWD_SMEM_PDS}[_bwd_writes(writes)]


def attend_wgmma_bwd_roles(writes="direct") -> tuple:
    """(threads, setmaxnreg) of the producer and the consumers for a write path."""
    return {"direct": ATTEND_WGMMA_BWD_ROLES, "staged": ATTEND_WGMMA_BWD_ROLES_STAGED,
            "split": ATTEND_WGMMA_BWD_ROLES}[_bwd_writes(writes)]


def attend_wgmma_bwd_dkv_name(atomic, hpad, bulk=None) -> str:
    """The split backward's second pass: dK/dV of one or two head blocks (hpad 64 / 128) by float
    atomics into dkv, else into per-(query, slot) part rows; bulk: through the TMA's bulk operations,
    else 8-byte writes from the accumulators (None: ATTEND_WGMMA_BWD_DKV_BULK)."""
    if hpad not in (64, 128):
        raise ValueError(f"argument 'hpad': {hpad} is not 64 or 128")
    bulk = ATTEND_WGMMA_BWD_DKV_BULK if bulk is None else bulk
    return f"hytopk_attend_bwd_dkv<{_b(atomic)}, {int(hpad)}, {_b(bulk)}>"


def attend_wgmma_bwd_ring_name(atomic, bulk=None) -> str:
    """The split's three passes (two head blocks) in one launch over a ring of P / dS slots
    (hytopk_attend_bwd_ring; the wrapper's RING)."""
    bulk = ATTEND_WGMMA_BWD_DKV_BULK if bulk is None else bulk
    return f"hytopk_attend_bwd_ring<{_b(atomic)}, {_b(bulk)}>"


def attend_wgmma_bwd_dkv_smem(bulk=None) -> int:
    """The second pass's dynamic shared memory for its write path (None: ATTEND_WGMMA_BWD_DKV_BULK)."""
    bulk = ATTEND_WGMMA_BWD_DKV_BULK if bulk is None else bulk
    return ATTEND_WGMMA_BWD_DKV_SMEM_BULK if bulk else ATTEND_WGMMA_BWD_DKV_SMEM


def attend_names() -> tuple:
    """The instantiations the compile check builds (the shipped shapes' hot ones)."""
    out = []
    for dqk, dv, shared in ATTEND_SHIPPED:
        for mt in (1, 2, 4):
            for qpt in (1, 2):
                out.append(attend_fwd_name(mt, dqk, dv, qpt, shared, True))
            out.append(attend_bwd_name(mt, dqk, dv, shared, False))
        out.append(attend_fwd_name(4, dqk, dv, 1, shared, False))
        out.append(attend_bwd_name(4, dqk, dv, shared, True))
    out += [f"hytopk_attend_pair_union_reg<{r}>" for r in (1, 2, 4, 8, 16)]
    for dqk, dv, shared in ATTEND_SHIPPED:
        out += [attend_fwd_acc2_name(mt, dqk, dv, qpt, shared, True) for mt in (1, 4) for qpt in (1, 2)]
        out += [attend_fwd_name(mt, dqk, dv, 2, shared, True, attend_wide_nk(mt, dqk, dv, 2, shared))
                for mt in (2, 4) if attend_wide_nk(mt, dqk, dv, 2, shared) != attend_nk(mt)]
        out += [attend_bwd_hb2_name(mt, dqk, dv, shared) for mt in (2, 4)]
        out.append(attend_reduce_warp_name(shared, dqk if shared else dqk + dv))
        if not shared:                                          # the key-major backward (GQA / MHA)
            out += [attend_bwd_dq_name(1, dqk, dv, 2, shared), attend_dkv_keys_name(dqk, dv)]
    out += ["hytopk_attend_pair_union", "hytopk_attend_pair_union_bits", "hytopk_attend_delta<true>", "hytopk_attend_delta<false>",
            "hytopk_attend_dkv_reduce<true>", "hytopk_attend_dkv_reduce<false>"]
    return tuple(out)


def indexer_source(H: int, D: int, dtype: str) -> str:
    """C++ type of the indexer source for one shape and input dtype."""
    if dtype not in C_TYPES:
        raise ValueError(f"argument 'dtype': expected one of {sorted(C_TYPES)}, got {dtype!r}")
    return f"hytopk::IndexerSource<{int(H)}, {int(D)}, {C_TYPES[dtype]}>"


def mma_ok(H: int, D: int) -> bool:
    return H % 8 == 0 and D % 16 == 0


def tiled_shape(H: int, D: int) -> tuple[int, int]:
    """The tensor-core cores' (H, D) for inputs of H heads and D dims: H up to the next of
    TILED_HEADS, D up to a multiple of 16 (zero heads and dims add exactly +0)."""
    H, D = int(H), int(D)
    if H < 1 or H > TILED_HEADS[-1]:
        raise ValueError(f"argument 'q': the tensor-core cores take 1 to {TILED_HEADS[-1]} heads, got {H}")
    if D < 1 or D > 256:
        raise ValueError(f"argument 'q': the tensor-core cores take head dims 1 to 256, got {D}")
    return next(h for h in TILED_HEADS if h >= H), -(-D // 16) * 16


def fp8_shape(H: int, D: int) -> tuple[int, int]:
    """The wgmma fp8 core's (H, D): H as tiled_shape, D up to a multiple of 32 (one k32 MMA step)."""
    H, D = tiled_shape(H, D)
    return H, -(-D // 32) * 32


def geometry_asserts(file: str, shapes=SHAPES) -> list[str]:
    """C++ static_asserts that check the Python geometry mirrors against `file`'s headers
    (compiled by the compile check next to the instantiations)."""
    if file == "attend.cu":
        return attend_static_asserts()
    if file == "wgmma_ws_threshold.cu":
        from workbench.geometry import ws_threshold_v2_static_asserts
        return ws_threshold_v2_static_asserts(list(dict.fromkeys(tiled_shape(*s) for s in shapes)))
    if file == "attend_wgmma2.cu":
        return [f'static_assert(hytopk::attw2::LAUNCH_SMEM == {ATTEND_WGMMA2_SMEM}, "instantiations.ATTEND_WGMMA2_SMEM drifted");',
                f'static_assert(hytopk::attw2::THREADS == {ATTEND_WGMMA_THREADS}, "instantiations.ATTEND_WGMMA_THREADS drifted");']
    if file == "attend_wgmma_bwd.cu":
        return [f'static_assert(hytopk::attwb::LAUNCH_SMEM == {ATTEND_WGMMA_BWD_SMEM}, "instantiations.ATTEND_WGMMA_BWD_SMEM drifted");',
                f'static_assert(hytopk::attwb::LAUNCH_SMEM_STAGED == {ATTEND_WGMMA_BWD_SMEM_STAGED}, '
                '"instantiations.ATTEND_WGMMA_BWD_SMEM_STAGED drifted");',
                f'static_assert(hytopk::attwb::THREADS == {ATTEND_WGMMA_BWD_THREADS}, "instantiations.ATTEND_WGMMA_BWD_THREADS drifted");',
                f'static_assert(hytopk::attwb::LAUNCH_SMEM_PDS == {ATTEND_WGMMA_BWD_SMEM_PDS}, "instantiations.ATTEND_WGMMA_BWD_SMEM_PDS drifted");',
                f'static_assert(hytopk::attwb::PRODUCER_REGS == {ATTEND_WGMMA_BWD_ROLES[0][1]} && hytopk::attwb::CONSUMER_REGS == '
                f'{ATTEND_WGMMA_BWD_ROLES[1][1]}, "instantiations.ATTEND_WGMMA_BWD_ROLES drifted");',
                f'static_assert(hytopk::attwb::PRODUCER_REGS_STAGED == {ATTEND_WGMMA_BWD_ROLES_STAGED[0][1]} && '
                f'hytopk::attwb::CONSUMER_REGS_STAGED == {ATTEND_WGMMA_BWD_ROLES_STAGED[1][1]}, '
                '"instantiations.ATTEND_WGMMA_BWD_ROLES_STAGED drifted");',
                f'static_assert(hytopk::attwb::dkv::LAUNCH_SMEM == {ATTEND_WGMMA_BWD_DKV_SMEM} && hytopk::attwb::dkv::PRODUCER_REGS == '
                f'{ATTEND_WGMMA_BWD_DKV_ROLES[0][1]} && hytopk::attwb::dkv::CONSUMER_REGS == {ATTEND_WGMMA_BWD_DKV_ROLES[1][1]} && '
                f'hytopk::attwb::dkv::THREADS == {ATTEND_WGMMA_BWD_DKV_THREADS}, "instantiations.ATTEND_WGMMA_BWD_DKV_* drifted");',
                f'static_assert(hytopk::attwb::dkv::LAUNCH_SMEM_BULK == {ATTEND_WGMMA_BWD_DKV_SMEM_BULK}, '
                '"instantiations.ATTEND_WGMMA_BWD_DKV_SMEM_BULK drifted");',
                f'static_assert(hytopk::attwb::sp::LAUNCH_SMEM == {ATTEND_WGMMA_BWD_SP_SMEM} && hytopk::attwb::dqp::LAUNCH_SMEM == '
                f'{ATTEND_WGMMA_BWD_DQ_SMEM} && hytopk::attwb::sp::PRODUCER_REGS == {ATTEND_WGMMA_BWD_SP_ROLES[0][1]} && '
                f'hytopk::attwb::sp::CONSUMER_REGS == {ATTEND_WGMMA_BWD_SP_ROLES[1][1]} && hytopk::attwb::dqp::PRODUCER_REGS == '
                f'{ATTEND_WGMMA_BWD_DKV_ROLES[0][1]} && hytopk::attwb::dqp::CONSUMER_REGS == {ATTEND_WGMMA_BWD_DKV_ROLES[1][1]}, '
                '"instantiations.ATTEND_WGMMA_BWD_SP_SMEM / DQ_SMEM / SP_ROLES / DKV_ROLES drifted");']
    if file == "attend_wgmma3.cu":
        return [f'static_assert(hytopk::attw3::LAUNCH_SMEM == {ATTEND_WGMMA3_SMEM}, "instantiations.ATTEND_WGMMA3_SMEM drifted");',
                f'static_assert(hytopk::attw3::THREADS == {ATTEND_WGMMA3_THREADS}, "instantiations.ATTEND_WGMMA3_THREADS drifted");',
                f'static_assert(hytopk::attw3::PRODUCER_REGS == {ATTEND_WGMMA3_ROLES[0][1]} && hytopk::attw3::CONSUMER_REGS == '
                f'{ATTEND_WGMMA3_ROLES[1][1]}, "instantiations.ATTEND_WGMMA3_ROLES drifted");']
    if file != "wgmma_ws.cu":
        return []
    from workbench.geometry import ws_static_asserts
    return ws_static_asserts(list(dict.fromkeys(tiled_shape(*s) for s in shapes)),
                             list(dict.fromkeys(fp8_shape(*s) for s in shapes)))


def name(kernel: str, source: str | None = None, shape: tuple | None = None) -> str:
    """The name expression of one instantiation (the string NVRTC and get_function use)."""
    if source is not None:
        return f"{kernel}<{source}>"
    if shape is not None:
        return f"{kernel}<{int(shape[0])}, {int(shape[1])}>"
    return kernel


def name_expressions(file: str, shapes=SHAPES, dtypes=DTYPES) -> list[str]:
    """Every instantiation of `file`'s kernels for the given shapes and dtypes."""
    return list(_name_expressions(file, tuple(map(tuple, shapes)), tuple(dtypes)))


@lru_cache(maxsize=256)          # on every launch's path: built once per (file, shapes, dtypes)
def _name_expressions(file: str, shapes: tuple, dtypes: tuple) -> tuple:
    out = []
    if file == "attend.cu":
        return attend_names()
    if file == "attend_wgmma2.cu":
        return tuple(attend_wgmma2_name(b, c, z) for z in (False, True) for c in (False, True) for b in (True, False)) \
            + tuple(attend_wgmma2_name(b, False, True, 2) for b in (True, False))
    if file == "attend_wgmma3.cu":
        return tuple(attend_wgmma3_name(b, qpt) for qpt in (1, 2) for b in (True, False))
    if file == "attend_wgmma_bwd.cu":
        # part rows 16 bytes at a time; atomics both ways (the bench compares them); both staged
        return (attend_wgmma_bwd_name(False, True), attend_wgmma_bwd_name(True, False), attend_wgmma_bwd_name(True, True),
                attend_wgmma_bwd_name(False, writes="staged"), attend_wgmma_bwd_name(True, writes="staged"),
                attend_wgmma_bwd_name(False, writes="split"),
                *(attend_wgmma_bwd_dkv_name(a, h, u) for a in (False, True) for h in (64, 128) for u in (False, True)),
                "hytopk_attend_bwd_sp", "hytopk_attend_bwd_dqp",
                *(attend_wgmma_bwd_ring_name(a, u) for a in (False, True) for u in (True, False)))
    for kernel, over in KERNELS[file]:
        if over == "plain":
            out.append(name(kernel))
            continue
        if over in ("mma_sync", "wgmma", "wgmma_fp8"):
            rounded = fp8_shape if over == "wgmma_fp8" else tiled_shape
            tiled = dict.fromkeys(rounded(*s) for s in shapes)          # ordered, deduplicated
            out += [name(kernel, shape=s) for s in tiled]
            continue
        if over == "mma":
            out += [name(kernel, shape=s) for s in shapes if mma_ok(*s)]
            continue
        if over == "tables":
            out += [name(kernel, src) for src in TABLES]
            continue
        if over == "tables_cfg":                # the fused table kernel's swept (threads, blocks per SM)
            out += [f"{kernel}<{src}, {t}, {b}>" for src in TABLES for t, b in FUSED_CONFIGS]
            continue
        if over == "tables_cfg1":               # the one-read fused table kernel
            out += [f"{kernel}<{src}, {t}, {b}>" for src in TABLES for t, b in FUSED1_CONFIGS]
            continue
        if over == "tables_cluster":            # the cluster table kernel: (cluster size, threads)
            out += [f"{kernel}<{src}, {c}, {t}, {str(sh).lower()}>" for src in TABLES for c, t, sh in CLUSTER_CONFIGS]
            continue
        if over == "table+indexer":
            out += [name(kernel, src) for src in TABLES]
        out += [name(kernel, indexer_source(H, D, dt)) for H, D in shapes for dt in dtypes]
    return tuple(out)
