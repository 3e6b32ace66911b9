"""`hytopk` (also `python -m workbench`): doctor, compare, calibrate, watch,
winners, compile-check. Each command is a thin shell over workbench.harness."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="HyTopK workbench: check, time and pick kernel variants.")
console = Console()
if not console.is_terminal:          # logs and CI: don't squeeze the tables into 80 columns
    console = Console(width=max(console.width, 200))


def _fail(msg, code: int = 2):
    """Misuse: one line (never wrapped, no traceback) and a non-zero exit."""
    from rich.markup import escape
    console.print(f"[red]error:[/] {escape(str(msg))}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def _outputs(json_path, plot):
    """--json and --plot (default: next to --json) checked writable before any work:
    (absolute json path or None, absolute plot path or None)."""
    from .harness import report
    if json_path is not None:
        json_path = report.check_writable(json_path, "argument '--json'")
    if plot is not None:
        plot = report.check_writable(plot, "argument '--plot'")
    elif json_path is not None:
        plot = report.check_writable(json_path.with_suffix(".png"), "argument '--plot' (default: next to --json)")
    return json_path, plot


def _progress(console, what):
    """The harness's advance(label) callable factory (label: the job starting now; None: all done):
    a bar on a terminal, periodic lines when the output goes to a log (workbench.progress)."""
    from .progress import Progress

    def factory(total):
        prog = Progress(total, what, console=console)
        started = []

        def advance(label):
            if label is None:
                if started:
                    prog.advance("finished")
                prog.close()
            elif started:
                prog.advance(label)
            else:
                started.append(True)
                prog.tick(label)
        return advance
    return factory


@app.command()
def doctor():
    """What this machine has (GPU, driver, CuPy, NVRTC/nvcc, numba-cuda, simulator, torch), what is missing and the fix."""
    from rich.markup import escape
    from rich.table import Table
    from .harness.doctor import checks
    t = Table(title="hytopk doctor")
    for c in ("component", "status", "detail", "fix"):
        t.add_column(c)
    bad_required = False
    for c in checks():
        st = "[green]ok[/]" if c.ok else ("[bold red]MISSING[/]" if c.required else "[yellow]absent[/]")
        bad_required |= c.required and not c.ok
        t.add_row(escape(c.name), st, escape(c.detail), escape(c.fix))   # fixes hold [extras]: not markup
    console.print(t)
    if bad_required:
        raise typer.Exit(1)


@app.command()
def compare(
    preset: Optional[str] = typer.Option(None, help="tiny | dsv32-32k | dsv32-128k | glm5-128k | glm5-256k-allkeys | "
                                                     "dsv32-1m (default: tiny on CPU, dsv32-128k on a GPU)"),
    stage: Optional[List[str]] = typer.Option(None, help="only these stages (repeatable)"),
    variant: Optional[List[str]] = typer.Option(None, help="only these variants, as the table prints them: a name "
                                                          "(every row of it) or name[source] (that row); repeatable; "
                                                          "winners are not updated"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the results JSON here"),
    plot: Optional[Path] = typer.Option(None, help="write the PNG plot here (default: next to --json)"),
    repeats: Optional[int] = typer.Option(None, help="timed repeats per row (default: until the median is known "
                                                     "to 2% on CPU / 1% on GPU or the row's time budget ends)"),
    record_winners: bool = typer.Option(True, "--winners/--no-winners", help="record the winners file"),
    family: Optional[List[str]] = typer.Option(None, help="only these families (reference, numba, cupy; repeatable)"),
    budget: Optional[float] = typer.Option(None, help="seconds for the per-stage rows; later ones are skipped "
                                                     "(pipelines and baselines always run). Default: 50 on a "
                                                     "GPU preset, none on tiny; 'inf' for no limit"),
    exclude: Optional[List[str]] = typer.Option(None, help="skip stage variants and score-only floors whose name "
                                                           "contains this, or matches it as a regular expression "
                                                           "(repeatable; pipelines still run), e.g. --exclude simt "
                                                           "on glm5-256k-allkeys, --exclude 'wgmma$'"),
):
    """Check, then time every variant of each stage, the pipelines and the baselines, side by side."""
    from .harness import report, winners
    from rich.markup import escape
    from .harness.compare import check_run_args, run_compare
    record = record_winners and not variant and not family and not exclude
    # everything that can be wrong with the arguments is found before the comparison starts
    try:
        check_run_args(repeats, budget)
        json_path, plot = _outputs(json_path, plot)
    except ValueError as e:
        _fail(e)
    if record:
        try:
            winners.check_recordable()
        except ValueError as e:
            _fail(f"{e} (or run with --no-winners)")
    try:
        res = run_compare(preset, stage, variant, repeats, say=lambda m: console.print(f"[cyan]{escape(m)}[/]"),
                          progress_factory=_progress(console, "compare"), families=family or None, budget_s=budget,
                          exclude=exclude or ())
    except ValueError as e:
        _fail(e)
    console.print(report.compare_table(res))
    by_reason = {}
    for s in res.skipped:
        by_reason.setdefault(s["reason"], []).append(s["name"])
    for reason, names in by_reason.items():
        console.print(f"[yellow]skipped {len(names)}:[/] {escape(', '.join(names))} — {escape(reason)}")
    for n in res.notes:
        console.print(f"[cyan]note:[/] {escape(n)}")
    wrong = [r for r in res.rows if r.correct is False]
    console.print(f"compare took {res.wall_s:.1f} s (wall, inputs and oracle included)")
    try:                     # checked before the run; a file system that changed since still gets one line
        if json_path:
            console.print(f"results: {report.write_json(res.to_json(), json_path)}")
        if plot:
            console.print(f"plot: {report.compare_plot(res, plot)}")
        if record:
            p = winners.record(res.preset, res.device, res.environment["gpu"].get("name"),
                               res.environment["git_commit"], res.environment["date"], res.winners,
                               stages_run=stage or None)
            console.print(f"winners: {p}")
    except (OSError, ValueError) as e:
        _fail(f"writing the results failed: {e}", 1)
    if variant or family or exclude:
        console.print("winners not updated (--variant/--family/--exclude compare a subset)")
    if wrong:
        console.print(f"[bold red]{len(wrong)} row(s) wrong:[/] " + escape(", ".join(r.label for r in wrong)))
        raise typer.Exit(1)


@app.command("winners")
def show_winners(path: Optional[Path] = typer.Option(None, help="winners file (default: $HYTOPK_WINNERS or the cache)")):
    """Show the recorded fastest correct variant per stage for each preset."""
    from .harness import winners
    try:
        data = winners.read(path)
    except ValueError as e:
        _fail(e)
    if not data["entries"]:
        console.print(f"no winners recorded yet in {path or winners.path()}: run `hytopk compare`")
        return
    console.print(winners.table(data, path))


@app.command()
def calibrate(
    n: int = typer.Option(None, help="queries per draw (default 64 on CPU, 4096 on GPU)"),
    L: int = typer.Option(None, "--L", help="keys (default 16384 on CPU, 131072 on GPU)"),
    k: int = typer.Option(None, help="k (default 64 on CPU, 2048 on GPU)"),
    draws: int = typer.Option(2, help="independent draws per setting"),
    family: Optional[List[str]] = typer.Option(None, help="score families (default: all)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the rates here"),
    plot: Optional[Path] = typer.Option(None, help="write the plot here (default: next to --json)"),
    quick: bool = typer.Option(False, help="fewer settings (CI)"),
):
    """Failure rates (overflow, underflow, fallback) vs oversample, capacity and sample-count bounds."""
    from rich.markup import escape
    from .harness import calibrate as cal
    from .harness import report
    try:
        json_path, plot = _outputs(json_path, plot)
        out = cal.run(n=n, L=L, k=k, draws=draws, families=family or None, quick=quick,
                      say=lambda m: console.print(f"[cyan]{escape(m)}[/]"), progress_factory=_progress(console, "calibrate"))
    except ValueError as e:
        _fail(e)
    console.print(cal.table(out))
    try:
        if json_path:
            console.print(f"results: {report.write_json(out, json_path)}")
        if plot:
            console.print(f"plot: {report.calibrate_plot(out, plot)}")
    except OSError as e:
        _fail(f"writing the results failed: {e}", 1)


@app.command()
def watch(
    stage: Optional[str] = typer.Option(None, help="only re-check this stage"),
    kernels_dir: Optional[Path] = typer.Option(None, help="CUDA sources to watch (default: kernels_cuda/)"),
    numba_dir: Optional[Path] = typer.Option(None, help="Numba variant modules to watch (default: workbench/families/numba/)"),
    poll: bool = typer.Option(False, help="poll instead of using watchdog"),
):
    """On every save: recompile / re-import, re-check against the reference, re-time, print the change."""
    from .harness import watch as W
    try:
        loop = W.WatchLoop(stage=stage, say=console.print)
        dirs = W.default_dirs(kernels_dir, numba_dir)
    except ValueError as e:
        _fail(e)
    console.print(f"watching {', '.join(str(d) for d in dirs)} (Ctrl-C to stop)")
    try:
        W.run_forever(loop, dirs, poll=poll, say=console.print)
    except KeyboardInterrupt:
        console.print("stopped")


@app.command("compile-check", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compile_check(ctx: typer.Context):
    """Compile every kernels_cuda/ source for sm_90 without a GPU (workbench.compile_check)."""
    try:
        from . import compile_check as cc
    except ImportError as e:
        console.print(f"[red]compile-check is not available here:[/] workbench.compile_check is missing ({e})")
        raise typer.Exit(2)
    rc = cc.main(list(ctx.args))
    raise typer.Exit(rc or 0)


def main(argv=None):
    """Entry point of the `hytopk` script."""
    try:
        app(args=argv, prog_name="hytopk")
    except SystemExit as e:
        if e.code not in (0, None) or argv is None:
            raise
