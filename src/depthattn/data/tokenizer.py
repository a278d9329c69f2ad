"""Byte-level BPE tokenizers (Hugging Face ``tokenizers``): train on documents, load, serialise, count bytes.

The tokenizer is GPT-2 style: a ``ByteLevel`` pre-tokenizer (no prefix space, GPT-2 split regex) and decoder, so
every UTF-8 string encodes and decodes back to itself; ``<|endoftext|>`` is the only special token and separates
documents (it is appended after each document as EOS); further special tokens can be declared (``special_tokens``):
each encodes as one id and none is ever learned as (part of) a merge, because training text is cut at every literal
special token. No normaliser runs, so byte counts of the text are exact.

:func:`load_tokenizer` reads an existing ``tokenizer.json`` or Hugging Face tokenizer folder (offline) as is;
:func:`tokenizer_config` is the ``tokenizer_config.json`` written beside it so ``AutoTokenizer`` loads the folder.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from depthattn.layout import TOKENIZER_FILE

#: The end-of-document token, the only special token (defined here only; hf/, eval/ and generate import it).
EOS_TOKEN = "<|endoftext|>"
MIN_VOCAB_SIZE = 257  # 256 byte symbols + EOS (+1 per extra special token)

#: Bounds checked before a ``tokenizer.json`` is parsed (:func:`check_tokenizer_file`): its size (released
#: tokenizers take 40–130 bytes per vocabulary entry: GPT-NeoX 42, Qwen3 75, Gemma 3 126), with a model's
#: ``vocab_size`` known at most ``TOKENIZER_BYTES_PER_TOKEN`` per entry plus 1 MiB, and its added tokens (at most
#: the model's ``vocab_size``, else ``MAX_ADDED_TOKENS``).
MAX_TOKENIZER_BYTES = 256 << 20
TOKENIZER_BYTES_PER_TOKEN = 1024
MAX_ADDED_TOKENS = 1 << 18
#: One entry of ``added_tokens`` (every entry has ``"special": true|false``; vocabulary values are ids, never
#: booleans, and a quote inside a JSON string is escaped, so nothing else matches).
_ADDED_TOKEN = re.compile(rb'"special"\s*:\s*(?:true|false)')


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


def check_special_tokens(special_tokens: Sequence[str]) -> list[str]:
    """``special_tokens`` without duplicates and without ``<|endoftext|>`` (always the first special token);
    ValueError for an empty one or a single character (already a byte symbol of the byte-level vocabulary)."""
    out: list[str] = []
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    for t in special_tokens:
        if not t or t.isspace():
            raise ValueError(f"--special-tokens: empty or whitespace-only token {t!r}")
        if t in alphabet or len(t) == 1:
            raise ValueError(f"--special-tokens: {t!r} is already in the vocabulary (a byte symbol of the "
                             f"byte-level alphabet); choose a multi-character token such as <|{t}|>")
        if t != EOS_TOKEN and t not in out:
            out.append(t)
    return out


def without_special_tokens(texts: Iterable[str], special_tokens: Sequence[str]) -> Iterator[str]:
    """``texts`` cut at every literal occurrence of a special token, which is dropped: what BPE training sees, so no
    merge is ever learned from (a part of) a special token. Texts without one pass unchanged."""
    pattern = re.compile("|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True)))
    for text in texts:
        if any(t in text for t in special_tokens):
            yield from (part for part in pattern.split(text) if part)
        else:
            yield text


def train_bpe(texts: Iterable[str], vocab_size: int = 8192, show_progress: bool = False,
              special_tokens: Sequence[str] = ()) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` entries (special tokens + bytes + merges) on ``texts``.

    The special tokens are ``<|endoftext|>`` (id 0) then ``special_tokens`` (ids 1, 2, ...; see
    :func:`check_special_tokens`); literal occurrences in ``texts`` are cut out before counting pairs."""
    extra = check_special_tokens(special_tokens)
    specials = [EOS_TOKEN, *extra]
    if vocab_size < MIN_VOCAB_SIZE + len(extra):
        raise ValueError(f"--vocab-size must be at least {MIN_VOCAB_SIZE + len(extra)} (256 bytes + "
                         f"{len(specials)} special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(_chunks(without_special_tokens(texts, specials)), trainer=trainer)
    return tok


def tokenizer_bytes(tok: Tokenizer) -> bytes:
    """The canonical ``tokenizer.json`` bytes (what is written to disk and hashed)."""
    return (tok.to_str(pretty=True) + "\n").encode("utf-8")


def check_tokenizer_file(path: str | os.PathLike, vocab_size: int | None = None) -> None:
    """Refuse, before it is parsed, a ``tokenizer.json`` that cannot be one (one ``ValueError`` naming it): a
    symbolic link to nothing (or a loop), not a regular file, empty, larger than its vocabulary allows (with a
    model's ``vocab_size``: ``TOKENIZER_BYTES_PER_TOKEN`` per entry + 1 MiB; else ``MAX_TOKENIZER_BYTES``), or with
    more added tokens than ``vocab_size`` (else ``MAX_ADDED_TOKENS``). The count is one regular-expression pass over
    the mapped file (C speed, no JSON parse); ``tokenizers`` would otherwise parse the whole file first (a 100 MB
    one took 287 s and 5 GB)."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ValueError(f"{path} is a symbolic link to {os.readlink(path)}, which does not exist (a dangling link "
                         f"or a loop); restore the tokenizer file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file (a tokenizer.json is a regular file)")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path}: empty file, not a tokenizer.json (truncated?)")
    limit = MAX_TOKENIZER_BYTES if vocab_size is None else min(
        MAX_TOKENIZER_BYTES, vocab_size * TOKENIZER_BYTES_PER_TOKEN + (1 << 20))
    if size > limit:
        why = (f"for the model's vocab_size={vocab_size} ({TOKENIZER_BYTES_PER_TOKEN} bytes per token + 1 MiB)"
               if vocab_size is not None and limit < MAX_TOKENIZER_BYTES else "(depthattn.data.tokenizer."
               "MAX_TOKENIZER_BYTES)")
        raise ValueError(f"{path} is {size} bytes, more than the {limit} bytes a tokenizer.json may have {why}; it "
                         f"is not this model's tokenizer")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        added = sum(1 for _ in _ADDED_TOKEN.finditer(data))
    bound = MAX_ADDED_TOKENS if vocab_size is None else vocab_size
    if added > bound:
        why = f"the model's vocab_size={vocab_size}" if vocab_size is not None else \
            "depthattn.data.tokenizer.MAX_ADDED_TOKENS"
        raise ValueError(f"{path} declares {added} added tokens, more than {bound} ({why}); it is not this "
                         f"model's tokenizer")


def read_tokenizer(path: str | os.PathLike, vocab_size: int | None = None) -> Tokenizer:
    """A ``tokenizer.json`` file as a ``tokenizers.Tokenizer``, after :func:`check_tokenizer_file`; ``ValueError``
    naming the file if it does not parse (truncated or corrupt)."""
    check_tokenizer_file(path, vocab_size)
    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as e:  # tokenizers raises a plain Exception (serde's message) on a bad file
        raise ValueError(f"{os.fspath(path)}: not a valid tokenizer.json ({e}); the file is truncated or "
                         f"corrupt") from None


#: Unicode normalisation forms a given tokenizer's normalizer may be; ``data prepare`` applies it to the text itself.
UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def unicode_normalization(tok: Tokenizer) -> str | None:
    """The Unicode normalisation form (one of :data:`UNICODE_FORMS`) that ``tok``'s normalizer is, alone or as the
    only member of a ``Sequence``; None for no normalizer or any other kind (which prepare's byte check refuses
    when it changes a text). GPT-NeoX-20B's and Qwen2/Qwen3's tokenizers normalise to NFC."""
    norm = json.loads(tok.to_str()).get("normalizer") or {}
    if norm.get("type") == "Sequence" and len(norm.get("normalizers") or []) == 1:
        norm = norm["normalizers"][0] or {}
    return norm.get("type") if norm.get("type") in UNICODE_FORMS else None


def load_tokenizer(path: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """Load a ``tokenizer.json``, or the ``tokenizer.json`` of a Hugging Face tokenizer folder (e.g. Qwen3's or
    GPT-NeoX's), as is; raises ValueError naming the file if it is missing, unreadable, beyond the bounds of
    :func:`check_tokenizer_file` (``vocab_size``: the model's, when one will use it) or has no EOS."""
    path = Path(path)
    if path.is_dir():
        if not (path / TOKENIZER_FILE).is_file():
            found = ", ".join(sorted(p.name for p in path.iterdir())[:6]) or "nothing"
            raise ValueError(f"{path}: tokenizer folder has no tokenizer.json (found: {found}); only fast "
                             f"tokenizers saved as tokenizer.json can be used")
        path = path / TOKENIZER_FILE
    if not path.is_file() and not path.is_symlink():
        raise ValueError(f"{path}: tokenizer file not found")
    tok = read_tokenizer(path, vocab_size)
    if tok.token_to_id(EOS_TOKEN) is None:
        raise ValueError(f"{path}: tokenizer has no {EOS_TOKEN} token (needed as the end-of-document token)")
    return tok


def add_special_tokens(tok: Tokenizer, special_tokens: Sequence[str], source: str | Path) -> Tokenizer:
    """Declare ``special_tokens`` on a loaded tokenizer (new ids at the end; those already special are kept).
    ValueError naming ``source`` if one is an ordinary token of its vocabulary (its merges already use it)."""
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    new = []
    for t in special_tokens:
        if t in special or t in new:
            continue
        if tok.token_to_id(t) is not None:
            raise ValueError(f"--special-tokens: {t!r} is already in the vocabulary of {source} as an ordinary "
                             f"token (id {tok.token_to_id(t)}); it cannot become a special token")
        new.append(t)
    if new:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
    return tok


def special_tokens_of(tok: Tokenizer) -> list[str]:
    """The special tokens of ``tok`` in id order (``<|endoftext|>`` among them)."""
    return [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special]


def tokenizer_config(tok: Tokenizer) -> dict:
    """``tokenizer_config.json`` for a prepared folder: ``PreTrainedTokenizerFast`` over ``tokenizer.json``, EOS and
    pad ``<|endoftext|>`` (no BOS, no UNK), the other special tokens as ``extra_special_tokens``."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN,
            "bos_token": None, "unk_token": None, "clean_up_tokenization_spaces": False,
            "extra_special_tokens": [t for t in special_tokens_of(tok) if t != EOS_TOKEN],
            "model_max_length": 1 << 30}


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
