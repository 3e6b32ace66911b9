"""The CI compile check, on CPU (nvcc and/or NVRTC from the pip wheel; no GPU).

Runs on single files or tiny stand-in kernels to stay fast; the full check of
every kernel is `python -m workbench compile-check` in .ci/run.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench import instantiations as INST
from workbench import compile_check as CC
from workbench import loader

needs_compiler = pytest.mark.skipif(CC.find_nvcc() is None and not CC.nvrtc_available(),
                                    reason="neither nvcc nor cuda.bindings.nvrtc is available")
needs_nvcc = pytest.mark.skipif(CC.find_nvcc() is None, reason="nvcc not found")

PTXAS = """\
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
ptxas info    : Function properties for _Z3fooPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'bar' for 'sm_90'
ptxas info    : Function properties for bar
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function '_Z3fooPf'
"""

SPILLER = """\
extern "C" __global__ void __launch_bounds__(1024, 2) hytopk_check(float* out, const float* in) {
    float v[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = in[threadIdx.x + i * 1024];
#pragma unroll
    for (int r = 1; r < 4; ++r)
#pragma unroll
        for (int i = 0; i < 96; ++i) v[i] = fmaf(v[i], v[(i + r) % 96], 1.0f);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += v[i] * v[95 - i];
    out[threadIdx.x] = s;
}
"""


def test_parse_ptxas():
    foo, bar = CC.parse_ptxas(PTXAS)
    assert (foo.mangled, foo.registers, foo.smem, foo.stack, foo.spill_stores, foo.spill_loads) == \
        ("_Z3fooPf", 255, 1024, 16, 8, 12)
    assert foo.spills and not bar.spills and bar.registers == 20 and bar.smem == 0
    # ptxas's serialisation warning names its function (here after that function's report)
    assert foo.wgmma_serialized == "insufficient register resources for the wgmma pipeline" and not bar.wgmma_serialized


def test_serialised_wgmma_fails_unless_allowed(monkeypatch):
    foo, bar = CC.parse_ptxas(PTXAS)
    foo.spill_stores = foo.spill_loads = 0
    foo.name = "hytopk_foo<1>"
    text, bad = CC.verdict(foo)
    assert bad == 1 and "WGMMA SERIALISED by ptxas (insufficient register resources" in text
    monkeypatch.setitem(CC.ALLOWED_SERIAL, "hytopk_foo<", "a stand-in")
    assert CC.verdict(foo) == ("  wgmma serialised, allowed: a stand-in", 0)
    assert CC.verdict(bar) == ("", 0)


def test_every_kernel_file_has_an_instantiation_list():
    on_disk = {p.name for p in Path(loader.DEFAULT_KERNEL_DIR).glob("*.cu")}
    assert on_disk == set(INST.KERNELS)
    for f in INST.KERNELS:
        names = INST.name_expressions(f)
        assert names and len(set(names)) == len(names)


def test_shipped_shapes_are_instantiated():
    names = INST.name_expressions("filter.cu")
    for H in (32, 64):
        for ct in ("float", "hytopk::bf16_bits"):
            assert f"hytopk_filter<hytopk::IndexerSource<{H}, 128, {ct}>>" in names
    assert "hytopk_filter<hytopk::TableSource>" in names
    assert "hytopk_filter_ws<64, 128>" in INST.name_expressions("wgmma_ws.cu")
    assert "hytopk_filter_ws_fp8<64, 128>" in INST.name_expressions("wgmma_ws.cu")


@needs_compiler
def test_real_kernel_passes(capsys, monkeypatch):
    monkeypatch.setenv("HYTOPK_PROGRESS_PERIOD", "0")
    assert CC.main(["check.cu", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    assert "hytopk_check" in out and "compile-check: OK" in out
    # progress on stderr (a log here, not a terminal): a first line, one per file, a last one
    assert "compile-check: 1 step(s)" in err and "[1/1] check.cu compiled" in err and "done, 1 step(s)" in err


@needs_nvcc
def test_spilling_kernel_fails_unless_allowed(tmp_path, capsys, monkeypatch):
    (tmp_path / "check.cu").write_text(SPILLER)
    assert CC.main(["--kernel-dir", str(tmp_path), "check.cu"]) == 1
    assert "SPILLS: not allowed" in capsys.readouterr().out
    monkeypatch.setitem(CC.ALLOWED_SPILLS, "hytopk_check", "stand-in kernel that spills on purpose")
    assert CC.main(["--kernel-dir", str(tmp_path), "check.cu"]) == 0
    assert "allowed: stand-in kernel" in capsys.readouterr().out


@needs_compiler
def test_compile_error_reports_file_and_line(tmp_path, capsys):
    kdir = tmp_path / "k"
    shutil.copytree(loader.DEFAULT_KERNEL_DIR, kdir, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    src = (kdir / "check.cu").read_text().replace("bool f = false;", "bool f = not_declared_anywhere;")
    (kdir / "check.cu").write_text(src)
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "not_declared_anywhere" in l)
    assert CC.main(["--kernel-dir", str(kdir), "check.cu"]) == 1
    out = capsys.readouterr().out
    assert f"check.cu:{line}:" in out and "not_declared_anywhere" in out


def test_unknown_file_is_rejected(capsys):
    assert CC.main(["nope.cu"]) == 2
    assert "argument 'files'" in capsys.readouterr().out


@needs_nvcc
def test_geometry_mirror_is_checked_against_the_header(tmp_path):
    """The Python geometry of the wgmma_ws core is asserted against its header: the real
    figures compile, a drifted one fails naming the mirror."""
    import subprocess
    src = CC.loader.kernel_dir() / "wgmma_ws.cu"
    asserts = INST.geometry_asserts("wgmma_ws.cu")
    assert len(asserts) >= 12

    def compile_with(lines):
        unit = tmp_path / "unit.cu"
        unit.write_text(f'#include "{src}"\n' + "\n".join(lines) + "\n")
        return subprocess.run([CC.find_nvcc(), "-std=c++17", "-arch=sm_90", "-c", str(unit), "-o", str(tmp_path / "u.o")],
                              capture_output=True, text=True)
    assert compile_with(asserts).returncode == 0
    wrong = asserts[0].replace("SMEM_BYTES == ", "SMEM_BYTES == 16 + ", 1)
    p = compile_with([wrong])
    assert p.returncode != 0 and "WsGeometry" in p.stdout + p.stderr
