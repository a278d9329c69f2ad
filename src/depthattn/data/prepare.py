"""Prepare a data folder: split documents into train/validation, train (or load) a byte-level BPE, encode each
split into a token file, and write ``tokenizer.json``, ``train.bin``, ``val.bin`` and ``meta.json``
(:func:`prepare_corpus`; the folder's format is described in :mod:`depthattn.data.shards`, which reads it back).

Bits per byte counts each token's bytes with ``tokenizer.token_byte_lengths`` (the byte-level alphabet), so prepare
checks, document by document, that the tokens' byte lengths add up to the text's UTF-8 bytes, and refuses a tokenizer
for which they do not (a normalizer, a Metaspace pre-tokenizer, unknown tokens).

Every file is first written under a temporary name in the folder and renamed only when all of them are complete,
with meta.json last, so a failed run leaves the previous contents of the folder as they were.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from depthattn.data.document import Document
from depthattn.data.inputs import read_inputs
from depthattn.data.shards import DTYPES, META_FORMAT
from depthattn.data.tokenizer import (EOS_TOKEN, MIN_VOCAB_SIZE, load_tokenizer, token_byte_lengths, tokenizer_bytes,
                                      train_bpe)
from depthattn.fileio import atomic_paths, sha256_bytes

UINT16_MAX_VOCAB = 1 << 16
#: The files of a prepared folder, in the order they are renamed into place (meta.json last: it vouches for the others).
FILES = ("tokenizer.json", "train.bin", "val.bin", "meta.json")


def _package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("depthattn")
    except (ImportError, PackageNotFoundError):
        return "unknown"


# ------------------------------------------------------------------------------------------------------------------
# splitting


#: Why a single document cannot be prepared, and what to do instead.
SPLIT_HINT = ("need at least 2 documents to split into train and validation (whole documents are held out), got {n}; "
              "pass several .txt files (one file = one document, e.g. a folder of them) or a .jsonl file (one line = "
              "one document), e.g. split one long text into chapters saved as separate files")


def split_documents(docs: list[Document], val_fraction: float, seed: int) -> tuple[list[Document], list[Document]]:
    """Hold out whole documents for validation, about ``val_fraction`` of the characters; deterministic in ``seed``.

    Documents are visited in a seeded shuffle; one joins validation while validation is below its character target
    and adding it stays within 1.5x of the target (so one long novel cannot swallow the split). If none fits, the
    shortest document is held out. Both splits always get at least one document; input order is kept within each.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if len(docs) < 2:
        raise ValueError(SPLIT_HINT.format(n=len(docs)))
    total = sum(len(d.text) for d in docs)
    target = val_fraction * total
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    val: set[int] = set()
    val_chars = 0
    for i in order:
        if val_chars >= target:
            break
        if val_chars + len(docs[i].text) <= 1.5 * target and len(val) < len(docs) - 1:
            val.add(i)
            val_chars += len(docs[i].text)
    if not val:
        val.add(min(order, key=lambda i: len(docs[i].text)))  # min() keeps the first (shuffled) among ties
    return [d for i, d in enumerate(docs) if i not in val], [d for i, d in enumerate(docs) if i in val]


# ------------------------------------------------------------------------------------------------------------------
# encoding


def _resolve_dtype(dtype: str, vocab_size: int) -> str:
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"--dtype must be auto, uint16 or uint32, got {dtype!r}")
    if dtype == "auto":
        return "uint16" if vocab_size <= UINT16_MAX_VOCAB else "uint32"
    if dtype == "uint16" and vocab_size > UINT16_MAX_VOCAB:
        raise ValueError(f"--dtype uint16 cannot hold a vocabulary of {vocab_size} tokens "
                         f"(at most {UINT16_MAX_VOCAB}); use --dtype uint32 or auto")
    return dtype


def _encode_split(tok: Tokenizer, docs: list[Document], eos_id: int, dtype: str, path: Path, desc: str,
                  progress: bool) -> dict:
    """Encode ``docs`` (each followed by EOS) into ``path``; returns the split's counts.

    A literal ``<|endoftext|>`` inside a document is encoded as plain text, so only the appended EOS ids mark
    document ends.
    """
    tok.encode_special_tokens = True
    try:
        return _encode_split_inner(tok, docs, eos_id, dtype, path, desc, progress)
    finally:
        tok.encode_special_tokens = False


def _encode_split_inner(tok: Tokenizer, docs: list[Document], eos_id: int, dtype: str, path: Path, desc: str,
                        progress: bool) -> dict:
    """The counts of ``_encode_split``, the sha256 of the written file, and under ``"byte_mismatch"`` (popped by
    ``prepare_corpus``) the first document whose tokens' byte lengths do not add up to its UTF-8 bytes, or None."""
    n_tokens = n_bytes = n_chars = 0
    batch: list[str] = []
    batch_docs: list[Document] = []
    byte_len = token_byte_lengths(tok)
    digest = hashlib.sha256()
    mismatch: dict | None = None
    with open(path, "wb") as f, tqdm(total=sum(len(d.text) for d in docs), unit="char", unit_scale=True, desc=desc,
                                     disable=not progress) as bar:
        def flush() -> None:
            nonlocal n_tokens, mismatch
            for doc, enc in zip(batch_docs, tok.encode_batch(batch, add_special_tokens=False)):
                ids = np.asarray(enc.ids + [eos_id], dtype=DTYPES[dtype])
                raw = ids.tobytes()
                f.write(raw)
                digest.update(raw)
                n_tokens += ids.size
                if mismatch is None:
                    counted, actual = int(byte_len[ids[:-1].astype(np.int64)].sum()), len(doc.text.encode("utf-8"))
                    if counted != actual:
                        mismatch = {"document": doc.id, "token_bytes": counted, "utf8_bytes": actual}
            bar.update(sum(len(t) for t in batch))
            batch.clear()
            batch_docs.clear()

        for d in docs:
            batch.append(d.text)
            batch_docs.append(d)
            n_bytes += len(d.text.encode("utf-8"))
            n_chars += len(d.text)
            if sum(len(t) for t in batch) >= 1 << 22:
                flush()
        if batch:
            flush()
    return {"file": path.name, "tokens": n_tokens, "bytes": n_bytes, "characters": n_chars, "documents": len(docs),
            "sha256": digest.hexdigest(), "byte_mismatch": mismatch}


# ------------------------------------------------------------------------------------------------------------------
# prepare


def _check_options(out_dir: Path, vocab_size: int, tokenizer: str | Path | None, val_fraction: float,
                   dtype: str) -> Tokenizer | None:
    """Fail fast on bad options, before any work; returns the tokenizer loaded from ``tokenizer`` (None: train one)."""
    if tokenizer is None:
        if vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"--vocab-size must be at least {MIN_VOCAB_SIZE} (256 bytes + {EOS_TOKEN}), "
                             f"got {vocab_size}")
        _resolve_dtype(dtype, vocab_size)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: --out exists and is not a folder")
    if tokenizer is None:
        return None
    tok = load_tokenizer(tokenizer)
    _resolve_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))
    return tok


def _train_tokenizer(train_docs: list[Document], vocab_size: int, progress: bool,
                     log: Callable[[str], None]) -> Tokenizer:
    """A byte-level BPE trained on the training documents only; notes a vocabulary smaller than asked for."""
    if progress:
        log(f"training a byte-level BPE tokenizer (vocabulary {vocab_size:,d}) on {len(train_docs):,d} "
            f"documents, {sum(len(d.text) for d in train_docs):,d} characters")
    # the tokenizers library's own progress display prints blank lines to stdout: keep it off
    tok = train_bpe((d.text for d in train_docs), vocab_size=vocab_size, show_progress=False)
    if tok.get_vocab_size(with_added_tokens=True) < vocab_size:
        log(f"note: the trained vocabulary has {tok.get_vocab_size(with_added_tokens=True):,d} tokens, fewer "
            f"than --vocab-size {vocab_size:,d}: the training text has no more pairs that occur at least twice")
    return tok


def _encode_checked(tok: Tokenizer, docs: list[Document], dtype: str, path: Path, split: str,
                    tokenizer: str | Path | None, progress: bool) -> dict:
    """``_encode_split`` into ``path`` for the ``split`` of meta.json; ValueError if the tokenizer loses bytes."""
    stats = _encode_split(tok, docs, tok.token_to_id(EOS_TOKEN), dtype, path, f"encode {split}", progress)
    stats["file"] = f"{split}.bin"
    bad = stats.pop("byte_mismatch", None)
    if bad is not None:
        source = f"tokenizer {tokenizer}" if tokenizer is not None else "the trained tokenizer"
        raise ValueError(
            f"{source} does not preserve bytes: the tokens of {split} document {bad['document']!r} stand for "
            f"{bad['token_bytes']} bytes by the byte-level alphabet, but its text has {bad['utf8_bytes']} "
            f"UTF-8 bytes; bits per byte needs a byte-level BPE without normalizer (ByteLevel pre-tokenizer "
            f"and decoder, no normalizer), e.g. one trained by `depthattn data prepare` without --tokenizer")
    return stats


def prepare_corpus(out_dir: str | Path, inputs: list[str] | None = None, *, vocab_size: int = 8192,
                   tokenizer: str | Path | None = None, val_fraction: float = 0.05, seed: int = 0,
                   dtype: str = "auto", progress: bool = True, log: Callable[[str], None] | None = print) -> dict:
    """Split documents, train (or load) a tokenizer, and write ``tokenizer.json``, ``train.bin``, ``val.bin`` and
    ``meta.json`` to ``out_dir``; returns the meta dict.

    ``inputs``: see :mod:`depthattn.data.inputs` (default: the embedded corpus). ``tokenizer``: an existing
    ``tokenizer.json`` with an ``<|endoftext|>`` token; when given, ``vocab_size`` is ignored. ``dtype``:
    ``auto`` picks uint16 up to 65,536 tokens, else uint32. ``log`` (None: silent): one-line notes (skipped
    files, a trained vocabulary smaller than ``vocab_size``, and with ``progress`` the tokenizer training).
    """
    out_dir = Path(out_dir)
    tok = _check_options(out_dir, vocab_size, tokenizer, val_fraction, dtype)
    log = log or (lambda _msg: None)
    docs, records = read_inputs(inputs, log)
    train_docs, val_docs = split_documents(docs, val_fraction, seed)
    if tok is None:
        tok = _train_tokenizer(train_docs, vocab_size, progress, log)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = _resolve_dtype(dtype, vocab)
    tok_bytes = tokenizer_bytes(tok)

    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_paths([out_dir / name for name in FILES]) as (tok_tmp, train_tmp, val_tmp, meta_tmp):
        tok_tmp.write_bytes(tok_bytes)
        splits = {split: _encode_checked(tok, split_docs, dtype, tmp, split, tokenizer, progress)
                  for split, split_docs, tmp in (("train", train_docs, train_tmp), ("val", val_docs, val_tmp))}
        meta = {
            "format": META_FORMAT, "format_version": 1, "package_version": _package_version(),
            "tokenizer_file": "tokenizer.json", "tokenizer_sha256": sha256_bytes(tok_bytes),
            "tokenizer_source": str(tokenizer) if tokenizer is not None else "trained",
            "vocab_size": vocab, "eos_token": EOS_TOKEN, "eos_token_id": tok.token_to_id(EOS_TOKEN), "dtype": dtype,
            "seed": seed, "val_fraction": val_fraction, "sources": records, "splits": splits,
            "val_document_ids": [d.id for d in val_docs],
        }
        meta_tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta
