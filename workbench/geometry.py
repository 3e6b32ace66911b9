"""Host mirrors of the tensor-core cores' compile-time geometry (no CuPy needed).

The CUDA headers are the source of truth; `static_asserts()` renders C++
assertions that the compile check (`hytopk compile-check`, nvcc leg) compiles
next to every instantiation, so a figure here that drifts from its header fails
CI instead of launching a kernel with the wrong shared memory or grid.
"""
from __future__ import annotations

SMEM_LIMIT = 227 * 1024      # a block's shared memory on sm_90


class WsGeometry:
    """hytopk::ws::Shape<H, D, In, C> (kernels_cuda/hytopk_wgmma_ws.cuh): the warp-specialised
    wgmma core, `elem_bytes` 2 (bf16) or 1 (fp8 e4m3), `consumers` warpgroups 4 or 2."""

    KT = 128                 # keys per stage
    TILES_PER_BLOCK = 64     # stages per block run: 8192 keys

    def __init__(self, H: int, D: int, elem_bytes: int, consumers: int = 4):
        self.H, self.D, self.elem_bytes, self.consumers = H, D, elem_bytes, consumers
        C = consumers
        row = D * elem_bytes
        self.threads = 128 * (C + 1)
        self.qpb = 256 // H
        nj = self.qpb * (512 // C) // 256
        self.stages = 4 if elem_bytes == 2 else 6
        base = 256 * row + self.stages * self.KT * row + 256 * 4 + 16 * self.qpb + 8 * (2 * self.stages + 1)
        base = (base + 15) // 16 * 16
        entry = 4 * C * nj * 8
        self.stage_entries = min(128, (SMEM_LIMIT - base) // entry // 16 * 16)
        self.smem = base + entry * self.stage_entries
        self.block_keys = self.KT * self.TILES_PER_BLOCK

    def groups(self, n: int) -> int:
        return -(-n // self.qpb)

    def cxx(self) -> str:
        kind = "hytopk::ws::Bf16" if self.elem_bytes == 2 else "hytopk::ws::E4m3"
        return f"hytopk::ws::Shape<{self.H}, {self.D}, {kind}, {self.consumers}>"


def _gather_smem(H: int, D: int, elem_bytes: int, stages: int) -> int:
    """GatherShape<In, H, D, STAGES>::SMEM_BYTES: q rows, key tiles, weights, per-slot scale + position."""
    row = D * elem_bytes
    return H * row + stages * 64 * row + 4 * H + stages * 64 * 8


class WsReplayGeometry:
    """ReplayShape<In, H, D> of kernels_cuda/wgmma_ws.cu: one warpgroup per block."""

    TILES = 8                # 64-key tiles per block

    def __init__(self, H: int, D: int, elem_bytes: int):
        self.H, self.D, self.elem_bytes = H, D, elem_bytes
        self.threads = 128
        self.smem = _gather_smem(H, D, elem_bytes, 2)
        self.block_slots = 64 * self.TILES

    def cxx(self) -> str:
        kind = "hytopk::ws::Bf16" if self.elem_bytes == 2 else "hytopk::ws::E4m3"
        return f"ReplayShape<{kind}, {self.H}, {self.D}>"


class WsThresholdGeometry:
    """ThresholdShape<In, H, D> of kernels_cuda/wgmma_ws.cu: one warpgroup per query, three
    gather stages, the samples' score bits and the radix select's scratch in shared memory."""

    MAX_SAMPLES = 8192
    STAGES = 3

    def __init__(self, H: int, D: int, elem_bytes: int):
        self.H, self.D, self.elem_bytes = H, D, elem_bytes
        self.threads = 128
        gather = _gather_smem(H, D, elem_bytes, self.STAGES)
        self.smem = (gather + 15) // 16 * 16 + 4 * self.MAX_SAMPLES + 4 * 256 + 16

    def cxx(self) -> str:
        kind = "hytopk::ws::Bf16" if self.elem_bytes == 2 else "hytopk::ws::E4m3"
        return f"ThresholdShape<{kind}, {self.H}, {self.D}>"


class WsGroupThresholdGeometry:
    """GroupThresholdShape<In, H, D, NROWS, STAGES> of kernels_cuda/wgmma_ws.cu: G adjacent queries
    per 128-thread block over the union of their sample positions (kernel name, NROWS, STAGES)."""

    KERNELS = {256: ("hytopk_threshold_group_ws", 6), 128: ("hytopk_threshold_group128_ws", 4)}
    MAX_SAMPLES = 8192

    def __init__(self, H: int, D: int, elem_bytes: int, nrows: int = 256, lines: bool = False):
        self.H, self.D, self.elem_bytes, self.nrows = H, D, elem_bytes, nrows
        self.name, self.stages = self.KERNELS[nrows]
        if lines:                                               # copies by whole 128-byte lines (N = 128 only)
            if nrows != 128:
                raise ValueError(f"argument 'nrows': the line-copy grouped threshold has nrows 128, got {nrows}")
            self.name = self.name.replace("_ws", "_lines_ws")
        self.threads = 128
        self.G = min(nrows // H, 8)
        self.JC = 128 if self.G <= 2 else 64                    # sample indices per merged chunk
        G, S, N, row, JC = self.G, self.stages, self.G * H, D * elem_bytes, self.JC
        ring = 1
        while ring < G * JC + 64:
            ring *= 2
        tile = 64 * row
        qi = N * row + S * tile + 4 * N + 8 * 64 * S + 4 * G * JC + 4 * G * (JC + 1) + 4 * G * (JC // 32) + 4 * ring
        qi = (qi + 7) // 8 * 8                                    # the contexts c are 64-bit
        end = qi + 8 * G + 16 * G + 4 * 256 + 16 + 2 * ring * G + 2 * 64 * G * S
        end = (end + 15) // 16 * 16
        self.smem = end if S * tile >= 4 * self.MAX_SAMPLES else end + 4 * self.MAX_SAMPLES

    def groups(self, n: int) -> int:
        return -(-n // self.G)

    def cxx(self) -> str:
        kind = "hytopk::ws::Bf16" if self.elem_bytes == 2 else "hytopk::ws::E4m3"
        return f"GroupThresholdShape<{kind}, {self.H}, {self.D}, {self.nrows}, {self.stages}>"


class WsThresholdV2Geometry:
    """ThresholdV2Shape<H, D, STAGES> of kernels_cuda/wgmma_ws_threshold.cu (bf16): one block of a
    consumer warpgroup and a producer warp per query, STAGES gathered 64-row key tiles, the sample
    bits ([mcap] u32) after the fixed part. STAGES 4 where two blocks fit an SM, else 3."""

    KERNELS = {4: "hytopk_threshold_v2{}_ws", 3: "hytopk_threshold_v2s3{}_ws"}     # {}: "" or "_ns" (no swizzle)
    MAX_SAMPLES = 8192
    THREADS = 160
    SM_SMEM = 228 * 1024     # an SM's shared memory; each block reserves 1 KiB more

    def __init__(self, H: int, D: int, mcap: int, swizzle: bool = True, stages: int | None = None):
        self.H, self.D, self.mcap = H, D, int(mcap)
        if stages is None:
            stages = 4 if 2 * (self.bytes_for(H, D, 4, mcap) + 1024) <= self.SM_SMEM else 3
        self.stages = stages
        self.name = self.KERNELS[stages].format("" if swizzle else "_ns")
        self.threads = self.THREADS
        self.fixed = self.fixed_bytes(H, D, stages)
        self.smem = self.bytes_for(H, D, stages, mcap)

    @staticmethod
    def fixed_bytes(H: int, D: int, stages: int) -> int:
        row = 2 * D
        return H * row + stages * 64 * row + 4 * H + 4 * 64 * stages + 16 * stages + 4 * 256 + 16

    ALIGN_PAD = 1024         # the kernel starts its layout at the first 1024-byte boundary (the swizzle)

    @classmethod
    def bytes_for(cls, H: int, D: int, stages: int, mcap: int) -> int:
        return cls.ALIGN_PAD + cls.fixed_bytes(H, D, stages) + 4 * int(mcap)

    @staticmethod
    def cxx(H: int, D: int, stages: int) -> str:
        return f"ThresholdV2Shape<{H}, {D}, {stages}>"


def ws_threshold_v2_static_asserts(shapes) -> list[str]:
    """C++ static_asserts tying WsThresholdV2Geometry to wgmma_ws_threshold.cu, per instantiated shape."""
    out = []
    for H, D in shapes:
        for st in WsThresholdV2Geometry.KERNELS:
            s = WsThresholdV2Geometry.cxx(H, D, st)
            fixed = WsThresholdV2Geometry.fixed_bytes(H, D, st)
            out.append(f'static_assert({s}::FIXED_BYTES == {fixed} && {s}::THREADS == {WsThresholdV2Geometry.THREADS} '
                       f'&& {s}::ALIGN_PAD == {WsThresholdV2Geometry.ALIGN_PAD}, '
                       f'"workbench/geometry.py WsThresholdV2Geometry({H}, {D}, stages={st}) != {s}");')
    return out


def ws_static_asserts(shapes_bf16, shapes_fp8) -> list[str]:
    """C++ static_asserts tying WsGeometry / WsReplayGeometry to the header, per instantiated shape."""
    out = []
    for shapes, eb, consumers in ((shapes_bf16, 2, (4, 2)), (shapes_fp8, 1, (4,))):
        for H, D in shapes:
            for C in consumers:
                g = WsGeometry(H, D, eb, C)
                s = g.cxx()
                for field, value in (("SMEM_BYTES", g.smem), ("THREADS", g.threads), ("QPB", g.qpb),
                                     ("KT", g.KT), ("TILES_PER_BLOCK", g.TILES_PER_BLOCK), ("E", g.stage_entries)):
                    out.append(f'static_assert({s}::{field} == {value}, "workbench/geometry.py WsGeometry'
                               f'({H}, {D}, {eb}, {C}).{field} != {s}::{field}");')
            r = WsReplayGeometry(H, D, eb)
            out.append(f'static_assert({r.cxx()}::SMEM_BYTES == {r.smem} && {r.cxx()}::RT == {r.TILES}, '
                       f'"workbench/geometry.py WsReplayGeometry({H}, {D}, {eb}) != {r.cxx()}");')
            if eb == 2:
                for nrows in WsGroupThresholdGeometry.KERNELS:
                    gt = WsGroupThresholdGeometry(H, D, eb, nrows)
                    out.append(f'static_assert({gt.cxx()}::SMEM_BYTES == {gt.smem} && {gt.cxx()}::G == {gt.G}, '
                               f'"workbench/geometry.py WsGroupThresholdGeometry({H}, {D}, {eb}, {nrows}) != {gt.cxx()}");')
            th = WsThresholdGeometry(H, D, eb)
            out.append(f'static_assert({th.cxx()}::SMEM_BYTES_ALL == {th.smem}, '
                       f'"workbench/geometry.py WsThresholdGeometry({H}, {D}, {eb}) != {th.cxx()}");')
    return out
