"""Byte-level BPE tokenizers (Hugging Face ``tokenizers``): train on documents, load, serialise, count bytes.

The tokenizer is GPT-2 style: a ``ByteLevel`` pre-tokenizer (no prefix space, GPT-2 split regex) and decoder, so
every UTF-8 string encodes and decodes back to itself; ``<|endoftext|>`` is the only special token and separates
documents (it is appended after each document as EOS). No normaliser runs, so byte counts of the text are exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

#: The end-of-document token, the only special token (defined here only; hf/, eval/ and generate import it).
EOS_TOKEN = "<|endoftext|>"
MIN_VOCAB_SIZE = 257  # 256 byte symbols + EOS


def _chunks(texts: Iterable[str], max_chars: int = 1 << 16) -> Iterator[str]:
    """Split long documents at line ends so training parallelises; BPE counts are per pre-token, so this only
    changes the pre-tokens that straddle a cut (whitespace runs at the cut)."""
    for text in texts:
        start = 0
        while start < len(text):
            end = min(len(text), start + max_chars)
            if end < len(text):
                nl = text.rfind("\n", start, end)
                end = nl + 1 if nl > start else end
            yield text[start:end]
            start = end


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, show_progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` entries (bytes + merges + ``<|endoftext|>``) on ``texts``."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"--vocab-size must be at least {MIN_VOCAB_SIZE} (256 bytes + {EOS_TOKEN}), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(_chunks(texts), trainer=trainer)
    return tok


def tokenizer_bytes(tok: Tokenizer) -> bytes:
    """The canonical ``tokenizer.json`` bytes (what is written to disk and hashed)."""
    return (tok.to_str(pretty=True) + "\n").encode("utf-8")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a ``tokenizer.json``; raises ValueError naming the file if it is missing, unreadable or has no EOS."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: tokenizer file not found")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a plain Exception on a bad file
        raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from e
    if tok.token_to_id(EOS_TOKEN) is None:
        raise ValueError(f"{path}: tokenizer has no {EOS_TOKEN} token (needed as the end-of-document token)")
    return tok


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
