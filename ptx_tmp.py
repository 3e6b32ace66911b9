import sys
import types as _t
import numba.cuda.dispatcher as _D
_D.get_current_device = lambda: _t.SimpleNamespace(compute_capability=(9, 0))
from numba import cuda, float32, int32, int64, uint8
from numba.core import types
from workbench.families.numba import rows, filter as F, threshold as TH, recover as RC
f32_2 = types.Array(types.float32, 2, "C"); i32_1 = types.Array(types.int32, 1, "C"); i32_2 = types.Array(types.int32, 2, "C"); f32_1=types.Array(types.float32,1,"C")
hg = int(sys.argv[1]) if len(sys.argv) > 1 else 8
k = rows.score_rows_kernel("dense", hg)
ptx, _ = cuda.compile_ptx(k.py_func, (f32_2, f32_2, f32_2, i32_1, i32_1, f32_2, types.int64), cc=(9, 0))
open("/tmp/dense.ptx", "w").write(ptx)
k = F.filter_tiled_kernel("warp", hg)
ptx, _ = cuda.compile_ptx(k.py_func, (f32_2, f32_2, f32_2, types.int64, i32_1, i32_1, f32_1, types.int64, i32_2, f32_2, i32_1), cc=(9, 0))
open("/tmp/filter.ptx", "w").write(ptx)
print("ok")
