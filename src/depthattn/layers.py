"""Small modules: RMSNorm, the SwiGLU MLP and the rotary embedding (Qwen3 forms, HF parameter names).

Legend: B batch, T time, C hidden size, F intermediate size, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .functional import rms_norm, rope_cos_sin, rope_inv_freq


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


class RotaryEmbedding(nn.Module):
    """RoPE tables for absolute positions (HF ``Qwen3RotaryEmbedding``, default RoPE only).

    Holds the inverse frequencies ``inv_freq`` ``[D/2]`` = ``theta ** (-2i / D)`` as a non-persistent float32 buffer
    (not in the state dict, so checkpoints keep Hugging Face Qwen3's keys). ``forward(position_ids [B|1, T], dtype)``
    returns ``(cos, sin)``, each ``[B|1, T, D]`` in ``dtype``, computed in float32.
    """

    def __init__(self, head_dim: int, theta: float, device=None):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, device=device), persistent=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Recompute ``inv_freq`` in place (it is a buffer; the name is torch's meta-device init convention)."""
        self.inv_freq.copy_(rope_inv_freq(self.head_dim, self.theta, device=self.inv_freq.device))

    def _apply(self, fn, recurse=True):
        """``.to()`` / ``.cuda()`` / ``.bfloat16()`` / ``.to_empty()`` move ``inv_freq`` but keep it float32 and
        recompute it (a bf16 ``inv_freq`` would turn position 3000's angles by up to half a radian)."""
        super()._apply(fn, recurse)
        self._buffers["inv_freq"] = rope_inv_freq(self.head_dim, self.theta, device=self.inv_freq.device)
        return self

    def forward(self, position_ids_BT: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(position_ids_BT, self.inv_freq, dtype)
