"""Pre-allocated KV cache: one K and one V tensor per (virtual) layer, vanilla-shaped, plus slot bookkeeping.

Legend: L virtual layers, B batch, K KV heads, S slots (capacity), D head dim, T tokens of one call.

With Depth-Attention the value slot of layer l holds the depth-mixed value Ṽ_l (spec-depth-attention.md §7.1);
the shapes and bytes are exactly those of a vanilla Qwen3 cache. Besides K/V the cache keeps only which slots hold
real tokens (``key_mask``, from the attention mask) and how many slots are filled, so decode needs no mask from the
caller. Nothing else persists across steps, so reordering (beam search) and cropping are generic.

The fill level is kept twice, and the two never disagree: ``length`` (a Python int, host bookkeeping: every call
adds its known T, so reading it never waits for the device) and ``slot`` (an int64 device scalar, what a
fixed-shape decode step reads so that one compiled graph serves every token). Two write paths use them:

- dynamic (``write``): slots ``[start, start + T)`` by Python slicing; attention reads the filled slots only;
- static (``write_at``, used when ``static`` is True, i.e. by ``generate(..., compile=True)``): ``index_copy_`` at
  device slot indices and attention over all ``S`` slots (unfilled ones are masked out through ``key_mask``), so
  every decode step has the same shapes and reads no Python number that changes per token. The compiled
  steps of ``generate.CompiledDecoder`` ask the forward to advance only ``slot`` (``advance_host=False``) and
  advance ``length`` themselves (``advance_host``), outside the graph; every other forward advances both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import ModelConfig


class KVCache:
    """Keys ``[L, B, K, S, D]`` and values ``[L, B, K, S, D]``; slots ``[0, length)`` are filled.

    A forward call over T tokens writes slots ``[length, length + T)`` of every layer (``write`` / ``write_at``)
    and then the model calls ``advance(T)``. Slots are cache positions; RoPE positions are separate (left padding
    shifts them).

    Attributes:
        key_mask: bool ``[B, S]``, True at filled slots holding real tokens (False at padding and unfilled slots).
        slot: int64 device scalar, equal to ``length``.
        has_padding: host flag, True once any call recorded an attention mask (then every later call builds a
            padding mask; a cache that never saw one needs none, which is decided without reading device data).
        static: use the fixed-shape path (set by the compiled decode in ``depthattn.generate``).
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
        self.slot = torch.zeros((), dtype=torch.long, device=device)
        #: int64 ``[L]`` = 0 … L−1: the static path indexes the whole ``k`` / ``v`` with ``layer_index[l]``.
        self.layer_index = torch.arange(num_layers, device=device)
        self._length = 0
        self.has_padding = False
        self.static = False

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
    def length(self) -> int:
        """Filled slots (host bookkeeping; equal to ``slot``)."""
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        """Set the fill level from outside (e.g. after copying slots into a larger cache). The slots' padding is
        then unknown to the host, so later calls build a padding mask from ``key_mask`` (always correct)."""
        self._length = n
        self.slot.fill_(n)
        self.has_padding = True

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

    def check_room(self, T: int) -> None:
        """Raise ``ValueError`` if ``T`` more tokens do not fit (host-side; reads no device data)."""
        if self._length + T > self.capacity:
            raise ValueError(f"{T} new tokens after {self._length} cached exceed the cache capacity={self.capacity}")

    # ----------------------------------------------------------------- writing
    def reserve(self, key_mask_BT: Tensor | None, T: int) -> None:
        """Record the padding mask of ``T`` new tokens (None: all real) at slots ``[length, length + T)``.

        Raises:
            ValueError: if the batch size differs or ``length + T`` exceeds the capacity.
        """
        if key_mask_BT is not None:
            B = key_mask_BT.shape[0]
            if B != self.batch_size:
                raise ValueError(f"input batch size {B} does not match the cache's batch_size={self.batch_size}")
            self.has_padding = True
        self.check_room(T)
        new = True if key_mask_BT is None else key_mask_BT.bool()
        self.key_mask[:, self._length:self._length + T] = new

    def reserve_at(self, key_mask_BT: Tensor | None, slots_T: Tensor) -> None:
        """Static twin of ``reserve``: record the new tokens' mask at device slot indices ``slots_T``."""
        B, T = self.batch_size, slots_T.shape[0]
        new = (torch.ones(B, T, dtype=torch.bool, device=self.key_mask.device) if key_mask_BT is None
               else key_mask_BT.bool())
        torch.ops.aten.index_put_(self.key_mask, [None, slots_T], new)

    def write(self, layer: int, start: int, k_BKTD: Tensor, v_BKTD: Tensor) -> tuple[Tensor, Tensor]:
        """Store K̂ and Ṽ at slots ``[start, start + T)`` of ``layer``; return all filled K, V ``[B, K, start+T, D]``."""
        end = start + k_BKTD.shape[2]
        self.k[layer, :, :, start:end] = k_BKTD
        self.v[layer, :, :, start:end] = v_BKTD
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def write_at(self, layer: int, slots_T: Tensor, k_BKTD: Tensor, v_BKTD: Tensor) -> tuple[Tensor, Tensor]:
        """Static twin of ``write``: store at device slot indices ``slots_T``; return the whole ``[B, K, S, D]``.

        One ``index_put_`` on the whole ``[L, B, K, S, D]`` tensor (indices ``layer_index[layer]`` and ``slots_T``;
        the indexed shape is ``[T, B, K, D]``), never a write through the view ``k[layer]``: inductor updates a
        mutated graph input in place only when the mutation is on the input itself; through a view it copied the
        layer and then the whole cache on every compiled decode step (``docs/benchmarks.md``)."""
        at = [self.layer_index[layer], None, None, slots_T]
        torch.ops.aten.index_put_(self.k, at, k_BKTD.permute(2, 0, 1, 3))
        torch.ops.aten.index_put_(self.v, at, v_BKTD.permute(2, 0, 1, 3))
        return self.k[layer], self.v[layer]

    def advance(self, T: int) -> None:
        """Mark ``T`` more slots as filled (called once per forward, after every layer wrote)."""
        self.advance_host(T)
        self.advance_device(T)

    def advance_device(self, T: int) -> None:
        """The device half of ``advance`` (``slot += T``): what a static forward does inside a compiled graph."""
        self.slot.add_(T)

    def advance_host(self, T: int) -> None:
        """The host half of ``advance`` (``length += T``): done by the caller of a compiled static step, outside
        the graph, so the graph never reads a number that changes per token."""
        self._length += T

    # ----------------------------------------------------------------- generic edits
    def reorder(self, index_B: Tensor) -> None:
        """Select rows (beam search): row i becomes old row ``index[i]``."""
        self.k = self.k.index_select(1, index_B)
        self.v = self.v.index_select(1, index_B)
        self.key_mask = self.key_mask.index_select(0, index_B)

    def crop(self, length: int) -> None:
        """Forget every slot from ``length`` on."""
        if not 0 <= length <= self._length:
            raise ValueError(f"crop length={length} must be within [0, {self._length}]")
        self.key_mask[:, length:] = False
        self._length = length
        self.slot.fill_(length)

    def reset(self) -> None:
        self.crop(0)
