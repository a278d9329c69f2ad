"""The Depth-Attention value mix in a serving engine's flat token layout (no vLLM import; tested against the core).

Legend: T tokens (all requests of one engine step, flattened), H / K query / KV heads, G = H/K, D head dim,
N candidates including self.

Same math as ``depthattn.cross_layer.depth_attention.depth_mix`` (spec-depth-attention.md §3.2–3.4, float32 softmax
over depth), laid out as vLLM hands tensors over (``[T, heads·D]``, no transposes) and written for many tokens at
once: one group sum of q, one dot product and one fused multiply-add per candidate. On one CPU thread, for
T = 2048, K = 2, D = 64, N = 3, it takes about a quarter of the time of the core's ``depth_mix`` on the same
tensors transposed to ``[1, K, T, D]`` (whose small-batch layout suits decode in the core).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor


def token_depth_mix(q_TQ: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor], num_heads: int,
                    num_kv_heads: int, head_dim: int) -> Tensor:
    """Ṽ ``[T, K·D]`` (dtype of the self value) from rotated normalised queries ``q_TQ`` ``[T, H·D]`` and the
    candidates' keys K̂_j and values Ṽ_j ``[T, K·D]`` each, in candidate order with self (K̂, raw v) last.

    ``Ṽ = Σ_j α_j V_j`` with ``α = softmax_j(<q̄, K̂_j> / sqrt(D))``, q̄ the mean of the G query heads of a KV head,
    accumulated in float32. Raises ``ValueError`` for mismatched key/value counts.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError(f"token_depth_mix needs as many keys as values (>= 1), got {len(keys)} and {len(values)}")
    T, K, D = q_TQ.shape[0], num_kv_heads, head_dim
    G = num_heads // num_kv_heads
    qsum_TKD = q_TQ.float().reshape(T, K, G, D).sum(2)
    logits_TKN = torch.stack([torch.linalg.vecdot(qsum_TKD, k.float().reshape(T, K, D)) for k in keys], dim=-1)
    w_TKN = (logits_TKN * (1.0 / (G * math.sqrt(D)))).softmax(-1)
    out = w_TKN[..., 0, None] * values[0].float().reshape(T, K, D)
    for i in range(1, len(values)):
        out.addcmul_(w_TKN[..., i, None], values[i].float().reshape(T, K, D))
    return out.reshape(T, K * D).to(values[-1].dtype)
