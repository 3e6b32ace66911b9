"""What this machine has for the workbench, what is missing, and the command that fixes it.

`environment()` also feeds the metadata of every results JSON (GPU, clocks,
driver, library versions, git commit).
"""
from __future__ import annotations

import ctypes
import datetime
import importlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""           # exact command that fixes it ("" when ok or not needed)
    required: bool = False  # the CPU path needs it


def _run(cmd, timeout=10) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:
        try:
            return getattr(importlib.import_module(module), "__version__", "?")
        except Exception:
            return None


def numba_cuda_mode(say=print) -> str:
    """'gpu' or 'simulator': how the Numba family runs in this process. On a machine without a
    CUDA driver the simulator is turned on (NUMBA_ENABLE_CUDASIM=1, which numba reads when it is
    imported) and that is said in one line; if numba is already imported without it, this stops
    with one message saying what to do."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "simulator"
    if driver_version() is not None:
        return "gpu"
    if "numba" in sys.modules:
        raise SystemExit("no CUDA driver here, and numba is already imported without its simulator: start again "
                         "with NUMBA_ENABLE_CUDASIM=1 set before Python starts (e.g. NUMBA_ENABLE_CUDASIM=1 ipython)")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    say("no CUDA driver here: the Numba variants run in the CUDA simulator "
        "(NUMBA_ENABLE_CUDASIM=1 set for this session; one Python thread per CUDA thread, so tiny shapes only)")
    return "simulator"


def driver_version() -> str | None:
    """CUDA driver version straight from libcuda (no toolkit needed); None without a driver."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int()
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    return None


def gpu_info() -> dict:
    """GPU name, arch, memory and clocks when a GPU is visible; {} otherwise."""
    info = {}
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, arch=f"sm_{p.major}{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                        sms=p.multi_processor_count)
    except Exception:
        pass
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm",
                    "--format=csv,noheader"])
        if out:
            f = [x.strip() for x in out.splitlines()[0].split(",")]
            if len(f) >= 5:
                info.setdefault("name", f[0])
                info.update(driver=f[1], clock_sm=f[2], clock_mem=f[3], clock_max_sm=f[4])
    return info


def git_commit() -> str | None:
    return _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])


def source_digest() -> str:
    """sha256 of the project's source files (workbench/, reference/, kernels_cuda/): names
    the code that produced a result even where the checkout's git metadata is stale
    (a copied working tree)."""
    import hashlib
    h = hashlib.sha256()
    for pkg in ("workbench", "reference", "kernels_cuda"):
        for p in sorted((ROOT / pkg).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".cu", ".cuh"):
                h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def environment() -> dict:
    """Facts recorded with every result."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "source_digest": source_digest(),
        "gpu": gpu_info(),
        "driver": driver_version(),
        "numba_cudasim": os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
        "versions": {m: _version(m) for m in ("numpy", "torch", "cupy-cuda13x", "cupy", "numba", "numba-cuda")},
    }


def _nvrtc_check(pip: str) -> Check:
    """NVRTC from CuPy, else from the cuda-bindings wheel (what compile-check uses without a driver)."""
    errors = []
    try:
        from cupy.cuda import nvrtc as _nv
        return Check("NVRTC", True, "cupy: " + ".".join(map(str, _nv.getVersion())))
    except Exception as e:
        errors.append(f"cupy: {type(e).__name__}")
    try:
        from cuda.bindings import nvrtc as _nb
        err, major, minor = _nb.nvrtcVersion()
        return Check("NVRTC", True, f"cuda-bindings: {major}.{minor}")
    except Exception as e:
        errors.append(f"cuda-bindings: {type(e).__name__}")
    return Check("NVRTC", False, "not loadable (" + "; ".join(errors) + ")",
                 f"{pip} 'numba-cuda[cu13]'   # brings cuda-bindings and the NVRTC wheel")


def checks() -> list[Check]:
    out: list[Check] = []
    py = sys.executable
    pip = f"{py} -m pip install"
    for mod, extra in (("numpy", ""), ("torch", "torch"), ("rich", "cli"), ("typer", "cli"),
                       ("matplotlib", "cli"), ("watchdog", "cli"), ("hypothesis", "test"), ("pytest", "test")):
        v = _version(mod)
        fix = f"{pip} -e '.[{extra}]'" if extra else f"{pip} 'numpy>=1.26,<2.5'"
        if mod == "watchdog" and v is None:
            out.append(Check(mod, False, "missing: `hytopk watch` falls back to polling", fix))
        else:
            out.append(Check(mod, v is not None, v or "missing", "" if v else fix, required=mod in ("numpy", "torch")))

    drv = driver_version()
    out.append(Check("CUDA driver", drv is not None, drv or "no libcuda: no GPU work here (CPU path only)",
                     "" if drv else "install the NVIDIA driver (or run on the GPU machine)"))
    g = gpu_info()
    out.append(Check("GPU", bool(g.get("arch") or g.get("name")),
                     f"{g.get('name')} {g.get('arch', '')} {g.get('memory_gib', '')} GiB".strip() if g else "none visible",
                     "" if g else "run on a machine with an NVIDIA GPU (H200: sm_90)"))

    cupy_v = _version("cupy-cuda13x") or _version("cupy")
    out.append(Check("CuPy", cupy_v is not None, cupy_v or "missing", "" if cupy_v else f"{pip} -e '.[cupy]'"))
    out.append(_nvrtc_check(pip))
    nvcc = shutil.which("nvcc")
    nvcc_v = (_run([nvcc, "--version"]) or "").splitlines()[-1:] if nvcc else []
    out.append(Check("nvcc", nvcc is not None, f"{nvcc} {' '.join(nvcc_v)}" if nvcc else "missing (compile-check can use NVRTC instead)",
                     "" if nvcc else "install the CUDA 13 toolkit, or use NVRTC from the cupy wheel"))

    nb = _version("numba-cuda")
    out.append(Check("numba-cuda", nb is not None, nb or "missing", "" if nb else f"{pip} -e '.[numba]'"))
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    out.append(Check("Numba CUDA simulator", sim, "enabled (NUMBA_ENABLE_CUDASIM=1)" if sim else
                     "off: without a GPU the Numba variants are skipped",
                     "" if sim or drv else "export NUMBA_ENABLE_CUDASIM=1   # before starting python"))
    tv = _version("torch")
    if tv:
        try:
            import torch
            cuda = torch.version.cuda
            out.append(Check("torch CUDA", torch.cuda.is_available(),
                             f"built for CUDA {cuda}" + ("" if torch.cuda.is_available() else ", no GPU visible")
                             if cuda else "CPU-only build",
                             "" if cuda else f"{pip} torch --index-url https://download.pytorch.org/whl/cu130"))
        except Exception as e:
            out.append(Check("torch CUDA", False, f"import failed: {e}", f"{pip} -e '.[torch]'"))
    out.extend(family_checks())
    return out


def family_checks() -> list[Check]:
    """One line per kernel family: loaded (with its variant count) or why not."""
    from .. import registry
    res = []
    for fam in registry.FAMILY_MODULES:
        if registry.load_family(fam):
            n = len(registry.variants(family=fam, load=False))
            res.append(Check(f"family {fam}", True, f"{n} variants registered"))
        else:
            err = registry.load_error(fam) or "?"
            fix = {"numba": "export NUMBA_ENABLE_CUDASIM=1  (CPU) / pip install -e '.[numba]'",
                   "cupy": "pip install -e '.[cupy]'  (and a GPU + driver)"}.get(fam, "")
            res.append(Check(f"family {fam}", False, f"not loaded: {err}", fix))
    return res
