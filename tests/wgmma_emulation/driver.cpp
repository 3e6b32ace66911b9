// Runs one wgmma attention forward (kernels_cuda/attend_wgmma2.cu or attend_wgmma3.cu) or the MLA
// backward (attend_wgmma_bwd.cu: version 4), compiled for the CPU by emulate.py, on the case in
// argv[1]; writes out and lse (the backward: dq and its dkv / part rows) to argv[2].
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "wgmma_emu.h"

typedef unsigned short bf16_t;
// the kernel translation units (emulate.py): one per source file
void emu_attend_wgmma2(bool out_bf16, bool swz, int qpt, const bf16_t* q, const bf16_t* kv, long long kv_stride,
                       const int* idx, const int* lens, const int* mult, int kk, int n, long long L, int Hq,
                       float scale_log2, void* out, float* lse);
void emu_attend_wgmma_bwd(int atomic, const bf16_t* q, const bf16_t* kv, long long ks, const int* idx, int kk, int n,
                          int t0, int count, long long L, int Hq, float scale, float sl2, const bf16_t* dout,
                          const float* lse, const float* delta, float* dq, float* out);
void emu_attend_wgmma3(bool out_bf16, int qpt, int opts, const bf16_t* q, const bf16_t* kv, long long kv_stride, const int* idx,
                       const int* lens, const int* mult, int kk, int n, long long L, int Hq, float scale_log2,
                       void* out, float* lse);

// a buffer of exactly n bytes at a 256-byte boundary (cudaMalloc's alignment), bounds as registered
static unsigned char* buffer(std::vector<unsigned char>& store, size_t n, const char* name) {
    store.assign(n + 256, 0xCD);
    unsigned char* p = store.data() + (256 - reinterpret_cast<uintptr_t>(store.data()) % 256) % 256;
    emu::wg::global_buffer(p, n, name);
    return p;
}

// version 4: header h[11..13] = t0, count, scale bits; then dout, lse, delta
static int backward(std::ifstream& in, const char* out_path, const int* h, const unsigned char* q,
                    const unsigned char* kv, const unsigned char* idx) {
    const int mode = h[1], atomic = mode & 1, n = h[3], Hq = h[4], kk = h[5], L = h[6], stride = h[7];
    int h2[3];
    in.read(reinterpret_cast<char*>(h2), sizeof h2);
    const int t0 = h2[0], count = h2[1];
    float scale, scale_log2;
    std::memcpy(&scale, &h2[2], 4);
    std::memcpy(&scale_log2, &h[9], 4);
    std::vector<unsigned char> sdo, slse, sdel, sdq, sout;
    const size_t rows = (size_t)n * Hq, dob = rows * 512 * 2;
    unsigned char* dout = buffer(sdo, dob, "dout");
    float* lse = reinterpret_cast<float*>(buffer(slse, rows * 4, "lse"));
    float* delta = reinterpret_cast<float*>(buffer(sdel, rows * 4, "delta"));
    in.read(reinterpret_cast<char*>(dout), (std::streamsize)dob);
    in.read(reinterpret_cast<char*>(lse), (std::streamsize)(rows * 4));
    in.read(reinterpret_cast<char*>(delta), (std::streamsize)(rows * 4));
    if (!in) { std::fprintf(stderr, "driver: short input\n"); return 2; }
    const int nhb = (Hq + 63) / 64;
    const size_t dqb = rows * 576 * 4;
    const int nrow = (mode & 8) ? 1 : nhb;           // split: one part row per (query, slot)
    const size_t ob = atomic ? (size_t)L * 576 * 4 : (size_t)count * nrow * kk * 576 * 4;
    float* dq = reinterpret_cast<float*>(buffer(sdq, dqb, "dq"));
    float* out = reinterpret_cast<float*>(buffer(sout, ob, atomic ? "dkv" : "part"));
    std::memset(dq, 0xff, dqb);                     // NaN: rows the kernel must not write stay NaN
    std::memset(out, atomic ? 0 : 0xff, ob);
    emu_attend_wgmma_bwd(mode, reinterpret_cast<const bf16_t*>(q), reinterpret_cast<const bf16_t*>(kv), stride,
                         reinterpret_cast<const int*>(idx), kk, n, t0, count, L, Hq, scale, scale_log2,
                         reinterpret_cast<const bf16_t*>(dout), lse, delta, dq, out);
    std::ofstream of(out_path, std::ios::binary);
    of.write(reinterpret_cast<const char*>(dq), (std::streamsize)dqb);
    of.write(reinterpret_cast<const char*>(out), (std::streamsize)ob);
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 3) { std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]); return 2; }
    std::ifstream in(argv[1], std::ios::binary);
    int h[11];
    in.read(reinterpret_cast<char*>(h), sizeof h);
    // (version 3: h[1] = the prefetch distance in pairs | interleave << 8)
    const int version = h[0], swz = h[1], out_bf16 = h[2], n = h[3], Hq = h[4], kk = h[5], L = h[6], stride = h[7];
    const int qpt = h[10];                          // 2: the pairs' union rows [P, 2 kk], counts [P], mult [P, 2 kk, 2] follow
    emu::wg::smem_off = (unsigned)h[8];
    float scale_log2;
    std::memcpy(&scale_log2, &h[9], 4);
    std::vector<unsigned char> sq, skv, sidx, sout, slse;
    const size_t qb = (size_t)n * Hq * 576 * 2, kvb = (size_t)L * stride * 2, ib = (size_t)n * kk * 4;
    unsigned char* q = buffer(sq, qb, "q");
    unsigned char* kv = buffer(skv, kvb, "kv");
    unsigned char* idx = buffer(sidx, ib, "idx");
    in.read(reinterpret_cast<char*>(q), (std::streamsize)qb);
    in.read(reinterpret_cast<char*>(kv), (std::streamsize)kvb);
    in.read(reinterpret_cast<char*>(idx), (std::streamsize)ib);
    std::vector<unsigned char> su, sc, sm;
    const int P = (n + 1) / 2, U = 2 * kk;
    const int *up = nullptr, *cp = nullptr, *mp = nullptr;
    if (qpt == 2) {
        unsigned char* u = buffer(su, (size_t)P * U * 4, "uidx");
        unsigned char* c = buffer(sc, (size_t)P * 4, "count");
        unsigned char* m = buffer(sm, (size_t)P * U * 8, "mult");
        in.read(reinterpret_cast<char*>(u), (std::streamsize)((size_t)P * U * 4));
        in.read(reinterpret_cast<char*>(c), (std::streamsize)((size_t)P * 4));
        in.read(reinterpret_cast<char*>(m), (std::streamsize)((size_t)P * U * 8));
        up = reinterpret_cast<const int*>(u), cp = reinterpret_cast<const int*>(c), mp = reinterpret_cast<const int*>(m);
    }
    if (version == 4) return backward(in, argv[2], h, q, kv, idx);
    if (!in) { std::fprintf(stderr, "driver: short input\n"); return 2; }
    const size_t ob = (size_t)n * Hq * 512 * (out_bf16 ? 2 : 4);
    unsigned char* out = buffer(sout, ob, "out");
    float* lse = reinterpret_cast<float*>(buffer(slse, (size_t)n * Hq * 4, "lse"));
    const bf16_t* qp = reinterpret_cast<const bf16_t*>(q);
    const bf16_t* kvp = reinterpret_cast<const bf16_t*>(kv);
    const int* ip = reinterpret_cast<const int*>(idx);
    if (version == 2 && qpt == 2) emu_attend_wgmma2(out_bf16, true, 2, qp, kvp, stride, up, cp, mp, U, n, L, Hq, scale_log2, out, lse);
    else if (version == 2) emu_attend_wgmma2(out_bf16, swz, 1, qp, kvp, stride, ip, nullptr, nullptr, kk, n, L, Hq, scale_log2, out, lse);
    else if (version == 3 && qpt == 2) emu_attend_wgmma3(out_bf16, 2, swz, qp, kvp, stride, up, cp, mp, U, n, L, Hq, scale_log2, out, lse);
    else if (version == 3) emu_attend_wgmma3(out_bf16, 1, swz, qp, kvp, stride, ip, nullptr, nullptr, kk, n, L, Hq, scale_log2, out, lse);
    else { std::fprintf(stderr, "driver: version %d\n", version); return 2; }
    std::ofstream of(argv[2], std::ios::binary);
    of.write(reinterpret_cast<const char*>(out), (std::streamsize)ob);
    of.write(reinterpret_cast<const char*>(lse), (std::streamsize)n * Hq * 4);
    return 0;
}
