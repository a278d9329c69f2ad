"""Pre-allocated KV cache: one K and one V tensor per (virtual) layer, vanilla-shaped, plus slot bookkeeping.

Legend: L virtual layers, B batch, K KV heads, S slots (capacity), D head dim.

With Depth-Attention the value slot of layer l holds the depth-mixed value Ṽ_l (spec-depth-attention.md §7.1);
the shapes and bytes are exactly those of a vanilla Qwen3 cache. Besides K/V the cache keeps only which slots hold
real tokens (``key_mask``, from the attention mask) and how many slots are filled, so decode needs no mask from the
caller. Nothing else persists across steps, so reordering (beam search) and cropping are generic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import ModelConfig


class KVCache:
    """Keys ``[L, B, K, S, D]`` and values ``[L, B, K, S, D]``; slots ``[0, length)`` are filled.

    A forward call over T tokens writes slots ``[length, length + T)`` of every layer (``write``) and then the model
    calls ``advance(T)``. Slots are cache positions; RoPE positions are separate (left padding shifts them).
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        for name, value in (("num_layers", num_layers), ("batch_size", batch_size), ("capacity", capacity)):
            if value < 1:
                raise ValueError(f"KVCache {name}={value} must be >= 1")
        shape = (num_layers, batch_size, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_mask = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
        self.length = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, batch_size: int, max_seq_len: int, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> "KVCache":
        """A cache for ``cfg`` (one slot set per virtual layer) holding up to ``max_seq_len`` tokens per row."""
        if max_seq_len > cfg.max_position_embeddings:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds max_position_embeddings="
                             f"{cfg.max_position_embeddings}")
        return cls(cfg.num_virtual_layers, batch_size, cfg.num_key_value_heads, cfg.head_dim, max_seq_len,
                   dtype, device)

    # ----------------------------------------------------------------- shape facts
    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def bytes_per_token(self) -> int:
        """Bytes one token occupies: ``2 · L · K · D · itemsize``, the vanilla figure (spec §8)."""
        _, _, K, _, D = self.k.shape
        return 2 * self.num_layers * K * D * self.k.element_size()

    # ----------------------------------------------------------------- writing
    def reserve(self, key_mask_BT: Tensor) -> int:
        """Check room for ``T`` more tokens and record their padding mask; returns the first slot ``p0``.

        Raises:
            ValueError: if the batch size differs or ``length + T`` exceeds the capacity.
        """
        B, T = key_mask_BT.shape
        if B != self.batch_size:
            raise ValueError(f"input batch size {B} does not match the cache's batch_size={self.batch_size}")
        if self.length + T > self.capacity:
            raise ValueError(f"{T} new tokens after {self.length} cached exceed the cache capacity={self.capacity}")
        self.key_mask[:, self.length:self.length + T] = key_mask_BT.bool()
        return self.length

    def write(self, layer: int, start: int, k_BKTD: Tensor, v_BKTD: Tensor) -> tuple[Tensor, Tensor]:
        """Store K̂ and Ṽ at slots ``[start, start + T)`` of ``layer``; return all filled K, V ``[B, K, start+T, D]``."""
        end = start + k_BKTD.shape[2]
        self.k[layer, :, :, start:end] = k_BKTD
        self.v[layer, :, :, start:end] = v_BKTD
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, T: int) -> None:
        """Mark ``T`` more slots as filled (called once per forward, after every layer wrote)."""
        self.length += T

    # ----------------------------------------------------------------- generic edits
    def reorder(self, index_B: Tensor) -> None:
        """Select rows (beam search): row i becomes old row ``index[i]``."""
        self.k = self.k.index_select(1, index_B)
        self.v = self.v.index_select(1, index_B)
        self.key_mask = self.key_mask.index_select(0, index_B)

    def crop(self, length: int) -> None:
        """Forget every slot from ``length`` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length={length} must be within [0, {self.length}]")
        self.key_mask[:, length:] = False
        self.length = length

    def reset(self) -> None:
        self.crop(0)
