"""THE Numba indexer scorer: a block scores a tile of TK keys of one query at a time.

Every Numba stage that scores indexer keys (threshold samples, filter, dense, recovery,
replay) writes the tile's key positions into shared memory (``pos_s``, -1 = no key) and calls
``score_tile(hg, cfg)``; the scores come back in ``acc_s``. Layout of the work:

* keys are staged DT dims at a time into shared memory, transposed ([DT, TK + 1]: the lanes of
  a warp read consecutive keys, the +1 keeps the transposing store conflict-free), and the
  query's q rows for the heads in flight beside them ([heads, DT]);
* warp w owns HG heads, lane l owns KPT keys (l, l + 32, ...): each thread keeps HG x KPT dot
  products in registers (the register block), so one shared-memory load of q feeds KPT
  multiply-adds and one load of a key feeds HG;
* the head sum, in head order, through ``acc_s``: ``hsum="warps"`` runs it warp after warp
  (each warp adds its HG heads while the others wait at a barrier); ``hsum="smem"`` stages the
  relu'd dots in the key buffer and one thread per key adds every head of the round (the
  block's threads all work; MC key slots per lane at a time, as the buffer holds them).

The shape is a ``Tile`` (keys per lane, staged dims, heads per warp, head sum, threads per
block): the default is ``DEFAULT`` (``HYTOPK_NUMBA_TILE="kpt=8,dt=32,hg=8,hsum=warps,block=256"``
overrides it, ``HYTOPK_NUMBA_KPT`` only the keys per lane); ``use(tile)`` switches it for a
block of code (scripts/bench_numba_scorer.py --sweep times every shape of ``SWEEP``).

The arithmetic is ``common.indexer_score``'s, in its order, in every shape: each dot over d
ascending (``dot + q * k``), ``relu`` keeping NaN, ``acc + w[h] * relu`` over h ascending from
+0.0, the fp8 key scale applied after the head sum, so the tile's scores equal the one-position
routine's (and the CuPy SIMT scorer's) bit for bit (tests/test_numba_tile.py). The kernel text is
generated per (HG, shape) because Numba keeps only scalars in registers (a local array indexed
in a loop would live in local memory). Indices are non-negative and cast to unsigned (``U``):
Numba then drops the negative-index wraparound it adds to every signed index (a compare and a
select per load, which in the inner loop cost more issue slots than the multiply-adds).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import lru_cache

from numba import cuda, float32, int64, uint64

from .common import BLOCK, SIM

STATIC_SMEM = 48 * 1024            # a kernel's static shared memory


@dataclass(frozen=True)
class Tile:
    """One shape of the tiled scorer. Every shape computes the same bits."""
    kpt: int = 8                   # keys per lane: TK = 32 * kpt keys per tile
    dt: int = 32                   # key dims staged per step
    hg: int = 8                    # heads per warp and round at most (HG x KPT dots per thread)
    hsum: str = "warps"            # head sum: "warps" (warp after warp) or "smem" (a thread per key);
    #                                "warps" at occupancy 2 was the sweep's fastest (H200, 2026-11-30 run 3)
    block: int = BLOCK             # threads per block
    batch: int = 8                 # staged key values a thread loads before it stores them (registers)
    occupancy: int = 2             # blocks per SM the kernels are compiled for (launch bounds: registers
    #                                per thread <= 64K / (block * occupancy)); 0: ptxas's choice (up to 255)

    def __post_init__(self):
        bad = []
        if self.kpt not in (1, 2, 4, 8):
            bad.append(f"kpt={self.kpt} (1, 2, 4 or 8)")
        if self.block % 32 or not 32 <= self.block <= 1024:
            bad.append(f"block={self.block} (a multiple of 32 up to 1024)")
        elif self.dt < 1 or self.block % self.dt or (self.tk * self.dt) % self.block:
            bad.append(f"dt={self.dt} (must divide block={self.block}, and block must divide TK * dt)")
        if not 0 <= self.occupancy <= 32:
            bad.append(f"occupancy={self.occupancy} (0 to 32)")
        if self.batch < 1:
            bad.append(f"batch={self.batch} (>= 1)")
        if not 1 <= self.hg <= 16:
            bad.append(f"hg={self.hg} (1 to 16)")
        if self.hsum not in ("warps", "smem"):
            bad.append(f"hsum={self.hsum!r} ('warps' or 'smem')")
        if not bad and self.smem_bytes() > STATIC_SMEM:
            bad.append(f"shared memory {self.smem_bytes()} B > {STATIC_SMEM} B")
        if bad:
            raise ValueError(f"Numba tile shape {self.label}: bad " + "; ".join(bad))

    # derived sizes (compile-time constants of the kernels)
    @property
    def warps(self) -> int:
        return self.block // 32

    @property
    def tk(self) -> int:
        return 32 * self.kpt

    @property
    def key_stride(self) -> int:
        return self.tk + 1

    @property
    def mc(self) -> int:
        """hsum="smem": key slots per lane whose relu'd dots the key buffer holds at once."""
        mc = self.kpt
        while mc > 1 and self.warps * self.hg * 32 * mc > self.dt * self.key_stride:
            mc //= 2
        return mc

    @property
    def key_smem(self) -> int:
        """Floats of the key buffer (also the relu'd dots' buffer of hsum="smem")."""
        r = self.warps * self.hg * 32 * self.mc if self.hsum == "smem" else 0
        return max(self.dt * self.key_stride, r)

    @property
    def q_smem(self) -> int:
        return self.warps * self.hg * self.dt

    @property
    def items(self) -> int:
        """Tile entries per thread in an epilogue."""
        return max(1, -(-self.tk // self.block))

    @property
    def step(self) -> int:
        """Staging: key rows a block moves per load."""
        return self.block // self.dt

    @property
    def key_loads(self) -> int:
        """Staged key values per thread and step."""
        return self.tk * self.dt // self.block

    @property
    def label(self) -> str:
        return (f"kpt={self.kpt},dt={self.dt},hg={self.hg},hsum={self.hsum},block={self.block},batch={self.batch},"
                f"occupancy={self.occupancy}")

    @property
    def jit(self) -> dict:
        """cuda.jit options of the kernels of this shape: launch bounds (none in the simulator)."""
        return dict(launch_bounds=(self.block, self.occupancy)) if self.occupancy and not SIM else {}

    def smem_bytes(self) -> int:
        """Static shared memory of one tile (keys, q rows, scores, positions)."""
        return 4 * (self.key_smem + self.q_smem + self.tk) + 8 * self.tk

    def heads_per_warp(self, H: int) -> int:
        """HG for H heads: the heads spread over the block's warps, at most ``hg`` per round."""
        return max(1, min(self.hg, -(-int(H) // self.warps)))

    def q_loads(self, hg: int) -> int:
        """Staged q values per thread and step: [warps * hg heads, dt dims] over the block."""
        return -(-self.warps * hg // self.step)


def parse(text: str, base: Tile | None = None) -> Tile:
    """"kpt=8,dt=32,hg=8,hsum=smem,block=256" (any subset; the rest from ``base``) -> Tile."""
    fields = dict((base or Tile()).__dict__)
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in fields:
            raise ValueError(f"Numba tile shape {text!r}: cannot read {part!r}; write e.g. "
                             f"'kpt=8,dt=32,hg=8,hsum=smem,block=256' (keys: {', '.join(fields)})")
        fields[k] = v.strip() if k == "hsum" else int(v)
    return Tile(**fields)


def _default() -> Tile:
    # the simulator runs one Python thread per CUDA thread: small tiles keep its tests quick
    base = Tile(kpt=2, dt=8, hg=2, hsum="smem", block=BLOCK) if SIM else Tile()
    kpt = os.environ.get("HYTOPK_NUMBA_KPT")
    if kpt and not SIM:
        base = parse(f"kpt={kpt}", base)
    return parse(os.environ.get("HYTOPK_NUMBA_TILE", ""), base) if not SIM else base


DEFAULT = _default()
_ACTIVE = [DEFAULT]

# the shapes scripts/bench_numba_scorer.py --sweep times (the GPU's; every one compiles for sm_90
# without spills in 48 KiB of static shared memory: tests/test_numba_ptx.py; registers noted at H = 64)
SWEEP = tuple(Tile(kpt=k, dt=d, hg=h, hsum=s, block=b, batch=n, occupancy=o) for k, d, h, s, b, n, o in (
    (8, 32, 8, "warps", 256, 8, 0),    # run 4's shape (0.75x CuPy SIMT then), unsigned indices: 125 regs
    (8, 32, 8, "smem", 256, 8, 2),     # 128 regs, 2 blocks (16 warps) per SM
    (8, 32, 8, "warps", 256, 8, 2),    # the default: run 3's fastest, 26.2 TFLOP/s at dsv32-32k
    (8, 32, 8, "smem", 256, 8, 0),     # ptxas's choice: 118 regs
    (8, 32, 8, "smem", 256, 32, 2),    # every staged load in flight
    (8, 16, 8, "smem", 256, 8, 2),
    (4, 32, 16, "smem", 256, 8, 2),    # 16 heads x 4 keys per thread
    (4, 32, 8, "smem", 256, 8, 3),     # 32 dots: 80 regs, 3 blocks per SM
    (8, 32, 4, "smem", 256, 8, 3),
    (2, 32, 16, "smem", 256, 8, 3),
    (4, 64, 4, "smem", 256, 8, 3),
    (8, 32, 8, "smem", 128, 8, 4),     # 4 blocks of 4 warps per SM
))
# the simulator's shapes (tests/test_numba_tile.py runs each): both head sums, one and two warps,
# staging in one batch and in several
SIM_SWEEP = tuple(Tile(kpt=k, dt=d, hg=h, hsum=s, block=b, batch=n) for k, d, h, s, b, n in (
    (2, 8, 2, "smem", 32, 8), (2, 8, 2, "warps", 32, 8), (1, 16, 3, "smem", 64, 2), (2, 8, 2, "warps", 64, 1),
    (4, 4, 1, "smem", 64, 8), (2, 32, 4, "smem", 32, 3),
))


def current() -> Tile:
    """The shape the Numba stages launch with now."""
    return _ACTIVE[-1]


@contextlib.contextmanager
def use(tile: Tile):
    """Launch the Numba stages with ``tile`` inside the block (kernels are built per shape)."""
    _ACTIVE.append(tile)
    try:
        yield tile
    finally:
        _ACTIVE.pop()


def _dots(hg: int, cfg: Tile):
    return [[f"d_{i}_{m}" for m in range(cfg.kpt)] for i in range(hg)]


def _relu(ind: str, name: str) -> list:
    return [f"{ind}r = {name}",
            f"{ind}if not (r > float32(0.0)) and r == r:",
            f"{ind}    r = float32(0.0)"]


def _head_sum_warps(hg: int, cfg: Tile, ind: str) -> list:
    """Warp after warp: warp ww adds its heads hw..hw+HG-1 to acc_s of its keys."""
    dots = _dots(hg, cfg)
    lines = [f"{ind}    for ww in range(WARPS):                 # head sum: warp after warp, in head order",
             f"{ind}        cuda.syncthreads()",
             f"{ind}        if warp == ww and hw < H:"]
    for m in range(cfg.kpt):
        lines.append(f"{ind}            a = acc_s[U(lane + {32 * m})]")
        for i in range(hg):
            lines += [f"{ind}            if hw + {i} < H:"]
            lines += _relu(f"{ind}                ", dots[i][m])
            lines += [f"{ind}                a = a + w[U(t), U(hw + {i})] * r"]
        lines.append(f"{ind}            acc_s[U(lane + {32 * m})] = a")
    return lines


def _head_sum_smem(hg: int, cfg: Tile, ind: str) -> list:
    """The relu'd dots of MC key slots per lane go to the key buffer ([warps * HG heads, 32 * MC
    keys]); then a thread per key adds the round's heads, in order, to acc_s of key mc * 32 + j."""
    dots, rw = _dots(hg, cfg), 32 * cfg.mc
    lines = []
    for mc in range(0, cfg.kpt, cfg.mc):
        lines.append(f"{ind}    cuda.syncthreads()                      # the key buffer's readers are done")
        for i in range(hg):
            for m in range(mc, mc + cfg.mc):
                lines += _relu(f"{ind}    ", dots[i][m])
                lines.append(f"{ind}    key_s[U((warp * HG + {i}) * {rw} + {(m - mc) * 32} + lane)] = r")
        lines += [f"{ind}    cuda.syncthreads()",
                  f"{ind}    for j in range(tid, {rw}, BLOCK):       # one thread per key, heads in order",
                  f"{ind}        a = acc_s[U({mc * 32} + j)]",
                  f"{ind}        for hh in range(WARPS * HG):",
                  f"{ind}            if h0 + hh < H:",
                  f"{ind}                a = a + w[U(t), U(h0 + hh)] * key_s[U(hh * {rw} + j)]",
                  f"{ind}        acc_s[U({mc * 32} + j)] = a"]
    return lines


def _source(hg: int, cfg: Tile | None = None) -> str:
    """Python text of the device function for HG = hg (scalars d_<head>_<key>)."""
    cfg = cfg or current()
    dots = _dots(hg, cfg)
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
    # staging, straight-line: a thread issues ``batch`` loads before it stores them (a loop would
    # wait for each load in turn; all at once holds them all in registers); thread (sj, sd) moves
    # dim d0 + sd of keys sj, sj + STEP, ... and of the q rows of the heads in flight
    body = " " * 8
    step, nq = cfg.step, cfg.warps * hg
    for r0 in range(0, cfg.key_loads, cfg.batch):
        batch = range(r0, min(cfg.key_loads, r0 + cfg.batch))
        for r in batch:
            lines += [f"{ind}{body}s_{r} = pos_s[U(sj + {r * step})]",
                      f"{ind}{body}v_{r} = float32(0.0)",
                      f"{ind}{body}if live and s_{r} >= 0 and s_{r} < L:",
                      f"{ind}{body}    v_{r} = keys[U(s_{r}), U(d0 + sd)]"]
        lines += [f"{ind}{body}key_s[U(sd * KEY_STRIDE + sj + {r * step})] = v_{r}" for r in batch]
    for r in range(cfg.q_loads(hg)):          # the q rows of the heads in flight: [WARPS * HG, DT]
        guard = f"sj + {r * step} < {nq} and " if (r + 1) * step > nq else ""
        lines += [f"{ind}{body}u_{r} = float32(0.0)",
                  f"{ind}{body}if {guard}live and h0 + sj + {r * step} < H:",
                  f"{ind}{body}    u_{r} = q2[U(t), U((h0 + sj + {r * step}) * D + d0 + sd)]"]
    for r in range(cfg.q_loads(hg)):
        guard = f"if sj + {r * step} < {nq}: " if (r + 1) * step > nq else ""
        lines += [f"{ind}{body}{guard}q_s[U((sj + {r * step}) * DT + sd)] = u_{r}"]
    lines += [
        f"{ind}        cuda.syncthreads()",
        f"{ind}        if hw < H:",
        f"{ind}            qb = warp * (HG * DT)",
        f"{ind}            for dd in range(nd):",
    ]
    body = " " * 20
    lines += [f"{body}q_{i} = q_s[U(qb + {i * cfg.dt} + dd)]" for i in range(hg)]
    lines += [f"{body}kb = dd * KEY_STRIDE + lane"]
    lines += [f"{body}k_{m} = key_s[U(kb + {32 * m})]" for m in range(cfg.kpt)]
    lines += [f"{body}{dots[i][m]} = {dots[i][m]} + q_{i} * k_{m}" for i in range(hg) for m in range(cfg.kpt)]
    lines += (_head_sum_smem if cfg.hsum == "smem" else _head_sum_warps)(hg, cfg, ind)
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
def score_tile(hg: int, cfg: Tile | None = None):
    """The tile scorer for HG = hg and shape ``cfg`` (default: the current one), as a device
    function. Every thread of the block calls it (it has barriers) with the block's shared
    arrays (``Scratch``); on return acc_s[j] is the score of key pos_s[j] (meaningless where
    pos_s[j] is not a key)."""
    cfg = cfg or current()
    env = dict(cuda=cuda, float32=float32, U=uint64, BLOCK=cfg.block, WARPS=cfg.warps, TK=cfg.tk, DT=cfg.dt, HG=int(hg),
               KEY_STRIDE=cfg.key_stride)
    exec(compile(_source(int(hg), cfg), f"<numba tile scorer HG={hg} {cfg.label}>", "exec"), env)
    return cuda.jit(device=True)(env["score_tile"])


@lru_cache(maxsize=None)
def scratch(cfg: Tile):
    """The shared arrays of a tiled kernel of shape ``cfg``, as a device function every such
    kernel calls once: (key_s, q_s, acc_s, pos_s) for score_tile (one statement per array: the
    simulator tells its shared arrays apart by the line that allocates them)."""
    KS, QS, TK = cfg.key_smem, cfg.q_smem, cfg.tk

    @cuda.jit(device=True)
    def tile_scratch():
        key_s = cuda.shared.array(KS, float32)
        q_s = cuda.shared.array(QS, float32)
        acc_s = cuda.shared.array(TK, float32)
        pos_s = cuda.shared.array(TK, int64)
        return key_s, q_s, acc_s, pos_s
    return tile_scratch


@lru_cache(maxsize=None)
def has_key(cfg: Tile):
    """tile_has_key for shape ``cfg``: is any pos_s[j] >= 0? Block-wide (every thread calls it;
    ``flag``: 1 shared int32)."""
    TK, NT = cfg.tk, cfg.block

    @cuda.jit(device=True)
    def tile_has_key(pos_s, flag):
        if cuda.threadIdx.x == 0:
            flag[0] = 0
        cuda.syncthreads()
        for j in range(cuda.threadIdx.x, TK, NT):
            if pos_s[j] >= 0:
                flag[0] = 1
        cuda.syncthreads()
        any_key = flag[0] != 0
        cuda.syncthreads()
        return any_key
    return tile_has_key
