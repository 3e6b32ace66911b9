"""The kernel loader's key, include resolution and hot reload, on CPU.

The compiler is swapped for a fake (records each build) or for NVRTC from
the pip wheel (cuda.bindings; no driver needed), so all of this runs here.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from workbench import loader
from workbench.loader import KernelCompileError, KernelModule

KDIR = Path(loader.DEFAULT_KERNEL_DIR)


class FakeModule:
    def __init__(self, source, options, names):
        self.source, self.options, self.names = source, options, names

    def get_function(self, name):
        return (self, name)


class FakeCompiler:
    """Builds FakeModules; fails like NVRTC when the source contains BROKEN."""

    def __init__(self):
        self.calls = []

    def __call__(self, source, options, names, file):
        self.calls.append((source, options, names))
        if "BROKEN" in source:
            where, line = file, 0                  # honour #line markers, as a real compiler does
            for text in source.splitlines():
                if text.startswith("#line "):
                    _, num, name = text.split(" ", 2)
                    where, line = name.strip('"'), int(num) - 1
                    continue
                line += 1
                if "BROKEN" in text:
                    break
            log = f'{where}({line}): error: identifier "BROKEN" is undefined\n1 error detected'
            f, ln, msg = loader.parse_compile_log(log, file)
            raise KernelCompileError(f, ln, msg, log)
        return FakeModule(source, options, names)


def make_tree(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "common.cuh").write_text('#pragma once\n#include "inc/deep.cuh"\n#define COMMON 1\n')
    (tmp_path / "inc" / "deep.cuh").write_text("#pragma once\n#define DEEP 2\n")
    (tmp_path / "k.cu").write_text('#include "common.cuh"\n#include "common.cuh"\nextern "C" __global__ void k() {}\n')
    return tmp_path


def bump(path: Path, text: str):
    """Rewrite a file and move its mtime forward (coarse filesystem clocks)."""
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def fake_module(tmp_path, **kw):
    comp = FakeCompiler()
    mod = KernelModule("k.cu", ("k",), kernel_dir=tmp_path, compile_fn=comp, arch_fn=lambda: "90", **kw)
    return mod, comp


def test_include_closure_is_recursive_and_deduplicated(tmp_path):
    make_tree(tmp_path)
    files = loader.include_closure(tmp_path / "k.cu", (tmp_path,))
    assert [f.name for f in files] == ["k.cu", "common.cuh", "deep.cuh"]


def test_inlined_source_has_each_header_once_with_line_markers(tmp_path):
    make_tree(tmp_path)
    text = loader.inline_includes(tmp_path / "k.cu", (tmp_path,))
    assert text.count("#define DEEP 2") == 1 and text.count("#define COMMON 1") == 1
    assert f'#line 1 "{tmp_path / "inc" / "deep.cuh"}"' in text
    assert f'#line 3 "{tmp_path / "k.cu"}"' in text          # back in k.cu after its 2nd include
    assert "#include" not in text and "pragma once" not in text


def test_missing_include_names_file_and_line(tmp_path):
    (tmp_path / "k.cu").write_text('// x\n#include "nope.cuh"\n')
    with pytest.raises(KernelCompileError) as e:
        loader.include_closure(tmp_path / "k.cu")
    assert e.value.line == 2 and e.value.file.endswith("k.cu") and "nope.cuh" in str(e.value)


@pytest.mark.parametrize("change", ["header", "deep_header", "options", "defines", "names", "arch"])
def test_key_covers_everything(tmp_path, change):
    make_tree(tmp_path)
    arch = {"v": "90"}
    kw = dict(kernel_dir=tmp_path, compile_fn=FakeCompiler(), arch_fn=lambda: arch["v"])
    base = KernelModule("k.cu", ("k",), **kw).key()
    if change == "header":
        bump(tmp_path / "common.cuh", (tmp_path / "common.cuh").read_text() + "// edit\n")
        other = KernelModule("k.cu", ("k",), **kw).key()
    elif change == "deep_header":
        bump(tmp_path / "inc" / "deep.cuh", "#pragma once\n#define DEEP 3\n")
        other = KernelModule("k.cu", ("k",), **kw).key()
    elif change == "options":
        other = KernelModule("k.cu", ("k",), options=("-lineinfo",), **kw).key()
    elif change == "defines":
        other = KernelModule("k.cu", ("k",), defines={"X": 1}, **kw).key()
    elif change == "names":
        other = KernelModule("k.cu", ("k", "k2"), **kw).key()
    else:
        arch["v"] = "100"
        other = KernelModule("k.cu", ("k",), **kw).key()
    assert other != base
    assert KernelModule("k.cu", ("k",), **kw).key() == KernelModule("k.cu", ("k",), **kw).key()


def test_hot_reload_on_header_edit_only_when_contents_change(tmp_path):
    make_tree(tmp_path)
    mod, comp = fake_module(tmp_path)
    first = mod.get()
    assert mod.get() is first and len(comp.calls) == 1          # unchanged: no rebuild
    bump(tmp_path / "inc" / "deep.cuh", (tmp_path / "inc" / "deep.cuh").read_text())   # touched only
    assert mod.get() is first and len(comp.calls) == 1
    bump(tmp_path / "inc" / "deep.cuh", "#pragma once\n#define DEEP 42\n")
    second = mod.get()
    assert second is not first and len(comp.calls) == 2 and "#define DEEP 42" in second.source
    digest = [o for o in second.options if o.startswith("-DHYTOPK_SOURCE_DIGEST=")]
    assert digest and digest != [o for o in first.options if o.startswith("-DHYTOPK_SOURCE_DIGEST=")]


def test_compile_error_shows_file_line_and_keeps_last_good(tmp_path):
    make_tree(tmp_path)
    mod, comp = fake_module(tmp_path)
    good = mod.get()
    fn = mod.function("k")
    bump(tmp_path / "common.cuh", '#pragma once\n#include "inc/deep.cuh"\nBROKEN\n')
    with pytest.raises(KernelCompileError) as e:
        mod.get()
    assert e.value.file == str(tmp_path / "common.cuh") and e.value.line == 3
    assert "BROKEN" in e.value.message and e.value.last_good is good
    assert mod.last_good is good
    with pytest.warns(UserWarning, match="last good"):
        assert mod.get(on_error="last_good") is good
    assert mod.function("k", on_error="last_good") == fn
    bump(tmp_path / "common.cuh", '#pragma once\n#include "inc/deep.cuh"\n#define COMMON 7\n')
    fixed = mod.get()
    assert fixed is not good and "#define COMMON 7" in fixed.source


def test_kernel_dir_override_by_env_and_argument(tmp_path, monkeypatch):
    copy = tmp_path / "edited"
    shutil.copytree(KDIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    monkeypatch.setenv(loader.KERNEL_DIR_ENV, str(copy))
    assert loader.kernel_dir() == copy.resolve()
    assert loader.kernel_dir(KDIR) == KDIR.resolve()
    mod = KernelModule("check.cu", ("hytopk_check",), compile_fn=FakeCompiler(), arch_fn=lambda: "90")
    assert mod.path == copy.resolve() / "check.cu"
    monkeypatch.setenv(loader.KERNEL_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=loader.KERNEL_DIR_ENV):
        loader.kernel_dir()


@pytest.mark.parametrize("log,want", [
    ('/k/a.cuh(12): error: identifier "x" is undefined', ("/k/a.cuh", 12, 'identifier "x" is undefined')),
    ("k.cu(3): catastrophic error: cannot open source file \"y.h\"", ("k.cu", 3, 'cannot open source file "y.h"')),
    ("k.cu:7:2: error: expected ';'", ("k.cu", 7, "expected ';'")),
    ("something odd", ("dflt", None, "something odd")),
])
def test_parse_compile_log(log, want):
    assert loader.parse_compile_log(log, "dflt") == want


def _nvrtc_compile(source, options, names, file):
    """A compile_fn using NVRTC from the pip wheel (no driver): returns lowered names."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), os.path.basename(file).encode(), 0, [], [])
    for n in names:
        nvrtc.nvrtcAddNameExpression(prog, n.encode())
    opts = [o.encode() for o in (*options, "-arch=sm_90")]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    log = buf.rstrip(b"\0").decode()
    if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        f, line, msg = loader.parse_compile_log(log, file)
        raise KernelCompileError(f, line, msg, log)
    return {n: nvrtc.nvrtcGetLoweredName(prog, n.encode())[1] for n in names}


def test_real_nvrtc_error_points_at_the_header(tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    copy = tmp_path / "k"
    shutil.copytree(KDIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    mod = KernelModule("check.cu", ("hytopk_check",), kernel_dir=copy, compile_fn=_nvrtc_compile,
                       arch_fn=lambda: "90")
    assert "hytopk_check" in mod.get()
    hdr = copy / "hytopk_order.cuh"
    lines = hdr.read_text().splitlines()
    at = next(i for i, l in enumerate(lines) if "typedef unsigned int u32;" in l)
    lines.insert(at + 1, "__device__ int broken_here() { return undefined_symbol_xyz; }")
    bump(hdr, "\n".join(lines) + "\n")
    with pytest.raises(KernelCompileError) as e:
        mod.get()
    assert Path(e.value.file).name == "hytopk_order.cuh" and e.value.line == at + 2
    assert "undefined_symbol_xyz" in e.value.message
    assert e.value.last_good is not None
