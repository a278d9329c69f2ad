"""Several shard files read as one 1-D token array (:class:`ShardedTokens`), with one global index.

Legend: ``N`` tokens in all shards together; shard ``k`` holds global positions ``[offsets[k], offsets[k + 1])``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ShardedTokens:
    """Read-only concatenation of 1-D arrays (``numpy.memmap`` shards) without copying them.

    Supports what the loaders use of a 1-D array: ``len``, ``dtype``, ``shape``, integer indexing, slices with
    step 1 (a window across a shard boundary is copied out of the two shards; one inside a shard is a view),
    ``tolist`` and ``numpy.asarray`` (which reads every shard into memory)."""

    def __init__(self, parts: Sequence[np.ndarray]):
        if not parts:
            raise ValueError("ShardedTokens needs at least one shard")
        self.parts = [p for p in parts if len(p)] or [parts[0]]
        self.dtype = self.parts[0].dtype
        if any(p.dtype != self.dtype for p in self.parts):
            raise ValueError("all shards of a split must have one dtype")
        self.offsets = np.concatenate([[0], np.cumsum([len(p) for p in self.parts])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def ndim(self) -> int:
        return 1

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                return np.asarray(self)[key]
            if stop <= start:
                return np.zeros(0, dtype=self.dtype)
            k0 = int(np.searchsorted(self.offsets, start, side="right")) - 1
            k1 = int(np.searchsorted(self.offsets, stop, side="left")) - 1
            if k0 == k1:
                return self.parts[k0][start - self.offsets[k0]:stop - self.offsets[k0]]
            pieces = [self.parts[k0][start - self.offsets[k0]:]]
            pieces += [self.parts[k] for k in range(k0 + 1, k1)]
            pieces.append(self.parts[k1][:stop - self.offsets[k1]])
            return np.concatenate(pieces)
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {key} out of range for {n} tokens")
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[k][i - self.offsets[k]]

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.parts)
        return out if dtype is None else out.astype(dtype)

    def __eq__(self, other):
        return np.asarray(self) == other

    __hash__ = None

    def astype(self, dtype) -> np.ndarray:
        return np.asarray(self).astype(dtype)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()

    def max(self):
        return max(p.max() for p in self.parts)

    def __repr__(self) -> str:
        return f"ShardedTokens({len(self)} {self.dtype} tokens in {len(self.parts)} shards)"
