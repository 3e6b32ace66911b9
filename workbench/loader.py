"""Load kernels_cuda/ sources through NVRTC (CuPy RawModule), with hot reload.

Why not plain RawModule: CuPy's compile cache keys on the source text and
options only, so editing a header would silently keep running the old kernel.
Here every `#include "..."` is resolved recursively and inlined (with `#line`
markers, so compiler messages name the real file and line), and our own key
hashes the contents of every file involved, the options (defines, -lineinfo,
...), the name expressions and the GPU architecture.

Hot reload: `KernelModule.get()` stats the files (cheap); only when a size or
mtime moved does it re-hash, and only a changed digest recompiles. A compile
error raises `KernelCompileError` (file, line, compiler message) and the last
good module stays available (`.last_good`, or `get(on_error="last_good")`).

The key logic needs no GPU (tests run it on CPU); only `compile_cupy` does.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

KERNEL_DIR_ENV = "HYTOPK_KERNEL_DIR"
DEFAULT_KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels_cuda"
BASE_OPTIONS = ("-std=c++17",)

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.M)
# nvrtc / nvcc diagnostics: path(line): error: message   (also "path:line: error: ...")
_DIAG = re.compile(r'^(?P<file>[^\s(:][^(:]*?)(?:\((?P<line>\d+)\)|:(?P<line2>\d+)(?::\d+)?):\s*'
                   r'(?:catastrophic\s+)?error\b[^:]*:\s*(?P<msg>.*)$', re.M)


def kernel_dir(override: str | os.PathLike | None = None) -> Path:
    """The kernel source folder: the argument, else $HYTOPK_KERNEL_DIR, else kernels_cuda/."""
    chosen = override if override is not None else os.environ.get(KERNEL_DIR_ENV) or DEFAULT_KERNEL_DIR
    path = Path(chosen).expanduser().resolve()
    if not path.is_dir():
        which = "argument 'kernel_dir'" if override is not None else f"${KERNEL_DIR_ENV}"
        raise FileNotFoundError(f"{which}: kernel folder {str(path)!r} does not exist")
    return path


_find_kernel_dir = kernel_dir      # for callers whose argument shadows the name


class KernelCompileError(RuntimeError):
    """A kernel failed to compile: where (file, line) and what the compiler said."""

    def __init__(self, file, line, message, log, last_good=None):
        self.file, self.line, self.message, self.log = file, line, message, log
        self.last_good = last_good
        where = f"{file}:{line}" if line else str(file)
        super().__init__(f"{where}: {message}\n--- compiler log ---\n{log.strip()}")


def parse_compile_log(log: str, default_file: str = "?"):
    """(file, line, message) of the first error in a compiler log."""
    m = _DIAG.search(log)
    if not m:
        text = log.strip().splitlines()
        return default_file, None, (text[0] if text else "compilation failed")
    line = m.group("line") or m.group("line2")
    return m.group("file").strip(), int(line), m.group("msg").strip()


def _resolve(name: str, including: Path, search: Sequence[Path]) -> Path | None:
    for base in (including.parent, *search):
        cand = (base / name)
        if cand.is_file():
            return cand.resolve()
    return None


def include_closure(path: Path, search: Sequence[Path] = ()) -> list[Path]:
    """`path` and every file it includes with #include "..." (recursively), in first-seen order."""
    seen: list[Path] = []

    def visit(p: Path):
        if p in seen:
            return
        seen.append(p)
        text = p.read_text()
        for m in _INCLUDE.finditer(text):
            dep = _resolve(m.group(1), p, search)
            if dep is None:
                lineno = text.count("\n", 0, m.start()) + 1
                raise KernelCompileError(str(p), lineno, f'cannot find included file "{m.group(1)}"', "")
            visit(dep)
    visit(Path(path).resolve())
    return seen


def inline_includes(path: Path, search: Sequence[Path] = ()) -> str:
    """One translation unit: quoted includes inlined once each, with #line markers
    so diagnostics still name the original file and line."""
    done: set[Path] = set()

    def expand(p: Path) -> str:
        done.add(p)
        out = [f'#line 1 "{p}"']
        for lineno, line in enumerate(p.read_text().splitlines(), 1):
            m = _INCLUDE.match(line)
            if _PRAGMA_ONCE.match(line):
                out.append("")
            elif m:
                dep = _resolve(m.group(1), p, search)
                if dep is None:
                    raise KernelCompileError(str(p), lineno, f'cannot find included file "{m.group(1)}"', "")
                if dep not in done:
                    out.append(expand(dep))
                out.append(f'#line {lineno + 1} "{p}"')
            else:
                out.append(line)
        return "\n".join(out)
    return expand(Path(path).resolve()) + "\n"


def cache_key(files: Sequence[Path], options: Sequence[str], name_expressions: Sequence[str], arch: str) -> str:
    """sha256 over every file's name and contents, the options, the names and the arch."""
    h = hashlib.sha256()
    for f in files:
        h.update(b"file\0" + Path(f).name.encode() + b"\0")
        h.update(Path(f).read_bytes() + b"\0")
    for tag, items in (("opt", options), ("name", name_expressions)):
        for it in items:
            h.update(f"{tag}\0{it}\0".encode())
    h.update(f"arch\0{arch}\0".encode())
    return h.hexdigest()


def define_options(defines: dict | None) -> tuple[str, ...]:
    return tuple(f"-D{k}" if v is None else f"-D{k}={v}" for k, v in sorted((defines or {}).items()))


def _stamps(files: Sequence[Path]):
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((str(f), st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            out.append((str(f), None, None))
    return tuple(out)


# ----- compilers: (source text, options, name expressions, file) -> module -------------

def current_arch() -> str:
    """'90' for the current CUDA device (needs a driver)."""
    import cupy
    return str(cupy.cuda.Device().compute_capability)


COMPILES = 0      # NVRTC compiles so far in this process (timers use it to spot a cold first call)


def compile_cupy(source: str, options: Sequence[str], names: Sequence[str], file: str):
    """NVRTC through cupy.RawModule for the current device; errors -> KernelCompileError."""
    import cupy
    global COMPILES
    COMPILES += 1
    try:
        mod = cupy.RawModule(code=source, options=tuple(options), name_expressions=list(names),
                             backend="nvrtc")
        mod.compile()
    except cupy.cuda.compiler.CompileException as e:
        log = str(e)
        f, line, msg = parse_compile_log(log, file)
        raise KernelCompileError(f, line, msg, log) from None
    return mod


@dataclass
class _Built:
    key: str
    stamps: tuple
    files: tuple
    module: object


class KernelModule:
    """One .cu file compiled with given options and name expressions; hot-reloading.

    ``compile_fn(source, options, names, file)`` and ``arch_fn()`` default to
    CuPy/NVRTC on the current device; tests substitute fakes to exercise the
    key and reload logic on a machine without a GPU.
    """

    def __init__(self, file: str, names: Sequence[str] = (), *, options: Sequence[str] = (),
                 defines: dict | None = None, kernel_dir: str | os.PathLike | None = None,
                 compile_fn: Callable | None = None, arch_fn: Callable[[], str] | None = None):
        self.file = file
        self.names = tuple(names)
        self.options = tuple(BASE_OPTIONS) + tuple(options) + define_options(defines)
        self._dir_override = kernel_dir
        self._compile = compile_fn or compile_cupy
        self._arch = arch_fn or current_arch
        self._built: _Built | None = None
        self._lock = threading.Lock()
        self._functions: dict[str, dict] = {}
        self._path_for: tuple | None = None
        self._checked_at = float("-inf")
        self.compiles = 0          # how many times it actually compiled (tests, diagnostics)

    @property
    def path(self) -> Path:
        # resolved once per $HYTOPK_KERNEL_DIR value; a file deleted later fails at its stat / read
        env = os.environ.get(KERNEL_DIR_ENV)
        if self._path_for is None or self._path_for[0] != env:
            p = kernel_dir(self._dir_override) / self.file
            if not p.is_file():
                raise FileNotFoundError(f"argument 'file': no kernel source {str(p)!r}")
            self._path_for = (env, p)
        return self._path_for[1]

    @property
    def last_good(self):
        return self._built.module if self._built else None

    def key(self) -> str:
        path = self.path
        files = include_closure(path, (path.parent,))
        return cache_key(files, self.options, self.names, self._arch())

    def _fresh(self, path: Path) -> bool:
        b = self._built
        return b is not None and b.files[0] == path and _stamps(b.files) == b.stamps

    def get(self, on_error: str = "raise", max_age: float = 0.0):
        """The compiled module, recompiled first if any file it includes changed.
        ``max_age`` > 0: trust a freshness check younger than that many seconds (the launch
        path: a kernel launched in a loop stats its files at most every max_age seconds)."""
        if on_error not in ("raise", "last_good"):
            raise ValueError(f"argument 'on_error' must be 'raise' or 'last_good', got {on_error!r}")
        if max_age > 0 and self._built is not None and time.monotonic() - self._checked_at < max_age:
            return self._built.module
        with self._lock:
            path = self.path
            if self._fresh(path):
                self._checked_at = time.monotonic()
                return self._built.module
            try:
                files = tuple(include_closure(path, (path.parent,)))
                stamps = _stamps(files)
                arch = self._arch()
                key = cache_key(files, self.options, self.names, arch)
                self._checked_at = time.monotonic()
                if self._built is not None and self._built.key == key:
                    self._built = _Built(key, stamps, files, self._built.module)   # touched, not changed
                    return self._built.module
                source = inline_includes(path, (path.parent,))
                # our digest in the options too: CuPy's own cache can never hand back a stale binary
                opts = self.options + (f"-DHYTOPK_SOURCE_DIGEST=0x{key[:16]}",)
                module = self._compile(source, opts, self.names, str(path))
                self.compiles += 1
                self._built = _Built(key, stamps, files, module)
                return module
            except KernelCompileError as e:
                e.last_good = self.last_good
                if on_error == "last_good" and e.last_good is not None:
                    warnings.warn(f"kernel {self.file} failed to compile; using the last good build:\n{e}")
                    return e.last_good
                raise

    def function(self, name: str, on_error: str = "raise", max_age: float = 0.0):
        """A kernel of the module by its name expression (or plain extern "C" name);
        cached per build, so a reload hands out the new kernel (``max_age``: see get)."""
        mod = self.get(on_error, max_age)
        cache = self._functions.setdefault(self._built.key, {})
        if len(self._functions) > 4:                     # forget old builds
            for key in list(self._functions)[:-4]:
                del self._functions[key]
        fn = cache.get(name)
        if fn is None:
            fn = cache[name] = mod.get_function(name)
        return fn


_MODULES: dict[tuple, KernelModule] = {}


def module(file: str, names: Sequence[str] = (), *, options: Sequence[str] = (), defines: dict | None = None,
           kernel_dir: str | os.PathLike | None = None) -> KernelModule:
    """The shared KernelModule for (file, names, options, defines, kernel folder).

    The kernel folder is read from $HYTOPK_KERNEL_DIR at every call, so pointing
    it at an edited copy takes effect on the next launch."""
    names = tuple(names)
    fast = (file, names, tuple(options), define_options(defines), kernel_dir, os.environ.get(KERNEL_DIR_ENV))
    mod = _BY_ARGS.get(fast)          # the launch path: no path resolution once seen
    if mod is not None:
        return mod
    folder = str(_find_kernel_dir(kernel_dir))
    key = (file, names, tuple(options), define_options(defines), folder)
    mod = _MODULES.get(key)
    if mod is None:
        mod = _MODULES[key] = KernelModule(file, names, options=options, defines=defines, kernel_dir=folder)
    _BY_ARGS[fast] = mod
    return mod


_BY_ARGS: dict[tuple, KernelModule] = {}
