"""HyTopK as a drop-in for the DSA indexers of Hugging Face transformers models.

    from workbench.torch.integrations.transformers import patch, unpatch
    patch(model)      # every DeepseekV32Indexer / GlmMoeDsaIndexer now takes its top-k from HyTopK
    unpatch(model)    # the original indexers again

transformers' indexer (``DeepseekV32Indexer``, GLM-5's ``GlmMoeDsaIndexer``; transformers >= 5.17)
scores every key of every query into a dense table, ``[B, S, H, T]`` float32 per head and then
``[B, S, T]``, and runs ``torch.topk`` on it. The patched forward computes the indexer's own q, keys
and float32 weights with the module's own layers (same RoPE, same key cache update), folds
``n_heads**-0.5 * softmax_scale`` into the weights (``relu(x * c) = c * relu(x)`` for c > 0) and
calls ``workbench.torch.select`` over packed per-sequence contexts taken from the attention mask:
no score table is written (on CUDA the CuPy / Numba kernels; on CPU the NumPy reference).

What stays the same: the output, int32 indices ``[B, S, min(index_topk, T)]`` in rank order. Where
the k-th score is tied the choice follows the contract (lower position first) while ``torch.topk``
picks any, so the selected sets agree wherever the k-th score is not tied. Slots beyond a short
context (fewer than k visible keys: the original returns masked positions there, which the
attention masks again) repeat the query's best key for the eager / sdpa attention (the index mask
is built by scatter: a repeat is harmless) and are -1 for other attention implementations
(kernels that consume indices, such as FlashMLA, skip -1). A mask that is not one contiguous
key range per query (or a float mask with biases other than 0 / min) falls back to the original
forward for that call (counted in ``state(model)``).

``IndexerAdapter`` exposes a transformers indexer as the indexer of ``workbench.torch.dsa.DSAttention``
(x -> q, w, keys, differentiable), for training it with the KL loss under ``checkpoint_with_replay``.
``tiny_config`` / ``tiny_model`` build small random-initialised models (tests, examples, benchmarks).
"""
from __future__ import annotations

import contextlib
import sys
import types
import torch
from torch import nn

# indexer class name -> the name of its RoPE function in its own modeling module
INDEXERS = {
    "DeepseekV32Indexer": "apply_rotary_pos_emb",                 # half-split RoPE
    "GlmMoeDsaIndexer": "apply_rotary_pos_emb_interleave",        # interleaved RoPE
}
MODEL_TYPES = {"deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
               "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM")}
MASK_BUDGET = 1 << 28            # mask elements read per chunk when deriving the key ranges


def _kind(module) -> str | None:
    for cls in type(module).__mro__:
        if cls.__name__ in INDEXERS:
            return cls.__name__
    return None


def find_indexers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every supported DSA indexer in ``model`` (``model`` itself included)."""
    return [(name, m) for name, m in model.named_modules() if _kind(m) is not None]


def _rope(indexer):
    fn = getattr(sys.modules[type(indexer).__module__], INDEXERS[_kind(indexer)], None)
    if fn is None:
        raise RuntimeError(f"{type(indexer).__name__}: its module has no {INDEXERS[_kind(indexer)]}; "
                           "this transformers version is not supported (pin transformers>=5.17)")
    return fn


def indexer_inputs(indexer, hidden_states, q_resid, position_embeddings, past_key_values=None):
    """The indexer's q [B, S, H, D] and keys [B, T, D] (model dtype) and its float32 weights
    [B, S, H] with ``n_heads**-0.5 * softmax_scale`` folded in, computed exactly as its own forward
    does (its layers, its RoPE, its key-cache update). Differentiable when grad is enabled."""
    B, S, _ = hidden_states.shape
    H, D, R = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    cos, sin = position_embeddings
    q = indexer.wq_b(q_resid).view(B, S, H, D)
    q_rot, q_pass = torch.split(q, [R, D - R], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [R, D - R], dim=-1)
    q_rot, k_rot = _rope(indexer)(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    if past_key_values is not None:
        k = past_key_values.update_indexer(k, indexer.layer_idx)
    w = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    w = w * (indexer.n_heads ** -0.5) * indexer.softmax_scale
    return q, k, w


def ranges_from_mask(mask, S: int, T: int, device=None):
    """Per-query key ranges [lo, hi) (int64 [B, S]) from the indexer's mask [B, S, T] (bool:
    True = visible; float: 0 = visible, a large negative = masked), or None when a query's visible
    keys are not one contiguous range (or a float mask carries other biases). None mask: causal,
    with the cache offset T - S."""
    if mask is None:
        hi = torch.arange(T - S + 1, T + 1, device=device, dtype=torch.int64)
        return torch.zeros(1, S, dtype=torch.int64, device=device), hi[None]
    B = mask.shape[0]
    mask = mask.expand(B, S, T)
    lo = torch.empty((B, S), dtype=torch.int64, device=mask.device)
    hi = torch.empty_like(lo)
    step = max(1, MASK_BUDGET // max(1, B * T))
    for a in range(0, S, step):
        m = mask[:, a:a + step]
        if m.dtype == torch.bool:
            vis = m
        else:
            vis = m > torch.finfo(m.dtype).min / 2
            if bool((vis & (m != 0)).any()):
                return None
        cnt = vis.sum(-1)
        first = vis.view(torch.uint8).argmax(-1)           # the first visible key (argmax: first max)
        # contiguous <=> at most one run of visible keys: count the runs' starts
        starts = vis[..., :1].sum(-1) + (vis[..., 1:] & ~vis[..., :-1]).sum(-1)
        if bool((starts > 1).any()):
            return None
        lo[:, a:a + step] = torch.where(cnt > 0, first, 0)
        hi[:, a:a + step] = torch.where(cnt > 0, first + cnt, 0)
    return lo, hi


def _options(module):
    return module.__dict__.get("_hytopk")


@torch.no_grad()
def _patched_forward(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None,
                     past_key_values=None):
    from workbench.torch import select
    opt = _options(self)
    B, S, _ = hidden_states.shape
    if attention_mask is not None:                   # checked before the key cache is touched
        ranges = ranges_from_mask(attention_mask, S, attention_mask.shape[-1])
        if ranges is None:                           # not one key range per query: the original, unchanged
            opt["fallbacks"] += 1
            return type(self).forward(self, hidden_states, q_resid, position_embeddings, attention_mask,
                                      position_ids, past_key_values=past_key_values)
    q, k, w = indexer_inputs(self, hidden_states, q_resid, position_embeddings, past_key_values)
    T = k.shape[1]
    if attention_mask is None:
        ranges = ranges_from_mask(None, S, T, q.device)
    H, D = q.shape[2], q.shape[3]
    lo, hi = (x.expand(B, S) for x in ranges)
    off = torch.arange(B, device=q.device, dtype=torch.int64)[:, None] * T
    kk = min(self.index_topk, T)
    idx, _ = select(q.reshape(B * S, H, D), w.reshape(B * S, H), k.reshape(B * T, D),
                    (lo + off).reshape(-1).to(torch.int32), (hi + off).reshape(-1).to(torch.int32), kk,
                    fp8=opt["fp8"], capacity=opt["capacity"], oversample=opt["oversample"],
                    max_failed=opt["max_failed"])
    idx = idx.view(B, S, kk)                         # int32 throughout: B * T < 2**31
    if B > 1:
        idx = torch.where(idx >= 0, idx - off.to(torch.int32)[:, :, None], idx)
    pad = opt["pad"]
    if pad is None:
        pad = "repeat" if getattr(self.config, "_attn_implementation", "eager") in ("eager", "sdpa") else "-1"
    if pad == "repeat":
        best = idx[..., :1].clamp(min=0)
        idx = torch.where(idx >= 0, idx, best)
    opt["calls"] += 1
    return idx.contiguous()


def patch(model: nn.Module, *, fp8: bool = False, oversample: float = 3.0, max_failed: int = 64,
          capacity: int | None = None, pad: str | None = None) -> list[str]:
    """Make every DSA indexer of ``model`` select with HyTopK; returns the patched module names.

    fp8: quantise the indexer's q/keys to e4m3 (workbench.torch.fp8.quantize) before selecting.
    pad: "repeat" | "-1" | None (= repeat for eager / sdpa attention, -1 otherwise); see the module
    docstring. Patching twice updates the options."""
    if pad not in (None, "repeat", "-1"):
        raise ValueError(f"argument 'pad' must be None, 'repeat' or '-1', got {pad!r}")
    found = find_indexers(model)
    if not found:
        raise ValueError(f"argument 'model': no DSA indexer ({' / '.join(INDEXERS)}) in {type(model).__name__}")
    for _, m in found:
        _rope(m)
        prev = _options(m) or {"calls": 0, "fallbacks": 0}
        m._hytopk = dict(prev, fp8=bool(fp8), oversample=oversample, max_failed=max_failed, capacity=capacity,
                         pad=pad)
        m.forward = types.MethodType(_patched_forward, m)
    return [name for name, _ in found]


def unpatch(model: nn.Module) -> list[str]:
    """Restore the original forward of every patched indexer; returns their names."""
    out = []
    for name, m in find_indexers(model):
        if _options(m) is not None:
            m.__dict__.pop("forward", None)
            del m._hytopk
            out.append(name)
    return out


def is_patched(model: nn.Module) -> bool:
    return any(_options(m) is not None for _, m in find_indexers(model))


def state(model: nn.Module) -> dict:
    """{indexer name: {options, calls, fallbacks}} of the patched indexers."""
    return {name: dict(_options(m)) for name, m in find_indexers(model) if _options(m) is not None}


@contextlib.contextmanager
def patched(model: nn.Module, **options):
    """``with patched(model): ...`` patches for the block and restores the original after."""
    patch(model, **options)
    try:
        yield model
    finally:
        unpatch(model)


# --------------------------------------------------------------------------- training adapter

def rotary_for(indexer) -> nn.Module:
    """The rotary embedding module of the indexer's model (built from its config)."""
    mod = sys.modules[type(indexer).__module__]
    for name in dir(mod):
        if name.endswith("RotaryEmbedding") and isinstance(getattr(mod, name), type):
            return getattr(mod, name)(indexer.config)
    raise RuntimeError(f"no RotaryEmbedding class beside {type(indexer).__name__}")


class IndexerAdapter(nn.Module):
    """A transformers DSA indexer as DSAttention's indexer: x [L, dim] -> (q [L, H, D], w [L, H]
    float32, keys [L, D]), differentiable in the indexer's parameters. It owns what the indexer
    reads from its attention layer: q_resid = RMSNorm(q_a_proj(x)) and the RoPE tables."""

    def __init__(self, indexer: nn.Module, dim: int | None = None):
        super().__init__()
        if _kind(indexer) is None:
            raise TypeError(f"argument 'indexer' must be one of {sorted(INDEXERS)}, got {type(indexer).__name__}")
        cfg = indexer.config
        dim = dim or cfg.hidden_size
        self.indexer = indexer
        self.q_a_proj = nn.Linear(dim, cfg.q_lora_rank, bias=False)
        self.q_a_norm = nn.RMSNorm(cfg.q_lora_rank, eps=getattr(cfg, "rms_norm_eps", 1e-6))
        self.rotary = rotary_for(indexer)

    def forward(self, x):
        L = x.shape[0]
        h = x[None]
        pos = torch.arange(L, device=x.device)[None]
        cos, sin = self.rotary(h, pos)
        q, k, w = indexer_inputs(self.indexer, h, self.q_a_norm(self.q_a_proj(h)), (cos, sin))
        return q[0], w[0], k[0]


# --------------------------------------------------------------------------- tiny random models

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, n_group=1,
            topk_group=1, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
            v_head_dim=16, qk_nope_head_dim=16, index_topk=8, index_head_dim=16, index_n_heads=4,
            first_k_dense_replace=1, max_position_embeddings=4096)


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("workbench.torch.integrations.transformers needs transformers>=5.17 "
                          "(pip install 'hytopk-workbench[transformers]')") from e
    return transformers


def tiny_config(model_type: str = "deepseek_v32", attn_implementation: str = "eager", **overrides):
    """A small config of ``model_type`` ('deepseek_v32' | 'glm_moe_dsa'); ``overrides`` win."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"argument 'model_type' must be one of {sorted(MODEL_TYPES)}, got {model_type!r}")
    tf = _transformers()
    kw = dict(TINY, **overrides)
    if model_type == "deepseek_v32":
        kw.setdefault("head_dim", kw["qk_rope_head_dim"])   # its rotary tables: the rope slice (GLM derives it)
    cfg = getattr(tf, MODEL_TYPES[model_type][0])(**kw)
    cfg._attn_implementation = attn_implementation
    return cfg


def tiny_model(model_type: str = "deepseek_v32", seed: int = 0, dtype=torch.float32, **overrides) -> nn.Module:
    """A random-initialised causal LM of ``tiny_config(model_type, **overrides)`` in eval mode, in
    ``dtype`` except the modules the model keeps in float32 (``_keep_in_fp32_modules``: the
    indexers' weights_proj), as from_pretrained would load it."""
    tf = _transformers()
    cfg = tiny_config(model_type, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(tf, MODEL_TYPES[model_type][1])(cfg)
    model = model.to(dtype).eval()
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, m in model.named_modules():
        if any(name.endswith(k) for k in keep):
            m.float()
    return model


__all__ = ["patch", "unpatch", "patched", "is_patched", "state", "find_indexers", "indexer_inputs",
           "ranges_from_mask", "IndexerAdapter", "rotary_for", "tiny_config", "tiny_model", "INDEXERS"]

