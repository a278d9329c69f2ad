"""Validation loss, perplexity and bits per byte over a token split, in non-overlapping windows.

Legend: B windows per batch, T window length (targets per window), V vocab.

Definitions (nats, natural log):

- ``loss`` = total nats / number of predicted tokens (mean next-token cross-entropy);
- ``perplexity`` = exp(loss);
- ``bits_per_byte`` = total nats / (ln 2 · UTF-8 bytes of the predicted tokens' text). The byte count comes from
  the byte-level BPE vocabulary: a token's bytes are its symbols mapped back through the GPT-2 byte alphabet;
  special tokens (``<|endoftext|>``) count 0 bytes, matching ``meta.json``'s per-split byte counts.

Every token of the split except the first is predicted exactly once: full windows of ``T + 1`` tokens at stride
``T``, then one shorter window for the tail.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm


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


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (the alphabet of ``tokenizers``' ByteLevel pre-tokenizer)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_byte_lengths(tokenizer) -> np.ndarray:
    """``[V]`` int64: UTF-8 bytes each token id stands for (0 for special tokens).

    ``tokenizer``: a ``tokenizers.Tokenizer`` (or a transformers fast tokenizer, via ``backend_tokenizer``) with a
    byte-level vocabulary; symbols outside the byte alphabet count their own UTF-8 length.
    """
    tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
    V = tok.get_vocab_size(with_added_tokens=True)
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    dec = _byte_decoder()
    out = np.zeros(V, dtype=np.int64)
    for i in range(V):
        s = tok.id_to_token(i)
        if s is None or s in special:
            continue
        out[i] = sum(1 if ch in dec else len(ch.encode("utf-8")) for ch in s)
    return out


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
                        amp_dtype: torch.dtype | None = None, progress: bool = True) -> EvalResult:
    """Loss, perplexity and bits per byte of ``model`` on the 1-D token array ``tokens`` (module docstring).

    ``max_tokens`` evaluates only the first ``max_tokens + 1`` tokens. Raises ``ValueError`` for a split with fewer
    than 2 tokens, ``seq_len < 1``, or ``seq_len`` beyond the model's ``max_position_embeddings``.
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be >= 1")
    if seq_len > model.config.max_position_embeddings:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_position_embeddings="
                         f"{model.config.max_position_embeddings}")
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        tokens = tokens[:max_tokens + 1]
    if len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    byte_len = torch.from_numpy(token_byte_lengths(tokenizer))
    device = torch.device(device)
    was = model.training
    model.eval()
    nats, count, n_bytes = 0.0, 0, 0
    n_targets = len(tokens) - 1
    bar = tqdm(total=n_targets, desc="eval", unit="tok", unit_scale=True, disable=not progress)
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
    bpb = nats / (math.log(2) * n_bytes) if n_bytes else float("nan")
    return EvalResult(loss=loss, perplexity=math.exp(loss), bits_per_byte=bpb, tokens=count, bytes=n_bytes,
                      nats=nats, seq_len=seq_len)
