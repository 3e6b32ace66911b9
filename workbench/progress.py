"""Progress of a long step: a bar on a terminal, periodic lines in a log.

    with Progress(len(files), "compile-check") as prog:
        for f in files:
            ...
            prog.advance(f)          # one step done, the next one's label
        # prog.tick("waiting")       # no step done, but say that it is still running

On a terminal (and with rich installed) a transient bar; otherwise a first line, then at most
one line every `period_s` seconds (HYTOPK_PROGRESS_PERIOD, default 10), then a last line with
the total time, so a log shows that a long step is alive and how far it got.
"""
from __future__ import annotations

import os
import sys
import time

PERIOD_ENV = "HYTOPK_PROGRESS_PERIOD"


def default_period() -> float:
    try:
        return float(os.environ.get(PERIOD_ENV, "10"))
    except ValueError:
        return 10.0


class Progress:
    def __init__(self, total: int | None, what: str, *, stream=None, period_s: float | None = None,
                 bar: bool | None = None, console=None):
        self.total, self.what = total, what
        self.stream = stream or sys.stderr
        self.period = default_period() if period_s is None else period_s
        self.done = 0
        self.t0 = self._last = time.perf_counter()
        self._bar = None
        use_bar = (console.is_terminal if console is not None else self._isatty()) if bar is None else bar
        if use_bar:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, \
                    TimeElapsedColumn
                self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console or Console(file=self.stream), transient=True)
                self._bar.start()
                self._task = self._bar.add_task(what, total=total)
            except ImportError:
                self._bar = None
        self._console = console
        if self._bar is None:
            self._line(f"{what}: {total} step(s)" if total is not None else f"{what}: started")

    def _isatty(self) -> bool:
        try:
            return self.stream.isatty()
        except Exception:
            return False

    def _line(self, text: str):
        if self._console is not None:
            from rich.markup import escape
            self._console.print(escape(text), highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def _elapsed(self) -> str:
        return f"+{time.perf_counter() - self.t0:.0f} s"

    def _periodic(self, text: str):
        now = time.perf_counter()
        if now - self._last >= self.period:
            self._last = now
            self._line(text)

    def advance(self, label: str | None = None, n: int = 1):
        """``n`` more steps done; ``label`` says what runs now (or what just finished)."""
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n, description=f"{self.what}: {label}" if label else self.what)
            return
        of = f"/{self.total}" if self.total is not None else ""
        self._periodic(f"{self.what}: [{self.done}{of}] {label or ''} ({self._elapsed()})".replace("  ", " "))

    def tick(self, label: str):
        """No step done, still running: a line when the period has passed (the bar just ticks)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.what}: {label}")
            return
        of = f"/{self.total}" if self.total is not None else ""
        self._periodic(f"{self.what}: [{self.done}{of}] {label} ({self._elapsed()})")

    def close(self):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            return
        self._line(f"{self.what}: done, {self.done} step(s) in {time.perf_counter() - self.t0:.1f} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
