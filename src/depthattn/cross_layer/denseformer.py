"""DenseFormer: a depth-weighted average (DWA) after blocks (``cross_layer="denseformer"``).

Source: Pagliardini et al., "DenseFormer: Enhancing Information Flow in Transformers via Depth Weighted Averaging",
NeurIPS 2024, arXiv 2402.02622; our form is spec-baselines.md §3. Variant implemented: the paper's k×p-DenseFormer
(dilation k = ``denseformer_dilation``, DWA period p = ``denseformer_period``; the default 1×1 is the full
DenseFormer), with DWA weights initialised to the identity as in the paper.

Legend: B batch, T time, C hidden size, J sources of one DWA.

Blocks B_1 … B_L are unchanged. X_0 = x_0 (embedding), Y_0 = X_0, X_i = B_i(Y_{i−1}). After block i with
i mod p = 0: Y_i = Σ_{j ∈ S_i} α_{i,j} X_j, S_i = {j ≤ i : j ≡ i (mod k)}; otherwise Y_i = X_i. The α are free
scalars initialised α_{i,i} = 1, others 0, so the model **is exactly vanilla at init** (tested with atol 0).

State through depth: ``(h, history)`` with ``h`` the current hidden state ``[B, T, C]`` and ``history`` the tuple
(X_0, …, X_{i−1}) of block outputs (a tuple grows; nothing is concatenated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor, nn

from .registry import MethodRecord

if TYPE_CHECKING:
    from ..config import ModelConfig


# ----------------------------------------------------------------------------- static structure
def dwa_sources(block: int, dilation: int) -> tuple[int, ...]:
    """S_i = (j ≤ i with j ≡ i mod k), increasing, so the block's own output X_i is last; |S_i| = ⌊i/k⌋ + 1."""
    return tuple(j for j in range(block + 1) if j % dilation == block % dilation)


def dwa_blocks(num_layers: int, period: int) -> tuple[int, ...]:
    """1-based blocks i ∈ [1, L] followed by a DWA: those with i mod p = 0."""
    return tuple(i for i in range(1, num_layers + 1) if i % period == 0)


# ----------------------------------------------------------------------------- the mix
def dwa(alpha_J: Tensor, xs: Sequence[Tensor]) -> Tensor:
    """Σ_j α_j x_j for ``xs`` = J tensors ``[B, T, C]`` (self term last), float32 accumulation, cast back once.

    A chain of fused scaled adds (``addcmul``): no stacked copy of the history is made or saved for backward
    (spec-baselines.md §3 pitfalls). The self term goes first, so α = (0, …, 0, 1) returns ``xs[-1]`` bit-exactly.
    """
    alpha_J = alpha_J.float()
    acc = xs[-1].float() * alpha_J[-1]
    for j in range(len(xs) - 1):
        acc = torch.addcmul(acc, xs[j], alpha_J[j])
    return acc.to(xs[-1].dtype)


def dwa_ref(alpha_J: Tensor, xs: Sequence[Tensor]) -> Tensor:
    """Reference twin of ``dwa``: a plain float32 sum in source order."""
    out = torch.zeros_like(xs[0], dtype=torch.float32)
    for a, x in zip(alpha_J.float(), xs):
        out = out + a * x.float()
    return out.to(xs[-1].dtype)


# ----------------------------------------------------------------------------- costs (spec-baselines.md §3)
def extra_params(cfg: ModelConfig) -> int:
    """Σ_{i ∈ DWA blocks} (⌊i/k⌋ + 1); = L(L + 3)/2 for k = p = 1."""
    k = cfg.denseformer_dilation
    return sum(i // k + 1 for i in dwa_blocks(cfg.num_hidden_layers, cfg.denseformer_period))


def extra_flops(cfg: ModelConfig) -> float:
    """2 · C · Σ_i |S_i| forward FLOPs per token; = C · L(L + 3) for k = p = 1."""
    return 2.0 * cfg.hidden_size * extra_params(cfg)


def inflight_elements(cfg: ModelConfig) -> int:
    """Per-token in-flight residual state: up to (L + 1) · C (X_0 … X_L)."""
    return (cfg.num_hidden_layers + 1) * cfg.hidden_size


# ----------------------------------------------------------------------------- modules
class DWA(nn.Module):
    """Layer module for block i = layer_idx + 1: the plain residual inside the block, then the DWA (if p | i).

    Parameters: ``alpha`` ``[|S_i|]`` float32 (absent when p ∤ i), ordered as ``dwa_sources(i, k)``.
    """

    #: The state's tuple grows with depth: ``parallelize.apply_compile`` compiles the sublayer bodies only.
    state_grows_with_depth = True

    def __init__(self, cfg: ModelConfig, layer_idx: int, device=None):
        super().__init__()
        self.block = layer_idx + 1
        self.sources = dwa_sources(self.block, cfg.denseformer_dilation)
        self.has_dwa = self.block % cfg.denseformer_period == 0
        self.alpha = nn.Parameter(torch.zeros(len(self.sources), device=device)) if self.has_dwa else None

    @torch.no_grad()
    def init_weights(self, cfg: ModelConfig) -> None:
        """α_{i,i} = 1, all others 0 (exactly vanilla)."""
        if self.alpha is not None:
            self.alpha.zero_()
            self.alpha[-1] = 1.0

    def prepare(self, state, sublayer: int):
        return state

    def read(self, state: tuple[Tensor, tuple[Tensor, ...]], sublayer: int) -> Tensor:
        return state[0]

    def write(self, state, sublayer: int, out: Tensor):
        h, history = state
        h = h + out
        if sublayer == 0:
            return h, history
        history = history + (h,)  # X_i, the block's output before any mixing
        if self.alpha is None:
            return h, history
        return dwa(self.alpha, [history[j] for j in self.sources]), history


class DWAStart(nn.Module):
    """Model module: ``begin`` starts the history with X_0 = x_0; ``end`` returns Y_L. No parameters."""

    def __init__(self, cfg: ModelConfig, device=None):
        super().__init__()

    def begin(self, h0: Tensor):
        return h0, (h0,)

    def end(self, state) -> Tensor:
        return state[0]


RECORD = MethodRecord(
    name="denseformer",
    at_init="exactly vanilla (α_{i,i} = 1, others 0)",
    layer=DWA,
    model=DWAStart,
    extra_params=extra_params,
    extra_flops=extra_flops,
    inflight_elements=inflight_elements,
    no_decay=(r"alpha",),  # DWA α (spec-baselines.md §8)
)
