"""Context-parallel HyTopK with torch.distributed (issue 8).

    python -m workbench.distributed selftest --backend gloo --world-size 2   # CPU, spawns the ranks
    python -m workbench.distributed selftest --backend nccl --world-size 2   # GPUs, family cupy
    python -m workbench.distributed bench --world-size 2 --json results/cp_bench.json
    torchrun --nproc-per-node 2 -m workbench.distributed worker --job selftest --backend nccl --out DIR

Library use (every rank, inside an initialised process group)::

    sh = make_sharding("zigzag", n, L, world_size)
    cp = ContextParallelHyTopK(lo, hi, k, sh, backend="cupy")      # plan once per layout
    res = cp(q_local, w_local, keys_shard)                        # CPResult of this rank's rows

Importing this package needs torch (CPU build is enough), not a GPU.
"""
from .sharding import KINDS, Sharding, make_sharding

__all__ = ["Sharding", "make_sharding", "KINDS", "ContextParallelHyTopK", "CPResult", "gather_result"]


def __getattr__(name):                  # torch is imported only when the CP code is used
    if name in ("ContextParallelHyTopK", "CPResult", "gather_result"):
        from . import cp
        return getattr(cp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
