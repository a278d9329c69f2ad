"""Byte-level BPE tokenizers (Hugging Face ``tokenizers``): train on documents, load, and hash.

The tokenizer is GPT-2 style: a ``ByteLevel`` pre-tokenizer (no prefix space, GPT-2 split regex) and decoder, so
every UTF-8 string encodes and decodes back to itself; ``<|endoftext|>`` is the only special token and separates
documents (it is appended after each document as EOS). No normaliser runs, so byte counts of the text are exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
