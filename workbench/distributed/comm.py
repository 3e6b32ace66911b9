"""The two communication patterns of context-parallel HyTopK, on torch.distributed.

* ``exchange``: a sparse all-to-all (rank p sends ``send[o]`` to rank o and
  receives ``recv_counts[o]`` rows from it), used for the sampled keys.
* ``ring_pass``: every key shard visits every rank once. Step j hands the
  shard of rank (me - j) mod P to ``compute`` while the next shard is already
  in flight (isend right / irecv left). On CUDA the transfers are issued from
  a dedicated ring stream: they wait for nothing the compute stream queued
  after the ring began, and the compute stream waits (an event, no host sync)
  only for the shard it is about to use.

A shard is one tensor or a tuple of row-aligned tensors (fp8 keys + their
scales). Tensors travel as their bytes (uint8 views, no copies), so every
input dtype (bf16, fp8 e4m3) goes over gloo as well as NCCL. Both patterns use
batched point-to-point ops, which NCCL and gloo both implement.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def wire(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a uint8 view (same storage): what goes on the wire."""
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


class Comm:
    """Rank, world size and peer numbering of one process group (None = default group)."""

    def __init__(self, group=None, device=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = torch.device(device) if device is not None else default_device()
        self._ring_stream = None

    def ring_stream(self):
        """The CUDA stream the ring's transfers are issued from (None on CPU)."""
        if self.device.type != "cuda":
            return None
        if self._ring_stream is None:
            self._ring_stream = torch.cuda.Stream(self.device)
        return self._ring_stream

    def peer(self, r: int) -> int:
        """Global rank of group rank ``r`` (P2P ops address global ranks)."""
        return r if self.group is None else dist.get_global_rank(self.group, r)

    @property
    def _coll_device(self):
        return torch.device("cpu") if dist.get_backend(self.group) == "gloo" else self.device

    def all_sum(self, value: int) -> int:
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._coll_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return int(t.item())

    def all_gather_counts(self, counts) -> torch.Tensor:
        """[P, P] int64 on the host: row p = the ``counts`` vector of rank p."""
        mine = torch.as_tensor(counts, dtype=torch.int64).to(self._coll_device).reshape(1, -1)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self.group)
        return torch.cat(out).cpu()

    def barrier(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)


def default_device() -> torch.device:
    """CPU for gloo (the rank's GPU under launch's gloo-cuda), the current CUDA device for NCCL."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    import os
    return torch.device(os.environ.get("HYTOPK_CP_DEVICE") or "cpu")


def _staged(comm) -> bool:
    """gloo moves host memory only: CUDA tensors go through host copies."""
    return comm.device.type == "cuda" and dist.get_backend(comm.group) == "gloo"


def _p2p(comm, op, t, peer, staged):
    """A P2POp on t's bytes; staged (gloo + CUDA): on a host copy, returned for a later copy-back."""
    buf = wire(t)
    if staged:
        buf = buf.cpu() if op is dist.isend else torch.empty(buf.shape, dtype=buf.dtype)
    return dist.P2POp(op, buf, peer, comm.group), buf


def exchange(comm: Comm, send: list, recv_shapes: list, dtype) -> list:
    """Sparse all-to-all: send[o] (a tensor, or None for nothing) goes to rank o;
    returns recv[o] of shape recv_shapes[o] from rank o. Empty messages are
    skipped on both sides (both know the sizes), self-messages are copied."""
    me, staged = comm.rank, _staged(comm)
    recv = [torch.empty(tuple(s), dtype=dtype, device=comm.device) for s in recv_shapes]
    ops, back = [], []
    for o in range(comm.world_size):
        if o == me:
            continue
        if send[o] is not None and send[o].numel():
            ops.append(_p2p(comm, dist.isend, send[o].contiguous(), comm.peer(o), staged)[0])
        if recv[o].numel():
            op, buf = _p2p(comm, dist.irecv, recv[o], comm.peer(o), staged)
            ops.append(op)
            back.append((recv[o], buf))
    works = dist.batch_isend_irecv(ops) if ops else []
    if send[me] is not None and recv[me].numel():
        recv[me].copy_(send[me])
    for w in works:
        w.wait()
    if staged:
        for t, buf in back:
            wire(t).copy_(buf)
    return recv


def ring_pass(comm: Comm, shard, shard_rows: list, compute, *, exchange_keys=True, shards=None, events=None):
    """Call ``compute(owner, shard_of_owner)`` once per rank's key shard.

    ``shard`` is a tensor or a tuple of tensors whose first dimension is the
    shard's rows (``compute`` gets the same form). ``shard_rows[o]`` is the row
    count of rank o's shard (known to all: the receive buffers are sized from
    it). With ``exchange_keys`` the next shard travels while ``compute`` runs
    on the current one. For measurements, ``exchange_keys=False`` with
    ``shards`` (every rank's shard, pre-gathered) runs the compute alone, and
    ``compute=None`` runs the transfers alone. ``events`` (a list; CUDA ring
    only): per step, a pair of CUDA events (compute of this step done on the
    compute stream, next shard arrived on the ring stream), preceded by a
    start event: how long the compute stream waited for a transfer
    (``exposed_transfer_s``).
    """
    P, me = comm.world_size, comm.rank
    single = not isinstance(shard, tuple)
    parts = (shard,) if single else tuple(shard)
    right, left = comm.peer((me + 1) % P), comm.peer((me - 1) % P)
    staged = _staged(comm)
    side = comm.ring_stream() if exchange_keys and P > 1 and not staged else None
    main = torch.cuda.current_stream(comm.device) if side is not None else None
    on_side = (lambda: torch.cuda.stream(side)) if side is not None else contextlib.nullcontext
    if side is not None:
        side.wait_stream(main)                      # our own shard is ready
    timing = events is not None and side is not None
    if timing:
        events.append(_event(main))
    cur = parts
    for step in range(P):
        owner = (me - step) % P
        works, nxt = [], None
        if exchange_keys and step < P - 1:
            rows = shard_rows[(me - step - 1) % P]
            with on_side():
                nxt = tuple(torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
                            for t in parts)
                ops, back = [], []
                for c, x in zip(cur, nxt):
                    if c.shape[0]:
                        ops.append(_p2p(comm, dist.isend, c, right, staged)[0])
                    if x.shape[0]:
                        op, buf = _p2p(comm, dist.irecv, x, left, staged)
                        ops.append(op)
                        back.append((x, buf))
                works = dist.batch_isend_irecv(ops) if ops else []
        if compute is not None:
            got = cur if exchange_keys else shards[owner]
            compute(owner, got[0] if single and isinstance(got, tuple) else got)
        if nxt is not None:
            with on_side():
                for w in works:
                    w.wait()                        # the ring stream waits for the transfer
                if staged:
                    for x, buf in back:
                        wire(x).copy_(buf)
            if timing:
                events.append((_event(main), _event(side)))
            if side is not None:
                main.wait_stream(side)              # and the compute stream for the ring stream
                for x in nxt:
                    x.record_stream(main)           # allocated on the ring stream, used on main
            cur = nxt


def _event(stream):
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(stream)
    return ev


def exposed_transfer_s(events):
    """Seconds the compute stream waited for shards (ring_pass ``events``, after a synchronize):
    per step, how far the arrival of the next shard came after the end of that step's compute.
    None when nothing was recorded (no CUDA ring stream: CPU, gloo-cuda, one rank)."""
    if not events:
        return None
    start, total = events[0], 0.0
    for done, arrived in events[1:]:
        total += max(0.0, start.elapsed_time(arrived) - start.elapsed_time(done)) / 1e3
    return total
