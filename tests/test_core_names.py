"""Each tensor-core core of the CuPy family has one name across its header, its entry file, its
module and its variants (mma_sync, wgmma, wgmma_ws: what the core is), and the CuPy modules
share stage pieces through _shared.py, never through a sibling's private names. Static: no GPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KDIR = ROOT / "kernels_cuda"
CUPY = ROOT / "workbench" / "families" / "cupy"
CORES = ("mma_sync", "wgmma", "wgmma_ws")


@pytest.mark.parametrize("core", CORES)
def test_core_has_one_name(core):
    assert (KDIR / f"hytopk_{core}.cuh").exists(), f"header hytopk_{core}.cuh"
    entry = (KDIR / f"{core}.cu").read_text()
    assert f'#include "hytopk_{core}.cuh"' in entry
    module = (CUPY / f"{core}.py").read_text()
    names = re.findall(r'@register\(\s*"(\w+)",\s*"(cupy\.\w+\.\w+)"', module)
    assert names, f"{core}.py registers no variant"
    for stage, name in names:
        fam, st, what = name.split(".")
        assert st == stage and (what == core or what.startswith(core)), f"{name} in {core}.py"
    assert f'"{core}.cu"' in module or core == "wgmma_ws" and '"wgmma_ws.cu"' in module


def test_no_old_core_names_left():
    old = re.compile(r"\btiled_mma\b|hytopk_mma_tile|hytopk_wgmma_tile|\btiled\.cu\b|_tiled<|hytopk::tiled")
    found = []
    for p in sorted(list(KDIR.glob("*.cu*")) + list((ROOT / "workbench").rglob("*.py"))
                    + list((ROOT / "tests").glob("*.py")) + list((ROOT / "scripts").glob("*"))):
        if p.name == Path(__file__).name or not p.is_file():
            continue
        found += [f"{p.relative_to(ROOT)}: {m}" for m in old.findall(p.read_text())]
    assert not found, "\n".join(found)


def test_cupy_modules_share_pieces_through_shared_only():
    bad = []
    for p in sorted(CUPY.glob("*.py")):
        for m in re.finditer(r"from \.(\w+) import ([^\n]+)", p.read_text()):
            if m.group(1) in ("_launch", "_shared"):
                continue
            private = [n.strip() for n in m.group(2).split(",") if n.strip().startswith("_")]
            if private:
                bad.append(f"{p.name} imports {private} from .{m.group(1)}")
    assert not bad, "\n".join(bad)
