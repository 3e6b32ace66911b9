"""Who holds what: the query rows and key pieces of every rank.

A rank holds some query rows (global ids, ascending) and some key *pieces*
(half-open global key ranges). Its key shard is the concatenation of its
pieces, in piece order; that shard is what circulates around the ring.

``zigzag`` cuts queries and keys into 2P chunks and gives rank p chunks p and
2P-1-p, so under causal contexts every rank gets one early (cheap) and one
late (expensive) block of queries and every ring step carries a similar
amount of work. ``contiguous`` cuts them into P blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class Sharding:
    n: int                                   # queries in total
    L: int                                   # keys in total
    query_rows: tuple                        # per rank: int64 array of global query ids
    key_pieces: tuple                        # per rank: tuple of (a, b) global key ranges

    @property
    def world_size(self) -> int:
        return len(self.query_rows)

    def shard_len(self, rank: int) -> int:
        return sum(b - a for a, b in self.key_pieces[rank])

    def piece_offsets(self, rank: int):
        """[(a, b, offset in the shard)] for the pieces of ``rank``."""
        out, off = [], 0
        for a, b in self.key_pieces[rank]:
            out.append((a, b, off))
            off += b - a
        return out

    def owner_of(self, positions) -> np.ndarray:
        """Rank holding each global key position, and its row in that rank's shard."""
        positions = np.asarray(positions, np.int64)
        owner = np.full(positions.shape, -1, np.int64)
        row = np.full(positions.shape, -1, np.int64)
        for p in range(self.world_size):
            for a, b, off in self.piece_offsets(p):
                m = (positions >= a) & (positions < b)
                owner[m], row[m] = p, positions[m] - a + off
        if np.any(owner < 0):
            raise ValueError("a key position is held by no rank (sharding does not cover [0, L))")
        return owner, row

    def take_queries(self, x, rank: int):
        """Rows of a global per-query array (q, w, lo, hi, ...) held by ``rank``."""
        return x[self.query_rows[rank]]

    def take_keys(self, keys, rank: int):
        """The key shard of ``rank`` cut from a global [L, D] array (tests, benchmarks)."""
        parts = [keys[a:b] for a, b in self.key_pieces[rank]]
        if not parts:
            return keys[0:0]
        if hasattr(keys, "new_empty"):                      # torch
            import torch
            return torch.cat(parts).contiguous()
        return np.ascontiguousarray(np.concatenate(parts))


def causal_ranges(n: int, L: int):
    """Causal contexts of n queries evenly strided over a sequence of L keys: query i sits at
    position (i + 1) L / n - 1 (rounded down) and reads keys [0, that + 1); n = L is plain causal
    self-attention (hi = i + 1). With n and L both multiples of 2P, zigzag gives rank p the
    queries of key chunks p and 2P-1-p: every rank the same causal work."""
    if n < 0 or L < 0 or (n > 0 and L < 1):
        raise ValueError(f"arguments 'n'/'L': need n >= 0 and L >= 1, got n={n}, L={L}")
    hi = (np.arange(1, n + 1, dtype=np.int64) * L) // max(n, 1)
    return np.zeros(n, np.int32), np.maximum(hi, 1).astype(np.int32)


def _cuts(total: int, parts: int):
    """parts + 1 boundaries splitting [0, total) as evenly as possible."""
    return [(i * total) // parts for i in range(parts + 1)]


def make_sharding(kind: str, n: int, L: int, world_size: int) -> Sharding:
    """``zigzag`` (causal-balanced) or ``contiguous`` split of n queries and L keys."""
    if kind not in KINDS:
        raise ValueError(f"argument 'kind': unknown sharding {kind!r}; choose from {KINDS}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"argument 'world_size' must be an int >= 1, got {world_size!r}")
    if n < 0 or L < 0:
        raise ValueError(f"arguments 'n'/'L' must be >= 0, got n={n}, L={L}")
    P = world_size
    chunks_of = (lambda p: (p, 2 * P - 1 - p)) if kind == "zigzag" else (lambda p: (p,))
    nchunks = 2 * P if kind == "zigzag" else P
    qc, kc = _cuts(n, nchunks), _cuts(L, nchunks)
    rows, pieces = [], []
    for p in range(P):
        ids = [np.arange(qc[c], qc[c + 1], dtype=np.int64) for c in chunks_of(p)]
        rows.append(np.concatenate(ids))
        pieces.append(tuple((kc[c], kc[c + 1]) for c in chunks_of(p) if kc[c + 1] > kc[c]))
    return Sharding(int(n), int(L), tuple(rows), tuple(pieces))
