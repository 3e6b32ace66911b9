"""Selection replay: rescore only the saved k positions per query (O(n k H D))."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import BLOCK, bind_indexer, chunks, i32, kernel, launch, launch_stream

REPLAY_CHUNK = BLOCK * 4


@register("replay", "cupy.replay.simt", gpu_only=True)
def replay(q, w, keys, idx):
    """Same scoring routine as the filter: replayed scores equal the selected ones bit for bit."""
    with launch_stream():
        src = bind_indexer(q, w, keys)
        idx = i32(idx, "idx")
        if idx.ndim != 2 or idx.shape[0] != src.n:
            raise ValueError(f"argument 'idx' must have shape ({src.n}, k), got {idx.shape}")
        k = idx.shape[1]
        out = cp.empty((src.n, k), cp.float32)
        fn = kernel("replay.cu", f"hytopk_replay<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(k, REPLAY_CHUNK)),
               (*src.args, np.int32(src.n), idx, np.int32(k), np.int32(REPLAY_CHUNK), out), 4 * src.smem_floats)
        return out
