"""Per-kernel launch attributes read from a cubin's ELF .nv.info sections (no cuobjdump needed).

What the driver launches with: REGCOUNT (registers per thread at launch, before any setmaxnreg)
and MAX_THREADS (.maxntid, from __launch_bounds__). `nvrtc_kernel_attrs` compiles a kernels_cuda/
file with NVRTC exactly as the loader does and reads them back, so a launch that cannot fit (e.g.
registers x threads over the SM's 65536) shows up without a GPU.

EIATTR records: u8 format, u8 attribute, then u16 (format 3: the value itself; format 4: the size
of the payload that follows). REGCOUNT (0x2f) lives in `.nv.info` as (u32 symbol, u32 count);
MAX_THREADS (0x05) in `.nv.info.<kernel>` as three u32.
"""
from __future__ import annotations

import struct
from pathlib import Path

EIATTR_MAX_THREADS = 0x05
EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def _sections(elf: bytes) -> tuple[dict[str, bytes], list[tuple[str, bytes]]]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("argument 'elf': not a 64-bit ELF image")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    def data(h):
        return elf[h[4]:h[4] + h[5]]
    names = data(heads[shstrndx])
    def name(off):
        return names[off:names.index(b"\0", off)].decode()
    out, ordered = {}, []
    for h in heads:
        n = name(h[0])
        out[n] = data(h)
        ordered.append((n, data(h)))
    return out, ordered


def _records(info: bytes):
    at = 0
    while at + 4 <= len(info):
        fmt, attr, val = struct.unpack_from("<BBH", info, at)
        at += 4
        if fmt == _EIFMT_SVAL:
            yield attr, info[at:at + val]
            at += val
        else:
            yield attr, val


def kernel_attrs(elf: bytes) -> dict[str, dict[str, int]]:
    """{mangled kernel name: {'regcount': n, 'max_threads': x*y*z (when declared)}}."""
    secs, _ = _sections(elf)
    symtab, strtab = secs.get(".symtab", b""), secs.get(".strtab", b"")
    def sym_name(i):
        st_name, = struct.unpack_from("<I", symtab, i * 24)
        return strtab[st_name:strtab.index(b"\0", st_name)].decode()
    out: dict[str, dict[str, int]] = {}
    for attr, val in _records(secs.get(".nv.info", b"")):
        if attr == EIATTR_REGCOUNT and isinstance(val, bytes) and len(val) >= 8:
            sym, regs = struct.unpack_from("<II", val)
            out.setdefault(sym_name(sym), {})["regcount"] = regs
    for sec, body in secs.items():
        if sec.startswith(".nv.info."):
            for attr, val in _records(body):
                if attr == EIATTR_MAX_THREADS and isinstance(val, bytes) and len(val) >= 12:
                    x, y, z = struct.unpack_from("<III", val)
                    out.setdefault(sec[len(".nv.info."):], {})["max_threads"] = x * y * z
    return out


def nvrtc_kernel_attrs(src: str | Path, names, arch_options=("-arch=sm_90a",)) -> dict[str, dict[str, int]]:
    """Compile `src` (includes inlined, the loader's base options) with NVRTC; {name expression: attrs}."""
    from cuda.bindings import nvrtc

    from . import loader
    src = Path(src)
    text = loader.inline_includes(src, (src.parent,))
    _, prog = nvrtc.nvrtcCreateProgram(text.encode(), src.name.encode(), 0, [], [])
    try:
        for n in names:
            nvrtc.nvrtcAddNameExpression(prog, n.encode())
        opts = [o.encode() for o in (*loader.BASE_OPTIONS, *arch_options)]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0").decode(errors="replace")
            raise RuntimeError(f"NVRTC failed on {src.name}:\n{log}")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        attrs = kernel_attrs(cubin)
        lowered = {}
        for n in names:
            _, low = nvrtc.nvrtcGetLoweredName(prog, n.encode())
            lowered[n] = low.decode() if isinstance(low, bytes) else str(low)
        return {n: attrs.get(m, {}) for n, m in lowered.items()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


SM_REGISTERS = 65536               # the register file of one SM (sm_90): 4 quarters of 16384


def check_launch(num_regs: int, max_threads_per_block: int, threads: int, kernel: str,
                 roles: tuple = ()) -> None:
    """RuntimeError naming the numbers when a block of `threads` cannot launch: registers per
    thread x threads over the SM's file, or over the driver's per-kernel thread limit (which also
    counts how warps spread over the register-file quarters: 10 warps at 200 registers -> 256).
    roles: ((threads, registers), ...) the warp-specialised roles' setmaxnreg budgets; their sum
    over the block's launch allocation would leave a setmaxnreg.inc waiting forever (a hang, no error)."""
    need = sum(t * r for t, r in roles)
    if need > num_regs * threads:
        raise RuntimeError(f"{kernel}: its roles' setmaxnreg budgets need {need} registers, the launch holds "
                           f"{num_regs} x {threads} = {num_regs * threads}; setmaxnreg.inc would never return")
    if num_regs * threads > SM_REGISTERS:
        raise RuntimeError(f"{kernel}: {num_regs} registers per thread x {threads} threads = "
                           f"{num_regs * threads} > the SM's {SM_REGISTERS}; the launch would fail "
                           f"(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)")
    if max_threads_per_block < threads:
        raise RuntimeError(f"{kernel}: the driver allows {max_threads_per_block} threads per block at "
                           f"{num_regs} registers per thread, the launch needs {threads}; the launch would "
                           f"fail (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)")
