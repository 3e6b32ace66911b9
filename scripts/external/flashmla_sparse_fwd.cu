// A C entry point for FlashMLA's sm90 sparse prefill forward (deepseek-ai/FlashMLA,
// csrc/sm90/prefill/sparse), so that scripts/bench_attention.py can time it as an external
// baseline through ctypes, without torch's extension build. Built by build_flashmla.sh against a
// FlashMLA checkout and CUTLASS headers; nothing of FlashMLA is kept in this repository.
// MLA layout only: q [s_q, h_q, 576] bf16, kv [s_kv, 576] bf16 (one kv head), indices [s_q, topk]
// int32 (-1 / out of range: skipped), out [s_q, h_q, 512] bf16, max_logits / lse [s_q, h_q] float
// (natural log). FlashMLA's own limits: h_q a multiple of 64, topk a multiple of 128 (checked by
// the caller: workbench/harness/flashmla.py). Returns 0, or a CUDA error code, or -1 (an exception).
#include <cstdio>
#include <exception>
#include "params.h"
#include "sm90/prefill/sparse/phase1.h"

extern "C" int hytopk_flashmla_sparse_fwd(void* q, void* kv, int* indices, void* out, float* max_logits,
                                          float* lse, int s_q, int s_kv, int h_q, int topk, float sm_scale,
                                          int num_sms, void* stream) {
    constexpr int DQK = 576, DV = 512;
    SparseAttnFwdParams p = {};
    p.s_q = s_q;
    p.s_kv = s_kv;
    p.h_q = h_q;
    p.h_kv = 1;
    p.d_qk = DQK;
    p.d_v = DV;
    p.topk = topk;
    p.sm_scale = sm_scale;
    p.sm_scale_div_log2 = sm_scale * 1.4426950408889634f;   // the kernel's exponents are base 2
    p.q = static_cast<cutlass::bfloat16_t*>(q);
    p.kv = static_cast<cutlass::bfloat16_t*>(kv);
    p.indices = indices;
    p.attn_sink = nullptr;
    p.topk_length = nullptr;
    p.stride_q_s_q = h_q * DQK;
    p.stride_q_h_q = DQK;
    p.stride_kv_s_kv = DQK;
    p.stride_kv_h_kv = DQK;
    p.stride_indices_s_q = topk;
    p.stride_indices_h_kv = topk;
    p.out = static_cast<cutlass::bfloat16_t*>(out);
    p.max_logits = max_logits;
    p.lse = lse;
    p.num_sm = num_sms;
    p.stream = static_cast<cudaStream_t>(stream);
    try {
        sm90::fwd::run_fwd_phase1_kernel<DQK, false>(p);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hytopk_flashmla_sparse_fwd: %s\n", e.what());
        return -1;
    }
    return static_cast<int>(cudaGetLastError());
}
