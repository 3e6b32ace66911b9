"""`hytopk watch`: edit a kernel, save, see whether it is still correct and how its time moved.

`WatchLoop.on_change(path)` is the whole loop body (tests drive it directly):
  * a Numba variant module (.py) is re-imported from the saved file under its
    package name, so its @register calls replace the variants in the registry;
  * a CUDA source (.cu/.cuh) needs nothing here: workbench.loader recompiles
    any kernel whose included files changed at its next launch;
then every variant of the affected stage(s) is checked against the reference
(`compare`'s gates, on the tiny preset on CPU / a small GPU shape) and timed,
and the change against the previous run is printed. A compile or import error
is reported as such and the loop keeps going.
`run_forever` feeds it from watchdog file events (or polling when watchdog is absent).
"""
from __future__ import annotations

import importlib.util
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.markup import escape

from .. import registry

ROOT = Path(__file__).resolve().parents[2]
NUMBA_PACKAGE = "workbench.families.numba"
WATCHED_SUFFIXES = (".py", ".cu", ".cuh")


@dataclass
class Outcome:
    path: str
    variant: str | None          # None: the file itself failed (compile / import error)
    stage: str | None
    correct: bool | None
    time_ms: float | None
    detail: str = ""
    change: str = ""
    spread: dict | None = None      # Timing.spread() of time_ms: quantiles, repeats, the median's interval

    def as_dict(self):
        return dict(self.__dict__)


def default_dirs(kernels_dir=None, numba_dir=None) -> list[Path]:
    """The folders to watch. A folder given that is missing or not a folder is a ValueError
    naming it (never dropped silently); a default folder absent from this install is skipped."""
    from .. import loader
    out = []
    for opt, given, default in (("--kernels-dir", kernels_dir, loader.kernel_dir()),
                                ("--numba-dir", numba_dir, ROOT / "workbench" / "families" / "numba")):
        d = Path(given).expanduser().absolute() if given is not None else Path(default)
        if d.is_dir():
            out.append(d)
        elif given is not None:
            why = "is not a directory" if d.exists() else "does not exist"
            raise ValueError(f"argument '{opt}': {d} {why}")
    if not out:
        raise ValueError("nothing to watch: neither kernels_cuda/ nor workbench/families/numba/ is here; "
                         "give --kernels-dir / --numba-dir")
    return out


def stage_of_source(path: Path) -> list[str]:
    """filter_mma.cu -> ['filter'], score_only.cu -> ['score_only'] (a floor's card); a header
    (.cuh) or an unknown name -> every stage."""
    if path.suffix == ".cu" and path.stem in registry.FLOORS:
        return [path.stem]
    if path.suffix == ".cu":
        head = path.stem.split("_")[0]
        if head in registry.STAGES:
            return [head]
    return list(registry.STAGES)


class WatchLoop:
    def __init__(self, stage: str | None = None, say: Callable = print, preset: str | None = None,
                 repeats: int | None = None):
        if stage is not None and stage not in registry.STAGES:
            raise ValueError(f"argument 'stage': unknown stage {stage!r}; choose from {sorted(registry.STAGES)}")
        self.stage, self.say, self.repeats = stage, say, repeats
        self.preset = preset
        self.previous: dict = {}            # label -> Outcome
        self._runner = None

    def runner(self):
        if self._runner is None:
            from .compare import Runner, Workload
            from .presets import get
            from .timing import gpu_available, make_timer
            gpu = gpu_available()
            p = get(self.preset or ("dsv32-32k" if gpu else "tiny"))
            device = "cuda" if p.gpu else "cpu"
            self._runner = Runner(Workload(p, device), make_timer(device), self.repeats)
        return self._runner

    # ---- reloading
    def _reimport(self, path: Path) -> tuple[str, list[str]]:
        """Execute the saved Numba module under its package name; returns (module name, its stages)."""
        name = f"{NUMBA_PACKAGE}.{path.stem}"
        registry.load_family("numba")                      # the package (and its common helpers) first
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        old = sys.modules.get(name)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            if old is not None:
                sys.modules[name] = old                    # keep the last good module importable
            else:
                sys.modules.pop(name, None)
            raise
        stages = sorted({v.stage for v in registry.variants(load=False) if v.fn.__module__ == name})
        return name, stages

    def on_change(self, path) -> list[Outcome]:
        path = Path(path)
        if path.suffix not in WATCHED_SUFFIXES or path.name.startswith("."):
            return []
        t0 = time.perf_counter()
        if path.suffix == ".py":
            try:
                module, stages = self._reimport(path)
            except Exception as e:
                detail = "".join(traceback.format_exception_only(type(e), e)).strip()
                out = Outcome(str(path), None, None, False, None, f"import/compile error: {detail}")
                self.say(f"[bold red]✗ {path.name}: {escape(detail)}[/] (fix it and save again)")
                return [out]
            # the HyTopK stages only: attention stages (registry.ATTENTION_STAGES) have their own tests and bench
            chosen = [v for v in registry.variants(load=False) if v.fn.__module__ == module and v.stage in registry.STAGES]
        else:
            stages = stage_of_source(path)
            if not registry.load_family("cupy"):  # its variants are listed only once it is imported
                self.say(escape(f"{path.name}: not checked: the CUDA C++ variants run through CuPy, which cannot "
                                f"load here ({registry.load_error('cupy')}); `hytopk doctor` says what is missing"))
                return []
            chosen = [v for v in registry.variants(load=False) if v.family == "cupy" and v.stage in stages]
        if self.stage:
            chosen = [v for v in chosen if v.stage == self.stage]
        if not chosen:
            self.say(escape(f"{path.name}: no variants of {'stage ' + self.stage if self.stage else 'any stage'} here"))
            return []
        return self.check_and_time(path, chosen, t0)

    def check_and_time(self, path: Path, chosen, t0) -> list[Outcome]:
        from .compare import family_usable
        runner = self.runner()
        outs = []
        for v in chosen:
            ok, why = family_usable(v.family, runner.wl.device, runner.wl.p)
            if not ok or (v.gpu_only and runner.wl.device == "cpu"):
                self.say(escape(f"  {v.name}: skipped ({why or 'gpu_only: needs a real GPU'})"))
                continue
            if registry.CARDS[v.stage].sources:         # the real use (indexer) when the variant takes it
                srcs = ["indexer"] if "indexer" in v.sources else list(v.sources[:1])
            else:
                srcs = [None]
            for src in srcs:
                row = runner.stage_row(v.stage, v, src)
                o = Outcome(str(path), v.name, v.stage, row.correct, row.time_ms, row.detail, spread=row.spread)
                o.change = self._change(row.label, o)
                self.previous[row.label] = o
                mark = "[green]✓ correct[/]" if o.correct else "[bold red]✗ WRONG[/]"
                tm = f"{o.time_ms:.4g} ms" if o.time_ms is not None else "not timed"
                self.say(f"  {escape(row.label)}: {mark}  {tm}  {escape(o.change)}"
                         + (f"\n    {escape(o.detail)}" if not o.correct else ""))
                outs.append(o)
        self.say(f"[dim]{escape(path.name)}: {len(outs)} variant(s) in {time.perf_counter() - t0:.1f} s[/]")
        return outs

    def _change(self, label, o: Outcome) -> str:
        p = self.previous.get(label)
        if p is None:
            return "(first run)"
        parts = []
        if p.correct != o.correct:
            parts.append(f"correct: {p.correct} -> {o.correct}")
        if p.time_ms and o.time_ms:
            parts.append(time_change(p.time_ms, o.time_ms, p.spread, o.spread))
        return "(" + "; ".join(parts) + ")" if parts else "(unchanged)"


def time_change(before_ms, after_ms, before: dict | None, after: dict | None) -> str:
    """A time change, called a change only outside the noise: the medians' ~95% intervals
    (timing.differs) must not overlap."""
    from .timing import differs
    moved = f"time {before_ms:.4g} -> {after_ms:.4g} ms"
    verdict = differs(before, after)
    if verdict is None:
        return f"{moved}, one call each: noise unknown"
    noise = 100 * max(before["ci_ms"] / before["median_ms"], after["ci_ms"] / after["median_ms"])
    if verdict:
        return f"{moved} ({100 * (after_ms / before_ms - 1):+.0f}%, outside the noise of ±{noise:.1g}%)"
    return f"{moved}: within the noise (±{noise:.1g}%)"


class Watcher:
    """File events for a set of folders -> on_change(path), debounced, on one worker thread."""

    def __init__(self, dirs, on_change: Callable, poll: bool = False, say: Callable = print, debounce_s=0.3):
        self.dirs = [Path(d) for d in dirs]
        self.on_change, self.say, self.debounce = on_change, say, debounce_s
        self.events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.poll = poll
        if not poll:
            try:
                import watchdog  # noqa: F401
            except ImportError:
                say("watchdog is not installed: polling the folders every 0.5 s (pip install watchdog)")
                self.poll = True
        self._threads: list[threading.Thread] = []
        self._observer = None

    def start(self):
        if self.poll:
            t = threading.Thread(target=self._poll_loop, daemon=True)
            t.start()
            self._threads.append(t)
        else:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
            events = self.events

            class Handler(FileSystemEventHandler):
                def on_any_event(self, ev):
                    if ev.event_type in ("modified", "created", "moved") and not ev.is_directory:
                        events.put(getattr(ev, "dest_path", None) or ev.src_path)
            self._observer = Observer()
            for d in self.dirs:
                self._observer.schedule(Handler(), str(d), recursive=False)
            self._observer.start()
        w = threading.Thread(target=self._work_loop, daemon=True)
        w.start()
        self._threads.append(w)
        return self

    def stop(self):
        self._stop.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        for t in self._threads:
            t.join(timeout=10)

    def _snapshot(self):
        snap = {}
        for d in self.dirs:
            for p in d.iterdir():
                if p.suffix in WATCHED_SUFFIXES:
                    try:
                        snap[p] = p.stat().st_mtime_ns
                    except FileNotFoundError:
                        pass
        return snap

    def _poll_loop(self):
        last = self._snapshot()
        while not self._stop.wait(0.5):
            now = self._snapshot()
            for p, m in now.items():
                if last.get(p) != m:
                    self.events.put(str(p))
            last = now

    def _work_loop(self):
        while not self._stop.is_set():
            try:
                first = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = {first}
            deadline = time.monotonic() + self.debounce       # editors write a file in several steps
            while time.monotonic() < deadline:
                try:
                    batch.add(self.events.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            for p in sorted(batch):
                if Path(p).suffix not in WATCHED_SUFFIXES:
                    continue
                try:
                    self.on_change(p)
                except Exception as e:                         # never let one bad save end the loop
                    self.say(f"[red]watch: {p}: {type(e).__name__}: {e}[/]")


def run_forever(loop: WatchLoop, dirs, poll=False, say=print):
    w = Watcher(dirs, loop.on_change, poll=poll, say=say).start()
    try:
        while True:
            time.sleep(1)
    finally:
        w.stop()
