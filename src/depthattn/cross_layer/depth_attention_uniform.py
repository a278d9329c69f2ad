"""Depth-Attention with uniform weights (``cross_layer="depth_attention_uniform"``): a mechanism control.

Depth-Attention (Zeng et al., arXiv 2606.05014) mixes the values of a static candidate set by a softmax of
query–key scores over depth. This control keeps its candidate plan (spec-depth-attention.md §4: stride
``depth_attention_stride``, window ``depth_attention_window``, §11 for loops), its value seam and its cache, and
replaces the scores by equal weights:

    Ṽ_l = (1 / N) · (Σ_{j ∈ C(l)} Ṽ_j + v_l)        N = |C(l)| + 1

so it separates *which layers are mixed* from *selecting them by content*. Layers with no candidates are plain.

**At init:** no parameters; vanilla when the candidate plan is empty, and layer 0 is always a vanilla layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from .depth_attention import model_plan
from .none import residual_layer, residual_model
from .registry import MethodRecord

if TYPE_CHECKING:
    from ..config import ModelConfig


def uniform_mix(q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
    """Mean of ``values`` ``[B, K, T, D]`` each (candidates, self last), accumulated in float32 (float64 for float64
    inputs) and rounded once to the self value's dtype. ``q_BHTD`` and ``keys`` are unused (no scoring)."""
    acc = torch.float64 if values[-1].dtype == torch.float64 else torch.float32
    out = values[0].to(acc).clone()
    for v in values[1:]:
        out.add_(v.to(acc))
    return (out * (1.0 / len(values))).to(values[-1].dtype)


def value_mix(cfg: ModelConfig, layer_idx: int, device=None):
    """Every layer uses ``uniform_mix`` (no parameters)."""
    return uniform_mix


def extra_flops(cfg: ModelConfig) -> float:
    """Σ_l n_l·K·D per token over layers with candidates (n_l − 1 adds and one scale per element)."""
    K, D = cfg.num_key_value_heads, cfg.head_dim
    return float(sum((len(c) + 1) * K * D for c in model_plan(cfg) if c))


RECORD = MethodRecord(
    name="depth_attention_uniform",
    at_init="no parameters; vanilla when the candidate plan is empty, and layer 0 is always a vanilla layer",
    layer=residual_layer,
    model=residual_model,
    extra_flops=extra_flops,
    loopable=True,
    value_plan=model_plan,
    value_mix=value_mix,
)
