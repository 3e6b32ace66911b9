"""Which shared-memory descriptor offsets does the wgmma core need? Scores a small
exact-arithmetic case with the header's layout and with the two descriptor offsets
swapped (HYTOPK_WG_SWAP_OFFSETS) and compares each with the reference, bit for bit.
Run on a Hopper GPU: python scripts/wgmma_probe.py"""
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as R                                              # noqa: E402
from reference import generate as G                               # noqa: E402
from workbench import instantiations as INST                    # noqa: E402
from workbench import loader                                       # noqa: E402
from workbench.bf16 import float32_to_bf16_bits                    # noqa: E402
from workbench.families.cupy.wgmma import WgInputs                 # noqa: E402

n, L, H, D = 8, 700, 64, 128
rng = np.random.default_rng(1)
q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
want = np.stack([R.indexer_score_block(q[t], w[t], keys) for t in range(n)])
x = WgInputs(R.IndexerSource(*(cp.asarray(float32_to_bf16_bits(a)) for a in (q, w, keys))))
names = INST.name_expressions("wgmma.cu")
lo, hi = cp.zeros(n, cp.int32), cp.full(n, L, cp.int32)
for swap in (False, True):
    mod = loader.module("wgmma.cu", names, options=INST.FILE_OPTIONS["wgmma.cu"],
                        defines={"HYTOPK_WG_SWAP_OFFSETS": 1} if swap else None)
    fn = mod.function(f"hytopk_dense_wgmma<{H}, {D}>")
    out = cp.full((n, L), cp.nan, cp.float32)
    fn.max_dynamic_shared_size_bytes = x.geo.smem
    fn((x.geo.groups(n), 1), (256,), (*x.head_args(), np.int32(n), lo, hi, out), shared_mem=x.geo.smem)
    got = out.get()
    same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
    print(f"wgmma probe, offsets {'swapped' if swap else 'as in the header'}: "
          f"{'BIT-EXACT' if same else 'WRONG'} (max |diff| {np.nanmax(np.abs(got - want)):.4g})")
