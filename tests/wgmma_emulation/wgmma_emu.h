// CPU versions of the PTX wrappers of kernels_cuda/hytopk_cp_async.cuh, hytopk_wgmma_common.cuh
// and hytopk_wgmma_ptx.cuh (the kernels are compiled with HYTOPK_EMU_PTX, which drops the asm
// ones), on top of the table emulation's core (table_emulation/cuda_emu.h: one std::thread per
// CUDA thread, blocks one after another). What it adds:
// - shared memory as a window of 32-bit shared addresses (the dynamic part starts past 16-byte
//   alignment of 1024, so the kernels' round-up to swizzle atoms runs); every access through an
//   address is bounds-checked
// - mbarriers (phase, pending arrivals, transaction bytes; try_wait.parity), named barriers (a
//   generation count per id; bar.arrive does not wait), cp.async deferred until the latest point
//   the PTX lets a copy land (wait_group, wait_all, the noinc arrival, thread exit)
// - wgmma.mma_async m64nNk16 bf16: descriptors decoded as the PTX ISA's canonical layouts (K- and
//   MN-major, no swizzle and 32/64/128-byte swizzle on the absolute address), each thread computing
//   the accumulator elements it owns (a warp issues it as one: a rendezvous); the result reaches the
//   registers only at the wait_group that retires it; errors: the operand bytes a thread read changed
//   before that wait, or the warps of a warpgroup saw different operands for the same wgmma
// - setmaxnreg as a pool: a block holds the registers it launched with (__launch_bounds__(threads,
//   1)'s bound per thread, HYTOPK_EMU_LAUNCH_REGS overrides); .dec returns some, .inc waits until
//   enough are free (budgets over the launch's never get them: a deadlock, as on the GPU)
// - HYTOPK_EMU_JITTER=p: random short sleeps at synchronisation points (other interleavings)
// - a watchdog: no synchronisation progress for HYTOPK_EMU_STALL_S seconds (default 10) = a
//   deadlock: every thread's wait is printed and the process exits 3. Every emulation error exits 3
//   with "EMU ERROR" on stderr; a kernel trap exits 4.
#pragma once
#define HYTOPK_EMU_PTX 1
#include "cuda_emu.h"

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#define __cluster_dims__(...)

struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float __int_as_float(int b) { float f; std::memcpy(&f, &b, 4); return f; }
inline float __fdiv_rn(float a, float b) { return a / b; }

namespace emu {
namespace wg {

typedef unsigned int u32;
typedef unsigned long long u64;

// ---- errors and per-thread wait states (for the deadlock report)
enum Kind { RUNNING = 0, BAR_SYNC, MBAR_WAIT, REGS_WAIT, EXITED };
struct TState { std::atomic<int> kind{RUNNING}; std::atomic<u32> a{0}, b{0}; };
inline std::vector<TState>* states = nullptr;
inline void dump_states();

[[noreturn]] inline void fail_code(int code, const char* fmt, ...) {
    static std::mutex once;
    once.lock();                                        // one report, the other threads stop here
    std::fprintf(stderr, "EMU ERROR (block %u, thread %u): ", bidx.x, tidx.x);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "\n");
    dump_states();
    std::fflush(stderr);
    std::_Exit(code);
}
#define EMU_FAIL(...) ::emu::wg::fail_code(3, __VA_ARGS__)

// ---- shared memory window and registered global buffers
inline unsigned char* win = nullptr;                   // shared address a lives at win + a
inline u32 win_lo = 0, win_hi = 0;                     // the dynamic shared memory [win_lo, win_hi)
inline u32 smem_off = 0x410;                           // where it starts (16 B past a 1024-byte boundary)
inline unsigned char* sh(u32 a, u32 n, const char* what) {
    if (a < win_lo || a + n > win_hi || a + n < a)
        EMU_FAIL("%s: shared address 0x%x (+%u) outside the dynamic shared memory [0x%x, 0x%x)", what, a, n, win_lo, win_hi);
    if (a % (n < 16 ? n : 16) != 0) EMU_FAIL("%s: shared address 0x%x not %u-byte aligned", what, a, n < 16 ? n : 16);
    return win + a;
}
struct Range { const unsigned char* p; size_t n; const char* name; };
inline std::vector<Range> globals;
inline void global_buffer(const void* p, size_t n, const char* name) {
    globals.push_back({static_cast<const unsigned char*>(p), n, name});
}
inline void check_global(const void* p, size_t n, const char* what) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    for (const Range& r : globals)
        if (c >= r.p && c + n <= r.p + r.n) return;
    EMU_FAIL("%s: global address %p (+%zu) outside every buffer of the launch", what, p, n);
}

// ---- synchronisation state of the running block
struct MBar { u32 count = 0; long long pending = 0, tx = 0; u64 phase = 0; };
struct NBar { int expected = 0, arrived = 0; u64 gen = 0; };
struct Sync {
    std::mutex m;
    std::condition_variable cv;
    std::map<u32, MBar> mbar;
    NBar nbar[16];
    long long regs_free = 0;       // registers released by setmaxnreg.dec, not yet taken by .inc
};
// registers per thread the block launched with: __launch_bounds__(threads, 1)'s bound (the wgmma
// kernels compile at it: tests/test_attention_wgmma*_gpu.py check the driver's num_regs);
// HYTOPK_EMU_LAUNCH_REGS overrides
inline thread_local int regs_now = 0;
inline Sync* sync = nullptr;
inline std::atomic<u64> progress{0};
inline void bump() { progress.fetch_add(1, std::memory_order_relaxed); }
inline void wake() { sync->cv.notify_all(); }              // only on completions: waiters re-check
inline void set_state(Kind k, u32 a = 0, u32 b = 0) {
    TState& s = (*states)[tidx.x];
    s.a = a; s.b = b; s.kind = k;
}

inline void dump_states() {
    if (!states || !sync) return;
    std::fprintf(stderr, "thread states (block %u):\n", bidx.x);
    int i = 0;
    const int nt = (int)states->size();
    while (i < nt) {                                    // runs of threads in the same state
        const TState& s = (*states)[i];
        const int k = s.kind; const u32 a = s.a, b = s.b;
        int j = i + 1;
        while (j < nt && (*states)[j].kind == k && (*states)[j].a == a && (*states)[j].b == b) ++j;
        std::fprintf(stderr, "  threads %d-%d: ", i, j - 1);
        if (k == RUNNING) std::fprintf(stderr, "running (or in a warp collective / __syncthreads)\n");
        else if (k == REGS_WAIT) std::fprintf(stderr, "setmaxnreg.inc from %u to %u registers (%lld free in the block)\n",
                                              a, b, sync->regs_free);
        else if (k == EXITED) std::fprintf(stderr, "exited\n");
        else if (k == BAR_SYNC) {
            const NBar& nb = sync->nbar[a & 15];
            std::fprintf(stderr, "bar.sync %u, %u (%d of %d arrived)\n", a, b, nb.arrived, nb.expected);
        } else {
            auto it = sync->mbar.find(a);
            if (it == sync->mbar.end()) std::fprintf(stderr, "mbarrier 0x%x try_wait.parity %u (never initialised)\n", a, b);
            else std::fprintf(stderr, "mbarrier 0x%x try_wait.parity %u (phase %llu, %lld of %u arrivals pending, tx %lld)\n",
                              a, b, it->second.phase, it->second.pending, it->second.count, it->second.tx);
        }
        i = j;
    }
}

// HYTOPK_EMU_JITTER=p: before each synchronisation and shared-memory operation a thread sleeps
// up to 200 us with probability p (seeded by HYTOPK_EMU_SEED and the thread): other interleavings,
// so a race shows in other runs
inline double env_num(const char* name, double dflt) {
    const char* v = std::getenv(name);
    return v && *v ? std::atof(v) : dflt;
}
inline void jitter() {
    static const double p = env_num("HYTOPK_EMU_JITTER", 0.0);
    if (p <= 0.0) return;
    static const unsigned long long seed = (unsigned long long)env_num("HYTOPK_EMU_SEED", 1.0);
    thread_local unsigned long long x = 0;
    if (x == 0) x = (seed * 0x9E3779B97F4A7C15ull) ^ ((u64)(bidx.x * 4096 + tidx.x + 1) * 0xD1B54A32D192ED03ull) | 1;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;            // xorshift
    if ((double)(x >> 11) * (1.0 / 9007199254740992.0) < p)
        std::this_thread::sleep_for(std::chrono::microseconds((x >> 3) % 200));
}

// ---- mbarriers
inline MBar& mb(u32 a, const char* what) {
    sh(a, 8, what);
    auto it = sync->mbar.find(a);
    if (it == sync->mbar.end()) EMU_FAIL("%s on shared address 0x%x: no mbarrier was initialised there", what, a);
    return it->second;
}
inline void complete_if_done(MBar& b) {
    if (b.pending == 0 && b.tx == 0) { b.phase++; b.pending = b.count; wake(); }
}
inline void arrive_locked(u32 a, const char* what) {
    MBar& b = mb(a, what);
    if (b.pending <= 0) EMU_FAIL("%s on mbarrier 0x%x: more arrivals than its count (%u) in phase %llu", what, a, b.count, b.phase);
    b.pending--;
    complete_if_done(b);
    bump();
}
inline void complete_tx(u32 a, u32 bytes) {
    std::lock_guard<std::mutex> lk(sync->m);
    MBar& b = mb(a, "complete_tx");
    b.tx -= bytes;
    complete_if_done(b);
    bump();
}
inline u32 try_wait(u32 a, u32 parity) {
    jitter();
    std::unique_lock<std::mutex> lk(sync->m);
    MBar& b = mb(a, "mbarrier.try_wait.parity");
    if ((u32)(b.phase & 1) != (parity & 1)) return 1;
    set_state(MBAR_WAIT, a, parity);
    // a bounded wait, as the instruction's: the kernel's loop polls again
    sync->cv.wait_for(lk, std::chrono::milliseconds(2), [&] { return (u32)(b.phase & 1) != (parity & 1); });
    const u32 done = (u32)(b.phase & 1) != (parity & 1);
    if (done) set_state(RUNNING);                       // (else still in the kernel's wait loop)
    return done;
}

// ---- named barriers (id 1..15; 0 is __syncthreads)
inline void named_bar(int id, int threads, bool wait) {
    jitter();
    if (id <= 0 || id >= 16) EMU_FAIL("bar %d: named barrier ids are 1..15 here (0 is __syncthreads)", id);
    if (threads <= 0 || threads % 32 || threads > (int)bdim.x) EMU_FAIL("bar %d: thread count %d", id, threads);
    std::unique_lock<std::mutex> lk(sync->m);
    NBar& b = sync->nbar[id];
    if (b.arrived == 0) b.expected = threads;
    else if (b.expected != threads)
        EMU_FAIL("bar %d: this arrival says %d threads, an earlier one of the same phase %d", id, threads, b.expected);
    const u64 g = b.gen;
    if (++b.arrived == b.expected) { b.arrived = 0; b.gen++; bump(); wake(); return; }
    bump();
    if (!wait) return;
    set_state(BAR_SYNC, (u32)id, (u32)threads);
    sync->cv.wait(lk, [&] { return b.gen != g; });
    set_state(RUNNING);
}

// ---- cp.async: pending copies of this thread, in commit groups
struct Copy { u32 dst; const void* src; bool valid; };
inline thread_local std::vector<Copy> cp_open;
inline thread_local std::deque<std::vector<Copy>> cp_groups;
inline void land(const std::vector<Copy>& g) {
    for (const Copy& c : g) {
        unsigned char* d = sh(c.dst, 16, "cp.async (landing)");
        if (c.valid) std::memcpy(d, c.src, 16);
        else std::memset(d, 0, 16);
    }
}
inline void land_all() {
    while (!cp_groups.empty()) { land(cp_groups.front()); cp_groups.pop_front(); }
    land(cp_open);
    cp_open.clear();
}

// ---- shared -> global bulk operations (cp.async.bulk / cp.reduce.async.bulk .add.f32) of this thread,
// in bulk groups, each done at the latest point the PTX allows: its source read at the wait that
// retires its group's reads (wait_group.read; so a source reused before that gives other values), its
// writes at the wait that retires the group (wait_group); a thread may not exit with a group not done
struct BulkOp { float* dst; u32 src, bytes; bool add; std::vector<float> data; };
struct BulkGroup { std::vector<BulkOp> ops; bool read = false; };
inline thread_local std::vector<BulkOp> bulk_open;
inline thread_local std::deque<BulkGroup> bulk_groups;
inline void bulk_read(BulkGroup& g) {
    if (g.read) return;
    for (BulkOp& o : g.ops) {
        const float* v = reinterpret_cast<const float*>(sh(o.src, o.bytes, "cp.async.bulk (source read)"));
        o.data.assign(v, v + o.bytes / 4);
    }
    g.read = true;
}
inline void bulk_write(BulkGroup& g) {
    bulk_read(g);
    for (const BulkOp& o : g.ops)
        for (u32 i = 0; i < o.bytes / 4; ++i)
            if (o.add) std::atomic_ref<float>(o.dst[i]).fetch_add(o.data[i]);
            else o.dst[i] = o.data[i];
}

// ---- wgmma: operand addressing (PTX ISA "matrix descriptor" + "canonical layouts")
struct Desc { u32 start, lbo, sbo, width; };            // bytes; width: swizzle bytes (0 = none)
inline Desc decode(u64 d) {
    if ((d >> 49) & 7) EMU_FAIL("wgmma descriptor 0x%llx: a matrix base offset is not emulated", d);
    const u32 mode = (u32)(d >> 62);
    return {(u32)(d & 0x3fff) << 4, (u32)((d >> 16) & 0x3fff) << 4, (u32)((d >> 32) & 0x3fff) << 4,
            mode == 0 ? 0u : mode == 1 ? 128u : mode == 2 ? 64u : 32u};
}
// shared address of bf16 element (mn, k), k < 16, of an operand K-major (mn_major = false) or MN-major
inline u32 elem_addr(const Desc& d, u32 mn, u32 k, bool mn_major) {
    const u32 W = d.width;
    u32 off;
    if (!mn_major) {        // ((8,m),(T,2k)):((1T,SBO),(1,LBO)); swizzled ((8,m),(T,2k)):((cT,SBO),(1,T))
        off = W ? (mn % 8) * W + (mn / 8) * d.sbo + k * 2
                : (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo;
    } else {                // ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); swizzled ((T,c,m),(8,k)):((1,T,LBO),(cT,SBO))
        const u32 per = W ? W / 2 : 8;                  // MN elements of one (swizzled) row
        off = W ? (mn % per) * 2 + (mn / per) * d.lbo + (k % 8) * W + (k / 8) * d.sbo
                : (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
    }
    u32 a = d.start + off;
    if (W) a ^= ((a >> 7) & (W / 16 - 1)) << 4;         // Swizzle<log2(W/16), 4, 3> on the address
    return a;
}
inline float bf16f(unsigned short b) { return __uint_as_float((u32)b << 16); }
inline unsigned short ld16(u32 a) { unsigned short v; std::memcpy(&v, sh(a, 2, "wgmma operand"), 2); return v; }

// Every warp of a warpgroup issues its own part of a wgmma: the i-th wgmma of each warp must see
// the same operands (else a warp wrote them while another's part was still to be issued: a race)
struct Issue { u64 hash; int seen; };
inline std::mutex issue_m;
inline std::map<std::pair<u32, u64>, Issue> issues;    // (warpgroup, sequence) -> the first warp's view
inline thread_local u64 wg_seq = 0;
inline u64 whole_operand_hash(u64 da, bool rs, u64 db, bool tb, int n, bool ta) {
    u64 h = 1469598103934665603ull;
    auto mix = [&](unsigned short v) { h = (h ^ v) * 1099511628211ull; };
    if (!rs) {
        const Desc a = decode(da);
        for (u32 r = 0; r < 64; ++r)
            for (u32 k = 0; k < 16; ++k) mix(ld16(elem_addr(a, r, k, ta)));
    }
    const Desc b = decode(db);
    for (u32 c = 0; c < (u32)n; ++c)
        for (u32 k = 0; k < 16; ++k) mix(ld16(elem_addr(b, c, k, tb)));
    return h;
}
inline void check_issue(u64 da, bool rs, u64 db, bool tb, int n, bool ta) {
    const u64 seq = wg_seq++;
    if (lane() != 0) return;                            // one view per warp
    const u64 h = whole_operand_hash(da, rs, db, tb, n, ta);
    std::lock_guard<std::mutex> lk(issue_m);
    const auto key = std::make_pair(tidx.x / 128, seq);
    auto it = issues.find(key);
    if (it == issues.end()) { issues[key] = {h, 1}; return; }
    if (it->second.hash != h)
        EMU_FAIL("wgmma #%llu of warpgroup %u (desc a 0x%llx, desc b 0x%llx): warp %u saw other shared-memory "
                 "operands than an earlier warp of its warpgroup (written between the warps' issues)",
                 seq, tidx.x / 128, da, db, tidx.x / 32);
    if (++it->second.seen == 4) issues.erase(it);
}

struct Op {
    float* d;                  // the accumulator registers it writes at retirement
    int nacc;
    u64 da, db;
    bool rs, tb, ta;
    u64 hash;                  // of the shared-memory operand bytes it read
    std::vector<float> result;
};
inline thread_local std::vector<Op> wg_open;
inline thread_local std::deque<std::vector<Op>> wg_groups;
inline thread_local std::unordered_map<float*, std::vector<float>> wg_shadow;   // latest in-flight value per accumulator
inline thread_local std::unordered_map<float*, int> wg_inflight;               // ops in flight per accumulator

inline void fnv(u64& h, unsigned short v) { h = (h ^ v) * 1099511628211ull; }
// this thread's rows (2) and columns of an m64nNk16: element i at row 16*warp + g8 + 8*((i>>1)&1),
// column 8*(i>>2) + 2*tig + (i&1)
inline u64 operand_hash(const Op& op) {
    const u32 t = tidx.x & 127, warp = t >> 5, g8 = (t & 31) >> 2, tig = t & 3;
    const Desc db = decode(op.db);
    u64 h = 1469598103934665603ull;
    if (!op.rs) {
        const Desc da = decode(op.da);
        for (u32 r = 0; r < 2; ++r)
            for (u32 k = 0; k < 16; ++k) fnv(h, ld16(elem_addr(da, 16 * warp + g8 + 8 * r, k, op.ta)));
    }
    for (int c8 = 0; c8 < op.nacc / 4; ++c8)
        for (u32 e = 0; e < 2; ++e)
            for (u32 k = 0; k < 16; ++k) fnv(h, ld16(elem_addr(db, 8 * c8 + 2 * tig + e, k, op.tb)));
    return h;
}

// issue: compute now from the operands as they are (the kernel must not change them before the
// wait), keep the result until the wait_group that retires it
template <int NACC>
inline void mma(float (&d)[NACC], u64 da, const u32* a_regs, u64 db, int scale_d, bool tb, bool ta = false) {
    const u32 t = tidx.x & 127, warp = t >> 5, g8 = (t & 31) >> 2, tig = t & 3;
    jitter();
    emu::warp().bar.arrive_and_wait();                  // .sync.aligned: the warp issues it as one
    check_issue(da, a_regs != nullptr, db, tb, NACC / 2, ta);
    float A[2][16];
    if (a_regs) {              // RS: A fragments of the warp's lanes (rows g8, g8+8; k 2tig.., 8+2tig..)
        u32 all[32][4];
        Warp& w = emu::warp();
        static_assert(sizeof(u64) * 2 == 16, "");
        // two rounds through the warp's 64-bit exchange
        for (int half = 0; half < 2; ++half) {
            const u64 mine = (u64)a_regs[2 * half] | ((u64)a_regs[2 * half + 1] << 32);
            w.v[lane()] = mine;
            w.bar.arrive_and_wait();
            for (int l = 0; l < 32; ++l) { all[l][2 * half] = (u32)w.v[l]; all[l][2 * half + 1] = (u32)(w.v[l] >> 32); }
            w.bar.arrive_and_wait();
        }
        for (u32 r = 0; r < 2; ++r)
            for (u32 k = 0; k < 16; ++k) {
                const u32 src = g8 * 4 + (k % 8) / 2, reg = r + 2 * (k / 8);
                const u32 pair = all[src][reg];
                A[r][k] = bf16f((unsigned short)((k & 1) ? pair >> 16 : pair & 0xffff));
            }
    } else {
        const Desc a = decode(da);
        for (u32 r = 0; r < 2; ++r)
            for (u32 k = 0; k < 16; ++k) A[r][k] = bf16f(ld16(elem_addr(a, 16 * warp + g8 + 8 * r, k, ta)));
    }
    const Desc b = decode(db);
    auto sh_it = wg_shadow.find(&d[0]);
    const float* in = sh_it != wg_shadow.end() ? sh_it->second.data() : d;
    std::vector<float> res(NACC);
    for (int c8 = 0; c8 < NACC / 4; ++c8)
        for (u32 e = 0; e < 2; ++e) {
            float B[16];
            for (u32 k = 0; k < 16; ++k) B[k] = bf16f(ld16(elem_addr(b, 8 * c8 + 2 * tig + e, k, tb)));
            for (u32 r = 0; r < 2; ++r) {
                double acc = 0.0;                       // products of bf16 are exact in double
                for (u32 k = 0; k < 16; ++k) acc += (double)A[r][k] * (double)B[k];
                const int i = 4 * c8 + 2 * r + e;
                res[i] = scale_d ? (float)((double)in[i] + acc) : (float)acc;
            }
        }
    Op op{&d[0], NACC, da, db, a_regs != nullptr, tb, ta, 0, res};
    op.hash = operand_hash(op);
    wg_shadow[&d[0]] = res;
    wg_inflight[&d[0]]++;
    wg_open.push_back(std::move(op));
}
inline void retire(std::vector<Op>& g) {
    for (Op& op : g) {
        if (operand_hash(op) != op.hash)
            EMU_FAIL("wgmma (desc a 0x%llx, desc b 0x%llx): its shared-memory operands changed before the "
                     "wgmma.wait_group that retired it", op.da, op.db);
        std::memcpy(op.d, op.result.data(), sizeof(float) * op.nacc);
        if (--wg_inflight[op.d] == 0) { wg_inflight.erase(op.d); wg_shadow.erase(op.d); }
    }
}
inline void wait_groups(size_t n) {
    while (wg_groups.size() > n) { retire(wg_groups.front()); wg_groups.pop_front(); }
}

// ---- setmaxnreg's pool: this thread moves to n registers per thread, giving back to the block's pool
// or taking from it (waiting until it holds enough: never, if the budgets exceed the launch's)
inline void regs_set(int n) {
    std::unique_lock<std::mutex> lk(sync->m);
    const long long need = n - regs_now;
    if (need > 0 && sync->regs_free < need) {
        set_state(REGS_WAIT, (u32)regs_now, (u32)n);
        sync->cv.wait(lk, [&] { return sync->regs_free >= need; });
        set_state(RUNNING);
    }
    sync->regs_free -= need;
    regs_now = n;
    bump();
    if (need < 0) wake();
}

// ---- launch: blocks one after another, 'threads' std::threads each, a watchdog per block
template <class K>
inline void launch(unsigned grid, unsigned threads, size_t dyn_bytes, K kernel) {
    gdim = {grid, 1, 1};
    bdim = {threads, 1, 1};
    const double stall_s = env_num("HYTOPK_EMU_STALL_S", 10.0);
    const int launch_regs = (int)env_num("HYTOPK_EMU_LAUNCH_REGS", std::min(255u, 65536u / threads / 8u * 8u));
    const size_t win_bytes = smem_off + dyn_bytes;
    std::vector<unsigned char> mem(win_bytes + 4096);
    unsigned char* aligned = mem.data() + (4096 - reinterpret_cast<uintptr_t>(mem.data()) % 4096) % 4096;
    for (unsigned bl = 0; bl < grid; ++bl) {
        bidx = {bl, 0, 0};
        Block blk;
        blk.bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
        for (unsigned w = 0; w < threads / 32; ++w) blk.warps.push_back(std::make_unique<Warp>());
        block = &blk;
        Sync sy;
        sync = &sy;
        std::vector<TState> st(threads);
        states = &st;
        win = aligned;
        win_lo = smem_off;
        win_hi = (u32)win_bytes;
        std::memset(win, 0xAB, win_bytes);              // garbage, as real shared memory
        std::atomic<bool> done{false};
        std::thread watchdog([&] {
            bidx = {bl, 0, 0};                          // (thread-local in cuda_emu.h: its reports name the block)
            u64 last = progress.load();
            auto since = std::chrono::steady_clock::now();
            while (!done.load()) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                const u64 p = progress.load();
                const auto now = std::chrono::steady_clock::now();
                if (p != last) { last = p; since = now; continue; }
                if (std::chrono::duration<double>(now - since).count() > stall_s) {
                    std::lock_guard<std::mutex> lk(sync->m);
                    std::fprintf(stderr, "EMU ERROR (block %u): deadlock: no synchronisation progress for %.0f s\n", bl, stall_s);
                    dump_states();
                    std::fflush(stderr);
                    std::_Exit(3);
                }
            }
        });
        std::vector<std::thread> ts;
        ts.reserve(threads);
        for (unsigned t = 0; t < threads; ++t)
            ts.emplace_back([t, bl, &kernel, &blk, launch_regs] {
                tidx = {t, 0, 0};
                regs_now = launch_regs;
                bidx = {bl, 0, 0};                      // block and bidx are thread-local (cuda_emu.h's clusters)
                block = &blk;
                kernel();
                land_all();                             // copies still in flight land before the block ends
                if (!bulk_open.empty() || !bulk_groups.empty())
                    EMU_FAIL("thread exits with %zu bulk groups (and %zu uncommitted bulk operations) in flight",
                             bulk_groups.size(), bulk_open.size());
                if (!wg_open.empty() || !wg_groups.empty())
                    EMU_FAIL("thread exits with %zu wgmma groups (and %zu uncommitted wgmma) in flight",
                             wg_groups.size(), wg_open.size());
                set_state(EXITED);
                bump();
                blk.warps[t / 32]->bar.arrive_and_drop();  // an exited thread never blocks the others
                blk.bar->arrive_and_drop();
            });
        for (auto& th : ts) th.join();
        done = true;
        watchdog.join();
        states = nullptr;
        sync = nullptr;
        issues.clear();
    }
}

}  // namespace wg
}  // namespace emu

inline int __ldg(const int* p) { emu::wg::check_global(p, 4, "__ldg"); return *p; }
inline int2 __ldg(const int2* p) {                  // a vector load faults on the GPU unless 8-byte aligned
    if (reinterpret_cast<unsigned long long>(p) % 8) EMU_FAIL("__ldg: int2 address %p not 8-byte aligned", (const void*)p);
    emu::wg::check_global(p, 8, "__ldg");
    return *p;
}
inline bool __any_sync(unsigned, int pred) {
    return emu::collective(pred ? 1 : 0, [](const unsigned long long* v, unsigned) {
        unsigned long long any = 0;
        for (int i = 0; i < 32; ++i) any |= v[i];
        return any;
    }) != 0;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp().bar.arrive_and_wait(); }

// ---- the wrappers the kernels call (same names and signatures as the PTX ones)
namespace hytopk {
typedef unsigned int u32;
typedef unsigned long long u64;

inline u32 smem_addr(const void* p) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < emu::wg::win || c > emu::wg::win + emu::wg::win_hi) EMU_FAIL("smem_addr of a pointer outside shared memory");
    return (u32)(c - emu::wg::win);
}
inline void cp_async16(u32 dst, const void* src, bool valid) {
    emu::wg::sh(dst, 16, "cp.async");
    if (valid) {
        if (reinterpret_cast<uintptr_t>(src) % 16) EMU_FAIL("cp.async: global source %p not 16-byte aligned", src);
        emu::wg::check_global(src, 16, "cp.async");
    }
    emu::wg::cp_open.push_back({dst, src, valid});
}
inline void cp_async16_l2pf(u32 dst, const void* src, bool valid) { cp_async16(dst, src, valid); }
// an L2 prefetch has no effect to emulate; its source must lie in a buffer (and 16-byte aligned)
inline void prefetch_l2_bulk(const void* src, u32 bytes) {
    if (reinterpret_cast<unsigned long long>(src) % 16 || bytes % 16) EMU_FAIL("prefetch_l2_bulk: %p, %u bytes not 16-byte aligned", src, bytes);
    emu::wg::check_global(src, bytes, "cp.async.bulk.prefetch.L2");
}
inline void cp_async_commit() {
    emu::wg::cp_groups.push_back(std::move(emu::wg::cp_open));
    emu::wg::cp_open.clear();
}
template <int N>
inline void cp_async_wait() {
    while (emu::wg::cp_groups.size() > (size_t)N) {
        emu::wg::land(emu::wg::cp_groups.front());
        emu::wg::cp_groups.pop_front();
    }
}
inline void cp_async_wait_all() { emu::wg::land_all(); }
inline void cp_async_arrive_noinc(u32 bar) {
    emu::wg::jitter();
    emu::wg::land_all();                                // the arrival comes once all earlier copies landed
    std::lock_guard<std::mutex> lk(emu::wg::sync->m);
    emu::wg::arrive_locked(bar, "cp.async.mbarrier.arrive.noinc");
}
inline void st_shared_u32(u32 addr, u32 v) { emu::wg::jitter(); std::memcpy(emu::wg::sh(addr, 4, "st.shared.u32"), &v, 4); }
inline void st_shared_f32x2(u32 addr, float a, float b) {
    emu::wg::jitter();
    const float v[2] = {a, b};
    std::memcpy(emu::wg::sh(addr, 8, "st.shared.v2.f32"), v, 8);
}
inline uint4 ld_shared_v4(u32 addr) {
    emu::wg::jitter();
    uint4 v;
    std::memcpy(&v, emu::wg::sh(addr, 16, "ld.shared.v4.u32"), 16);
    return v;
}
inline void ld_shared_f32x2(u32 addr, float& a, float& b) {
    emu::wg::jitter();
    float v[2];
    std::memcpy(v, emu::wg::sh(addr, 8, "ld.shared.v2.f32"), 8);
    a = v[0];
    b = v[1];
}

namespace wgp {
inline void wgmma_fence() {}
inline void wgmma_commit() {
    emu::wg::wg_groups.push_back(std::move(emu::wg::wg_open));
    emu::wg::wg_open.clear();
}
inline void wgmma_wait_all() { emu::wg::wait_groups(0); }
template <int N>
inline void wgmma_wait() { emu::wg::wait_groups((size_t)N); }
// not modelled: a missing proxy fence (generic stores read by the TMA) shows only on the GPU
inline void fence_proxy_async() {}
inline void fence_proxy_async_global() {}
inline void fence_gpu() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// flags between blocks (the blocks run one after another here: a wait on a later block deadlocks)
inline u32 ticket_take(u32* p) {
    emu::wg::check_global(p, 4, "atom.global.add.u32");
    return std::atomic_ref<u32>(*p).fetch_add(1u);
}
inline void flag_release_add(int* p, int v) {
    emu::wg::check_global(p, 4, "red.release.gpu.global.add.s32");
    emu::wg::jitter();
    std::atomic_ref<int>(*p).fetch_add(v);
    emu::wg::bump();
}
inline int flag_acquire(const int* p) {
    emu::wg::check_global(p, 4, "ld.acquire.gpu.global.s32");
    emu::wg::jitter();
    return std::atomic_ref<int>(*const_cast<int*>(p)).load();
}
inline float rcp_approx(float x) { return 1.0f / x; }     // (the GPU's is approximate; the refined quotient is the same)
inline void bar_sync(int id, int threads) { emu::wg::named_bar(id, threads, true); }
inline void bar_arrive(int id, int threads) { emu::wg::named_bar(id, threads, false); }

inline void mbar_init(u32 bar, u32 count) {
    emu::wg::sh(bar, 8, "mbarrier.init");
    if (count == 0 || count >= (1u << 20)) EMU_FAIL("mbarrier.init 0x%x: count %u", bar, count);
    std::lock_guard<std::mutex> lk(emu::wg::sync->m);
    emu::wg::MBar b;
    b.count = count;
    b.pending = count;
    emu::wg::sync->mbar[bar] = b;
    emu::wg::bump();
}
inline void mbar_fence_init() {}
inline void mbar_arrive(u32 bar) {
    emu::wg::jitter();
    std::lock_guard<std::mutex> lk(emu::wg::sync->m);
    emu::wg::arrive_locked(bar, "mbarrier.arrive");
}
inline void mbar_expect_tx(u32 bar, u32 bytes) {
    std::lock_guard<std::mutex> lk(emu::wg::sync->m);
    emu::wg::mb(bar, "mbarrier.arrive.expect_tx").tx += bytes;
    emu::wg::arrive_locked(bar, "mbarrier.arrive.expect_tx");
}
inline u32 mbar_try_wait(u32 bar, u32 parity) { return emu::wg::try_wait(bar, parity); }
inline u32 mbar_try_wait_cluster(u32 bar, u32 parity) { return emu::wg::try_wait(bar, parity); }
inline void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    if (bytes % 16 || reinterpret_cast<uintptr_t>(src) % 16) EMU_FAIL("cp.async.bulk: %u bytes from %p", bytes, src);
    emu::wg::check_global(src, bytes, "cp.async.bulk");
    std::memcpy(emu::wg::sh(dst, bytes, "cp.async.bulk"), src, bytes);
    emu::wg::complete_tx(bar, bytes);
}
// setmaxnreg: the block keeps the registers it launched with; .dec gives some back to its pool,
// .inc takes from it and waits (a deadlock, for the watchdog) until the pool has enough
template <int REGS>
inline void regs_dec() {
    if (REGS > emu::wg::regs_now) EMU_FAIL("setmaxnreg.dec to %d registers, above the thread's %d", REGS, emu::wg::regs_now);
    emu::wg::regs_set(REGS);
}
template <int REGS>
inline void regs_inc() {
    if (REGS < emu::wg::regs_now) EMU_FAIL("setmaxnreg.inc to %d registers, below the thread's %d", REGS, emu::wg::regs_now);
    emu::wg::regs_set(REGS);
}

// %globaltimer runs HYTOPK_EMU_TIMER_DIV (default 8) times slower than the host clock: the kernels'
// 2-second trap timeouts stay longer than the emulation's slow but live waits
inline u32 globaltimer_lo() {
    static const double div = emu::wg::env_num("HYTOPK_EMU_TIMER_DIV", 8.0);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return (u32)(unsigned long long)((double)ns / div);
}
[[noreturn]] inline void device_trap() { emu::wg::fail_code(4, "trap (the kernel gave up waiting)"); }
inline u32 opaque_u32(u32 x) { return x; }
inline u32 pack_bf16x2(float lo, float hi) {
    auto rn = [](float f) -> u32 {
        const u32 b = __float_as_uint(f);
        if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;          // NaN: the canonical one
        return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;                  // round to nearest even
    };
    return rn(lo) | (rn(hi) << 16);
}

inline void red_add_v4(float* p, float a, float b, float c, float d) {
    if (reinterpret_cast<uintptr_t>(p) % 16) EMU_FAIL("red.global.add.v4.f32: %p not 16-byte aligned", (void*)p);
    emu::wg::check_global(p, 16, "red.global.add.v4.f32");
    emu::wg::jitter();
    const float v[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) std::atomic_ref<float>(p[i]).fetch_add(v[i]);
}
inline void red_add_v2(float* p, float a, float b) {
    if (reinterpret_cast<uintptr_t>(p) % 8) EMU_FAIL("red.global.add.v2.f32: %p not 8-byte aligned", (void*)p);
    emu::wg::check_global(p, 8, "red.global.add.v2.f32");
    emu::wg::jitter();
    std::atomic_ref<float>(p[0]).fetch_add(a);
    std::atomic_ref<float>(p[1]).fetch_add(b);
}
inline void st_global_v2(float* p, float a, float b) {
    if (reinterpret_cast<uintptr_t>(p) % 8) EMU_FAIL("st.global.v2.f32: %p not 8-byte aligned", (void*)p);
    emu::wg::check_global(p, 8, "st.global.v2.f32");
    const float v[2] = {a, b};
    std::memcpy(p, v, 8);
}
inline void st_global_u32(void* p, u32 v) {
    if (reinterpret_cast<uintptr_t>(p) % 4) EMU_FAIL("st.global.u32: %p not 4-byte aligned", (void*)p);
    emu::wg::check_global(p, 4, "st.global.u32");
    std::memcpy(p, &v, 4);
}
inline void st_global_v4(float* p, float a, float b, float c, float d) {
    if (reinterpret_cast<uintptr_t>(p) % 16) EMU_FAIL("st.global.v4.f32: %p not 16-byte aligned", (void*)p);
    emu::wg::check_global(p, 16, "st.global.v4.f32");
    const float v[4] = {a, b, c, d};
    std::memcpy(p, v, 16);
}

inline void bulk_s2g_op(float* dst, u32 src, u32 bytes, bool add, const char* what) {
    if (bytes == 0 || bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || src % 16)
        EMU_FAIL("%s: %u bytes from shared 0x%x to %p (16-byte multiples and alignment)", what, bytes, src, (void*)dst);
    emu::wg::check_global(dst, bytes, what);
    emu::wg::sh(src, bytes, what);
    emu::wg::jitter();
    emu::wg::bulk_open.push_back({dst, src, bytes, add, {}});
}
inline void bulk_s2g(float* dst, u32 src, u32 bytes) { bulk_s2g_op(dst, src, bytes, false, "cp.async.bulk.global.shared::cta"); }
inline void bulk_s2g_add_f32(float* dst, u32 src, u32 bytes) {
    bulk_s2g_op(dst, src, bytes, true, "cp.reduce.async.bulk.global.shared::cta.add.f32");
}
inline void bulk_commit() {
    emu::wg::bulk_groups.push_back({std::move(emu::wg::bulk_open), false});
    emu::wg::bulk_open.clear();
}
template <int N>
inline void bulk_wait_read() {
    emu::wg::jitter();
    auto& gs = emu::wg::bulk_groups;
    for (size_t i = 0; i + N < gs.size(); ++i) emu::wg::bulk_read(gs[i]);
}
template <int N>
inline void bulk_wait() {
    emu::wg::jitter();
    while (emu::wg::bulk_groups.size() > (size_t)N) {
        emu::wg::bulk_write(emu::wg::bulk_groups.front());
        emu::wg::bulk_groups.pop_front();
    }
}

[[noreturn]] inline u32 cluster_ctarank() { EMU_FAIL("2-CTA clusters are not emulated"); }
[[noreturn]] inline void cluster_sync() { EMU_FAIL("2-CTA clusters are not emulated"); }
[[noreturn]] inline u32 map_peer(u32, u32) { EMU_FAIL("2-CTA clusters are not emulated"); }
[[noreturn]] inline void mbar_arrive_remote(u32) { EMU_FAIL("2-CTA clusters are not emulated"); }
[[noreturn]] inline void bulk_s2peer(u32, u32, u32, u32) { EMU_FAIL("2-CTA clusters are not emulated"); }

// wgmma.mma_async m64nNk16 bf16 -> f32 (hytopk_wgmma_ptx.cuh's names): both operands K-major from
// shared memory; _tb: B MN-major (transposed); _rs_tb: A from registers, B MN-major; _rs: A from
// registers, B K-major; _ta_tb: both MN-major
#define HYTOPK_EMU_WGMMA(N)                                                                           \
    inline void wgmma_m64n##N##k16_bf16(float (&d)[N / 2], u64 da, u64 db, int scale_d) {              \
        emu::wg::mma(d, da, nullptr, db, scale_d, false);                                              \
    }
HYTOPK_EMU_WGMMA(16)
HYTOPK_EMU_WGMMA(32)
HYTOPK_EMU_WGMMA(64)
HYTOPK_EMU_WGMMA(128)
HYTOPK_EMU_WGMMA(256)
#undef HYTOPK_EMU_WGMMA
inline void wgmma_m64n256k16_bf16_tb(float (&d)[128], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true);
}
inline void wgmma_m64n256k16_bf16_rs_tb(float (&d)[128], const u32 (&a)[4], u64 db, int scale_d) {
    emu::wg::mma(d, 0, a, db, scale_d, true);
}
inline void wgmma_m64n144k16_bf16_tb(float (&d)[72], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true);
}
inline void wgmma_m64n192k16_bf16_tb(float (&d)[96], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true);
}
inline void wgmma_m64n32k16_bf16_tb(float (&d)[16], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true);
}
// _rs: A from registers, B K-major (the dq-pass split's S = Q K^T and dP = dO V^T)
inline void wgmma_m64n64k16_bf16_rs(float (&d)[32], const u32 (&a)[4], u64 db, int scale_d) {
    emu::wg::mma(d, 0, a, db, scale_d, false);
}
// _ta_tb: A MN-major too (the MLA backward's Q^T / dO^T read from the row-major tiles)
inline void wgmma_m64n32k16_bf16_ta_tb(float (&d)[16], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true, true);
}
inline void wgmma_m64n16k16_bf16_ta_tb(float (&d)[8], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true, true);
}
inline void wgmma_m64n192k16_bf16_ta_tb(float (&d)[96], u64 da, u64 db, int scale_d) {
    emu::wg::mma(d, da, nullptr, db, scale_d, true, true);
}
}  // namespace wgp
}  // namespace hytopk
