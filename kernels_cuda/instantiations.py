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

# file -> (kernel, what it is instantiated over)
#   "table+indexer": every source; "indexer": indexer sources only;
#   "mma": (H, D) only (bf16 tensor-core path); "tiled" and "wgmma": (H, D) rounded up by
#   tiled_shape (the tiled and wgmma bf16 cores); "wgmma_fp8": by fp8_shape; "plain": not a template
KERNELS = {
    "threshold.cu": (("hytopk_threshold", "table+indexer"), ("hytopk_sample_positions", "plain")),
    "filter.cu": (("hytopk_filter", "table+indexer"),),
    "check.cu": (("hytopk_check", "plain"),),
    "device_recovery.cu": (("hytopk_recovery_slots", "plain"), ("hytopk_scatter_slots", "plain")),
    "select.cu": (("hytopk_select", "plain"), ("hytopk_select_bitonic", "plain")),
    "recover.cu": (("hytopk_score_rows", "indexer"), ("hytopk_select_rows", "plain")),
    "dense.cu": (("hytopk_dense", "indexer"),),
    "replay.cu": (("hytopk_replay", "indexer"),),
    "score_only.cu": (("hytopk_score_only", "indexer"),),
    "tiled.cu": (("hytopk_filter_tiled", "tiled"), ("hytopk_dense_tiled", "tiled"),
                 ("hytopk_score_rows_tiled", "tiled"), ("hytopk_score_only_tiled", "tiled"),
                 ("hytopk_replay_tiled", "tiled")),
    "wgmma.cu": tuple((f"hytopk_{k}_{kind}", kind) for kind in ("wgmma", "wgmma_fp8")
                      for k in ("filter", "dense", "score_rows", "score_only")),
    "wgmma_ws.cu": tuple((f"hytopk_{k}_{kind}", over) for kind, over in (("ws", "wgmma"), ("ws_fp8", "wgmma_fp8"))
                         for k in ("filter", "dense", "score_rows", "score_only", "replay", "threshold"))
                   + (("hytopk_filter_ws2", "wgmma"), ("hytopk_score_only_ws2", "wgmma"), ("hytopk_ws_pretile", "plain")),
}
# files that need an arch-specific target (wgmma exists on sm_90a only): NVRTC options, nvcc -gencode
FILE_OPTIONS = {"wgmma.cu": ("-arch=sm_90a",), "wgmma_ws.cu": ("-arch=sm_90a",)}


def nvcc_target(file: str, arch: str) -> str:
    """nvcc's target for `file`: its FILE_OPTIONS arch as -gencode (nvcc's -arch=sm_90a shorthand
    also runs a plain sm_90 pass that rejects wgmma), else -arch=sm_<arch>."""
    for opt in FILE_OPTIONS.get(file, ()):
        if opt.startswith("-arch=sm_"):
            sm = opt.split("sm_", 1)[1]
            return f"-gencode=arch=compute_{sm},code=sm_{sm}"
    return f"-arch=sm_{arch}"
TILED_HEADS = (16, 32, 64)                   # the tiled core's H (hytopk_mma_tile.cuh); fewer heads are zero-padded


def indexer_source(H: int, D: int, dtype: str) -> str:
    """C++ type of the indexer source for one shape and input dtype."""
    if dtype not in C_TYPES:
        raise ValueError(f"argument 'dtype': expected one of {sorted(C_TYPES)}, got {dtype!r}")
    return f"hytopk::IndexerSource<{int(H)}, {int(D)}, {C_TYPES[dtype]}>"


def mma_ok(H: int, D: int) -> bool:
    return H % 8 == 0 and D % 16 == 0


def tiled_shape(H: int, D: int) -> tuple[int, int]:
    """The tiled core's (H, D) for inputs of H heads and D dims: H up to the next of
    TILED_HEADS, D up to a multiple of 16 (zero heads and dims add exactly +0)."""
    H, D = int(H), int(D)
    if H < 1 or H > TILED_HEADS[-1]:
        raise ValueError(f"argument 'q': the tiled core takes 1 to {TILED_HEADS[-1]} heads, got {H}")
    if D < 1 or D > 256:
        raise ValueError(f"argument 'q': the tiled core takes head dims 1 to 256, got {D}")
    return next(h for h in TILED_HEADS if h >= H), -(-D // 16) * 16


def fp8_shape(H: int, D: int) -> tuple[int, int]:
    """The wgmma fp8 core's (H, D): H as tiled_shape, D up to a multiple of 32 (one k32 MMA step)."""
    H, D = tiled_shape(H, D)
    return H, -(-D // 32) * 32


def geometry_asserts(file: str, shapes=SHAPES) -> list[str]:
    """C++ static_asserts that check the Python geometry mirrors against `file`'s headers
    (compiled by the compile check next to the instantiations)."""
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
    for kernel, over in KERNELS[file]:
        if over == "plain":
            out.append(name(kernel))
            continue
        if over in ("tiled", "wgmma", "wgmma_fp8"):
            rounded = fp8_shape if over == "wgmma_fp8" else tiled_shape
            tiled = dict.fromkeys(rounded(*s) for s in shapes)          # ordered, deduplicated
            out += [name(kernel, shape=s) for s in tiled]
            continue
        if over == "mma":
            out += [name(kernel, shape=s) for s in shapes if mma_ok(*s)]
            continue
        if over == "table+indexer":
            out.append(name(kernel, TABLE))
        out += [name(kernel, indexer_source(H, D, dt)) for H, D in shapes for dt in dtypes]
    return tuple(out)
