"""Value residual learning (``cross_layer="value_residual"``): a mechanism control for Depth-Attention.

Zhou et al., "Value Residual Learning for Alleviating Attention Concentration in Transformers" (ResFormer),
arXiv 2410.17897, 2024. Variant implemented: ResFormer's form on the value seam (``attention.py``), where every
layer l ≥ 1 attends with

    Ṽ_l = λ_l · v_l + (1 − λ_l) · v_0

v_l the layer's raw value and v_0 layer 0's value, at the same position (ResFormer's V_1 in its 1-based count). The
default is ResFormer's fixed λ = 0.5 (``value_residual_lambda``, in [0, 1]); ``value_residual_learnable=true`` gives
every layer l ≥ 1 its own scalar λ_l (``model.layers.{l}.self_attn.value_mix.lam``), initialised at
``value_residual_lambda`` and trained without weight decay or a constraint (ResFormer's learnable variant). Keys
are never mixed; the cache stores Ṽ_l, like Depth-Attention's, so cached decode is the full forward.

Why a control: Depth-Attention's candidate set always holds layer 0, so part of its effect may be nothing more than
this fixed shortcut to layer 0's value.

**At init:** the fixed variant has no parameters; with λ = 1 it is exactly the plain Qwen3 decoder. The learnable
variant starts equal to the fixed one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor, nn

from .none import residual_layer, residual_model
from .registry import MethodRecord, Plan

if TYPE_CHECKING:
    from ..config import ModelConfig


def value_plan(cfg: ModelConfig) -> Plan:
    """Layer 0 plain; every later layer reads layer 0 only: ``((), (0,), (0,), …)``."""
    return ((),) + ((0,),) * (cfg.num_virtual_layers - 1)


def residual_mix(lam: float | Tensor, v_BKTD: Tensor, v0_BKTD: Tensor) -> Tensor:
    """``λ · v + (1 − λ) · v_0`` in float32 (float64 for float64 inputs), rounded once to ``v``'s dtype.

    Args:
        lam: λ, a Python float or a 0-d tensor (the learnable variant).
        v_BKTD: the layer's raw value ``[B, K, T, D]``.
        v0_BKTD: layer 0's value at the same positions ``[B, K, T, D]``.
    With λ = 1 the result is ``v`` exactly (1·v + 0·v_0).
    """
    acc = torch.float64 if v_BKTD.dtype == torch.float64 else torch.float32
    lam = lam.to(acc) if isinstance(lam, Tensor) else lam
    return (lam * v_BKTD.to(acc) + (1 - lam) * v0_BKTD.to(acc)).to(v_BKTD.dtype)


class FixedValueResidual:
    """The fixed-λ mix (no parameters): ``mix(q, keys, values)`` with values = (v_0, v_l)."""

    def __init__(self, lam: float):
        self.lam = float(lam)

    def __call__(self, q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
        v0, v = values
        return residual_mix(self.lam, v, v0)


class LearnableValueResidual(nn.Module):
    """The learnable mix of one layer: parameter ``lam`` (shape ``[1]``, float32; one element rather than 0-d because
    FSDP2's ``fully_shard`` refuses scalar parameters), initialised at ``value_residual_lambda``."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()
        self.lam = nn.Parameter(torch.full((1,), float(cfg.value_residual_lambda), device=device))

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """λ_l = ``value_residual_lambda``."""
        self.lam.fill_(cfg.value_residual_lambda)

    def forward(self, q_BHTD: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor]) -> Tensor:
        v0, v = values
        return residual_mix(self.lam.reshape(()), v, v0)


def value_mix(cfg: ModelConfig, layer_idx: int, device=None):
    """The mix of physical layer ``layer_idx``: learnable (layers ≥ 1, when ``value_residual_learnable``) or fixed."""
    if cfg.value_residual_learnable and layer_idx >= 1:
        return LearnableValueResidual(cfg, device=device)
    return FixedValueResidual(cfg.value_residual_lambda)


def extra_params(cfg: ModelConfig) -> int:
    """L − 1 scalars λ_l with ``value_residual_learnable``, else 0."""
    return cfg.num_hidden_layers - 1 if cfg.value_residual_learnable else 0


def extra_flops(cfg: ModelConfig) -> float:
    """(L − 1) · 3·K·D per token: two multiplies and one add per value element of every layer l ≥ 1."""
    return float((cfg.num_virtual_layers - 1) * 3 * cfg.num_key_value_heads * cfg.head_dim)


RECORD = MethodRecord(
    name="value_residual",
    at_init="fixed λ (default 0.5): no parameters, exactly vanilla at λ = 1; learnable λ_l start at the fixed λ",
    layer=residual_layer,
    model=residual_model,
    extra_params=extra_params,
    extra_flops=extra_flops,
    value_plan=value_plan,
    value_mix=value_mix,
)
