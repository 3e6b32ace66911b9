"""Device building blocks shared by every Numba stage kernel.

* the contract's order key (docs/CONTRACT.md §2) and its inverse, as integer math;
* the ONE indexer scoring routine: filter, dense, recovery and replay all call
  `indexer_score`, so their scores agree bit for bit within this family;
* score sources as device functions (`table_score`, `indexer_at`) with one
  argument shape (a, b, c, t, s), so a kernel is written once and built per source;
* the two flavours of thread cooperation (block: shared-memory atomics; warp: warp
  intrinsics) as interchangeable device functions, and the block-wide 8-bit MSB-first
  radix select built per flavour;
* launch helpers: block size, stream choice (PyTorch's current stream), fills.

Order keys are carried as int64 in [0, 2**32) inside kernels: plain integer
compares, no unsigned wrap-around surprises in either the GPU or the simulator.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import config, cuda

SIM = bool(config.ENABLE_CUDASIM)
if SIM:
    # The simulator runs a block as one Python thread per CUDA thread, and every syncthreads waits
    # for all of them to take the GIL in turn: at the default 5 ms switch interval a select kernel
    # spends seconds per block in barriers. A 0.2 ms interval makes simulated kernels ~6x faster.
    sys.setswitchinterval(min(sys.getswitchinterval(), 2e-4))


def _lock_simulator_shared_arrays():
    """The simulator hands a block's shared arrays out by the (file, line) that allocates them with an
    unlocked look-up-then-store (numba-cuda kernelapi.FakeCUDAShared.array): two threads of a block
    that reach the line together can each create and keep their own array, so a value one writes is
    never seen by the other (a CI run read an index -2147483648 from such a copy, another got a wrong
    row). The same look-up under a lock. The caller's frame is read here as there, so allocations
    keep their keys (a wrapper would move every key to its own line)."""
    import threading
    import traceback
    try:
        from numba.cuda.simulator import kernelapi as K
    except ImportError:             # a numba-cuda without this simulator module: leave it as it is
        return
    if getattr(K.FakeCUDAShared.array, "_hytopk_locked", False):
        return
    try:                            # the simulator's own types (numba-cuda), else numba's
        from numba.cuda import types
        from numba.cuda.np import numpy_support
    except ImportError:
        from numba.core import types
        from numba.np import numpy_support
    original, lock = K.FakeCUDAShared.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0 or not hasattr(self, "_allocations"):
            return original(self, shape, dtype, alignment)      # errors and dynamic shared memory: as before
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res
    array._hytopk_locked = True
    K.FakeCUDAShared.array = array


if SIM:
    _lock_simulator_shared_arrays()
RADIX = 256
BLOCK = 32 if SIM else 256          # threads per block (simulator: one Python thread each)
WARPS = BLOCK // 32
WARP_BINS = WARPS * 256            # per-warp digit counts (select.warp)
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-np.inf)
NAN_BITS = 0x7FC00000
SIGN = 0x80000000
LOW32 = 0xFFFFFFFF

# ---------------------------------------------------------------- bit casts
if SIM:
    @cuda.jit(device=True)
    def f32_bits(x):
        """float32 -> its bit pattern as a non-negative int."""
        return int(np.float32(x).view(np.uint32))

    @cuda.jit(device=True)
    def bits_f32(b):
        """bit pattern (0 <= b < 2**32) -> float32."""
        return np.uint32(b).view(np.float32)
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def f32_bits(x):
        return np.int64(libdevice.float_as_int(np.float32(x))) & LOW32

    @cuda.jit(device=True)
    def bits_f32(b):
        return libdevice.int_as_float(np.int32(b))


@cuda.jit(device=True)
def order_key(x):
    """Order key of a float32 score (bigger = better); NaN -> 0, -0.0 -> key(+0.0)."""
    if x != x:
        return 0
    b = f32_bits(x)
    if b == SIGN:
        return SIGN
    if b >= SIGN:
        return LOW32 - b
    return b + SIGN


@cuda.jit(device=True)
def key_value(key):
    """A float32 whose order key is ``key`` (key 0 -> NaN)."""
    if key == 0:
        return bits_f32(NAN_BITS)
    if key >= SIGN:
        return bits_f32(key - SIGN)
    return bits_f32(LOW32 - key)


# ---------------------------------------------------------------- scores
@cuda.jit(device=True)
def indexer_score(qrow, wrow, keys, s, H, D):
    """I = sum_h w[h] * relu(q[h] . keys[s]) in float32, h then d in order.

    ``qrow`` is one query flattened to [H*D] (global or shared memory), ``wrow``
    its [H] weights. NaN dots propagate like the reference's np.maximum."""
    acc = np.float32(0.0)
    for h in range(H):
        dot = np.float32(0.0)
        base = h * D
        for d in range(D):
            dot += qrow[base + d] * keys[s, d]
        if not (dot > np.float32(0.0)) and dot == dot:
            dot = np.float32(0.0)
        acc += wrow[h] * dot
    return acc


@cuda.jit(device=True)
def indexer_score_ks(qrow, wrow, keys, s, H, scaled):
    """``indexer_score`` on keys [L, D] (scaled = 0), or on packed fp8 keys [L, D + 1] whose
    last column is the key's scale (scaled = 1): kscale[s] * sum_h w[h] * relu(q[h] . keys[s]),
    the scale applied after the head sum (reference.dtypes)."""
    D = keys.shape[1] - scaled
    acc = indexer_score(qrow, wrow, keys, s, H, D)
    if scaled:
        acc = acc * keys[s, D]
    return acc


@cuda.jit(device=True)
def table_score(a, b, c, t, s):
    """Table source: a = scores[n, L]; b, c unused."""
    return a[t, s]


@cuda.jit(device=True)
def indexer_at(a, b, c, t, s):
    """Indexer source: a = q flattened [n, H*D], b = w [n, H], c = keys [L, D]."""
    return indexer_score(a[t], b[t], c, s, b.shape[1], c.shape[1])


@cuda.jit(device=True)
def indexer_at_fp8(a, b, c, t, s):
    """fp8 indexer source: a = q values flattened [n, H*D], b = w [n, H], c = packed keys [L, D+1]
    (decoded e4m3 values, then the key's float32 scale)."""
    return indexer_score_ks(a[t], b[t], c, s, b.shape[1], 1)


SCORE_FNS = {"table": table_score, "indexer": indexer_at, "indexer_fp8": indexer_at_fp8}


# ---------------------------------------------------------------- flavours
# How the threads of a block cooperate. Every kernel with more than one variant is written once
# and built per flavour by its module's factory (like the score sources above):
#   block: shared-memory atomics and syncthreads only (runs in the CUDA simulator);
#   warp:  warp intrinsics (match_any, ballot, shuffles): GPU only.
# Each flavour supplies the same four device functions, called by every thread of the block.

@cuda.jit(device=True)
def block_hist_add(hist, d, active):
    """Histogram add: one shared-memory atomic per active entry."""
    if active:
        cuda.atomic.add(hist, d, 1)


@cuda.jit(device=True)
def warp_hist_add(hist, d, active):
    """Warp-aggregated histogram add: one atomic per distinct digit per warp."""
    key = d if active else RADIX
    peers = cuda.match_any_sync(FULL_MASK, key)
    leader = cuda.ffs(peers) - 1
    if active and cuda.laneid == leader:
        cuda.atomic.add(hist, d, cuda.popc(peers))


@cuda.jit(device=True)
def pick_digit(hist, remaining, largest):
    """Scan 256 bins best-first; return (digit, count of entries before it)."""
    before = 0
    for j in range(RADIX):
        d = RADIX - 1 - j if largest else j
        h = hist[d]
        if before + h >= remaining:
            return d, before
        before += h
    return 0, before


@cuda.jit(device=True)
def block_pick(hist, largest, state, shift, prefix):
    """Thread 0 scans the bins best-first; state = (prefix with the digit, still needed)."""
    if cuda.threadIdx.x == 0:
        d, before = pick_digit(hist, state[1], largest)
        state[1] = state[1] - before
        state[0] = prefix | (d << shift)


@cuda.jit(device=True)
def warp_pick(hist, largest, state, shift, prefix):
    """Warp 0 scans the bins (8 per lane, shuffle prefix sums); the lane holding the digit records it."""
    if cuda.threadIdx.x >= 32:
        return
    remaining = state[1]
    lane = cuda.laneid
    local = 0
    for j in range(8):
        b = lane * 8 + j
        local += hist[RADIX - 1 - b if largest else b]
    incl = local
    for o in (1, 2, 4, 8, 16):
        v = cuda.shfl_up_sync(FULL_MASK, incl, o)
        if lane >= o:
            incl += v
    hit = cuda.ballot_sync(FULL_MASK, incl >= remaining)
    if lane == cuda.ffs(hit) - 1:
        before = incl - local
        for j in range(8):
            b = lane * 8 + j
            d = RADIX - 1 - b if largest else b
            h = hist[d]
            if before + h >= remaining:
                state[1] = remaining - before
                state[0] = prefix | (np.int64(d) << shift)
                break
            before += h


@cuda.jit(device=True)
def block_reserve(counter, c, n, local):
    """Reserve ``n`` consecutive slots of counter[c] for this thread; returns the first (meaningless
    when n = 0). Every thread of the block calls it: slots are handed out in shared memory
    (``local``, 2 ints), then one atomic on counter per block."""
    if cuda.threadIdx.x == 0:
        local[0] = 0
    cuda.syncthreads()
    slot = 0
    if n > 0:
        slot = cuda.atomic.add(local, 0, n)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and local[0] > 0:
        local[1] = cuda.atomic.add(counter, c, local[0])
    cuda.syncthreads()              # the next call writes local[0] only: local[1] is safe to read now
    return np.int64(local[1]) + slot


@cuda.jit(device=True)
def warp_reserve(counter, c, n, local):
    """The same with one atomic on counter per warp: an inclusive shuffle scan of n over the
    lanes (``local`` unused)."""
    lane = cuda.laneid
    incl = n
    for o in (1, 2, 4, 8, 16):
        v = cuda.shfl_up_sync(FULL_MASK, incl, o)
        if lane >= o:
            incl += v
    total = cuda.shfl_sync(FULL_MASK, incl, 31)
    base = 0
    if lane == 0 and total > 0:
        base = cuda.atomic.add(counter, c, total)
    base = cuda.shfl_sync(FULL_MASK, base, 0)
    return np.int64(base) + incl - n


@cuda.jit(device=True)
def block_tile_rank(d, valid, offs, scratch):
    """Stable destination offs[d] + (entries of digit d earlier in this tile of blockDim entries)
    of this thread's entry; offs advances past the tile. The tile's digits sit in shared memory
    (``scratch``, BLOCK ints) and each thread counts its equals."""
    tid = cuda.threadIdx.x
    scratch[tid] = d if valid else -1
    cuda.syncthreads()
    before = 0
    after = 0
    off = 0
    if valid:
        for j in range(cuda.blockDim.x):
            if scratch[j] == d:
                if j < tid:
                    before += 1
                elif j > tid:
                    after += 1
        off = offs[d] + before
    cuda.syncthreads()
    if valid and after == 0:            # the last of its digit in this tile
        offs[d] += before + 1
    cuda.syncthreads()
    return off


@cuda.jit(device=True)
def warp_tile_rank(d, valid, offs, scratch):
    """The same from match_any_sync ranks and per-warp digit counts (``scratch``, WARP_BINS ints)."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    warp = tid // 32
    for i in range(tid, WARP_BINS, nt):
        scratch[i] = 0
    cuda.syncthreads()
    peers = cuda.match_any_sync(FULL_MASK, d if valid else RADIX)
    rank = cuda.popc(peers & ((1 << cuda.laneid) - 1))
    if valid and rank == 0:
        scratch[warp * RADIX + d] = cuda.popc(peers)
    cuda.syncthreads()
    off = 0
    if valid:
        off = offs[d] + rank
        for w in range(warp):
            off += scratch[w * RADIX + d]
    cuda.syncthreads()
    for d2 in range(tid, RADIX, nt):
        tot = 0
        for w in range(WARPS):
            tot += scratch[w * RADIX + d2]
        offs[d2] += tot
    cuda.syncthreads()
    return off


class Flavour(NamedTuple):
    hist_add: object
    pick: object
    reserve: object
    tile_rank: object
    scratch: int                    # shared int32 scratch that tile_rank needs


FLAVOURS = {
    "block": Flavour(block_hist_add, block_pick, block_reserve, block_tile_rank, BLOCK),
    "warp": Flavour(warp_hist_add, warp_pick, warp_reserve, warp_tile_rank, WARP_BINS),
}


# ---------------------------------------------------------------- radix select (per flavour)
@cuda.jit(device=True)
def select_value(vals, pos, t, i, match_key):
    """The radix-select operand of entry i of row t: its order key when
    match_key < 0, else its position when its key equals match_key.
    Returns (active, value)."""
    kk = order_key(vals[t, i])
    if match_key < 0:
        return True, kk
    if kk == match_key:
        return True, np.int64(pos[t, i]) & LOW32
    return False, 0


@lru_cache(maxsize=None)
def msb_select(flavour: str):
    """The block-wide radix select of one flavour, as a device function."""
    hist_add, pick = FLAVOURS[flavour].hist_add, FLAVOURS[flavour].pick

    @cuda.jit(device=True)
    def select(vals, pos, t, m, rank, largest, match_key, hist, state):
        """The rank-th largest (or smallest) select_value over entries [0, m) of row t, by four
        8-bit MSB-first histogram passes in shared memory. Every thread of the block must call
        it. Returns (value, still-needed count among the entries equal to it)."""
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        if tid == 0:
            state[0] = 0
            state[1] = rank
        for p in range(4):
            shift = 24 - 8 * p
            hmask = 0 if p == 0 else (1 << 32) - (1 << (shift + 8))
            for i in range(tid, RADIX, nt):
                hist[i] = 0
            cuda.syncthreads()
            prefix = state[0]
            for base in range(0, m, nt):        # every thread in every round: warp flavours vote
                i = base + tid
                act = False
                d = 0
                if i < m:
                    a, v = select_value(vals, pos, t, i, match_key)
                    if a and (v & hmask) == prefix:
                        act = True
                        d = (v >> shift) & 255
                hist_add(hist, d, act)
            cuda.syncthreads()
            pick(hist, largest, state, shift, prefix)
            cuda.syncthreads()
        value = state[0]
        need = state[1]
        cuda.syncthreads()          # everyone has read state before it is reused
        return value, need
    return select


@cuda.jit(device=True)
def sort_digit(vals, pos, t, slot, p):
    """Digit p (0..7) of the LSD sort word (pos, ~key): positions first."""
    if p < 4:
        w = np.int64(pos[t, slot]) & LOW32
        shift = 8 * p
    else:
        w = LOW32 - order_key(vals[t, slot])
        shift = 8 * (p - 4)
    return (w >> shift) & 255


@cuda.jit(device=True)
def keep_entry(vals, pos, t, i, kstar, pstar):
    """Is entry i among the exact top-k? (kstar < 0: keep everything)."""
    if kstar < 0:
        return True
    kk = order_key(vals[t, i])
    return kk > kstar or (kk == kstar and pos[t, i] <= pstar)


@cuda.jit(device=True)
def write_rank_order(vals, pos, t, src, nk, k, out_idx, out_val, orow):
    """out[orow, j] = entry src[t, j] for j < nk, padding (-1, -inf) after."""
    for j in range(cuda.threadIdx.x, k, cuda.blockDim.x):
        if j < nk:
            slot = src[t, j]
            out_idx[orow, j] = pos[t, slot]
            out_val[orow, j] = vals[t, slot]
        else:
            out_idx[orow, j] = -1
            out_val[orow, j] = NEG_INF


# ---------------------------------------------------------------- small kernels
@cuda.jit
def fill_1d(a, v):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = v


@cuda.jit
def fill_2d(a, v):
    i, j = cuda.grid(2)
    if i < a.shape[0] and j < a.shape[1]:
        a[i, j] = v


@cuda.jit
def scatter_rows_kernel(dst_idx, dst_val, rows, src_idx, src_val):
    """dst[rows[j], :] = src[j, :]; rows outside dst are ignored."""
    j, c = cuda.grid(2)
    if j < rows.shape[0] and c < src_idx.shape[1]:
        r = rows[j]
        if 0 <= r < dst_idx.shape[0] and c < dst_idx.shape[1]:
            dst_idx[r, c] = src_idx[j, c]
            dst_val[r, c] = src_val[j, c]


# ---------------------------------------------------------------- launch helpers
_EXTERNAL = {}


def stream():
    """The stream to launch on: PyTorch's current stream when torch has touched
    CUDA in this process (so torch tensors see our writes in order), else the
    default stream. Read at every launch."""
    if SIM:
        return cuda.default_stream()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        ptr = torch.cuda.current_stream().cuda_stream
        if ptr:
            s = _EXTERNAL.get(ptr)
            if s is None:
                s = _EXTERNAL[ptr] = cuda.external_stream(ptr)
            return s
    return cuda.default_stream()


def blocks(total, per):
    return max(1, (int(total) + per - 1) // per)


def empty(shape, dtype, s=None):
    return cuda.device_array(shape, dtype=dtype, stream=s or stream())


def full(shape, dtype, value, s=None):
    s = s or stream()
    a = cuda.device_array(shape, dtype=dtype, stream=s)
    if a.size == 0:
        return a
    v = np.dtype(dtype).type(value)
    if a.ndim == 1:
        fill_1d[blocks(shape[0], BLOCK), BLOCK, s](a, v)
    else:
        fill_2d[(blocks(shape[0], 8), blocks(shape[1], 32)), (8, 32), s](a, v)
    return a


def host(a, s=None):
    """Copy a device array to host and wait for it."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    s = s or stream()
    h = a.copy_to_host(stream=s)
    s.synchronize()
    return h


def source_args(source):
    """(a, b, c, kind) device-function arguments for a TableSource / IndexerSource."""
    fields = getattr(source, "_fields", ())
    if fields == ("scores",):
        d = _dummy()
        return source.scores, d, d, "table"
    if fields == ("q", "w", "keys"):
        n, H, D = source.q.shape
        return source.q.reshape(n, H * D), source.w, source.keys, "indexer"
    if fields == ("q", "w", "keys", "kscale"):          # Fp8IndexerSource of decoded float32 values
        n, H, D = source.q.shape
        return source.q.reshape(n, H * D), source.w, pack_scaled_keys(source.keys, source.kscale), "indexer_fp8"
    raise TypeError(f"argument 'source' must be a TableSource, IndexerSource or Fp8IndexerSource, "
                    f"got {type(source).__name__}")


@cuda.jit
def _pack_kernel(keys, ks, out):
    s, d = cuda.grid(2)
    if s < out.shape[0] and d < out.shape[1]:
        if d < keys.shape[1]:
            out[s, d] = keys[s, d]
        else:
            out[s, d] = ks[s]


def pack_scaled_keys(keys, kscale, s=None):
    """keys [L, D] float32 (decoded e4m3 values) and kscale [L] -> one [L, D + 1] device array whose
    last column is the scale: the fp8 source in the (a, b, c) shape of every score function."""
    s = stream() if s is None else s
    L, D = (int(x) for x in keys.shape)
    out = cuda.device_array((L, D + 1), np.float32, stream=s)
    if L:
        _pack_kernel[(blocks(L, 8), blocks(D + 1, 32)), (8, 32), s](keys, kscale, out)
    return out


_DUMMY = []


def _dummy():
    if not _DUMMY:
        _DUMMY.append(cuda.to_device(np.zeros((1, 1), np.float32)))
    return _DUMMY[0]


def source_dims(source):
    """(n, L) of a source."""
    return tuple(int(x) for x in source.shape)
