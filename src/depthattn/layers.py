"""Small modules that own parameters: RMSNorm and the SwiGLU MLP (Qwen3 forms, HF parameter names).

Legend: B batch, T time, C hidden size, F intermediate size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .functional import rms_norm


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x²) + eps)`` over the last dim, float32 inside (Qwen3RMSNorm)."""

    def __init__(self, dim: int, eps: float, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj x) * up_proj x)``; ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, hidden_size: int, intermediate_size: int, device=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False, device=device)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False, device=device)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, device=device)

    def forward(self, x_BTC: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x_BTC)) * self.up_proj(x_BTC))
