"""The wgmma3 attention kernel's launch resources on this GPU (registers, threads, shared memory)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workbench import instantiations as INST                 # noqa: E402
from workbench.families.cupy import attend_wgmma3 as AW3       # noqa: E402
for bf in (True, False):
    fn = AW3._fn(INST.attend_wgmma3_name(bf))
    print(INST.attend_wgmma3_name(bf), "regs", fn.num_regs, "max threads", fn.max_threads_per_block,
          "static smem", fn.shared_size_bytes, "local", fn.local_size_bytes, "launch threads", INST.ATTEND_WGMMA3_THREADS)
