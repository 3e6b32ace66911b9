// Table reads shared by table_topk.cu and table_v2.cu (issue 21): how a 16-byte
// vector of a float32 or bf16 table unpacks into float32 score bits, and a thread's
// bounds-checked vector tile.
#pragma once
#include "hytopk_common.cuh"

namespace hytopk {

// CONTRACT.md §3.1 (reference/sampling.py)
constexpr long long SAMPLE_STRIDE = 128, MIN_SAMPLES = 4096, MAX_SAMPLES = 8192;

// How a table's 16-byte vector unpacks into float32 score bits.
template <class Src> struct TableVec;
template <> struct TableVec<TableSource> {
    static constexpr int PER_VEC = 4;
    __device__ static __forceinline__ u32 bits_at(const void* base, long long g) {
        return static_cast<const u32*>(base)[g];
    }
    __device__ static __forceinline__ void unpack(const uint4& v, u32* out) {
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
};
template <> struct TableVec<TableBf16Source> {
    static constexpr int PER_VEC = 8;
    __device__ static __forceinline__ u32 bits_at(const void* base, long long g) {
        return ((u32) static_cast<const unsigned short*>(base)[g]) << 16;
    }
    __device__ static __forceinline__ void unpack(const uint4& v, u32* out) {   // little endian: low half first
        out[0] = v.x << 16; out[1] = v.x & 0xffff0000u; out[2] = v.y << 16; out[3] = v.y & 0xffff0000u;
        out[4] = v.z << 16; out[5] = v.z & 0xffff0000u; out[6] = v.w << 16; out[7] = v.w & 0xffff0000u;
    }
};

// One thread's U vectors of a block-wide step over the flat table. Vectors are
// numbered over the whole table (vector v holds flat elements v*P .. v*P+P-1), so
// a row's [lo, hi) may start and end inside a vector: elements outside [g_lo, g_hi)
// are loaded (when the vector is in bounds) but never count. A vector that would
// reach past the table's end, or any vector of a table whose base is not 16-byte
// aligned, is read element by element, inside [g_lo, g_hi) only.
template <class Src, int U, bool STREAM>
struct VecTile {
    static constexpr int P = TableVec<Src>::PER_VEC;
    u32 bits[U][P];
    long long g0[U];        // flat index of the vector's first element; -1: no vector

    __device__ __forceinline__ void load(const void* base, long long total, int aligned, long long first,
                                         long long stride, long long v_end, long long g_lo, long long g_hi) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long v = first + u * stride;
            const bool have = v < v_end;
            g0[u] = have ? v * P : -1;
            if (have && aligned && (v + 1) * P <= total) {
                const uint4* p = static_cast<const uint4*>(base) + v;
                const uint4 x = STREAM ? __ldcs(p) : __ldg(p);
                TableVec<Src>::unpack(x, bits[u]);
            } else {
#pragma unroll
                for (int e = 0; e < P; ++e) {
                    const long long g = v * P + e;
                    bits[u][e] = (have && g >= g_lo && g < g_hi) ? TableVec<Src>::bits_at(base, g) : 0u;
                }
            }
        }
    }
    __device__ __forceinline__ bool in(int u, int e, long long g_lo, long long g_hi) const {
        const long long g = g0[u] + e;
        return g0[u] >= 0 && g >= g_lo && g < g_hi;
    }
};

// ---- The streaming pieces of table_v2.cu (issue 21, second design) ----

// key(x) >= key(T) (CONTRACT.md §2) on raw float32 bits as at most two unsigned ranges,
// (b - a1) <= s1 || (b - a2) <= s2: two adds and two compares per element instead of
// the order key's six operations (the streaming filter is issue-bound without it).
//   T > 0:     [Tb, +inf]                       (the second range repeats the first)
//   T = +-0:   [+0, +inf] and {-0}
//   T < 0:     [+0, +inf] and [-0, Tb]          (negative bits grow as the score falls)
//   T NaN:     everything (key 0 lets every key through)
// NaN bits (0x7f800001.. and 0xff800001..) lie outside every range but the last.
struct KeyAtLeast {
    u32 a1, s1, a2, s2;
    float t;                                     // T as a float (the one-range test)
    __device__ static KeyAtLeast of(u32 tb) {
        const u32 mag = tb & 0x7fffffffu;
        KeyAtLeast r;
        r.t = __uint_as_float(tb);
        if (mag > 0x7f800000u) { r.a1 = 0u; r.s1 = 0xffffffffu; r.a2 = 0u; r.s2 = 0xffffffffu; }
        else if (mag == 0u) { r.a1 = 0u; r.s1 = 0x7f800000u; r.a2 = 0x80000000u; r.s2 = 0u; }
        else if (tb < 0x80000000u) { r.a1 = tb; r.s1 = 0x7f800000u - tb; r.a2 = tb; r.s2 = 0x7f800000u - tb; }
        else { r.a1 = 0u; r.s1 = 0x7f800000u; r.a2 = 0x80000000u; r.s2 = tb - 0x80000000u; }
        return r;
    }
    __device__ __forceinline__ bool operator()(u32 b) const { return (b - a1) <= s1 || (b - a2) <= s2; }
    // T a positive normal score or +inf (every real top-k's case): one range, and key(b) >= key(T)
    // exactly when b >= T as floats, one compare an element. NaN, -0, +0 and every negative score
    // compare below T, and so does every subnormal (also where the compiler flushes them to zero:
    // CuPy's -ftz=true; hence not for a subnormal T, which takes the two ranges).
    __device__ __forceinline__ bool single() const { return a1 == a2 && s1 == s2 && a1 >= 0x00800000u; }
    template <bool ONE>
    __device__ __forceinline__ bool test(u32 b) const { return ONE ? __uint_as_float(b) >= t : (*this)(b); }
};

// The float32 bits of an order key (its canonical score: -0 -> +0, NaN -> 0xffffffff).
__device__ __forceinline__ u32 bits_of_key(u32 key) { return key >= 0x80000000u ? key ^ 0x80000000u : ~key; }

// Asks the L2 for bytes [p, p + bytes) of global memory: Hopper's bulk prefetch, one instruction
// for a whole step, no registers, nothing to wait for (a hint). It raises the bytes in flight
// per SM above what the registers hold (the fused kernel: 64 KB per block of 512 threads).
// p 16-byte aligned, bytes a multiple of 16. A no-op below sm_90; the CPU emulation checks it.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#elif defined(HYTOPK_CPU_EMULATION)
    emu::check_prefetch(p, bytes);              // tests/table_emulation: inside its row's context
#else
    (void)p;
    (void)bytes;
#endif
}

// The vectors [v, min(v + count, v_stop, total / P)) to the L2 (16 bytes each), by one thread.
__device__ __forceinline__ void prefetch_vectors(const void* table, long long v, long long count, long long v_stop,
                                                 long long total_vecs) {
    const long long e = min(min(v + count, v_stop), total_vecs);
    if (v < e) prefetch_l2(static_cast<const uint4*>(table) + v, (unsigned)((e - v) * 16));
}

// One step of a block stream: this thread's U vectors v0 + u * B of the flat table, their
// score bits, and the mask of elements (bit u * P + e) inside the row's [a, e_rel) (row-relative
// positions) that pass. FULL: the caller knows every vector is inside the row and 16-byte
// loadable (no checks at all: the hot path).
template <class Src, int U, bool FULL, bool ONE>
__device__ __forceinline__ u32 stream_tile(const void* table, long long total, int aligned, long long v0, int B,
                                           long long v_stop, long long row0, int a_rel, int e_rel,
                                           const KeyAtLeast& pass, u32 (&bits)[U][TableVec<Src>::PER_VEC]) {
    constexpr int P = TableVec<Src>::PER_VEC;
    u32 mask = 0u;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long v = v0 + (long long)u * B;
        if (FULL) {
            TableVec<Src>::unpack(__ldcs(static_cast<const uint4*>(table) + v), bits[u]);
#pragma unroll
            for (int e = 0; e < P; ++e) mask |= (u32)pass.template test<ONE>(bits[u][e]) << (u * P + e);
        } else {
            const bool have = v < v_stop;
            const int p0 = (int)(v * P - row0);
            if (have && aligned && (v + 1) * P <= total) {
                TableVec<Src>::unpack(__ldcs(static_cast<const uint4*>(table) + v), bits[u]);
            } else {
#pragma unroll
                for (int e = 0; e < P; ++e) {
                    const int p = p0 + e;
                    bits[u][e] = (have && p >= a_rel && p < e_rel) ? TableVec<Src>::bits_at(table, row0 + p) : 0u;
                }
            }
#pragma unroll
            for (int e = 0; e < P; ++e) {
                const int p = p0 + e;
                mask |= (u32)(have && p >= a_rel && p < e_rel && pass.template test<ONE>(bits[u][e])) << (u * P + e);
            }
        }
    }
    return mask;
}

// Streams the block's vectors [v_first, v_stop) of row t (flat vector numbers; block-uniform
// bounds) U vectors per thread per step and hands every element of the row's context that
// passes to the sink: sink.reserve(mine) once per step by every lane of every warp, then
// sink.put_mask(...) with this lane's mask of mine passing elements (pos row-relative). Steps
// wholly inside the context take the unchecked path. PF and ahead > 0 (and a 16-byte aligned table):
// thread 0 keeps the L2 prefetching `ahead` steps ahead of the loads (PF = false compiles it out:
// its few registers spill the bf16 fused kernel). ONE: the pass is one range (KeyAtLeast::single).
template <class Src, int U, class Sink, bool PF, bool ONE>
__device__ __forceinline__ void stream_row_pass(const void* table, long long total, int aligned, long long row0,
                                                long long a, long long c, long long v_first, long long v_stop,
                                                const KeyAtLeast& pass, Sink& sink, int ahead) {
    constexpr int P = TableVec<Src>::PER_VEC;
    static_assert(U * P <= 32, "the pass mask is one 32-bit word");
    const int B = blockDim.x;
    const long long step = (long long)B * U;
    const long long g_lo = row0 + a, g_hi = row0 + a + c;
    const bool prefetch = PF && ahead > 0 && aligned && threadIdx.x == 0;
    const long long pf_end = min(v_stop, total / P);                  // whole vectors of the table only
    long long pf = v_first + step;                                    // the next vector to prefetch
    if (prefetch) {
        prefetch_vectors(table, pf, (long long)(ahead - 1) * step, pf_end, pf_end);
        pf += (long long)(ahead - 1) * step;
    }
    for (long long vs = v_first; vs < v_stop; vs += step) {            // uniform over the block
        if (prefetch) {
            prefetch_vectors(table, pf, step, pf_end, pf_end);
            pf += step;
        }
        const long long v0 = vs + threadIdx.x;
        u32 bits[U][P];
        const bool full = aligned && vs * P >= g_lo && (vs + step) * P <= g_hi && vs + step <= v_stop;
        const u32 mask = full ? stream_tile<Src, U, true, ONE>(table, total, aligned, v0, B, v_stop, row0, (int)a,
                                                               (int)(a + c), pass, bits)
                              : stream_tile<Src, U, false, ONE>(table, total, aligned, v0, B, v_stop, row0, (int)a,
                                                                (int)(a + c), pass, bits);
        const int mine = __popc(mask);
        sink.reserve(mine);
        if (mask) sink.template put_mask<U, P>(mask, mine, (int)(v0 * P - row0), B * P, bits);
    }
}

template <class Src, int U, class Sink, bool PF = true>
__device__ __forceinline__ void stream_row(const void* table, long long total, int aligned, long long row0,
                                           long long a, long long c, long long v_first, long long v_stop,
                                           const KeyAtLeast& pass, Sink& sink, int ahead) {
    // float32 only: the bf16 streams (24 elements a thread) spill with a second copy of the loop
    if (TableVec<Src>::PER_VEC == 4 && pass.single())                 // uniform: T's bits are the block's
        stream_row_pass<Src, U, Sink, PF, true>(table, total, aligned, row0, a, c, v_first, v_stop, pass, sink, ahead);
    else
        stream_row_pass<Src, U, Sink, PF, false>(table, total, aligned, row0, a, c, v_first, v_stop, pass, sink, ahead);
}

// The passing elements of one stream step (bit u * P + e of mask: element e of vector u, row
// position p0 + u * BP + e) to put(pos, bits) in bit order: a sink's checked path.
template <int U, int P, class Put>
__device__ __forceinline__ void put_mask_bits(u32 mask, int p0, int BP, const u32 (&bits)[U][P], Put put) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < P; ++e)
            if (mask & (1u << (u * P + e))) put((u32)(p0 + u * BP + e), bits[u][e]);
}

// The same elements to pp[0 ..) and pb[0 ..) (positions, bits) when a sink knows all of them fit below
// its cap (every step of a row that fits): no per-element checks. DIST > 0: pb = pp + DIST (a
// compile-time distance: one address a store pair, the bits' store at an immediate offset; ~5
// instructions an element).
template <int U, int P, int DIST = 0>
__device__ __forceinline__ void put_unchecked(u32 mask, int p0, int BP, const u32 (&bits)[U][P], u32* pp, u32* pb) {
#if defined(__CUDA_ARCH__)
    if (P == 4 && DIST > 0) {
        u32 ap = (u32)__cvta_generic_to_shared(pp);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 pu = (u32)(p0 + u * BP);
#pragma unroll
            for (int e = 0; e < P; ++e)
                asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %1, 0;\n\t"
                             "@q st.shared.u32 [%0], %2;\n\t@q st.shared.u32 [%0+%4], %3;\n\t@q add.u32 %0, %0, 4;\n\t}"
                             : "+r"(ap) : "r"(mask & (1u << (u * P + e))), "r"(pu + (u32)e), "r"(bits[u][e]),
                               "n"(4 * DIST) : "memory");
        }
        return;
    }
    if (P == 4) {
        // float32: predicated stores (no branch) through shared-window addresses stepped by hand
        // (~8 instructions an element; the compiler's own form recomputes both addresses from an
        // index, ~10). A loop over the passing elements instead (~15 a candidate, divergent) was
        // slower: 0.746 against 0.731 ms at 4096 x 131072 (H200, 2026-12-01 s5 runs 1-2).
        u32 ap = (u32)__cvta_generic_to_shared(pp), ab = (u32)__cvta_generic_to_shared(pb);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 pu = (u32)(p0 + u * BP);
#pragma unroll
            for (int e = 0; e < P; ++e) {
                const u32 take = (mask >> (u * P + e)) & 1u;
                asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t"
                             "@q st.shared.u32 [%1], %2;\n\t@q st.shared.u32 [%3], %4;\n\t}"
                             :: "r"(take), "r"(ap), "r"(pu + (u32)e), "r"(ab), "r"(bits[u][e]) : "memory");
                ap += take << 2;
                ab += take << 2;
            }
        }
        return;
    }
#endif
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < P; ++e)
            if (mask & (1u << (u * P + e))) {
                *pp++ = (u32)(p0 + u * BP + e);
                *pb++ = bits[u][e];
            }
}

// A sink into shared memory: slots from one shared counter, those >= cap dropped (the
// counter still counts them). DIST > 0: bits == pos + DIST (table_v2.cu fused_collect).
template <int DIST = 0>
struct SmemSinkT {
    u32* pos;
    u32* bits;
    int* counter;
    int cap;
    int slot;
    __device__ __forceinline__ void reserve(int mine) { slot = warp_reserve(mine, counter); }
    __device__ __forceinline__ void put(u32 p, u32 b) {
        if (slot < cap) { pos[slot] = p; bits[slot] = b; }
        ++slot;
    }
    template <int U, int P>
    __device__ __forceinline__ void put_mask(u32 mask, int mine, int p0, int BP, const u32 (&b)[U][P]) {
        if (P == 4 && slot + mine <= cap) {     // float32: bf16's streams spill with it
            put_unchecked<U, P, DIST>(mask, p0, BP, b, pos + slot, bits + slot);
            slot += mine;
        } else {
            put_mask_bits<U, P>(mask, p0, BP, b, [&](u32 p, u32 x) { put(p, x); });
        }
    }
};
using SmemSink = SmemSinkT<0>;

// The contract's M samples of a context (CONTRACT.md §3.2: p_j = a + (j * c) // Mdiv, 64-bit)
// as order keys keys[0 .. m) (returns the best key this thread gathered, 0 for none), PER loads in
// flight per thread. j * c // Mdiv is stepped by
// quotient and remainder (one 64-bit division per thread instead of one per sample).
template <class Src, int PER>
__device__ __forceinline__ u32 gather_sample_keys(const void* table, long long g_a, long long c, long long Mdiv,
                                                  int m, u32* keys) {
    u32 best = 0u;
    const long long B = blockDim.x;
    const long long dq = (B * c) / Mdiv, dr = (B * c) % Mdiv;
    for (long long q0 = 0; q0 < m; q0 += PER * B) {
        const long long j0 = q0 + threadIdx.x;
        long long Q = (j0 * c) / Mdiv, R = (j0 * c) % Mdiv;
        u32 sb[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            sb[i] = j0 + i * B < m ? TableVec<Src>::bits_at(table, g_a + Q) : 0u;
            Q += dq;
            R += dr;
            if (R >= Mdiv) { R -= Mdiv; ++Q; }
        }
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (j0 + i * B < m) {
                const u32 key = order_key_bits(sb[i]);
                keys[j0 + i * B] = key;
                best = max(best, key);
            }
    }
    return best;
}

// Samples in runs (the table top-k's threshold, sampling="runs" in table.py / table_v2.py; reference:
// sampling.run_sample_positions): the contract's M and r, but the M samples taken as U = ceil(M / R)
// runs of R consecutive keys, R * element size = 64 bytes (one DRAM burst), run u starting at
// max(a, x - x % R), x = a + u * ((c - R) / (U - 1)) (row-relative). The contract's positions
// (one sample every c / M keys) touch every 64-byte burst of a 128K-key row: its samples cost half a
// table read; runs cost 1/32 of it. Only where c >= 4 M (else the contract's positions, which
// read about the same bursts).
template <class Src> struct SampleRun { static constexpr long long R = 4 * TableVec<Src>::PER_VEC; };
// (M >= 64: at least two runs of the longest R, whatever M a caller passes)
__host__ __device__ __forceinline__ bool runs_apply(long long c, long long M) { return M >= 64 && c >= 4 * M; }

// The M samples in runs of a context [a, a + c) of row row0 as order keys keys[0 .. m) (returns the
// best key this thread gathered, 0 for none), about PER samples of a thread in flight (runs_apply(c, M)
// must hold). A run is 64 bytes, four 16-byte vectors: a thread takes whole vectors, (run u, vector h)
// = item w = 4 u + h (samples j = w P .. w P + P - 1), one 16-byte load each where the run starts on a
// vector (every run but a first one clamped to an unaligned a, on a 16-byte aligned table; else element
// loads): ~9 instructions a sample, where one load a sample took ~30.
template <class Src, int PER>
__device__ __forceinline__ u32 gather_run_keys(const void* table, long long row0, long long a, long long c,
                                               long long M, int m, u32* keys) {
    // row-relative positions in 32 bits (contexts are int32 ranges): fewer registers than 64-bit steps
    constexpr int R = (int)SampleRun<Src>::R;
    constexpr int P = TableVec<Src>::PER_VEC;
    constexpr int H = R / P;                         // vectors a run
    constexpr int IPER = PER / P > 0 ? PER / P : 1;  // items a thread in flight
    const int U = (int)((M + R - 1) / R);
    const int S = (int)((c - R) / (U - 1));
    const int a32 = (int)a;
    const int B = blockDim.x;
    const bool vec = (reinterpret_cast<unsigned long long>(table) & 15ull) == 0ull;
    const int items = (m + P - 1) / P;
    u32 best = 0u;
    for (int w0 = 0; w0 < items; w0 += IPER * B) {
        u32 sb[IPER][P];
#pragma unroll
        for (int i = 0; i < IPER; ++i) {
            const int w = w0 + (int)threadIdx.x + i * B;
            const int x = a32 + (w / H) * S;
            const long long g = row0 + max(a32, x & ~(R - 1)) + (w % H) * P;   // the vector's first element
            if (w < items && vec && ((int)g & (P - 1)) == 0 && (w + 1) * P <= m) {
                TableVec<Src>::unpack(__ldg(static_cast<const uint4*>(table) + g / P), sb[i]);
            } else {
#pragma unroll
                for (int e = 0; e < P; ++e) sb[i][e] = w * P + e < m ? TableVec<Src>::bits_at(table, g + e) : 0u;
            }
        }
#pragma unroll
        for (int i = 0; i < IPER; ++i) {
            const int j0 = (w0 + (int)threadIdx.x + i * B) * P;
#pragma unroll
            for (int e = 0; e < P; ++e)
                if (j0 + e < m) {
                    const u32 key = order_key_bits(sb[i][e]);
                    keys[j0 + e] = key;
                    best = max(best, key);
                }
        }
    }
    return best;
}

// ---- A bitonic sort with E words per thread in registers (the v2 selects) ----
// block_bitonic_sort_desc moves every (word, bits) pair through shared memory at each of the
// log2(P) (log2(P) + 1) / 2 stages (66 at P = 2048): ~19K cycles of shared-memory traffic per
// row, the largest part of a select. Here thread tid holds words tid * E .. tid * E + E - 1:
// strides below E are swaps inside the thread, strides below 32 E warp shuffles, and only the
// 10 stages of strides >= 32 E (at P = 2048, 512 threads) go through shared memory.
template <int E>
struct RegBitonic {
    u64 x[E];
    u32 b[E];
    __device__ __forceinline__ void swap_in(int e, int f, bool desc) {     // e < f: indices base + e, base + f
        const bool sw = desc ? x[e] < x[f] : x[e] > x[f];
        if (sw) {
            const u64 t = x[e]; x[e] = x[f]; x[f] = t;
            const u32 u = b[e]; b[e] = b[f]; b[f] = u;
        }
    }
    template <int S>
    __device__ __forceinline__ void in_thread(int base, int size) {
#pragma unroll
        for (int e = 0; e < E; ++e)
            if ((e & S) == 0 && (e | S) < E) swap_in(e, (e | S) < E ? (e | S) : e, ((base + e) & size) == 0);
    }
    // index i's word against its partner's (y, yb) at i ^ stride: the lower index of a
    // descending run keeps the larger word, of an ascending run the smaller
    __device__ __forceinline__ void merge(int e, u64 y, u32 yb, int i, int stride, int size) {
        const bool want_max = ((i & stride) == 0) == ((i & size) == 0);
        const bool take = want_max ? y > x[e] : y < x[e];
        if (take) { x[e] = y; b[e] = yb; }
    }
};

// Sorts word[0 .. cnt) descending (bits[] rides along) over P = max(next_pow2(cnt),
// blockDim.x) slots, padding with word 0 (sorts last): word and bits need P slots, and
// blockDim.x * E == P. Same result as block_bitonic_sort_desc (the words are distinct where
// the order matters). Block-wide; every thread must call it; ends with a barrier.
template <int E>
__device__ void bitonic_sort_desc_reg(u64* word, u32* bits, int cnt, int P) {
    const int base = (int)threadIdx.x * E;
    RegBitonic<E> r;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = base + e;
        r.x[e] = i < cnt ? word[i] : 0ull;
        r.b[e] = i < cnt ? bits[i] : 0u;
    }
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {        // uniform over the block
            if (stride >= 32 * E) {
                __syncthreads();                    // every read of the last contents is done
#pragma unroll
                for (int e = 0; e < E; ++e) { word[base + e] = r.x[e]; bits[base + e] = r.b[e]; }
                __syncthreads();
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const int i = base + e;
                    r.merge(e, word[i ^ stride], bits[i ^ stride], i, stride, size);
                }
            } else if (stride >= E) {
                const int m = stride / E;           // the partner's lane (same e)
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const u64 y = __shfl_xor_sync(0xffffffffu, r.x[e], m);
                    const u32 yb = __shfl_xor_sync(0xffffffffu, r.b[e], m);
                    r.merge(e, y, yb, base + e, stride, size);
                }
            } else if (stride == 1) {
                r.template in_thread<1>(base, size);
            } else {                                // stride 2 (E = 4)
                r.template in_thread<2>(base, size);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < E; ++e) { word[base + e] = r.x[e]; bits[base + e] = r.b[e]; }
    __syncthreads();
}

// The v2 sort: bitonic_sort_desc_reg with E = P / blockDim.x in {1, 2, 4} (blockDim.x a
// power of two >= 32; word and bits hold max(next_pow2(k), blockDim.x) slots), else (k > 2048
// at 512 threads: E = 8 would spill in the fused kernel) block_bitonic_sort_desc. Ends with a
// barrier.
__device__ __forceinline__ void sort_desc_v2(u64* word, u32* bits, int cnt) {
    const int P = max(next_pow2(max(cnt, 1)), (int)blockDim.x);
    switch (P / (int)blockDim.x) {
        case 1: bitonic_sort_desc_reg<1>(word, bits, cnt, P); break;
        case 2: bitonic_sort_desc_reg<2>(word, bits, cnt, P); break;
        case 4: bitonic_sort_desc_reg<4>(word, bits, cnt, P); break;
        default: block_bitonic_sort_desc(word, bits, cnt);
    }
}

// ---- The key selects of the v2 kernels ----
// block_radix_select<LARGEST, FAST> with one __match_any_sync per entry at every level. Only
// the top digit of the keys is concentrated (sign and exponent: a few bins); below it the
// surviving keys spread over the 256 bins and plain shared atomics rarely collide, while
// __match_any_sync costs ~20 issue cycles per warp (run 3: table_topk with match atomics
// 4.20 ms against 3.19 with plain ones). So: match at the top digit, plain atomics below.
// Same result (a histogram does not depend on how its counts are added).
// coarse > 0 (LARGEST; the table top-k's threshold, reference.coarse_key): stop after the first
// 8-bit level whose chosen digit holds at most max(1, rank / coarse) keys (and whose prefix is at
// least 0x00800000) and return its prefix with the lower bits 0: a key at or below the rank-th best
// with at most that many more keys at or above it (two levels instead of four on a randn row).
// top (LARGEST; 0: unknown): the best of the m keys. The top level first counts the keys of top's
// digit D0 (no key has a larger one); when they hold the rank, D0 is the level's digit without the
// histogram of every digit (__match_any_sync a key) and its scan: a randn row's r-th best sample and
// its best share the digit. Same prefix, remaining and equal either way.
template <bool LARGEST, class Get>
__device__ u32 block_radix_select_keys(const Get& get, long long m, u32 rank, u32* hist, SelectScalars* sc,
                                       int coarse = 0, u32 top = 0u) {
    const u32 few = coarse > 0 ? max(1u, rank / (u32)coarse) : 0u;
    const u32 d0 = LARGEST && top != 0u ? top >> 24 : 0x100u;          // 0x100: no digit known
    if (threadIdx.x == 0) { sc->prefix = 0u; sc->remaining = rank; }
    u32 mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        const u32 prefix = sc->prefix;
        const u32 rem = sc->remaining;
        bool at_d0 = false;                          // uniform: the top level's digit is d0
        if (shift == 24) {
            if (d0 < 0x100u) {
                u32 mine = 0u;
                for (long long i = threadIdx.x; i < m; i += blockDim.x) {
                    u32 v;
                    mine += (get(i, &v) && (v >> 24) == d0) ? 1u : 0u;
                }
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
                if (lane_id() == 0u && mine) atomicAdd(&hist[d0], mine);
                __syncthreads();
                at_d0 = hist[d0] >= rem;
            }
            const long long m_round = at_d0 ? 0 : (m + blockDim.x - 1) / blockDim.x * blockDim.x;
            for (long long i = threadIdx.x; i < m_round; i += blockDim.x) {
                u32 v = 0u;
                const bool act = i < m && get(i, &v) && (v >> 24) != d0;    // d0's keys are counted
                const u32 d = act ? v >> 24 : 0x100u;
                const u32 peers = __match_any_sync(0xffffffffu, d);
                if (act && (peers & lanes_below_mask()) == 0u) atomicAdd(&hist[d], (u32)__popc(peers));
            }
        } else {
            for (long long i = threadIdx.x; i < m; i += blockDim.x) {
                u32 v;
                if (get(i, &v) && (v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 0xffu], 1u);
            }
        }
        if (at_d0) {                                 // every hist[d0] read is before the level's last barrier
            if (threadIdx.x == 0) {
                sc->remaining = rem;
                sc->prefix = prefix | (d0 << shift);
                sc->equal = hist[d0];
            }
        } else {
            __syncthreads();
            if (threadIdx.x < 32) radix_level_digit_warp<LARGEST>(hist, rem, prefix, shift, sc);
        }
        mask |= 0xffu << shift;
        __syncthreads();
        // uniform (read after the barrier); a prefix below key 0x00800000 (-FLT_MAX) would be a NaN as a
        // score, which lets NaN keys through: those go on to the exact key
        if (LARGEST && few > 0u && sc->equal <= few && sc->prefix >= 0x00800000u) break;
    }
    return sc->prefix;
}

// block_keep_top<true> with the key select above (the position select among the ties keeps
// __match_any_sync at every level: positions share their top digits).
template <class Entries, class Put>
__device__ int block_keep_top_v2(const Entries& e, long long m, int k, u32* hist, SelectScalars* sc, const Put& put) {
    if (m <= k) {                                        // everything is kept
        for (int i = threadIdx.x; i < (int)m; i += blockDim.x) {
            const u32 v = e.bits(i);
            put(i, order_key_bits(v), e.pos(i), v);
        }
        return (int)m;
    }
    auto key_of = [&](long long i, u32* out) { *out = order_key_bits(e.bits(i)); return true; };
    const u32 kstar = block_radix_select_keys<true>(key_of, m, (u32)k, hist, sc);
    const u32 need = sc->remaining;
    u32 pstar = 0xffffffffu;                             // keep every tie unless too many
    if (need < sc->equal) {
        __syncthreads();
        auto tie_pos = [&](long long i, u32* out) {
            if (order_key_bits(e.bits(i)) != kstar) return false;
            *out = e.pos(i);
            return true;
        };
        pstar = block_radix_select<false, true>(tie_pos, m, need, hist, sc);
    }
    __syncthreads();
    if (threadIdx.x == 0) sc->kept = 0u;
    __syncthreads();
    const long long m_round = (m + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (long long i = threadIdx.x; i < m_round; i += blockDim.x) {
        u32 v = 0u, key = 0u;
        bool keep = false;
        if (i < m) {
            v = e.bits(i);
            key = order_key_bits(v);
            keep = key > kstar || (key == kstar && e.pos(i) <= pstar);
        }
        const int slot = warp_append_slot(keep, reinterpret_cast<int*>(&sc->kept));
        if (keep && slot < k) put(slot, key, e.pos(i), v);
    }
    __syncthreads();
    return min((int)sc->kept, k);
}

// The sorted rank-order words word[0 .. kept) to one output row, -1 / -inf past kept.
__device__ __forceinline__ void write_row(const u64* word, const u32* wbits, int kept, int k, int* out_idx,
                                          float* out_val) {
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        if (i < kept) {
            out_idx[i] = (int)~(u32)word[i];
            out_val[i] = __uint_as_float(wbits[i]);
        } else {
            out_idx[i] = -1;
            out_val[i] = __uint_as_float(0xff800000u);
        }
    }
}

}  // namespace hytopk
