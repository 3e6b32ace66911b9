"""CLI: ``python -m workbench.distributed {selftest,bench,worker}`` (see --help)."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from .launch import BACKENDS


EXAMPLE_VARIANT = "select=cupy.select.radix_bitonic"      # tests/test_progress_and_names.py: it exists
GLOO_MAX_GFLOP = 5.0       # one scoring pass on gloo (the NumPy reference, ~0.1 GFLOP/s): about a minute
GLOO_SMALL = "--n 64 --L 4096 --H 4 --D 16 --k 32"
PRESETS = ("full128k-bf16", "causal1m-bf16", "causal1m-fp8")      # bench.PROBLEMS (torch-free import here)
PROBLEM_CHOICES = PRESETS + ("targets", "custom")
LAYOUTS = ("full", "causal", "causal_tail")


def _parser():
    ap = argparse.ArgumentParser(prog="python -m workbench.distributed",
                                 description="Context-parallel HyTopK over torch.distributed.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    st = sub.add_parser("selftest", help="spawn the ranks and check CP == single process, bit for bit")
    st.add_argument("--backend", choices=BACKENDS, default="gloo",
                    help="gloo (CPU), nccl (one GPU per rank) or gloo-cuda (ranks on GPUs over gloo; "
                         "several may share one GPU)")
    st.add_argument("--world-size", type=int, default=2)
    st.add_argument("--family", default=None, help="stage family (default: reference on gloo, cupy on GPUs)")
    st.add_argument("--full", action="store_true", help="every score family, not the quick subset")
    st.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    st.add_argument("--variant", action="append", default=[], metavar="STAGE=NAME",
                    help=f"pick a stage variant of the family, e.g. {EXAMPLE_VARIANT} with --family cupy (repeatable)")

    be = sub.add_parser("bench", help="time CP HyTopK on N GPUs against the single-GPU pipeline (one run)")
    be.add_argument("--world-size", type=int, default=2)
    be.add_argument("--json", type=Path, default=None,
                    help="write the results here (default: results/cp_bench_<family>_ws<N>.json)")
    be.add_argument("--family", default=None, help="stage family (default: cupy on GPUs, reference on gloo)")
    be.add_argument("--backend", choices=BACKENDS, default="nccl",
                    help="nccl (timings); gloo-cuda (ranks may share one GPU: a correctness check); gloo "
                         "(the reference family, small shapes: smoke-tests the code on a CPU)")
    be.add_argument("--problem", action="append", default=[], choices=PROBLEM_CHOICES,
                    help="a preset problem of the issue-15 targets, 'targets' for all of them, or 'custom' "
                         "(--n/--L/...); repeatable (default: targets on GPUs, custom on gloo)")
    be.add_argument("--n", type=int, default=8192, help="custom: queries in total")
    be.add_argument("--L", type=int, default=131072, help="custom: keys in total")
    be.add_argument("--H", type=int, default=64)
    be.add_argument("--D", type=int, default=128)
    be.add_argument("--k", type=int, default=2048)
    be.add_argument("--layout", default="full", choices=LAYOUTS,
                    help="custom: full, causal (queries strided over a causal sequence) or causal_tail")
    be.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "fp8"),
                    help="custom: indexer input dtype (bfloat16 / fp8: the tensor-core stage sets)")
    be.add_argument("--sharding", default="zigzag", choices=("zigzag", "contiguous"))
    be.add_argument("--repeats", type=int, default=5)
    be.add_argument("--profile", action="store_true",
                    help="GPUs: add a kernel profile (torch.profiler) of one CP call on rank 0 and of one "
                         "single-GPU pipeline call to each problem's record")
    be.add_argument("--timeout", type=float, default=600.0)
    be.add_argument("--force", action="store_true",
                    help=f"run gloo on shapes over {GLOO_MAX_GFLOP:.0f} GFLOP per scoring pass anyway (hours)")
    be.add_argument("--variant", action="append", default=[], metavar="STAGE=NAME",
                    help=f"pick a stage variant of the family, e.g. {EXAMPLE_VARIANT} (repeatable)")

    tr = sub.add_parser("train", help="spawn the ranks and check DSA training under CP == one process")
    tr.add_argument("--backend", choices=BACKENDS, default="gloo")
    tr.add_argument("--world-size", type=int, default=2)
    tr.add_argument("--family", default=None, help="CP stage family (default: reference on gloo; on GPUs "
                                                     "the family of the single-process op's dispatch)")
    tr.add_argument("--timeout", type=float, default=300.0)

    wk = sub.add_parser("worker", help="one rank (torchrun-style environment); used by selftest/bench")
    wk.add_argument("--job", choices=("selftest", "bench", "train"), required=True)
    wk.add_argument("--backend", choices=BACKENDS, default="gloo")
    wk.add_argument("--family", default=None)
    wk.add_argument("--out", type=Path, default=None,
                    help="folder for rank 0's JSON record (default: rank 0 prints a report)")
    wk.add_argument("--full", action="store_true")
    wk.add_argument("--bench", default="{}", help="bench parameters as JSON (set by 'bench')")
    wk.add_argument("--variant", action="append", default=[], metavar="STAGE=NAME")
    return ap


def _variants(args) -> dict:
    out = {}
    for item in args.variant:
        stage, sep, name = item.partition("=")
        if not sep or not stage or not name:
            raise SystemExit(f"argument --variant: expected STAGE=NAME, got {item!r}")
        out[stage] = name
    return out


def _variant_args(args) -> list:
    return [a for item in args.variant for a in ("--variant", item)]


def _family(args):
    return args.family or ("reference" if args.backend == "gloo" else "cupy")     # nccl, gloo-cuda: GPUs


def cmd_worker(args) -> int:
    """One rank. With --out (set by selftest/bench) rank 0 writes the job's JSON there and the
    launcher reports; without it (torchrun) rank 0 prints the report and sets the exit code."""
    from .launch import init_from_env
    rank, world = init_from_env(args.backend)
    import torch.distributed as dist
    rc = 0
    try:
        if args.job == "selftest":
            from .selftest import run_worker, summarize
            mine = run_worker(_family(args), quick=not args.full, variants=_variants(args))
            parts = [None] * world if rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
            record = {"records": [r for part in parts for r in part]} if rank == 0 else None
            if rank == 0 and args.out is None:
                ok, text = summarize(record["records"], world, args.backend, _family(args))
                print(text)
                rc = 0 if ok else 1
        elif args.job == "train":
            from .train_check import run_worker as train_worker
            from .train_check import summarize as train_summary
            mine = train_worker(args.family)
            parts = [None] * world if rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
            record = {"records": [r for part in parts for r in part]} if rank == 0 else None
            if rank == 0 and args.out is None:
                ok, text = train_summary(record["records"], world, args.backend)
                print(text)
                rc = 0 if ok else 1
        else:
            from .bench import run_worker as bench_worker
            record = bench_worker(_family(args), json.loads(args.bench), variants=_variants(args))
            if rank == 0 and args.out is None:
                print(json.dumps(record, indent=2))
        if rank == 0 and args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.job}.json").write_text(json.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return rc


def _spawned(args, worker_args, world_size, backend, out, on_wait=None):
    from .launch import spawn
    codes, logs = spawn(worker_args + ["--out", str(out)], world_size, backend=backend,
                        timeout_s=args.timeout, log_dir=out, on_wait=on_wait)
    if any(c != 0 for c in codes):
        print(f"FAIL: ranks exited with {codes} (None = killed after a timeout or another rank's failure)")
        for r, (c, text) in enumerate(zip(codes, logs)):
            if c != 0:
                print(f"--- rank {r} (exit {c}), last lines of its log:")
                print("\n".join(text.splitlines()[-25:]))
        return False
    return True


def cmd_selftest(args) -> int:
    from .selftest import summarize
    family = _family(args)
    with tempfile.TemporaryDirectory(prefix="hytopk-cp-") as tmp:
        out = Path(tmp)
        wargs = ["--job", "selftest", "--backend", args.backend, "--family", family] + \
            (["--full"] if args.full else []) + _variant_args(args)
        if not _spawned(args, wargs, args.world_size, args.backend, out):
            return 1
        records = json.loads((out / "selftest.json").read_text())["records"]
    ok, text = summarize(records, args.world_size, args.backend, family)
    print(text)
    return 0 if ok else 1


def problems(args) -> list:
    """The problems to run: presets (bench.PROBLEMS) and/or the custom one from --n/--L/..."""
    from .bench import PROBLEMS, TARGETS
    names = args.problem or (["custom"] if args.backend == "gloo" else ["targets"])
    out = []
    for name in names:
        for one in (TARGETS if name == "targets" else (name,)):
            if one == "custom":
                p = {k: getattr(args, k) for k in ("n", "L", "H", "D", "k", "layout", "sharding", "dtype")}
            else:
                p = dict(PROBLEMS[one])
            out.append(dict(p, name=one, **({"profile": True} if getattr(args, "profile", False) else {})))
    return out


def cmd_train(args) -> int:
    from .train_check import summarize
    with tempfile.TemporaryDirectory(prefix="hytopk-cp-train-") as tmp:
        out = Path(tmp)
        wargs = ["--job", "train", "--backend", args.backend] + (["--family", args.family] if args.family else [])
        if not _spawned(args, wargs, args.world_size, args.backend, out):
            return 1
        records = json.loads((out / "train.json").read_text())["records"]
    ok, text = summarize(records, args.world_size, args.backend)
    print(text)
    return 0 if ok else 1


def gloo_too_big(args, probs) -> str | None:
    """Why a gloo bench would run for hours (None: it will not). gloo runs the NumPy reference on
    the CPU: at most GLOO_MAX_GFLOP per scoring pass of n x L keys."""
    if args.backend != "gloo" or args.force:
        return None
    for p in probs:
        n = p.get("n", p.get("n_per_rank", 0) * args.world_size)
        gflop = 2.0 * n * p["L"] * p["H"] * p["D"] / 1e9
        if gflop > GLOO_MAX_GFLOP:
            return (f"bench --backend gloo runs the {_family(args)} family on the CPU: {p['name']} with n={n} "
                    f"L={p['L']} H={p['H']} D={p['D']} is {gflop:.0f} GFLOP per scoring pass (limit "
                    f"{GLOO_MAX_GFLOP:.0f}), hours of CPU time. Try {GLOO_SMALL}, run on GPUs (--backend nccl), "
                    f"or add --force.")
    return None


def cmd_bench(args) -> int:
    from ..progress import Progress
    from .bench import report
    family = _family(args)
    probs = problems(args)
    why = gloo_too_big(args, probs)
    if why:
        print(why, file=sys.stderr, flush=True)
        return 2
    params = dict(problems=probs, repeats=args.repeats)
    ws = args.world_size
    with tempfile.TemporaryDirectory(prefix="hytopk-cp-bench-") as tmp, Progress(1, "cp bench") as prog:
        out = Path(tmp) / f"ws{ws}"
        wargs = ["--job", "bench", "--backend", args.backend, "--family", family,
                 "--bench", json.dumps(params)] + _variant_args(args)
        if not _spawned(args, wargs, ws, args.backend, out,
                        on_wait=lambda line: prog.tick(f"{ws} rank(s): {line or 'starting'}")):
            return 1
        record = json.loads((out / "bench.json").read_text())
        prog.advance(f"{ws} rank(s) done")
    result, text = report(record)
    print(text)
    if args.json is None:
        from .launch import ROOT
        args.json = ROOT / "results" / f"cp_bench_{family}_ws{ws}.json"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0 if result["bitwise_equal"] else 1


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return {"selftest": cmd_selftest, "bench": cmd_bench, "train": cmd_train, "worker": cmd_worker}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
