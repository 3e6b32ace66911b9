"""Starting the ranks: a torchrun-compatible environment, spawned locally.

The worker reads the same variables torchrun sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so ``torchrun --nproc-per-node N -m
workbench.distributed worker ...`` and our own ``spawn`` run the same code.
``spawn`` starts N subprocesses with a rendezvous on 127.0.0.1 and a free
port, stops the others as soon as one rank fails, and kills them all after
the timeout.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]       # repository root (holds reference/ and workbench/)

# Multi-GPU hosts here must not use NVLink multicast (NVLS) or symmetric-memory multicast.
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker_args: list, world_size: int, *, backend: str, timeout_s: float, log_dir: Path,
          on_wait=None):
    """Run ``python -m workbench.distributed worker *worker_args`` as ``world_size`` ranks.

    Returns (returncodes, log texts). A rank still running at the timeout, or
    after another rank failed, is killed and reported with return code None.
    ``on_wait(line)`` is called about once a second while the ranks run, with the last line
    rank 0 has logged (its progress).
    """
    port = free_port()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // world_size)
    procs, logs = [], []
    for rank in range(world_size):
        env = dict(os.environ)
        env.update(GPU_ENV)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                   RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
        if backend == "gloo":           # ranks share the CPU cores: no oversubscribed BLAS pools
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                env.setdefault(var, str(threads))
        log = open(log_dir / f"rank{rank}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "workbench.distributed", "worker", *worker_args],
                                      cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    codes = [None] * world_size
    next_report = time.monotonic() + 1.0
    try:
        while any(c is None for c in codes):
            for i, p in enumerate(procs):
                if codes[i] is None:
                    codes[i] = p.poll()
            if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
                break
            if on_wait is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + 1.0
                on_wait(last_line(log_dir / "rank0.log"))
            time.sleep(0.05)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
                p.wait()
                codes[i] = None
            else:
                codes[i] = p.returncode
        for log in logs:
            log.close()
    texts = [(log_dir / f"rank{r}.log").read_text(errors="replace") for r in range(world_size)]
    return codes, texts


def last_line(path: Path, tail: int = 4096) -> str:
    """The last non-empty line of a log file ('' if none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""
    except OSError:
        return ""


BACKENDS = ("gloo", "nccl", "gloo-cuda")
DEVICE_ENV = "HYTOPK_CP_DEVICE"          # the rank's device under gloo-cuda (read by comm.default_device)


def init_from_env(backend: str, timeout_s: float = 300.0):
    """init_process_group from torchrun-style variables; pins rank -> GPU for NCCL. ``gloo-cuda``:
    gloo between ranks whose data live on CUDA devices (rank r on GPU r mod count, so several
    ranks may share one GPU, which NCCL refuses; transfers are staged through the host)."""
    import torch
    import torch.distributed as dist
    for var, value in GPU_ENV.items():
        os.environ.setdefault(var, value)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    kwargs = {}
    if backend == "gloo-cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'gloo-cuda' needs a CUDA GPU; none is visible (use --backend gloo on CPU)")
        local %= torch.cuda.device_count()
        torch.cuda.set_device(local)
        os.environ[DEVICE_ENV] = f"cuda:{local}"
        try:
            import cupy
            cupy.cuda.Device(local).use()
        except ImportError:
            pass
        backend = "gloo"
    elif backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs CUDA GPUs; none is visible (use --backend gloo on CPU)")
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} GPUs are visible")
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
        try:                            # the ring's transfers: a high-priority NCCL stream
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = True
            kwargs["pg_options"] = opts
        except (AttributeError, TypeError):
            pass
        try:                            # CuPy keeps its own current device
            import cupy
            cupy.cuda.Device(local).use()
        except ImportError:
            pass
    elif backend != "gloo":
        raise ValueError(f"argument 'backend': expected one of {BACKENDS}, got {backend!r}")
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s), **kwargs)
    return rank, world
