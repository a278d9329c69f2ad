"""Depth-Attention's static candidate plan and its value seam.

Zeng et al., "Depth-Attention: Cross-Layer Value Mixing for Language Models", EMNLP 2026, arXiv 2606.05014.
Candidate rule (spec-depth-attention.md §4), over virtual layers u = 0 … L_v − 1 (§11):

    C(u) = { j < u : j mod s = 0 }  ∪  { j : max(0, u − w) ≤ j < u }        (self is added last)

The plan is a tuple of tuples built once at construction; ``forward`` never recomputes it.
"""

from __future__ import annotations

from .config import ModelConfig


def candidate_plan(num_layers: int, stride: int, window: int) -> tuple[tuple[int, ...], ...]:
    """Source layers of each layer, ascending, excluding self.

    Args:
        num_layers: L (virtual layers for a looped model).
        stride: s >= 1; every layer j < l with j mod s == 0 is a candidate.
        window: w >= 0; the w most recent earlier layers are candidates too.
    Raises:
        ValueError: naming the argument, for L < 1, s < 1 or w < 0.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be >= 1")
    if stride < 1:
        raise ValueError(f"depth_attention_stride={stride} must be >= 1")
    if window < 0:
        raise ValueError(f"depth_attention_window={window} must be >= 0")
    plan = []
    for layer in range(num_layers):
        by_stride = {j for j in range(layer) if j % stride == 0}
        by_window = set(range(max(0, layer - window), layer))
        plan.append(tuple(sorted(by_stride | by_window)))
    return tuple(plan)


def model_plan(cfg: ModelConfig) -> tuple[tuple[int, ...], ...]:
    """The plan the model runs: the §4 rule for ``cross_layer="depth_attention"``, empty sets otherwise."""
    if cfg.cross_layer != "depth_attention":
        return ((),) * cfg.num_virtual_layers
    return candidate_plan(cfg.num_virtual_layers, cfg.depth_attention_stride, cfg.depth_attention_window)


def source_layers(plan: tuple[tuple[int, ...], ...]) -> frozenset[int]:
    """S = ∪_l C(l): the layers whose (K̂, Ṽ) some later layer reads."""
    return frozenset(j for cands in plan for j in cands)
