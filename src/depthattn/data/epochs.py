"""Training windows in epochs: every window of the training split once per epoch, in a seeded order that needs no
table in memory and no state between calls (``TrainConfig.data_order = "epochs"``).

Legend: ``B`` micro-batch rows per rank, ``T`` sequence length, ``N`` tokens in the split, ``n`` windows,
``W`` data-parallel ranks, ``A`` gradient-accumulation micro-steps, ``G = A * W * B`` samples per optimizer step.

Windows: window ``w`` is ``tokens[w * T : w * T + T + 1]`` (``T + 1`` tokens: inputs and shifted targets) at stride
``T``, for ``w`` in ``[0, n)``, ``n = (N - 1) // T`` -- the windows of ``sequential_batches``. Consecutive windows
share one token (the target of one is the first input of the next), so every token but the first is a target
exactly once per epoch up to the tail: the last ``(N - 1) % T`` tokens (fewer than ``T``; :attr:`EpochBatches.
tail_tokens`) never are -- the partial last window is dropped, as in evaluation.

Order: global sample ``i`` (counted from the run's first step) is window ``perm_e(i mod n)`` of epoch
``e = i // n``, where ``perm_e`` is :class:`KeyedPermutation` keyed by ``(seed, e)``: a bijection of ``[0, n)``
computed per index (a Feistel network on ``2h`` bits, ``4**h >= n``, with cycle walking), so each epoch visits every
window exactly once and a billion-window corpus costs nothing to shuffle. Step ``s``'s samples are the ``G``
indices ``[s * G, (s + 1) * G)``; micro-step ``m`` of rank ``r`` takes ``s * G + m * W * B + r * B + [0, B)``. The
order of global samples thus depends only on the seed and the global index: a run at another world size or
``grad_accum`` with the same global batch (``resume.keep_tokens_per_step`` keeps it on resume) sees the same windows
at the same steps, and the resume state is the step alone (``data_position``; the next sample is ``step * G``).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
#: Feistel rounds (4 make a pseudo-random permutation from a pseudo-random round function; 6 for margin).
ROUNDS = 6
#: Tag mixed into the key so the permutation's keys are not the seed sequence ``TokenBatches`` draws from.
_TAG = 0x45504F4348  # "EPOCH"


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic): a bijective avalanche mix."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@functools.lru_cache(maxsize=16)
def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    return tuple(int(k) for k in np.random.SeedSequence([seed, epoch, _TAG]).generate_state(ROUNDS, np.uint64))


@dataclasses.dataclass(frozen=True)
class KeyedPermutation:
    """A bijection of ``[0, n)`` keyed by ``(seed, epoch)``, evaluated per index (no table).

    ``perm(i_K)``: int64 array ``[K]`` of the images of ``i_K`` (each in ``[0, n)``). A balanced Feistel network on
    ``2h`` bits (``h >= 1``, ``4**h >= n``; round function SplitMix64 of the right half xor a round key from
    ``numpy.random.SeedSequence([seed, epoch, tag])``) permutes ``[0, 4**h)``; cycle walking (apply it again while
    the image is ``>= n``) restricts it to ``[0, n)``: ``4**h < 4 n`` (for n > 1), so under 4 passes on average.

    Raises:
        ValueError: ``n < 1``, a negative seed or epoch, or an index outside ``[0, n)``.
    """

    n: int
    seed: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"a permutation needs n >= 1 elements, got {self.n}")
        if self.seed < 0 or self.epoch < 0:
            raise ValueError(f"seed and epoch must be >= 0, got {self.seed}, {self.epoch}")

    @property
    def half_bits(self) -> int:
        return max(1, ((self.n - 1).bit_length() + 1) // 2)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        h = self.half_bits
        low = np.uint64((1 << h) - 1)
        left, right = x >> np.uint64(h), x & low
        for key in _round_keys(self.seed, self.epoch):
            left, right = right, left ^ (_mix64(right ^ np.uint64(key)) & low)
        return (left << np.uint64(h)) | right

    def __call__(self, i_K: np.ndarray) -> np.ndarray:
        i_K = np.asarray(i_K, dtype=np.int64)
        if i_K.size and (int(i_K.min()) < 0 or int(i_K.max()) >= self.n):
            raise ValueError(f"permutation index out of [0, {self.n}): {int(i_K.min())}..{int(i_K.max())}")
        x = i_K.astype(np.uint64)
        out = self._feistel(x)
        while True:  # cycle walking: terminates, as the Feistel map is a bijection of [0, 4**h) ⊇ [0, n)
            out_of_range = out >= np.uint64(self.n)
            if not out_of_range.any():
                return out.astype(np.int64)
            out[out_of_range] = self._feistel(out[out_of_range])


@dataclasses.dataclass(frozen=True)
class EpochBatches:
    """Training windows in epochs (module docstring): ``batch(step, micro_step)`` -> int64 ``[B, T + 1]``.

    ``batch_size`` is ``B`` (per rank), ``grad_accum`` ``A``, ``world_size`` ``W`` (None: 1), ``rank`` ``r``. The
    same interface as ``shards.TokenBatches``; no state is carried between calls.

    Raises:
        ValueError: a split shorter than ``seq_len + 1`` tokens, a non-positive size, or a rank outside the world.
    """

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int = 0
    rank: int = 0
    world_size: int | None = None
    grad_accum: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 1 or self.grad_accum < 1:
            raise ValueError(f"batch_size, seq_len and grad_accum must be positive, got {self.batch_size}, "
                             f"{self.seq_len}, {self.grad_accum}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world})")
        if len(self.tokens) < self.seq_len + 1:
            raise ValueError(f"split has {len(self.tokens)} tokens, fewer than seq_len + 1 = {self.seq_len + 1}")

    @property
    def world(self) -> int:
        return 1 if self.world_size is None else self.world_size

    @property
    def num_windows(self) -> int:
        """``n = (N - 1) // T``: the windows of one epoch."""
        return (len(self.tokens) - 1) // self.seq_len

    @property
    def tail_tokens(self) -> int:
        """Tokens at the end of the split that are never a target (the dropped partial window): ``(N - 1) % T``."""
        return (len(self.tokens) - 1) % self.seq_len

    @property
    def samples_per_step(self) -> int:
        """``G = A * W * B``: global samples per optimizer step."""
        return self.grad_accum * self.world * self.batch_size

    def sample_indices(self, step: int, micro_step: int = 0) -> np.ndarray:
        """int64 ``[B]``: the global sample indices of this rank's rows at ``(step, micro_step)``."""
        if not 0 <= micro_step < self.grad_accum:
            raise ValueError(f"micro_step {micro_step} is not in [0, grad_accum={self.grad_accum})")
        first = step * self.samples_per_step + (micro_step * self.world + self.rank) * self.batch_size
        return first + np.arange(self.batch_size, dtype=np.int64)

    def windows(self, samples_K: np.ndarray) -> np.ndarray:
        """int64 ``[K]``: the window index of each global sample index (``perm_e(i mod n)``, ``e = i // n``)."""
        samples_K = np.asarray(samples_K, dtype=np.int64)
        n = self.num_windows
        epoch_K, pos_K = samples_K // n, samples_K % n
        out = np.empty_like(samples_K)
        for e in np.unique(epoch_K):  # one batch spans at most a few epochs
            sel = epoch_K == e
            out[sel] = KeyedPermutation(n, self.seed, int(e))(pos_K[sel])
        return out

    def starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        """int64 ``[B]``: the first token of each of this rank's windows at ``(step, micro_step)``."""
        return self.windows(self.sample_indices(step, micro_step)) * self.seq_len

    def batch(self, step: int, micro_step: int = 0) -> torch.Tensor:
        T1 = self.seq_len + 1
        w_BT1 = np.stack([np.asarray(self.tokens[s:s + T1], dtype=np.int64) for s in self.starts(step, micro_step)])
        return torch.from_numpy(w_BT1)

    __call__ = batch

    def epoch(self, steps: int) -> float:
        """Epochs seen after ``steps`` optimizer steps: ``steps * G / n`` (fractional)."""
        return steps * self.samples_per_step / self.num_windows
