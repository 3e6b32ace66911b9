"""workbench.cubin_info without a GPU: the launch check's messages, and the launch attributes the
NVRTC cubin gives the wgmma MLA forwards (registers at launch x threads within the SM's 65536; the
first version 3, 320 threads at __maxnreg__(200), never launched on the H200)."""
from __future__ import annotations

import pytest

from workbench import compile_check as CC
from workbench import cubin_info as CI
from workbench import instantiations as INST
from workbench import loader

needs_nvrtc = pytest.mark.skipif(not CC.nvrtc_available(), reason="cuda.bindings.nvrtc not importable")


def test_check_launch_passes_a_fitting_block():
    CI.check_launch(168, 384, 384, "k")
    CI.check_launch(64, 1024, 1024, "k")


def test_check_launch_names_registers_times_threads():
    with pytest.raises(RuntimeError, match=r"k: 200 registers per thread x 384 threads = 76800 > the SM's 65536"):
        CI.check_launch(200, 1024, 384, "k")


def test_check_launch_names_a_setmaxnreg_budget_the_launch_cannot_hold():
    CI.check_launch(168, 384, 384, "k", roles=((128, 40), (256, 232)))          # exactly the launch's 64512
    with pytest.raises(RuntimeError, match=r"k: its roles' setmaxnreg budgets need 64512 registers, the launch holds 160 x 384"):
        CI.check_launch(160, 384, 384, "k", roles=((128, 40), (256, 232)))


def test_check_launch_names_the_driver_limit():
    # run 8 of results/h200-2026-12-01: 200 registers, 320 threads, the driver allowed 256
    with pytest.raises(RuntimeError, match=r"k: the driver allows 256 threads per block at 200 registers .* needs 320"):
        CI.check_launch(200, 256, 320, "k")


@needs_nvrtc
@pytest.mark.parametrize("file, threads", [("attend_wgmma3.cu", INST.ATTEND_WGMMA3_THREADS),
                                           ("attend_wgmma2.cu", INST.ATTEND_WGMMA_THREADS),
                                           ("attend_wgmma_bwd.cu", INST.ATTEND_WGMMA_BWD_THREADS)])
def test_wgmma_attention_launch_attributes(file, threads):
    src = loader.kernel_dir() / file
    attrs = CI.nvrtc_kernel_attrs(src, INST.name_expressions(file), INST.FILE_OPTIONS[file])
    assert set(attrs) == set(INST.name_expressions(file))
    for name, a in attrs.items():
        # __launch_bounds__(384, 1): 168 registers at launch; setmaxnreg moves them between the roles
        assert a == {"regcount": 168, "max_threads": threads}, name
        CI.check_launch(a["regcount"], a["max_threads"], threads, name)


def test_kernel_attrs_rejects_a_non_elf():
    with pytest.raises(ValueError, match="argument 'elf'"):
        CI.kernel_attrs(b"not an elf image")
