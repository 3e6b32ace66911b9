#!/usr/bin/env bash
# CuPy kernels under compute-sanitizer (memcheck, racecheck); prints one summary
# line per job. Needs a GPU; run from the repo root on the H200:
#   bash scripts/sanitize.sh                 (logs land in results/sanitizer/)
#   JOBS="racecheck:variants memcheck:variants" bash scripts/sanitize.sh   (a subset of the jobs)
# Sanitizers slow kernels 10-100x (racecheck tracks every shared-memory access),
# so jobs use small shapes and the 'sanitize' Hypothesis profile (3 examples).
set -uo pipefail
cd "$(dirname "$0")/.."
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
PY=${PYTHON:-python}
OUT=results/sanitizer
mkdir -p "$OUT"
G=tests/test_cupy_gpu.py
# the adversarial table pipelines, exact indexer inputs at H=64 / D=128, ties, score-only
BIG=("$G::test_table_pipeline_matches_reference[full-relu_plateau]"
     "$G::test_table_pipeline_matches_reference[causal_tail-specials]"
     "$G::test_table_pipeline_matches_reference[edge-alias_between_samples]"
     "$G::test_indexer_exact_matches_reference"
     "$G::test_select_is_bitwise_deterministic_on_ties"
     "$G::test_score_only_checksum_is_sum_of_order_keys")
# every registered CuPy variant (stage tests + pipelines) on small Hypothesis cases
VARIANTS=(tests/test_variants.py -k "cupy and not big and not bad_input")
# the mma_sync core at H=64 (4 queries per block), one case per dtype
MMA64=("$G::test_indexer_exact_matches_reference[float32-cupy.filter.mma_sync]")
# the wgmma core (ping-pong named barriers, async-proxy fences): bf16 at H=8 (16 slots), fp8 at H=64
W=tests/test_wgmma.py::test_wgmma_epilogues_agree_bitwise_on_random_inputs
WGMMA=("$W[8-bf16]" "$W[64-fp8]")
# the warp-specialised core (mbarriers, bulk copies, setmaxnreg): its stages at H=8 bf16 and H=64 fp8, the flush path
WS=tests/test_wgmma_ws.py
WSJOB=("$WS::test_ws_stages_agree_bitwise_on_random_inputs[8-bf16]" "$WS::test_ws_stages_agree_bitwise_on_random_inputs[64-fp8]"
       "$WS::test_ws_filter_flushes_full_staging_buffers")
# sparse attention (attend.cu): forward one/pair at MLA 16 heads and padded GQA, the deterministic backward,
# the key-major backward (MHA, GQA 192/128), the bitmap union (its sorting fallback too)
A=tests/test_attention_gpu.py
ATTEND=("$A::test_random_inputs_match_reference[empty-base-1-mla16]" "$A::test_random_inputs_match_reference[shared-base-2-mla16]"
        "$A::test_random_inputs_match_reference[dups-base-2-gqa_pad]" "$A::test_backward_matches_reference[dups-det-mla8]"
        "$A::test_backward_matches_reference[empty-atomic-gqa_pad]"
        "$A::test_key_major_backward_matches_reference[dups-mha4_d128]"
        "$A::test_key_major_backward_matches_reference[empty-gqa2x1_d192_128]"
        "$A::test_pair_union_bits_at_the_bench_size_with_repeats"
        "$A::test_pair_union_kernel_equals_reference[7-100-shared-bits]")
# the table top-k kernels (issue 21): radix top-k (collect and >cap-ties paths, unaligned bases), streaming
# filters (v1, v2: pieces, every threshold kind, the stage's spill), plans (v1, v2), fused v2, select_smem
TT=tests/test_table_topk_gpu.py
TABLEJOB=("$TT::test_more_ties_at_the_kth_key_than_fit_in_shared_memory" "$TT::test_unaligned_table_base_and_edges"
          "$TT::test_filter_stage_matches_reference_including_overflow" "$TT::test_recover_stage_on_a_subset_of_rows"
          "$TT::test_table_hytopk_plan_matches_reference[v1-float32-alias_between_samples-edge]"
          "$TT::test_table_hytopk_plan_matches_reference[v1-bfloat16-relu_plateau-causal_tail]"
          "$TT::test_table_hytopk_plan_matches_reference[v2-float32-alias_between_samples-edge]"
          "$TT::test_table_hytopk_plan_matches_reference[v2-bfloat16-relu_plateau-causal_tail]"
          "$TT::test_filter_stage_long_rows_pieces_and_every_threshold_kind[v2-float32]"
          "$TT::test_fused_hytopk_counts_are_the_contracts[float32-relu_plateau-v2]"
          "$TT::test_fused_hytopk_counts_are_the_contracts[bfloat16-specials-v2]"
          "$TT::test_select_smem_matches_reference_in_and_past_shared_memory"
          "$TT::test_run_sampling_thresholds_counts_and_top_k[float32-alias_on_samples]"
          "$TT::test_run_sampling_thresholds_counts_and_top_k[bfloat16-specials]"
          "$TT::test_topk_plan_min_rank_counts_and_top_k[float32-relu_plateau]"
          "$TT::test_topk_plan_min_rank_counts_and_top_k[float32-specials]")
# the cluster table kernel (distributed shared memory, bulk copies, mbarriers): listed rows, unaligned
# bases, and the exact rows at both cluster sizes with a grid of a few clusters (every leader in turn)
CL=(tests/test_table_topk_gpu.py -k "test_fused_hytopk_cluster_listed_rows or (test_fused_hytopk_cluster_is_exact and ties_at_kth and (8-1-40 or 4-0-2))")

# the wgmma attention forwards (attend_wgmma2.cu: producer warpgroup, mbarriers, setmaxnreg), a few random cases,
# its query-pair kernel (wgmma2sp), and the wgmma MLA backward (attend_wgmma_bwd.cu: direct, staged, split) on duplicated keys
AW=(tests/test_attention_wgmma_gpu.py tests/test_attention_wgmma_bwd_gpu.py -k "(test_random_inputs_match_reference and 100 and (empty or dups) and 64) or (test_pair_random_inputs_match_reference and 100 and dups and 16) or (test_backward_matches_reference and dups) or (test_staged_matches_reference and dups) or (test_split_matches_reference and (dups or pad_only))")
# the sort-free selects (hytopk_select_fast.cuh): select_smem and cupy.select.fast at k = 300 / 2048, every family
SEL=(tests/test_select_smem_gpu.py -k "test_select_smem_matches_reference and (300 or 2048)")

status=0
job() {   # job TOOL NAME PYTEST-ARGS...
  local tool=$1 name=$2; shift 2
  local log="$OUT/$tool-$name.log"
  HYPOTHESIS_PROFILE=sanitize "$SAN" --tool "$tool" --target-processes all --print-limit 20 \
      --error-exitcode 99 "$PY" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
  local rc=$?
  local summary tests
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error SUMMARY" "$log" | tail -1)
  tests=$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -1)
  echo "$tool $name: exit $rc | ${summary:-no sanitizer summary line} | ${tests:-no pytest summary}"
  [ $rc -ne 0 ] && status=1
}
for j in ${JOBS:-memcheck:big memcheck:variants racecheck:variants racecheck:mma64 memcheck:table racecheck:table}; do
  case "$j" in
    *:big) job "${j%%:*}" big "${BIG[@]}" ;;
    *:variants) job "${j%%:*}" variants "${VARIANTS[@]}" ;;
    *:mma64) job "${j%%:*}" mma64 "${MMA64[@]}" ;;
    *:wgmma) job "${j%%:*}" wgmma "${WGMMA[@]}" ;;
    *:ws) job "${j%%:*}" ws "${WSJOB[@]}" ;;
    *:attend) job "${j%%:*}" attend "${ATTEND[@]}" ;;
    *:table) job "${j%%:*}" table "${TABLEJOB[@]}" ;;
    *:attendw) job "${j%%:*}" attendw "${AW[@]}" ;;
    *:select) job "${j%%:*}" select "${SEL[@]}" ;;
    *:cluster) job "${j%%:*}" cluster "${CL[@]}" ;;
    *) echo "unknown job $j (TOOL:big|variants|mma64|wgmma|ws|attend|attendw|select|cluster|table)"; status=1 ;;
  esac
done
echo "logs: $OUT/"
exit $status
