"""THE Numba indexer scorer: a block scores a tile of TK keys of one query at a time.

Every Numba stage that scores indexer keys (threshold samples, filter, dense, recovery,
replay) writes the tile's key positions into shared memory (``pos_s``, -1 = no key) and calls
``score_tile(hg)``; the scores come back in ``acc_s``. Layout of the work:

* keys are staged DT dims at a time into shared memory, transposed ([DT, TK + 1]: the lanes of
  a warp read consecutive keys, the +1 keeps the transposing store conflict-free), and the
  query's q rows for the heads in flight beside them ([heads, DT]);
* warp w owns HG heads, lane l owns KPT keys (l, l + 32, ...): each thread keeps HG x KPT dot
  products in registers, so one shared-memory load of q feeds KPT multiply-adds and one load of
  a key feeds HG;
* the head sum then runs warp after warp, in head order, through ``acc_s``.

The arithmetic is ``common.indexer_score``'s, in its order: each dot over d ascending
(``dot + q * k``), ``relu`` keeping NaN, ``acc + w[h] * relu`` over h ascending from +0.0, the
fp8 key scale applied after the head sum, so the tile's scores equal the one-position routine's
bit for bit (tests/test_numba_tile.py). The kernel text is generated per HG because Numba keeps
only scalars in registers (a local array indexed in a loop would live in local memory).
"""
from __future__ import annotations

import os
from functools import lru_cache

from numba import cuda, float32

from .common import BLOCK, SIM

WARPS = BLOCK // 32
# keys per thread (a lane's register tile across keys); HYTOPK_NUMBA_KPT=4 trades reuse for occupancy
KPT = 2 if SIM else int(os.environ.get("HYTOPK_NUMBA_KPT", "8"))
if KPT not in (2, 4, 8):               # 16 would need more than 48 KiB of static shared memory
    raise ValueError(f"HYTOPK_NUMBA_KPT must be 2, 4 or 8, got {KPT}")
TK = 32 * KPT                      # keys per tile
DT = 8 if SIM else 32              # key dims staged per step
HG_MAX = 2 if SIM else 8           # heads per warp and round (registers: HG_MAX * KPT dots)
KEY_STRIDE = TK + 1                # staged keys [DT, TK + 1]
KEY_SMEM = DT * KEY_STRIDE
Q_SMEM = WARPS * HG_MAX * DT
ITEMS = max(1, TK // BLOCK)        # tile entries per thread in an epilogue
STEP = BLOCK // DT                 # staging: key rows a block moves per load
KEY_LOADS = TK * DT // BLOCK       # staged key values per thread and step
assert BLOCK % DT == 0 and (TK * DT) % BLOCK == 0


def heads_per_warp(H: int) -> int:
    """HG for H heads: the heads spread over the block's warps, at most HG_MAX per round."""
    return max(1, min(HG_MAX, -(-int(H) // WARPS)))


def q_loads(hg: int) -> int:
    """Staged q values per thread and step: [WARPS * hg heads, DT dims] over the block."""
    return -(-WARPS * hg // STEP)


def _source(hg: int) -> str:
    """Python text of the device function for HG = hg (scalars d_<head>_<key>)."""
    dots = [[f"d_{i}_{m}" for m in range(KPT)] for i in range(hg)]
    ind = " " * 4
    lines = [
        "def score_tile(q2, w, keys, scaled, t, pos_s, key_s, q_s, acc_s):",
        f"{ind}tid = cuda.threadIdx.x",
        f"{ind}lane = tid % 32",
        f"{ind}warp = tid // 32",
        f"{ind}H = w.shape[1]",
        f"{ind}D = keys.shape[1] - scaled",
        f"{ind}L = keys.shape[0]",
        f"{ind}sj = tid // DT                            # staging: this thread's first key row and its dim",
        f"{ind}sd = tid % DT",
        f"{ind}cuda.syncthreads()                       # the previous tile's readers are done",
        f"{ind}for j in range(tid, TK, BLOCK):",
        f"{ind}    acc_s[j] = float32(0.0)",
        f"{ind}for h0 in range(0, H, WARPS * HG):",
        f"{ind}    hw = h0 + warp * HG                   # this warp's first head",
    ]
    lines += [f"{ind}    {d} = float32(0.0)" for row in dots for d in row]
    lines += [
        f"{ind}    for d0 in range(0, D, DT):",
        f"{ind}        nd = min(DT, D - d0)",
        f"{ind}        live = sd < nd",
        f"{ind}        cuda.syncthreads()",
    ]
    # staging, straight-line: a thread's loads are all issued before its first store (a loop would
    # wait for each load in turn); thread (sj, sd) moves dim d0 + sd of keys sj, sj + STEP, ...
    body = " " * 8
    for r in range(KEY_LOADS):
        lines += [f"{ind}{body}s_{r} = pos_s[sj + {r * STEP}]",
                  f"{ind}{body}v_{r} = float32(0.0)",
                  f"{ind}{body}if live and s_{r} >= 0 and s_{r} < L:",
                  f"{ind}{body}    v_{r} = keys[s_{r}, d0 + sd]"]
    for r in range(q_loads(hg)):          # the q rows of the heads in flight: [WARPS * HG, DT]
        guard = f"sj + {r * STEP} < {WARPS * hg} and " if (r + 1) * STEP > WARPS * hg else ""
        lines += [f"{ind}{body}u_{r} = float32(0.0)",
                  f"{ind}{body}if {guard}live and h0 + sj + {r * STEP} < H:",
                  f"{ind}{body}    u_{r} = q2[t, (h0 + sj + {r * STEP}) * D + d0 + sd]"]
    lines += [f"{ind}{body}key_s[sd * KEY_STRIDE + sj + {r * STEP}] = v_{r}" for r in range(KEY_LOADS)]
    for r in range(q_loads(hg)):
        guard = f"if sj + {r * STEP} < {WARPS * hg}: " if (r + 1) * STEP > WARPS * hg else ""
        lines += [f"{ind}{body}{guard}q_s[(sj + {r * STEP}) * DT + sd] = u_{r}"]
    lines += [
        f"{ind}        cuda.syncthreads()",
        f"{ind}        if hw < H:",
        f"{ind}            qb = warp * (HG * DT)",
        f"{ind}            for dd in range(nd):",
    ]
    body = " " * 20
    lines += [f"{body}q_{i} = q_s[qb + {i * DT} + dd]" for i in range(hg)]
    lines += [f"{body}kb = dd * KEY_STRIDE + lane"]
    lines += [f"{body}k_{m} = key_s[kb + {32 * m}]" for m in range(KPT)]
    lines += [f"{body}{dots[i][m]} = {dots[i][m]} + q_{i} * k_{m}" for i in range(hg) for m in range(KPT)]
    lines += [
        f"{ind}    for ww in range(WARPS):                 # head sum: warp after warp, in head order",
        f"{ind}        cuda.syncthreads()",
        f"{ind}        if warp == ww and hw < H:",
    ]
    for m in range(KPT):
        lines.append(f"{ind}            a = acc_s[lane + {32 * m}]")
        for i in range(hg):
            r = dots[i][m]
            lines += [
                f"{ind}            if hw + {i} < H:",
                f"{ind}                r = {r}",
                f"{ind}                if not (r > float32(0.0)) and r == r:",
                f"{ind}                    r = float32(0.0)",
                f"{ind}                a = a + w[t, hw + {i}] * r",
            ]
        lines.append(f"{ind}            acc_s[lane + {32 * m}] = a")
    lines += [
        f"{ind}cuda.syncthreads()",
        f"{ind}if scaled:                                  # fp8: the key's scale after the head sum",
        f"{ind}    for j in range(tid, TK, BLOCK):",
        f"{ind}        s = pos_s[j]",
        f"{ind}        if s >= 0 and s < L:",
        f"{ind}            acc_s[j] = acc_s[j] * keys[s, D]",
        f"{ind}    cuda.syncthreads()",
    ]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def score_tile(hg: int):
    """The tile scorer for HG = hg, as a device function. Every thread of the block calls it
    (it has barriers) with the block's shared arrays from ``shared_arrays``; on return acc_s[j]
    is the score of key pos_s[j] (meaningless where pos_s[j] is not a key)."""
    env = dict(cuda=cuda, float32=float32, BLOCK=BLOCK, WARPS=WARPS, TK=TK, DT=DT, HG=int(hg),
               KEY_STRIDE=KEY_STRIDE)
    exec(compile(_source(int(hg)), f"<numba tile scorer HG={hg}>", "exec"), env)
    return cuda.jit(device=True)(env["score_tile"])


@cuda.jit(device=True)
def tile_has_key(pos_s, flag):
    """Is any pos_s[j] >= 0? Block-wide (every thread calls it; ``flag``: 1 shared int32)."""
    if cuda.threadIdx.x == 0:
        flag[0] = 0
    cuda.syncthreads()
    for j in range(cuda.threadIdx.x, TK, BLOCK):
        if pos_s[j] >= 0:
            flag[0] = 1
    cuda.syncthreads()
    any_key = flag[0] != 0
    cuda.syncthreads()
    return any_key


def smem_bytes() -> int:
    """Static shared memory of one tile (keys, q rows, scores, positions)."""
    return 4 * (KEY_SMEM + Q_SMEM + TK) + 8 * TK

