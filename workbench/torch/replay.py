"""Selection replay under activation recomputation (docs/CONTRACT.md §4).

Non-reentrant torch.utils.checkpoint with a selective-checkpoint policy: the
outputs of ``hytopk.select`` are saved in the forward pass (MUST_SAVE) and
handed back during recomputation, so only the cheap O(n k H D) replay and the
rest of ``fn`` run again; selection never does.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from . import ops  # noqa: F401  (registers torch.ops.hytopk)


# ops whose outputs are saved, never recomputed: the selection (and context parallel's, which
# workbench.distributed.dsa registers here: rerunning it would rerun a collective)
SAVED_OPS = {torch.ops.hytopk.select.default}


def replay_policy(ctx, func, *args, **kwargs):
    """Save the selection, recompute everything else."""
    if func in SAVED_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_with_replay(fn, *args, preserve_rng_state: bool = True, **kwargs):
    """``fn(*args, **kwargs)`` under non-reentrant checkpointing that replays the saved selection."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, replay_policy)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn,
                      preserve_rng_state=preserve_rng_state, **kwargs)
