"""CI compile check of kernels_cuda/ without a GPU (`python -m workbench compile-check`).

Every .cu is compiled for sm_90 twice, with the template instantiations we
ship (workbench/instantiations.py, the list the CuPy wrappers use):
  1. nvcc -Xptxas -v: each kernel's registers, static shared memory, stack
     and spill bytes are printed; a kernel that spills fails the check unless
     ALLOWED_SPILLS names it with a reason, and so does one whose wgmma ptxas
     serialises (its C7510 / C7511 "Potential Performance Loss" warning: the MMAs
     no longer overlap anything) unless ALLOWED_SERIAL does;
  2. NVRTC (the pip wheel through cuda.bindings, no driver needed) on the very
     source the loader builds (includes inlined), with the same name
     expressions: catches NVRTC-only errors before the GPU run.
Exit status 0 when everything compiled and nothing spilled or serialised unexpectedly.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from workbench import instantiations as INST

from . import loader
from .progress import Progress

# kernel name-expression prefix -> why its spills are acceptable
ALLOWED_SPILLS: dict[str, str] = {
    "hytopk_filter_ws<16, ": "H = 16 (the padded test shape, not a model's): 8 slots per consumer in 112 registers; "
                             "a few words spill, the model shapes H = 32 / 64 do not",
    "hytopk_filter_ws_fp8<16, ": "H = 16 fp8 (the padded test shape): as hytopk_filter_ws<16, ...>",
    "hytopk_table_fused_cfg<hytopk::TableSource, 512, 3>": "three 512-thread blocks an SM leave 40 registers: "
        "8 bytes spill outside the stream, the rest in the sample gather (16 loads a thread in flight); "
        "measured the faster launch for 128K-key rows all the same (table_v2.FUSED_SHORT)",
    "hytopk_table_fused_cfg<hytopk::TableBf16Source, 512, 3>": "as the float32 (512, 3); bf16 tables do not "
        "take it by default (table_v2.FUSED_SHORT_SOURCES)",
}
# kernel name-expression prefix -> why ptxas serialising its wgmma is acceptable (the check passed the
# bulk write path of attend_wgmma_bwd.cu, commit cd2ef35, serialised so, before it looked)
ALLOWED_SERIAL: dict[str, str] = {
    "hytopk_attend_bwd_wgmma<true, true, false>": "the direct path's 16-byte atomics: bench_attention's "
        "wgmma_atomic_vec comparison row only (its lane transpose's registers; the default paths are not serialised)",
}
NVCC_FLAGS = ("-std=c++17", "-O3", "-Xptxas", "-v", "-cubin")

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SERIAL = re.compile(r"wgmma\.mma_async instructions are serialized due to (.+?) in the function '([^']+)'")


@dataclass
class KernelReport:
    mangled: str
    arch: str
    registers: int = 0
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    name: str = ""                 # name expression, when known
    wgmma_serialized: str = ""     # ptxas's reason, when it serialised the kernel's wgmma

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def parse_ptxas(log: str) -> list[KernelReport]:
    """Resource report of every entry function in `nvcc -Xptxas -v` output."""
    out: list[KernelReport] = []
    cur = None
    serial: dict[str, str] = {}
    for line in log.splitlines():
        m = _SERIAL.search(line)          # names its function: before or after that function's report
        if m:
            serial[m.group(2)] = m.group(1)
            continue
        m = _ENTRY.search(line)
        if m:
            cur = KernelReport(m.group(1), m.group(2))
            out.append(cur)
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            cur.registers = int(m.group(1))
            cur.smem = int(m.group(2) or 0)
    for r in out:
        r.wgmma_serialized = serial.get(r.mangled, "")
    return out


def _allowed(table: dict[str, str], name: str) -> str | None:
    """The reason `table` (name-expression prefix -> why) gives for kernel `name`, if any."""
    return next((why for prefix, why in table.items() if name.startswith(prefix)), None)


def allowed_spill(name: str) -> str | None:
    return _allowed(ALLOWED_SPILLS, name)


def verdict(r: KernelReport) -> tuple[str, int]:
    """(what the report line says past the figures, the problems it counts): spills and serialised
    wgmma, each allowed only where ALLOWED_SPILLS / ALLOWED_SERIAL give a reason."""
    text, bad = "", 0
    if r.spills:
        why = allowed_spill(r.name)
        text += f"  spills, allowed: {why}" if why else "  SPILLS: not allowed"
        bad += why is None
    if r.wgmma_serialized:
        why = _allowed(ALLOWED_SERIAL, r.name)
        text += (f"  wgmma serialised, allowed: {why}" if why
                 else f"  WGMMA SERIALISED by ptxas ({r.wgmma_serialized}): not allowed")
        bad += why is None
    return text, bad


def instantiation_unit(source: Path, names, asserts=()) -> str:
    """A translation unit that includes `source` and takes every kernel's address
    (which instantiates the templates exactly as NVRTC name expressions do), plus the
    geometry assertions of `source` (the Python mirrors of its headers' constants)."""
    refs = ",\n".join(f"    (void*)&{n}" for n in names)
    checks = "".join(f"{a}\n" for a in asserts)
    return (f'#include "{source}"\n{checks}'
            f"__attribute__((used)) static void* const hytopk_instantiations[] = {{\n{refs}\n}};\n")


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc")
                                         if os.path.exists(p)), None)


def run_nvcc(nvcc: str, src: Path, names, arch: str, workdir: Path):
    """(ok, log) of compiling one .cu with its instantiations."""
    unit = workdir / f"inst_{src.stem}.cu"
    unit.write_text(instantiation_unit(src, names, INST.geometry_asserts(src.name)))
    target = INST.nvcc_target(src.name, arch)
    cmd = [nvcc, *NVCC_FLAGS, target, f"-I{src.parent}", str(unit),
           "-o", str(workdir / f"{src.stem}.cubin")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode == 0, p.stdout + p.stderr


def run_nvrtc(src: Path, names, arch: str):
    """(ok, log, {name expression: mangled}) compiling the loader's source with NVRTC."""
    from cuda.bindings import nvrtc
    text = loader.inline_includes(src, (src.parent,))
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), src.name.encode(), 0, [], [])
    try:
        for n in names:
            nvrtc.nvrtcAddNameExpression(prog, n.encode())
        target = INST.FILE_OPTIONS.get(src.name, (f"-arch=sm_{arch}",))
        opts = [o.encode() for o in (*loader.BASE_OPTIONS, *target)]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0").decode(errors="replace")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, log, {}
        lowered = {}
        for n in names:
            e, low = nvrtc.nvrtcGetLoweredName(prog, n.encode())
            lowered[n] = low.decode() if isinstance(low, bytes) else str(low)
        return True, log, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvrtc_available() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except Exception:
        return False


def check_file(src: Path, arch: str, nvcc: str | None, use_nvrtc: bool, workdir: Path) -> dict:
    names = INST.name_expressions(src.name)
    res = {"file": src.name, "names": names, "errors": [], "reports": [], "lowered": {}}
    if use_nvrtc:
        ok, log, lowered = run_nvrtc(src, names, arch)
        res["lowered"] = lowered
        if not ok:
            f, line, msg = loader.parse_compile_log(log, str(src))
            res["errors"].append(f"NVRTC: {f}:{line}: {msg}\n{log.strip()}")
    if nvcc:
        ok, log = run_nvcc(nvcc, src, names, arch, workdir)
        if not ok:
            f, line, msg = loader.parse_compile_log(log, str(src))
            res["errors"].append(f"nvcc: {f}:{line}: {msg}\n{log.strip()}")
        by_mangled = {v: k for k, v in res["lowered"].items()}
        for r in parse_ptxas(log):
            r.name = by_mangled.get(r.mangled, r.mangled)
            res["reports"].append(r)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="compile-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel-dir", default=None, help=f"kernel folder (default ${loader.KERNEL_DIR_ENV} or kernels_cuda/)")
    ap.add_argument("--arch", default="90", help="SM version, e.g. 90 (default)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compiler processes")
    ap.add_argument("--no-nvrtc", action="store_true", help="skip the NVRTC leg")
    ap.add_argument("--no-nvcc", action="store_true", help="skip the nvcc leg (no resource report)")
    ap.add_argument("files", nargs="*", help="only these .cu files (default: every file in the instantiation list)")
    args = ap.parse_args(argv)

    kdir = loader.kernel_dir(args.kernel_dir)
    files = args.files or sorted(INST.KERNELS)
    unknown = [f for f in files if f not in INST.KERNELS]
    if unknown:
        print(f"argument 'files': no instantiation list for {unknown}; known: {sorted(INST.KERNELS)}")
        return 2
    listed = set(INST.KERNELS)
    stray = sorted(p.name for p in kdir.glob("*.cu") if p.name not in listed)
    nvcc = None if args.no_nvcc else find_nvcc()
    use_nvrtc = not args.no_nvrtc and nvrtc_available()
    if not args.no_nvcc and nvcc is None:
        print("compile-check: nvcc not found (PATH, /usr/local/cuda/bin); resource report skipped")
    if not args.no_nvrtc and not use_nvrtc:
        print("compile-check: cuda.bindings.nvrtc not importable; NVRTC leg skipped")
    if nvcc is None and not use_nvrtc:
        print("compile-check: FAILED: no compiler available")
        return 1

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="hytopk_cc_") as tmp, \
            ThreadPoolExecutor(max(1, args.jobs)) as pool, \
            Progress(len(files), "compile-check", stream=sys.stderr) as prog:
        futures = {pool.submit(check_file, kdir / f, args.arch, nvcc, use_nvrtc, Path(tmp)): f for f in files}
        done = {}
        for fut in as_completed(futures):          # a bar on a terminal, a line every few seconds in a log
            done[futures[fut]] = fut.result()
            prog.advance(f"{futures[fut]} compiled")
        results = [done[f] for f in files]

    failed = 0
    legs = " + ".join(x for x, on in (("nvcc", nvcc), ("NVRTC", use_nvrtc)) if on)
    print(f"compile-check: {len(files)} files for sm_{args.arch} with {legs} in {time.time() - t0:.1f}s ({kdir})")
    print(f"{'kernel':<72} {'regs':>5} {'smem':>6} {'stack':>6} {'spill st/ld':>12}")
    for res in results:
        print(f"-- {res['file']} ({len(res['names'])} instantiations)")
        for err in res["errors"]:
            failed += 1
            print(f"ERROR {err}")
        for r in res["reports"]:
            text, bad = verdict(r)
            failed += bad
            print(f"   {r.name[:70]:<70} {r.registers:>5} {r.smem:>6} {r.stack:>6} "
                  f"{r.spill_stores:>5}/{r.spill_loads:<6}{text}")
        if nvcc and not res["errors"] and len(res["reports"]) < len(res["names"]):
            failed += 1
            print(f"ERROR {res['file']}: ptxas reported {len(res['reports'])} kernels, expected {len(res['names'])}")
    if stray:
        print(f"note: .cu files without an instantiation list (not checked): {stray}")
    print("compile-check: " + ("OK" if not failed else f"FAILED ({failed} problem(s))"))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
