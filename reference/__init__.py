"""The HyTopK contract in pure NumPy: docs/CONTRACT.md made executable.

Brute force (`topk`) defines the answer; `hytopk` runs the kernels' stages one
by one and must equal it bit for bit. Every backend copies this public API.
"""
from .capacity import default_capacity, resolve_capacity
from .candidates import stage_check, stage_filter
from .dtypes import IndexerDtypes, check_indexer_args, check_indexer_dtypes
from .fp8 import Fp8IndexerSource
from .indexer import indexer_kl_loss, indexer_scores, indexer_source, replay_scores
from .order import empty_selection, order_keys, rank_order, stage_score_only, table_float32, topk
from .pipeline import HyTopKResult, hytopk, hytopk_indexer, run_stages
from .radix import exact_topk_of_entries, select_kth_key, select_positions, sort_rank_order
from .sampling import (coarse_key, key_score, num_samples, run_sample_positions, runs_apply, sample_plan,
                       sample_positions, stage_threshold, threshold_rank)
from .select import fallback_all, stage_recover, stage_select
from .sources import IndexerSource, TableSource, indexer_score_block

__all__ = [
    "order_keys", "topk", "table_float32", "hytopk", "hytopk_indexer", "HyTopKResult",
    "indexer_scores", "replay_scores", "indexer_kl_loss", "default_capacity", "resolve_capacity",
    "TableSource", "IndexerSource", "Fp8IndexerSource", "indexer_source", "indexer_score_block",
    "IndexerDtypes", "check_indexer_args", "check_indexer_dtypes",
    "num_samples", "threshold_rank", "sample_plan", "sample_positions", "run_sample_positions", "runs_apply",
    "coarse_key", "key_score",
    "stage_threshold", "stage_filter", "stage_check", "stage_select",
    "stage_recover", "stage_score_only", "fallback_all", "run_stages", "rank_order",
    "select_kth_key", "select_positions", "sort_rank_order", "exact_topk_of_entries",
]
