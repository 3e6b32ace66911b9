"""One launch of each wgmma core's scan on a dsv32-like slice, for `ncu` (counters, stall reasons):
  ncu --clock-control none -k regex:"wgmma|_ws" --section SpeedOfLight --section WarpStateStats \\
      python scripts/profile_wgmma.py"""
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as R                                              # noqa: E402
from reference import generate as G                               # noqa: E402
from workbench.bf16 import float32_to_bf16_bits                    # noqa: E402
from workbench.families.cupy import wgmma as WG, wgmma_ws as WS     # noqa: E402

n, L, H, D = 512, 65536, 64, 128
rng = np.random.default_rng(0)
q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=False)
src = R.IndexerSource(*(cp.asarray(float32_to_bf16_bits(a)) for a in (q, w, keys)))
lo, hi = cp.zeros(n, cp.int32), cp.full(n, L, cp.int32)
T = cp.full(n, 1e30, cp.float32)                                   # nothing passes: the scan alone
WG.score_only_wgmma(src, lo, hi)
WG.filter_wgmma(src, lo, hi, T, 4096)
WS.score_only_ws(src, lo, hi)
WS.filter_ws(src, lo, hi, T, 4096)
cp.cuda.Device().synchronize()
print("profile_wgmma: done")
