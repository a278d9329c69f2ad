"""Pure tensor operations, each with the obvious reference twin that tests compare against.

Legend: B batch, T time (query positions), S key positions, L depth, H query heads, K KV heads, G = H/K group size,
D head dim, C hidden size, V vocab, N depth candidates including self.

Nothing here owns parameters or state. Sources for the math:
  * RMSNorm, RoPE (rotate-half form) and GQA attention: Hugging Face ``transformers`` Qwen3 (modeling_qwen3.py).
  * Depth-Attention: Zeng et al., "Depth-Attention: Cross-Layer Value Mixing for Language Models", EMNLP 2026,
    arXiv 2606.05014; the exact formulas we implement are spec-depth-attention.md §3.2–3.4 and §6.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


# ----------------------------------------------------------------------------- norms and RoPE
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim, computed in float32 and cast back (Qwen3RMSNorm). Shape and dtype of ``x``."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, device=None) -> Tensor:
    """Inverse RoPE frequencies, float32 ``[D/2]``: ``theta ** (-2i/D)``."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(position_ids_BT: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """RoPE tables for absolute positions: cos and sin of shape ``[B, T, D]`` in ``dtype``."""
    freqs_BTd = position_ids_BT[:, :, None].float() * inv_freq[None, None, :].float()
    emb_BTD = torch.cat((freqs_BTd, freqs_BTd), dim=-1)
    return emb_BTD.cos().to(dtype), emb_BTD.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x_BHTD: Tensor, cos_BTD: Tensor, sin_BTD: Tensor) -> Tensor:
    """Rotate ``x`` ([B, heads, T, D]) by the positions' angles (rotate-half convention of HF/Qwen3)."""
    cos, sin = cos_BTD.unsqueeze(1), sin_BTD.unsqueeze(1)
    return x_BHTD * cos + rotate_half(x_BHTD) * sin


# ----------------------------------------------------------------------------- sequence attention
def repeat_kv(x_BKSD: Tensor, groups: int) -> Tensor:
    """Expand KV heads to query heads: ``[B, K, S, D] -> [B, K*G, S, D]``, query head h reads KV head h // G."""
    if groups == 1:
        return x_BKSD
    B, K, S, D = x_BKSD.shape
    return x_BKSD[:, :, None].expand(B, K, groups, S, D).reshape(B, K * groups, S, D)


def causal_padding_mask(
    key_mask_BS: Tensor | None, q_start: int, T: int, S: int, dtype: torch.dtype, device
) -> Tensor:
    """Additive attention mask ``[B or 1, 1, T, S]`` aligned to absolute slots.

    Query i sits at slot ``q_start + i`` and may see keys at slots ``<= q_start + i`` that are real tokens
    (``key_mask`` True). Masked entries hold ``finfo(dtype).min`` (not -inf) so a fully masked row of a padded
    query stays finite (spec-depth-attention.md §7.4).
    """
    q_slot = torch.arange(q_start, q_start + T, device=device)[:, None]
    k_slot = torch.arange(S, device=device)[None, :]
    allowed = (k_slot <= q_slot)[None, None]  # [1, 1, T, S]
    if key_mask_BS is not None:
        allowed = allowed & key_mask_BS[:, None, None, :S].bool()
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def attention(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """Scaled dot-product GQA attention with scale ``1/sqrt(D)``; returns ``[B, H, T, D]``.

    ``mask`` is an additive ``[B|1, 1, T, S]`` mask (see ``causal_padding_mask``) or None; ``is_causal`` may only be
    True when ``T == S`` and there is no padding (top-left alignment then equals absolute alignment).
    """
    groups = q_BHTD.shape[1] // k_BKSD.shape[1]
    k, v = repeat_kv(k_BKSD, groups), repeat_kv(v_BKSD, groups)
    return F.scaled_dot_product_attention(q_BHTD, k, v, attn_mask=mask, is_causal=is_causal and mask is None)


def attention_ref(q_BHTD: Tensor, k_BKSD: Tensor, v_BKSD: Tensor, mask: Tensor | None) -> Tensor:
    """Eager twin of ``attention``: explicit softmax(q k^T / sqrt(D) + mask) v in float32."""
    groups = q_BHTD.shape[1] // k_BKSD.shape[1]
    k, v = repeat_kv(k_BKSD, groups).float(), repeat_kv(v_BKSD, groups).float()
    scores = q_BHTD.float() @ k.transpose(-1, -2) / math.sqrt(q_BHTD.shape[-1])
    if mask is not None:
        scores = scores + mask.float()
    return (scores.softmax(-1) @ v).to(q_BHTD.dtype)


# ----------------------------------------------------------------------------- Depth-Attention
def _acc(x: Tensor) -> Tensor:
    """Upcast to the accumulation dtype: float32, or float64 for float64 inputs (so gradcheck is exact)."""
    return x if x.dtype == torch.float64 else x.float()


def depth_query(q_BHTD: Tensor, num_kv_heads: int) -> Tensor:
    """Group-mean depth query ``q̄`` in float32, ``[B, K, T, D]`` (spec §3.2): mean of the G query heads of a KV head."""
    return _acc(q_BHTD).unflatten(1, (num_kv_heads, -1)).mean(2)


def depth_logits(qbar_BKTD: Tensor, keys: Sequence[Tensor]) -> Tensor:
    """Depth scores ``<q̄, K̂_j> / sqrt(D)`` for each candidate key, float32 ``[B, K, T, N]`` (spec §3.3)."""
    scale = 1.0 / math.sqrt(qbar_BKTD.shape[-1])
    return torch.stack([torch.linalg.vecdot(qbar_BKTD, _acc(k)) for k in keys], dim=-1) * scale


def depth_weights(q_BHTD: Tensor, keys: Sequence[Tensor]) -> Tensor:
    """Softmax over depth, float32 ``[B, K, T, N]``; ``keys`` are the candidates' keys with self last."""
    return depth_logits(depth_query(q_BHTD, keys[0].shape[1]), keys).softmax(-1)


# The fast path below touches each full-size [B, K, T, D] tensor as few times as it can (the mix is memory-bound):
# the group *sum* of q is formed once and the 1/(G·sqrt(D)) factor is applied to the small [B, K, T, N] logits;
# dot products use vecdot; weighted sums accumulate in place with addcmul.
def _query_sum(q_BHTD: Tensor, num_kv_heads: int) -> Tensor:
    return _acc(q_BHTD).unflatten(1, (num_kv_heads, -1)).sum(2)


def _weighted_sum(w_BKTN: Tensor, tensors: Sequence[Tensor]) -> Tensor:
    """Σ_i w[..., i] · x_i in the accumulation dtype, ``[B, K, T, D]``."""
    out = w_BKTN[..., 0, None] * _acc(tensors[0])
    for i in range(1, len(tensors)):
        out.addcmul_(w_BKTN[..., i, None], _acc(tensors[i]))
    return out


def _mix_forward(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    K, G, D = keys[0].shape[1], q_BHTD.shape[1] // keys[0].shape[1], q_BHTD.shape[-1]
    qsum_BKTD = _query_sum(q_BHTD, K)
    logits_BKTN = torch.stack([torch.linalg.vecdot(qsum_BKTD, _acc(k)) for k in keys], dim=-1)
    w_BKTN = (logits_BKTN * (1.0 / (G * math.sqrt(D)))).softmax(-1)
    return _weighted_sum(w_BKTN, values).to(values[-1].dtype), w_BKTN


class _DepthMix(torch.autograd.Function):
    """Depth mix with a hand-written backward that saves only activation-dtype inputs and float32 weights.

    Plain autograd would save float32 copies of every candidate value (spec §9); here they are recomputed.
    """

    @staticmethod
    def forward(ctx, q_BHTD: Tensor, n: int, *kv: Tensor) -> Tensor:  # kv = keys..., values...
        out, w_BKTN = _mix_forward(q_BHTD, kv[:n], kv[n:])
        ctx.n = n
        ctx.save_for_backward(q_BHTD, w_BKTN, *kv)
        return out

    @staticmethod
    def backward(ctx, grad_BKTD: Tensor):
        q_BHTD, w_BKTN, *kv = ctx.saved_tensors
        n = ctx.n
        keys, values = kv[:n], kv[n:]
        K, D = keys[0].shape[1], q_BHTD.shape[-1]
        G = q_BHTD.shape[1] // K
        factor = 1.0 / (G * math.sqrt(D))  # d logit / d qsum = factor · k
        g = _acc(grad_BKTD)
        dw_BKTN = torch.stack([torch.linalg.vecdot(g, _acc(v)) for v in values], dim=-1)
        dlogit_BKTN = w_BKTN * (dw_BKTN - (w_BKTN * dw_BKTN).sum(-1, keepdim=True))  # softmax backward
        dsum_BKTN = dlogit_BKTN * factor  # gradient w.r.t. <qsum, k_i>
        grads: list[Tensor | None] = [None, None]
        if ctx.needs_input_grad[0]:
            dqsum_BKTD = _weighted_sum(dsum_BKTN, keys)
            grads[0] = dqsum_BKTD.unsqueeze(2).expand(-1, -1, G, -1, -1).flatten(1, 2).to(q_BHTD.dtype)
        qsum_BKTD = _query_sum(q_BHTD, K) if any(ctx.needs_input_grad[2:2 + n]) else None
        for i, k in enumerate(keys):
            grads.append((dsum_BKTN[..., i, None] * qsum_BKTD).to(k.dtype) if ctx.needs_input_grad[2 + i] else None)
        for i, v in enumerate(values):
            grads.append((w_BKTN[..., i, None] * g).to(v.dtype) if ctx.needs_input_grad[2 + n + i] else None)
        return tuple(grads)


def depth_mix(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Depth-Attention value mix (arXiv 2606.05014; spec-depth-attention.md §3.2–3.4, §6).

    ``Ṽ = Σ_j α_j Ṽ_j + α_self v`` with ``α = softmax_j(<q̄, K̂_j> / sqrt(D))`` over the candidates and self.

    Args:
        q_BHTD: the layer's rotated, normalised queries ``[B, H, T, D]`` (all H heads; pooled here).
        keys: candidate keys ``[B, K, T, D]`` each, in candidate order with **self last**.
        values: matching values ``[B, K, T, D]``: stored (already mixed) values of the sources, self's raw value last.
    Returns:
        the mixed value ``[B, K, T, D]`` in the dtype of the self value, rounded once from float32.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError(f"depth_mix needs as many keys as values (>= 1), got {len(keys)} and {len(values)}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q_BHTD, *keys, *values)):
        return _DepthMix.apply(q_BHTD, len(keys), *keys, *values)
    return _mix_inference(q_BHTD, keys, values)


def _mix_inference(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Same math as ``_mix_forward`` in the fewest kernels (stacked candidates, one small matmul): no autograd
    memory to save here, and a decode step's tensors are so small that the kernel count is its cost."""
    K, G, D = keys[0].shape[1], q_BHTD.shape[1] // keys[0].shape[1], q_BHTD.shape[-1]
    k_BKTND = _acc(torch.stack(keys, dim=-2))
    v_BKTND = _acc(torch.stack(values, dim=-2))
    logits_BKTN1 = k_BKTND @ _query_sum(q_BHTD, K).unsqueeze(-1)
    w_BKTN1 = (logits_BKTN1 * (1.0 / (G * math.sqrt(D)))).softmax(-2)
    return (v_BKTND * w_BKTN1).sum(-2).to(values[-1].dtype)


def depth_mix_ref(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Loop-based float64 twin of ``depth_mix``: per-head scores, averaged over each group, then softmax."""
    B, H, T, D = q_BHTD.shape
    K = keys[0].shape[1]
    G = H // K
    out = torch.zeros(B, K, T, D, dtype=torch.float64)
    for b in range(B):
        for m in range(K):
            for t in range(T):
                scores = []
                for k in keys:
                    per_head = [float(q_BHTD[b, m * G + j, t].double() @ k[b, m, t].double()) for j in range(G)]
                    scores.append(sum(per_head) / G / math.sqrt(D))
                w = torch.tensor(scores, dtype=torch.float64).softmax(0)
                for i, v in enumerate(values):
                    out[b, m, t] += w[i] * v[b, m, t].double()
    return out
