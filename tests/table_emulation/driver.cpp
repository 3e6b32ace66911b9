// Runs the table kernels of table_v2.cu (and table_topk.cu's radix fallback) on one case read
// from argv[1], writes their outputs to argv[2]. Built and driven by emulate.py.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <atomic>
static std::atomic<int> g_one_read_rows{0};    // rows hytopk_table_fused1 finished reading once
#define HYTOPK_EMU_ONE_READ_HOOK(t) (threadIdx.x == 0 ? (void)g_one_read_rows.fetch_add(1) : (void)0)
#include "kernels_emu.inc"

using namespace hytopk;

template <class T> static void rd(std::ifstream& f, T* p, size_t n) { f.read(reinterpret_cast<char*>(p), n * sizeof(T)); }
template <class T> static void wr(std::ofstream& f, const T* p, size_t n) { f.write(reinterpret_cast<const char*>(p), n * sizeof(T)); }

static int next_pow2_h(int x) { int p = 1; while (p < x) p <<= 1; return p; }

// The rows a kernel listed (flagged[0 .. *nflagged)) as a 0 / 1 mask.
static std::vector<unsigned char> listed_mask(const std::vector<int>& flagged, const std::vector<int>& nflagged, int n) {
    std::vector<unsigned char> m(n, 0);
    for (int i = 0; i < nflagged[0]; ++i) m[flagged[i]] = 1;
    return m;
}

// The first row where a variant differs from the fused kernel (listed rows, counts, and the finished
// rows bit for bit: idx and the value bits), or -1.
static int first_row_differing(int n, int k, const std::vector<unsigned char>& failed2, const std::vector<int>& count2,
                               const std::vector<int>& idx2, const std::vector<float>& val2,
                               const std::vector<unsigned char>& failed, const std::vector<int>& count,
                               const std::vector<int>& idx, const std::vector<float>& val) {
    for (int t = 0; t < n; ++t) {
        bool same = failed2[t] == failed[t] && count2[t] == count[t];
        for (int j = 0; same && !failed[t] && j < k; ++j)
            same = idx2[(size_t)t * k + j] == idx[(size_t)t * k + j] &&
                   std::memcmp(&val2[(size_t)t * k + j], &val[(size_t)t * k + j], 4) == 0;
        if (!same) return t;
    }
    return -1;
}

// table_v2.py cluster_geometry: words of one slice buffer (S + P elements, S = ceil(L / C) rounded
// up to a vector, in whole 16-byte vectors)
static int cluster_buf_words(int L, int C, int P, int esize) {
    const int S = ((L + C - 1) / C + P - 1) / P * P;
    return ((S + P) * esize + 15) / 16 * 4;
}

// The cluster kernel (table_v2.py FUSED_CLUSTER) at C blocks of THREADS threads, `clusters` clusters,
// the fused kernel's cap: its counts and listed rows must equal the fused kernel's and its finished
// rows the fused kernel's bit for bit; then the radix kernel finishes its listed rows and its final
// output is written out (checked against the reference by emulate.py).
template <class Src, int C, int THREADS, bool SHARE>
static void run_cluster(std::ofstream& out, const void* table, int n, long long L, int k, int cap, int aligned,
                        const std::vector<int>& lo, const std::vector<int>& hi, int tcap, int clusters,
                        const std::vector<int>& idx, const std::vector<float>& val, const std::vector<int>& count,
                        const std::vector<unsigned char>& failed) {
    const int P = TableVec<Src>::PER_VEC;
    const int bw = cluster_buf_words((int)L, C, P, 16 / P);
    std::vector<int> idx2((size_t)n * k, 9), count2(n, -5), flagged2(n, -3), nflagged2(1, 0);
    std::vector<float> val2((size_t)n * k, 9.0f);
    emu::launch_cluster({(unsigned)(clusters * C), 1, 1}, C, THREADS, 4 * table_cluster_smem_words(k, cap, bw, THREADS), [&] {
        hytopk_table_cluster<Src, C, THREADS, SHARE>(table, L, n, lo.data(), hi.data(), k, cap, bw, aligned, 3.0, 1, 0,
                                              count2.data(), flagged2.data(), nflagged2.data(), idx2.data(), val2.data());
    });
    const std::vector<unsigned char> failed2 = listed_mask(flagged2, nflagged2, n);
    const int t = first_row_differing(n, k, failed2, count2, idx2, val2, failed, count, idx, val);
    if (t >= 0) {
        std::fprintf(stderr, "cluster (C = %d, %d threads, share %d): row %d differs from the fused kernel (count %d "
                     "vs %d, listed %d vs %d)\n", C, THREADS, (int)SHARE, t, count2[t], count[t], failed2[t], failed[t]);
        std::exit(1);
    }
    emu::launch({(unsigned)std::min(n, 2), 1, 1}, 512, 4 * table_topk_smem_words(k, tcap), [&] {
        hytopk_table_topk_listed<Src>(table, L, n, flagged2.data(), nflagged2.data(), lo.data(), hi.data(), k, tcap,
                                      aligned, idx2.data(), val2.data());
    });
    wr(out, idx2.data(), idx2.size()); wr(out, val2.data(), val2.size());
}

// Run sampling (table_v2.py SAMPLING "runs"): the fused kernel at 512 threads with runs = 1, the radix
// kernel on its listed rows, and the threshold kernel with runs = 1; writes idx, val, count, listed mask
// and T (emulate.py checks them against the reference's run_sample_positions).
template <class Src>
static void run_runs(std::ofstream& out, const void* table, int n, long long L, int k, int cap, int tcap, int aligned,
                     const std::vector<int>& lo, const std::vector<int>& hi, const std::vector<int>& M,
                     const std::vector<int>& r) {
    std::vector<int> idx((size_t)n * k, 9), count(n, -5), flagged(n, -3), nflagged(1, 0);
    std::vector<float> val((size_t)n * k, 9.0f);
    emu::launch({(unsigned)n, 1, 1}, 512, 4 * table_fused_smem_words(k, cap), [&] {
        hytopk_table_fused<Src>(table, L, n, lo.data(), hi.data(), k, cap, aligned, 2, 3.0, 1, 1, 0, 0, count.data(),
                                flagged.data(), nflagged.data(), idx.data(), val.data());
    });
    emu::launch({(unsigned)std::min(n, 2), 1, 1}, 512, 4 * table_topk_smem_words(k, tcap), [&] {
        hytopk_table_topk_listed<Src>(table, L, n, flagged.data(), nflagged.data(), lo.data(), hi.data(), k, tcap,
                                      aligned, idx.data(), val.data());
    });
    const std::vector<unsigned char> failed = listed_mask(flagged, nflagged, n);
    std::vector<float> T(n, 5.0f);
    emu::launch({(unsigned)n, 1, 1}, 512, 0, [&] {
        hytopk_table_threshold<Src>(table, L, n, lo.data(), hi.data(), M.data(), r.data(), reinterpret_cast<u32*>(T.data()),
                                    nullptr, nullptr, 1);
    });
    wr(out, idx.data(), idx.size()); wr(out, val.data(), val.size()); wr(out, count.data(), n); wr(out, failed.data(), n);
    wr(out, T.data(), n);
    {   // table_topk's plan (table.py TOPK_OVERSAMPLE / TOPK_MIN_RANK / TOPK_COARSE = 1.5, 48, 8), then the
        // radix kernel on its listed rows: idx, val, count, listed mask (emulate.py: reference.coarse_key)
        std::vector<int> idx3((size_t)n * k, 9), count3(n, -5), flagged3(n, -3), nflagged3(1, 0);
        std::vector<float> val3((size_t)n * k, 9.0f);
        emu::launch({(unsigned)n, 1, 1}, 512, 4 * table_fused_smem_words(k, cap), [&] {
            hytopk_table_fused<Src>(table, L, n, lo.data(), hi.data(), k, cap, aligned, 2, 1.5, 1, 1, 48, 8,
                                    count3.data(), flagged3.data(), nflagged3.data(), idx3.data(), val3.data());
        });
        emu::launch({(unsigned)std::min(n, 2), 1, 1}, 512, 4 * table_topk_smem_words(k, tcap), [&] {
            hytopk_table_topk_listed<Src>(table, L, n, flagged3.data(), nflagged3.data(), lo.data(), hi.data(), k,
                                          tcap, aligned, idx3.data(), val3.data());
        });
        const std::vector<unsigned char> failed3 = listed_mask(flagged3, nflagged3, n);
        wr(out, idx3.data(), idx3.size()); wr(out, val3.data(), val3.size()); wr(out, count3.data(), n);
        wr(out, failed3.data(), n);
        // the short rows' launch (table_v2.py FUSED_SHORT = (512, 3)): its cap 6144 (float32: the
        // immediate-offset appends at that distance, 4 vectors a step), then the radix kernel on what
        // it listed: every row and count equal to the (512, 2) launch's, bit for bit
        std::vector<int> idx4((size_t)n * k, 9), count4(n, -5), flagged4(n, -3), nflagged4(1, 0);
        std::vector<float> val4((size_t)n * k, 9.0f);
        emu::launch({(unsigned)n, 1, 1}, 512, 4 * table_fused_smem_words(k, 6144), [&] {
            hytopk_table_fused_cfg<Src, 512, 3>(table, L, n, lo.data(), hi.data(), k, 6144, aligned, 2, 1.5, 1, 1, 48, 8,
                                                count4.data(), flagged4.data(), nflagged4.data(), idx4.data(),
                                                val4.data());
        });
        emu::launch({(unsigned)std::min(n, 2), 1, 1}, 512, 4 * table_topk_smem_words(k, tcap), [&] {
            hytopk_table_topk_listed<Src>(table, L, n, flagged4.data(), nflagged4.data(), lo.data(), hi.data(), k,
                                          tcap, aligned, idx4.data(), val4.data());
        });
        const std::vector<unsigned char> none(n, 0);
        const int t = first_row_differing(n, k, none, count4, idx4, val4, none, count3, idx3, val3);
        if (t >= 0) { std::fprintf(stderr, "fused (512, 3): row %d differs from the (512, 2) launch\n", t); std::exit(1); }
    }
}

template <class Src>
static void run(std::ifstream& in, std::ofstream& out, int n, int L, int k, int capacity, int offset, int esize,
                int mode) {
    std::vector<int> lo(n), hi(n), M(n), r(n);
    std::vector<float> T(n);
    rd(in, lo.data(), n); rd(in, hi.data(), n); rd(in, M.data(), n); rd(in, r.data(), n); rd(in, T.data(), n);
    std::vector<unsigned char> buf((size_t)n * L * esize + 64 + 16);
    unsigned char* base = buf.data() + (16 - (reinterpret_cast<uintptr_t>(buf.data()) % 16)) % 16 + (size_t)offset * esize;
    in.read(reinterpret_cast<char*>(base), (size_t)n * L * esize);
    const void* table = base;
    emu::table_begin = base;                    // every prefetch_l2 checked against its contexts
    emu::table_end = base + (size_t)n * L * esize;
    emu::table_L = L, emu::table_esize = esize, emu::table_lo = lo.data(), emu::table_hi = hi.data();
    const int aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0;
    const long long LL = L;
    const int limit_words = 232448 / 4;

    // fused v2 + fallback (table_v2.py fused_v2 / fused_cap, table.py topk_cap)
    const int kw = next_pow2_h(k) > 512 ? next_pow2_h(k) : 512;
    int fixed = 256 + 6 + 3 * kw;
    int cap = (110 * 1024 / 4 - fixed) / 2 / 256 * 256;
    if (cap < 4096) cap = (limit_words - fixed) / 2;
    cap = std::min(cap, 16384);
    std::vector<int> idx((size_t)n * k, 7), count(n, -5), flagged(n, -3), nflagged(1, 0);
    std::vector<float> val((size_t)n * k, 7.0f);
    emu::launch({(unsigned)n, 1, 1}, 512, 4 * table_fused_smem_words(k, cap), [&] {
        hytopk_table_fused<Src>(table, LL, n, lo.data(), hi.data(), k, cap, aligned, 2, 3.0, 1, 0, 0, 0, count.data(),
                                flagged.data(), nflagged.data(), idx.data(), val.data());
    });
    int tfixed = 2048 + 12 + 3 * next_pow2_h(k);
    int tcap = (110 * 1024 / 4 - tfixed) / 2 / 256 * 256;
    if (tcap < 256) tcap = (limit_words - tfixed) / 2;
    tcap = std::min(tcap, 16384);
    emu::launch({(unsigned)std::min(n, 2), 1, 1}, 512, 4 * table_topk_smem_words(k, tcap), [&] {   // a grid smaller than the list
        hytopk_table_topk_listed<Src>(table, LL, n, flagged.data(), nflagged.data(), lo.data(), hi.data(), k, tcap,
                                      aligned, idx.data(), val.data());
    });
    const std::vector<unsigned char> failed = listed_mask(flagged, nflagged, n);
    if (mode & 1) {             // the fused kernel and the cluster kernel at C = 8 only (long rows)
        wr(out, idx.data(), idx.size()); wr(out, val.data(), val.size()); wr(out, count.data(), n); wr(out, failed.data(), n);
        run_cluster<Src, 8, 128, true>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, 1, idx, val, count, failed);
        run_cluster<Src, 8, 128, false>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, 1, idx, val, count, failed);
        run_runs<Src>(out, table, n, LL, k, cap, tcap, aligned, lo, hi, M, r);
        return;
    }
    // the cluster kernel: C = 2 on two clusters (rows alternate) with the ranking shared, C = 4 on one
    // (every leader in turn) without; mode & 2: also the other two
    run_cluster<Src, 2, 128, true>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, std::min(n, 2), idx, val, count, failed);
    run_cluster<Src, 4, 128, false>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, 1, idx, val, count, failed);
    if (mode & 2) {
        run_cluster<Src, 4, 128, true>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, 1, idx, val, count, failed);
        run_cluster<Src, 2, 128, false>(out, table, n, LL, k, cap, aligned, lo, hi, tcap, std::min(n, 2), idx, val, count,
                                        failed);
    }
    {   // the default launch (table_v2.py FUSED_THREADS / FUSED_MIN_BLOCKS = 1024, 1): its finished rows
        // must equal the 512-thread kernel's bit for bit, and it must flag the same rows (same cap)
        std::vector<int> idx2((size_t)n * k, 9), count2(n, -5), flagged2(n, -3), nflagged2(1, 0);
        std::vector<float> val2((size_t)n * k, 9.0f);
        emu::launch({(unsigned)n, 1, 1}, 1024, 4 * table_fused_smem_words(k, cap, 1024), [&] {
            hytopk_table_fused_cfg<Src, 1024, 1>(table, LL, n, lo.data(), hi.data(), k, cap, aligned, 2, 3.0, 1, 0, 0,
                                                 0,
                                                 count2.data(), flagged2.data(), nflagged2.data(), idx2.data(), val2.data());
        });
        const int t = first_row_differing(n, k, listed_mask(flagged2, nflagged2, n), count2, idx2, val2, failed, count,
                                          idx, val);
        if (t >= 0) { std::fprintf(stderr, "fused (1024, 1): row %d differs from the 512-thread kernel\n", t); std::exit(1); }
    }
    // the one-read kernel (table_v2.py FUSED_ONE_READ): its finished rows must equal the 512-thread
    // kernel's bit for bit, with the same counts and the same listed rows (same cap); z = -1 forces
    // the one-read plan on every row (at 1024 threads), z = 3 is table_v2.py's default (at 512)
    int one_read[2] = {0, 0};
    for (int variant = 0; variant < 2; ++variant) {
        std::vector<int> idx2((size_t)n * k, 9), count2(n, -5), flagged2(n, -3), nflagged2(1, 0);
        std::vector<float> val2((size_t)n * k, 9.0f);
        g_one_read_rows = 0;
        const int threads = variant == 0 ? 1024 : 512;
        emu::launch({(unsigned)n, 1, 1}, threads, 4 * table_fused_smem_words(k, cap, threads), [&] {
            if (variant == 0)
                hytopk_table_fused1<Src, 1024, 1>(table, LL, n, lo.data(), hi.data(), k, cap, aligned, 2, 3.0, 1, -1.0,
                                                  count2.data(), flagged2.data(), nflagged2.data(), idx2.data(), val2.data());
            else
                hytopk_table_fused1<Src, 512, 2>(table, LL, n, lo.data(), hi.data(), k, cap, aligned, 2, 3.0, 1, 3.0,
                                                 count2.data(), flagged2.data(), nflagged2.data(), idx2.data(), val2.data());
        });
        one_read[variant] = g_one_read_rows;
        const int t = first_row_differing(n, k, listed_mask(flagged2, nflagged2, n), count2, idx2, val2, failed, count,
                                          idx, val);
        if (t >= 0) {
            std::fprintf(stderr, "fused1 (%d threads): row %d differs from the 512-thread fused kernel\n", threads, t);
            std::exit(1);
        }
    }
    wr(out, idx.data(), idx.size()); wr(out, val.data(), val.size()); wr(out, count.data(), n); wr(out, failed.data(), n);
    wr(out, one_read, 2);

    // threshold v2
    std::vector<float> T2(n, 5.0f);
    std::vector<int> zeros(n + 1, 3);
    emu::launch({(unsigned)n, 1, 1}, 512, 0, [&] {
        hytopk_table_threshold<Src>(table, LL, n, lo.data(), hi.data(), M.data(), r.data(),
                                    reinterpret_cast<u32*>(T2.data()), zeros.data(), zeros.data() + n, 0);
    });
    for (int z : zeros)
        if (z != 0) { std::fprintf(stderr, "threshold: a count was not zeroed\n"); std::exit(1); }
    wr(out, T2.data(), n);

    // filter v2 on the given T (table_v2.py filter_geometry)
    const int P = TableVec<Src>::PER_VEC;
    const long long piece_vecs = 256LL * StreamU<Src>::U * 8;
    const bool aligned_rows = aligned && L % P == 0;
    const long long span = aligned_rows ? L / P : (L - 1) / P + 2;
    const int pieces = (int)std::max(1LL, (span + piece_vecs - 1) / piece_vecs);
    const int stage = std::min(capacity, 4096);
    std::vector<int> ci((size_t)n * capacity, -1), cnt(n, 0);
    std::vector<float> cv((size_t)n * capacity, -INFINITY);
    emu::launch({(unsigned)(n * pieces), 1, 1}, 256, 4 * (2 * stage + 2), [&] {
        hytopk_table_filter_pieces<Src>(table, LL, n, lo.data(), hi.data(), reinterpret_cast<const u32*>(T.data()),
                                        capacity, pieces, piece_vecs, stage, aligned, 1, ci.data(),
                                        reinterpret_cast<u32*>(cv.data()), cnt.data());
    });
    wr(out, ci.data(), ci.size()); wr(out, cv.data(), cv.size()); wr(out, cnt.data(), n);

    // select_smem on the filter's output (table_v2.py select_cap): the fast select (block_select_fast,
    // the body of select.cu's hytopk_select_fast too), then the key select + register sort
    const int scap = std::min(capacity, 8192);
    for (int fast = 1; fast >= 0; --fast) {
        std::vector<int> sidx((size_t)n * k, 7);
        std::vector<float> sval((size_t)n * k, 7.0f);
        emu::launch({(unsigned)n, 1, 1}, 512, 4 * select_smem_words(k, scap), [&] {
            hytopk_select_smem(n, ci.data(), reinterpret_cast<const u32*>(cv.data()), cnt.data(), capacity, k, scap,
                               sidx.data(), sval.data(), fast);
        });
        wr(out, sidx.data(), sidx.size()); wr(out, sval.data(), sval.size());
    }
    run_runs<Src>(out, table, n, LL, k, cap, tcap, aligned, lo, hi, M, r);
}

int main(int argc, char** argv) {
    std::ifstream in(argv[1], std::ios::binary);
    std::ofstream out(argv[2], std::ios::binary);
    int h[7];
    rd(in, h, 7);
    const int n = h[0], L = h[1], k = h[2], bf16 = h[3], capacity = h[4], offset = h[5], mode = h[6];
    if (bf16) run<TableBf16Source>(in, out, n, L, k, capacity, offset, 2, mode);
    else run<TableSource>(in, out, n, L, k, capacity, offset, 4, mode);
    return 0;
}
