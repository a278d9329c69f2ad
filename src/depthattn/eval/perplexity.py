"""Validation loss, perplexity and bits per byte over a token split, in non-overlapping windows.

Legend: B windows per batch, T window length (targets per window), V vocab.

Definitions (nats, natural log):

- ``loss`` = total nats / number of predicted tokens (mean next-token cross-entropy);
- ``perplexity`` = exp(loss);
- ``bits_per_byte`` = total nats / (ln 2 · UTF-8 bytes of the predicted tokens' text). The byte count comes from
  the byte-level BPE vocabulary: a token's bytes are its symbols mapped back through the GPT-2 byte alphabet;
  special tokens (``<|endoftext|>``) count 0 bytes, matching ``meta.json``'s per-split byte counts. ``data prepare``
  refuses a tokenizer for which these lengths do not add up to the text's bytes; evaluating a whole split with
  ``expected_bytes`` checks it again.

Every token of the split except the first is predicted exactly once: full windows of ``T + 1`` tokens at stride
``T``, then one shorter window for the tail.

Periodic validation during training (``depthattn.training``) uses the same definitions on a fixed subset:
``validation_windows`` picks the windows, ``mean_loss`` measures them, and ``next_token_loss`` is also the training
loss.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..checks import check_token_array
from ..data.boundaries import window_document_ids
from ..data.tokenizer import token_byte_lengths
from ..progress import progress_bar


@dataclass
class EvalResult:
    loss: float            # nats per predicted token
    perplexity: float      # exp(loss)
    bits_per_byte: float   # total nats / (ln 2 · bytes)
    tokens: int            # predicted tokens
    bytes: int             # UTF-8 bytes of the predicted tokens
    nats: float            # total cross-entropy
    seq_len: int

    def to_dict(self) -> dict:
        return asdict(self)


def _windows(tokens: np.ndarray, seq_len: int, batch_size: int):
    """Batches ``[B, T + 1]`` of non-overlapping windows, then the shorter tail window ``[1, r + 1]``."""
    n_full = (len(tokens) - 1) // seq_len
    for first in range(0, n_full, batch_size):
        idx = range(first, min(first + batch_size, n_full))
        yield torch.from_numpy(np.stack([np.asarray(tokens[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                                         for i in idx]))
    start = n_full * seq_len
    if len(tokens) - start >= 2:
        yield torch.from_numpy(np.asarray(tokens[start:], dtype=np.int64))[None]


@torch.no_grad()
def evaluate_perplexity(model: torch.nn.Module, tokens: np.ndarray, tokenizer, *, seq_len: int,
                        batch_size: int = 8, max_tokens: int | None = None, device: torch.device | str = "cpu",
                        amp_dtype: torch.dtype | None = None, progress: bool = True,
                        expected_bytes: int | None = None) -> EvalResult:
    """Loss, perplexity and bits per byte of ``model`` on the 1-D token array ``tokens`` (module docstring).

    ``max_tokens`` evaluates only the first ``max_tokens + 1`` tokens. ``expected_bytes``: the UTF-8 bytes of the
    whole split (``PreparedData.num_bytes``); when given and the whole split is evaluated, the tokens' byte lengths
    (the predicted ones plus the first) must add up to it. Raises ``ValueError`` for a split with fewer than 2
    tokens, ``seq_len < 1``, ``seq_len`` beyond the model's ``max_position_embeddings``, or a byte count that
    differs from ``expected_bytes`` (the tokenizer is not byte-level, so bits per byte would be wrong);
    ``FloatingPointError`` when the loss is not finite (a model with NaN/inf weights).
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be >= 1")
    if seq_len > model.config.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_position_embeddings="
                         f"{model.config.max_position_embeddings}")
    whole = max_tokens is None or max_tokens + 1 >= len(tokens)
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        tokens = tokens[:max_tokens + 1]
    if len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    check_token_array(tokens, model.config.vocab_size, "the evaluation split")  # the boundary value check
    byte_len = torch.from_numpy(token_byte_lengths(tokenizer))
    if expected_bytes is not None and whole:
        counted = int(byte_len[torch.from_numpy(np.asarray(tokens, dtype=np.int64))].sum())
        if counted != expected_bytes:
            raise ValueError(f"the tokens of the split stand for {counted} bytes by the tokenizer's byte-level "
                             f"alphabet, but the split has {expected_bytes} UTF-8 bytes: bits per byte needs a "
                             f"byte-level BPE without normalizer (was the data prepared with another tokenizer?)")
    device = torch.device(device)
    was = model.training
    model.eval()
    nats, count, n_bytes = 0.0, 0, 0
    n_targets = len(tokens) - 1
    bar = progress_bar(total=n_targets, desc="eval", unit="tok", unit_scale=True, enabled=progress)
    try:
        for w in _windows(tokens, seq_len, batch_size):
            w = w.to(device)
            ctx = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else torch.no_grad()
            with ctx:
                logits = model(w[:, :-1]).logits
            targets = w[:, 1:]
            nats += float(F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum"))
            count += targets.numel()
            n_bytes += int(byte_len[targets.cpu()].sum())
            bar.update(targets.numel())
    finally:
        bar.close()
        model.train(was)
    loss = nats / count
    if not math.isfinite(loss):  # a NaN model must not report perplexity nan (docs/reliability.md)
        raise FloatingPointError(f"the model's mean loss over {count} tokens is {loss}: its logits are not finite "
                                 f"(non-finite weights, e.g. from a diverged run?); perplexity is undefined")
    bpb = nats / (math.log(2) * n_bytes) if n_bytes else float("nan")
    return EvalResult(loss=loss, perplexity=math.exp(loss) if loss < 700 else math.inf, bits_per_byte=bpb,
                      tokens=count, bytes=n_bytes, nats=nats, seq_len=seq_len)


# ---------------------------------------------------------------------------------------------------- validation
def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``'s type; no autocast (a null context) when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def next_token_loss(net: torch.nn.Module, w_BT1: torch.Tensor, device: torch.device, amp: torch.dtype | None,
                    reduction: str = "mean", eos_id: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy of ``net`` on windows ``[B, T + 1]`` (inputs ``w[:, :-1]``, targets ``w[:, 1:]``),
    the forward under ``autocast``, the loss in float32. ``eos_id``: document masking (``TrainConfig.doc_mask``):
    the inputs' documents end at each ``eos_id`` token (``data.boundaries.window_document_ids``) and go to the
    forward as ``document_ids``."""
    inputs = w_BT1[:, :-1]
    extra = {} if eos_id is None else {"document_ids": window_document_ids(inputs, eos_id)}
    with autocast(device, amp):
        logits = net(inputs, **extra).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), w_BT1[:, 1:].flatten(), reduction=reduction)


def validation_windows(val: np.ndarray, seq_len: int, n: int) -> torch.Tensor:
    """``[n', T + 1]`` int64: ``n' = min(n, (N - 1) // T)`` non-overlapping windows spread evenly over the split
    (the fixed set used for periodic validation). Raises ``ValueError`` if the split is shorter than a window."""
    total = (len(val) - 1) // seq_len
    if total < 1:
        raise ValueError(f"the validation split has {len(val)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    idx = np.unique(np.linspace(0, total - 1, min(n, total)).round().astype(np.int64))
    return torch.from_numpy(np.stack([np.asarray(val[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                                      for i in idx]))


@torch.no_grad()
def mean_loss(model: torch.nn.Module, windows_BT1: torch.Tensor, batch_size: int, device: torch.device,
              amp: torch.dtype | None, abandon: Callable[[], bool] | None = None,
              eos_id: int | None = None) -> float | None:
    """Mean next-token cross-entropy (nats) over every target of ``windows`` (equal-length rows); ``eos_id``:
    with document masking, as ``next_token_loss``.

    ``abandon``: asked before each batch; when it says True the evaluation stops and the result is None (the
    trainer's preemption; it reads nothing, so it changes no number)."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows_BT1), batch_size):
        if abandon is not None and abandon():
            model.train(was)
            return None
        w = windows_BT1[i:i + batch_size].to(device)
        total += float(next_token_loss(model, w, device, amp, reduction="sum", eos_id=eos_id))
        count += w[:, 1:].numel()
    model.train(was)
    return total / count
