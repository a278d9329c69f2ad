"""Qwen3 GQA attention with the value seam.

Legend: B batch, T time (this call), S key slots, H query heads, K KV heads, D head dim, C hidden size.

Order (Qwen3 and spec-depth-attention.md §3.1): project, per-head RMSNorm of q and k over D, **then** RoPE. With
``qk_norm_position="k_after_rope"`` (the SDPA attention class of the Depth-Attention authors' code) the key is rotated
first and normalised after: K̂ = k_norm(RoPE(k)); the query keeps q_norm before RoPE. Either way K̂ is the one key of
the layer: the sequence attention reads it, the cache stores it and later layers' depth mix scores against it. The
value seam sits between the projections and the sequence attention: with Depth-Attention sources, the raw value is
replaced by the depth-mixed value (§3.4, ``cross_layer/depth_attention.py``), which is what the attention reads and
the cache stores. Keys are never mixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from torch import Tensor, nn

from .cache import KVCache
from .config import ModelConfig
from .cross_layer import get as method_record
from .cross_layer.depth_attention import depth_mix, depth_weights
from .functional import apply_rope, attention, eager_attention, flex_attention
from .layers import RMSNorm


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one forward call shares; built once per call by ``Backbone.forward``.

    Attributes:
        cos, sin: RoPE tables ``[B|1, T, D]`` for this call's positions (model dtype; 1 row when all rows share
            their positions).
        mask: additive ``[B|1, 1, T, S]`` mask aligned to absolute slots, or None for plain causal attention over
            exactly these T positions (no padding, no cache offset).
        cache: when given, each layer writes its K̂ and Ṽ to its own slots from ``cache_start`` and the attention
            reads every filled slot.
        cache_start: the slot of this call's first token (``cache.length`` before the call).
        cache_slots: int64 ``[T]`` device slot indices of this call's tokens on the static (fixed-shape) path, or
            None; then K̂ and Ṽ are written with ``index_copy_`` and the attention reads all ``S`` slots.
        block_mask: a FlexAttention ``BlockMask`` (``functional.document_block_mask``: document masking on CUDA);
            then the attention is FlexAttention with it and ``mask`` is None. No cache with it.
        record: None (the default: nothing is recorded), or what to record, filled in place
            (``Backbone.forward``'s ``record``): each virtual layer's attention appends its attention
            probabilities to ``record["attentions"]`` (then the attention is the eager ``functional.eager_attention``)
            and its depth weights (or None) to ``record["depth_weights"]`` when the key is there.
    """

    cos: Tensor
    sin: Tensor
    mask: Tensor | None = None
    cache: KVCache | None = None
    cache_start: int = 0
    cache_slots: Tensor | None = None
    block_mask: Any = None
    record: dict | None = None


class Attention(nn.Module):
    """Causal GQA self-attention with q/k RMSNorm before RoPE (HF ``Qwen3Attention`` names and math), or k_norm after
    RoPE when ``cfg.qk_norm_position == "k_after_rope"``.

    ``layer_idx`` (the physical layer) goes to the method record's ``value_mix`` factory (``MethodRecord``)."""

    def __init__(self, cfg: ModelConfig, device=None, layer_idx: int = 0):
        super().__init__()
        C, H, K, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, K, D
        self.q_proj = nn.Linear(C, H * D, bias=False, device=device)
        self.k_proj = nn.Linear(C, K * D, bias=False, device=device)
        self.v_proj = nn.Linear(C, K * D, bias=False, device=device)
        self.o_proj = nn.Linear(H * D, C, bias=False, device=device)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps, device=device)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps, device=device)
        self.k_after_rope = cfg.qk_norm_position == "k_after_rope"
        mix = method_record(cfg.cross_layer).value_mix  # the value seam's mix (None: Depth-Attention's depth_mix)
        self.value_mix = depth_mix if mix is None else mix(cfg, layer_idx, device=device)
        self.has_depth_weights = method_record(cfg.cross_layer).has_depth_weights

    def project(self, x_BTC: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated normalised q ``[B,H,T,D]``, K̂ ``[B,K,T,D]`` and raw v ``[B,K,T,D]``.

        q = RoPE(q_norm(q)); K̂ = RoPE(k_norm(k)), or k_norm(RoPE(k)) with ``qk_norm_position="k_after_rope"``."""
        B, T, _ = x_BTC.shape
        q_BHTD = self.q_norm(self.q_proj(x_BTC).view(B, T, self.num_heads, self.head_dim)).transpose(1, 2)
        k_BTKD = self.k_proj(x_BTC).view(B, T, self.num_kv_heads, self.head_dim)
        v_BKTD = self.v_proj(x_BTC).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.k_after_rope:
            k_BKTD = self.k_norm(apply_rope(k_BTKD.transpose(1, 2), cos, sin))
        else:
            k_BKTD = apply_rope(self.k_norm(k_BTKD).transpose(1, 2), cos, sin)
        return apply_rope(q_BHTD, cos, sin), k_BKTD, v_BKTD

    def forward(self, x_BTC: Tensor, sources: Sequence[tuple[Tensor, Tensor]], *, ctx: LayerContext,
                layer_idx: int) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over the sequence; return the output ``[B, T, C]`` and this layer's (K̂, Ṽ) for this call.

        Args:
            sources: (K̂_j, Ṽ_j) of this layer's depth candidates for the same positions, ``[B, K, T, D]`` each;
                empty for a plain Qwen3 layer.
            ctx: RoPE tables, mask and cache of this call (``LayerContext``).
            layer_idx: the virtual layer u, whose cache slots K̂ and Ṽ are written to.
        """
        q_BHTD, k_BKTD, v_BKTD = self.project(x_BTC, ctx.cos, ctx.sin)
        if sources:  # Depth-Attention value seam (arXiv 2606.05014, spec §3.2–3.4): mix along depth, same position
            keys = [k for k, _ in sources] + [k_BKTD]
            values = [v for _, v in sources] + [v_BKTD]
            v_BKTD = self.value_mix(q_BHTD, keys, values)
        if ctx.record is not None and "depth_weights" in ctx.record:
            ctx.record["depth_weights"].append(depth_weights(q_BHTD, keys) if sources and self.has_depth_weights
                                               else None)
        if ctx.cache is not None and ctx.cache_slots is not None:
            k_all, v_all = ctx.cache.write_at(layer_idx, ctx.cache_slots, k_BKTD, v_BKTD)
        elif ctx.cache is not None:
            k_all, v_all = ctx.cache.write(layer_idx, ctx.cache_start, k_BKTD, v_BKTD)
        else:
            k_all, v_all = k_BKTD, v_BKTD
        causal = ctx.mask is None and x_BTC.shape[1] > 1
        if ctx.record is not None and "attentions" in ctx.record:  # asked for the weights: the explicit softmax
            o_BHTD, probs_BHTS = eager_attention(q_BHTD, k_all, v_all, ctx.mask, causal)
            ctx.record["attentions"].append(probs_BHTS)
        elif ctx.block_mask is not None:
            o_BHTD = flex_attention(q_BHTD, k_all, v_all, ctx.block_mask)
        else:
            o_BHTD = attention(q_BHTD, k_all, v_all, ctx.mask, is_causal=causal)
        B, T, _ = x_BTC.shape
        return self.o_proj(o_BHTD.transpose(1, 2).reshape(B, T, -1)), (k_BKTD, v_BKTD)
