"""Selection plans for the ``hytopk::select`` op, kept across calls.

A training loop calls the op with the same context ranges every step; its host work
(range validation, sample plan, capacity, passes, uploads) is done once per layout by
``Backend.plan`` and the plan reused: a call then only launches kernels.

Plans are keyed by the identity of lo/hi (device, data pointer, version counter, shape) and
hold references to them, so their memory cannot be reused for other ranges while the plan
lives and an in-place edit (which bumps the version counter) makes a new plan. Edits that
bypass torch (raw pointers) are not seen: make new tensors instead.

While a CUDA graph is captured nothing may be read from the host. A capture finds its plan by
that key, or (torch.compile's CUDA graphs copy inputs into static buffers) the most recent
plan of the same (n, L, k, ...) signature, and then a device-side assert checks that the
captured lo/hi hold that plan's values. A capture with no plan at all is an error that says
to run the op once before capturing (the warm-up torch.cuda.graph asks for anyway).
"""
from __future__ import annotations

import collections

import torch

KEEP = 8                    # plans kept (least recently used dropped first)
_PLANS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()


def _signature(backend, lo, L, k, capacity, oversample, max_failed):
    return (id(backend), str(lo.device), int(lo.shape[0]), int(L), int(k), capacity, float(oversample),
            int(max_failed))


def _identity(lo, hi):
    return (lo.data_ptr(), lo._version, str(lo.dtype), hi.data_ptr(), hi._version, str(hi.dtype))


def get(backend, lo, hi, L, k, capacity, oversample, max_failed, *, capturing: bool):
    """The plan for these ranges (made now, eagerly, when new; see the module docstring)."""
    sig = _signature(backend, lo, L, k, capacity, oversample, max_failed)
    key = sig + _identity(lo, hi)
    hit = _PLANS.get(key)
    if hit is not None:
        _PLANS.move_to_end(key)
        return hit[0]
    if capturing:
        for other in reversed(_PLANS):
            if other[:len(sig)] == sig:
                plan = _PLANS[other][0]
                lo_p, hi_p = (torch.as_tensor(a, device=lo.device) for a in (plan.lo_d, plan.hi_d))
                same = (lo.to(lo_p.dtype) == lo_p).all() & (hi.to(hi_p.dtype) == hi_p).all()
                torch._assert_async(same, "hytopk::select under CUDA-graph capture: lo/hi differ from the "
                                          "planned layout")
                return plan
        raise RuntimeError("hytopk::select under CUDA-graph capture needs a selection plan for this layout "
                           f"(n={lo.shape[0]}, L={L}, k={k}): call the op once with these lo/hi before capturing "
                           "(the warm-up torch.cuda.graph asks for)")
    plan = backend.plan(lo, hi, k, L=L, capacity=capacity, oversample=oversample, max_failed=max_failed)
    _PLANS[key] = (plan, lo, hi)
    while len(_PLANS) > KEEP:
        _PLANS.popitem(last=False)
    return plan


def clear():
    _PLANS.clear()
