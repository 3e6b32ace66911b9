"""Static checks that catch what only a GPU run would otherwise show: a name used
but never defined or imported (most CuPy code paths run on a GPU only)."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workbench", "reference", "kernels_cuda", "tests", "examples", "scripts")


def test_no_undefined_names():
    api = pytest.importorskip("pyflakes.api", reason="pyflakes is in the [test] extra")
    from pyflakes import messages as m
    from pyflakes.reporter import Reporter

    class Collect(Reporter):
        def __init__(self):
            self.found = []

        def flake(self, msg):
            if isinstance(msg, (m.UndefinedName, m.UndefinedLocal, m.UndefinedExport)):
                self.found.append(str(msg))

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.found.append(f"{filename}:{lineno}: {msg}")

        def unexpectedError(self, filename, msg):
            self.found.append(f"{filename}: {msg}")

    rep = Collect()
    files = [str(p) for pkg in PACKAGES if (ROOT / pkg).exists() for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert files
    api.checkRecursive(files, rep)
    assert not rep.found, "\n".join(rep.found)


def test_kernels_cuda_holds_cpp_only():
    """kernels_cuda/ ships CUDA C++ (and its README); Python about the kernels lives in workbench/
    (the instantiation list is workbench/instantiations.py, next to the loader)."""
    kdir = ROOT / "kernels_cuda"
    others = sorted(p.name for p in kdir.iterdir()
                    if p.name != "__pycache__" and p.suffix not in (".cu", ".cuh", ".md"))
    assert not others, f"kernels_cuda/ should hold C++ only, found {others}"
    assert (ROOT / "workbench" / "instantiations.py").exists()
