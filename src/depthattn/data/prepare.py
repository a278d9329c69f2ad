"""Prepare a data folder from a stream of documents (:func:`prepare_corpus`), in three passes over the inputs:

1. **scan**: count each document's characters (and check its id is unique); memory: a few bytes per document;
2. **split** whole documents into train / validation from those lengths (:func:`split_by_lengths`), then train a
   byte-level BPE on at most ``tokenizer_sample_bytes`` of the training documents (or load ``--tokenizer``);
3. **encode** every document in ``workers`` processes (:mod:`depthattn.data.encode`), each followed by EOS, into
   shard files of ``shard_tokens`` tokens, in input order: the bytes do not depend on the number of workers.

Bits per byte counts each token's bytes with ``tokenizer.token_byte_lengths`` (the byte-level alphabet), so the
encode pass checks, piece by piece, that the tokens' byte lengths add up to the text's UTF-8 bytes, and refuses a
tokenizer for which they do not (a normalizer, a Metaspace pre-tokenizer, unknown tokens). A normalizer that is a
Unicode form only (NFC: GPT-NeoX-20B's, Qwen3's) is applied to each document first, so the bytes counted are those
of the normalised text (``text_normalization`` in meta.json).

Everything is written into ``<parent>/.<name>.partial/folder/`` first (the ``.partial`` records its writer's host
and pid and holds a ``flock``: :mod:`depthattn.data.staging`); only when all is complete is the folder renamed onto
``<out>`` (an old ``<out>`` renamed aside first and deleted last: :func:`depthattn.fileio.write_folder_atomically`),
so a failed or killed run never leaves a folder that looks valid and leaves a previous ``<out>`` as it was; a
re-run removes a stale ``.partial`` (its writer gone) with one line. An existing ``<out>`` is replaced only with
``overwrite`` and only when it is a prepared data folder (:data:`DATA_FOLDER`), and ``<out>`` may not be, contain or
lie inside an input (:func:`depthattn.outputs.check_output`). The folder's format is described in
:mod:`depthattn.data.shards`.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import os
import random
import re
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from depthattn.data.corpus import EMBEDDED_DIR
from depthattn.data.document import Document
from depthattn.data.encode import PIECE_CHARS, ShardWriter, encode_pieces, parallel_encode
from depthattn.data.inputs import TXT_PIECE_CHARS, InputSource, resolve_inputs
from depthattn.data.integrity import VERIFY_CACHE
from depthattn.data.mixture import MixStaging, check_mix
from depthattn.data.shards import DTYPES, META_FORMAT, SPLITS
from depthattn.data.staging import claimed, touch
from depthattn.data.tokenizer import (EOS_TOKEN, MIN_VOCAB_SIZE, add_special_tokens, check_special_tokens,
                                      load_tokenizer, special_tokens_of, tokenizer_bytes, tokenizer_config, train_bpe,
                                      unicode_normalization)
from depthattn.fileio import read_json, sha256_bytes, write_folder_atomically
from depthattn.outputs import OutputKind, check_output, describe_entries
from depthattn.layout import PREPARED_META_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from depthattn.progress import progress_bar

UINT16_MAX_VOCAB = 1 << 16
#: The staging folder of releases before the ``.partial`` moved beside the folder (a prepared folder may hold one).
LEGACY_STAGING = ".partial"
#: Default tokenizer training sample (UTF-8 bytes of training documents).
TOKENIZER_SAMPLE_BYTES = 300_000_000
#: Default tokens per shard file (200 MB of uint16).
SHARD_TOKENS = 100_000_000
#: Characters of text per work unit sent to a worker.
UNIT_CHARS = 1 << 20


def _package_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("depthattn")
    except (ImportError, PackageNotFoundError):
        return "unknown"


def default_workers() -> int:
    """All cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ------------------------------------------------------------------------------------------------------------------
# splitting


#: Why a single document cannot be prepared, and what to do instead.
SPLIT_HINT = ("need at least 2 documents to split into train and validation (whole documents are held out), got {n}; "
              "pass several files, a .jsonl / .parquet file (one line / row = one document), or one long .txt as the "
              "only input (cut into pieces of about --txt-piece-chars characters)")


def split_by_lengths(lengths: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """``[n]`` bool, True for the documents held out for validation, from their character ``lengths``.

    Documents are visited in a seeded shuffle (``random.Random(seed)``); one joins validation while validation is
    below ``val_fraction`` of the characters and adding it stays within 1.5x of the target (so one long novel
    cannot swallow the split). If none fits, the shortest document is held out. Both splits always get at least one
    document. Memory: 8 bytes per document for the order."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    n = len(lengths)
    if n < 2:
        raise ValueError(SPLIT_HINT.format(n=n))
    target = val_fraction * int(lengths.sum())
    order = array.array("q", range(n))
    random.Random(seed).shuffle(order)
    is_val = np.zeros(n, dtype=bool)
    val_chars = n_val = 0
    for i in order:
        if val_chars >= target:
            break
        if val_chars + int(lengths[i]) <= 1.5 * target and n_val < n - 1:
            is_val[i] = True
            val_chars += int(lengths[i])
            n_val += 1
    if not n_val:
        is_val[min(order, key=lambda i: int(lengths[i]))] = True  # min() keeps the first (shuffled) among ties
    return is_val


def split_share_note(lengths: np.ndarray, is_val: np.ndarray, val_fraction: float) -> str | None:
    """One line when the validation split's share of the characters is more than 25 % away from ``val_fraction``
    (whole documents are held out, so a corpus of few or long documents splits coarsely), else None."""
    share = float(lengths[is_val].sum()) / max(1, int(lengths.sum()))
    if abs(share - val_fraction) <= 0.25 * val_fraction:
        return None
    return (f"note: the validation split holds {share:.1%} of the characters ({int(is_val.sum())} of {len(lengths)} "
            f"documents), not the --val-fraction {val_fraction:g} target ({val_fraction:.1%}): whole documents are "
            f"held out, and these are few or long; give more, shorter documents (a .txt input is cut into pieces of "
            f"--txt-piece-chars) for a closer split")


def split_documents(docs: list[Document], val_fraction: float, seed: int) -> tuple[list[Document], list[Document]]:
    """:func:`split_by_lengths` on documents in memory: ``(train, val)``, input order kept within each."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    is_val = split_by_lengths(np.array([len(d.text) for d in docs], dtype=np.int64), val_fraction, seed)
    return [d for d, v in zip(docs, is_val) if not v], [d for d, v in zip(docs, is_val) if v]


# ------------------------------------------------------------------------------------------------------------------
# pass 1: scan


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


def _all_documents(sources: list[InputSource]) -> Iterator[Document]:
    for src in sources:
        yield from src.documents()


def _scan(sources: list[InputSource]) -> tuple[np.ndarray, list[dict]]:
    """Characters of every document, and one ``{"input", "kind", "documents", "characters"}`` record per input;
    ValueError for an input without documents or a document id that appears twice."""
    lengths = array.array("q")
    hashes = array.array("Q")
    records = []
    for src in sources:
        n = chars = 0
        for d in src.documents():
            lengths.append(len(d.text))
            hashes.append(_id_hash(d.id))
            n += 1
            chars += len(d.text)
        if n == 0:
            raise ValueError(f"{src.name}: input has no non-empty documents")
        records.append({"input": src.name, "kind": src.kind, "documents": n, "characters": chars})
    h = np.sort(np.frombuffer(hashes, dtype=np.uint64))
    dup = h[1:][h[1:] == h[:-1]]
    if dup.size:
        twice = next(d.id for d in _all_documents(sources) if _id_hash(d.id) == int(dup[0]))
        raise ValueError(f"document id {twice!r} appears twice in the inputs "
                         f"({', '.join(s.name for s in sources)})")
    return np.frombuffer(lengths, dtype=np.int64), records


# ------------------------------------------------------------------------------------------------------------------
# pass 2: tokenizer


def _resolve_dtype(dtype: str, vocab_size: int) -> str:
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"--dtype must be auto, uint16 or uint32, got {dtype!r}")
    if dtype == "auto":
        return "uint16" if vocab_size <= UINT16_MAX_VOCAB else "uint32"
    if dtype == "uint16" and vocab_size > UINT16_MAX_VOCAB:
        raise ValueError(f"--dtype uint16 cannot hold a vocabulary of {vocab_size} tokens "
                         f"(at most {UINT16_MAX_VOCAB}); use --dtype uint32 or auto")
    return dtype


def _training_sample(sources: list[InputSource], is_val: np.ndarray, sample_bytes: int) -> Iterator[str]:
    """The training documents in input order up to ``sample_bytes`` UTF-8 bytes (the last one truncated)."""
    left = sample_bytes
    for i, d in enumerate(_all_documents(sources)):
        if is_val[i]:
            continue
        raw = d.text.encode("utf-8")
        if len(raw) >= left:
            yield raw[:left].decode("utf-8", errors="ignore")  # drops a character cut in two
            return
        left -= len(raw)
        yield d.text


def _train_tokenizer(sources: list[InputSource], is_val: np.ndarray, vocab_size: int, sample_bytes: int,
                     special_tokens: list[str], progress: bool, log: Callable[[str], None]) -> Tokenizer:
    """A byte-level BPE trained on (a sample of) the training documents; notes a vocabulary smaller than asked."""
    if progress:
        log(f"training a byte-level BPE tokenizer (vocabulary {vocab_size:,d}) on up to {sample_bytes:,d} bytes of "
            f"the {int((~is_val).sum()):,d} training documents")
    # the tokenizers library's own progress display prints blank lines to stdout: keep it off
    tok = train_bpe(_training_sample(sources, is_val, sample_bytes), vocab_size=vocab_size, show_progress=False,
                    special_tokens=special_tokens)
    if tok.get_vocab_size(with_added_tokens=True) < vocab_size:
        log(f"note: the trained vocabulary has {tok.get_vocab_size(with_added_tokens=True):,d} tokens, fewer "
            f"than --vocab-size {vocab_size:,d}: the training text has no more pairs that occur at least twice")
    return tok


def _check_options(out_dir: Path, vocab_size: int, tokenizer: str | Path | None, val_fraction: float, dtype: str,
                   special_tokens: list[str], workers: int, sample_bytes: int) -> Tokenizer | None:
    """Fail fast on bad options, before any work; returns the tokenizer loaded from ``tokenizer`` (None: train one)."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if sample_bytes < 1:
        raise ValueError(f"--tokenizer-sample-bytes must be positive, got {sample_bytes}")
    if tokenizer is None:
        extra = len(check_special_tokens(special_tokens))
        if vocab_size < MIN_VOCAB_SIZE + extra:
            raise ValueError(f"--vocab-size must be at least {MIN_VOCAB_SIZE + extra} (256 bytes + {EOS_TOKEN}"
                             f"{f' + {extra} special tokens' if extra else ''}), got {vocab_size}")
        _resolve_dtype(dtype, vocab_size)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: --out exists and is not a folder")
    if tokenizer is None:
        return None
    tok = add_special_tokens(load_tokenizer(tokenizer), special_tokens, tokenizer)
    _resolve_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))
    return tok


# ------------------------------------------------------------------------------------------------------------------
# pass 3: encode


def _with_last(items: Iterator[str]) -> Iterator[tuple[str, bool]]:
    """``(item, is_last)`` pairs, one item of look-ahead."""
    prev = next(items)
    for item in items:
        yield prev, False
        prev = item
    yield prev, True


def _units(sources: list[InputSource], is_val: np.ndarray, stats: dict, val_ids: list[str], bar,
           form: str | None = None) -> Iterator[tuple[list[tuple[int, str, int]], list[tuple[str, bool]]]]:
    """Work units of about ``UNIT_CHARS`` characters: ``(tags, pieces)`` with one ``(split index, document id,
    document index)`` tag per ``(text, last)`` piece. Counts documents, bytes and characters per split into ``stats``
    on the way. ``form``: the Unicode normalisation the tokenizer's normalizer applies (``unicode_normalization``),
    applied to each whole document first, so its bytes are those of the text the tokens stand for."""
    tags: list[tuple[int, str, int]] = []
    pieces: list[tuple[str, bool]] = []
    size = 0
    n = 0
    for i, d in enumerate(_all_documents(sources)):
        if i >= len(is_val):
            raise ValueError(_CHANGED.format(names=", ".join(src.name for src in sources)))
        n = i + 1
        s = int(is_val[i])
        st = stats[SPLITS[s]]
        text = unicodedata.normalize(form, d.text) if form else d.text
        st["documents"] += 1
        st["bytes"] += len(text.encode("utf-8"))
        st["characters"] += len(text)
        if s:
            val_ids.append(d.id)
        for part, last in _with_last(encode_pieces(text, PIECE_CHARS)):
            tags.append((s, d.id, i))
            pieces.append((part, last))
            size += len(part)
            if size >= UNIT_CHARS:
                yield tags, pieces
                bar.update(size)
                tags, pieces, size = [], [], 0
    if n != len(is_val):
        raise ValueError(_CHANGED.format(names=", ".join(src.name for src in sources)))
    if pieces:
        yield tags, pieces
        bar.update(size)


@dataclasses.dataclass(frozen=True)
class _Mix:
    """A ``--mix`` to apply: the weights, the prepare seed, the scan's per-input records and document lengths."""

    weights: list[float]
    seed: int
    records: list[dict]
    lengths: np.ndarray


_CHANGED = "{names}: the inputs changed while being prepared (another number of documents than when first read)"


def _encode_all(sources: list[InputSource], is_val: np.ndarray, tok: Tokenizer, dtype: str, folder: Path,
                workers: int, shard_tokens: int, tokenizer: str | Path | None, total_chars: int,
                progress: bool, mix: _Mix | None = None) -> tuple[dict, list[str], dict | None]:
    """Encode every document into ``folder``'s shards; returns the per-split meta, the validation ids and (with
    ``mix``) the ``mixture`` record: the training documents are then staged per source and mixed into the train
    split by :mod:`depthattn.data.mixture`."""
    stats = {s: {"documents": 0, "bytes": 0, "characters": 0} for s in SPLITS}
    writers = [ShardWriter(folder, s, dtype, shard_tokens) for s in SPLITS]
    val_ids: list[str] = []
    eos_id = tok.token_to_id(EOS_TOKEN)
    staged = MixStaging(folder, dtype, [r["documents"] for r in mix.records]) if mix is not None else None
    mixture = None
    try:
        with progress_bar(total=total_chars, unit="char", unit_scale=True, desc="encode", enabled=progress) as bar:
            units = _units(sources, is_val, stats, val_ids, bar, unicode_normalization(tok))
            for tags, results in parallel_encode(units, tok.to_str(), eos_id, dtype, workers):
                for (s, doc_id, i), (ids, ok) in zip(tags, results):
                    if not ok:
                        raise ValueError(_byte_mismatch(tokenizer, SPLITS[s], doc_id))
                    if staged is not None and s == 0:
                        staged.write(i, ids)
                    else:
                        writers[s].write(ids)
        if staged is not None:
            stats["train"], mixture = staged.compose(writers[0], mix.weights, mix.seed, tok, ~is_val, mix.lengths,
                                                     [r["input"] for r in mix.records], eos_id)
        return {s: {**stats[s], **w.close()} for s, w in zip(SPLITS, writers)}, val_ids, mixture
    finally:
        for w in writers:
            w.abort()
        if staged is not None:
            staged.abort()


def _byte_mismatch(tokenizer: str | Path | None, split: str, doc_id: str) -> str:
    source = f"tokenizer {tokenizer}" if tokenizer is not None else "the trained tokenizer"
    return (f"{source} does not preserve bytes: the tokens of {split} document {doc_id!r} do not stand for its "
            f"UTF-8 bytes by the byte-level alphabet; bits per byte needs a byte-level BPE without normalizer "
            f"(ByteLevel pre-tokenizer and decoder; no normalizer, or only a Unicode form such as NFC, which prepare "
            f"applies to the text first), e.g. one trained by `depthattn data prepare` "
            f"without --tokenizer")


# ------------------------------------------------------------------------------------------------------------------
# staging


#: Names a prepared data folder may hold besides the shards (format 1: ``train.bin``; 2: ``train-00000.bin``).
DATA_NAMES = frozenset({PREPARED_META_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, VERIFY_CACHE, LEGACY_STAGING})
SHARD_NAME = re.compile(rf"({'|'.join(SPLITS)})(-\d+)?\.bin")


def data_folder_foreign(folder: Path) -> str | None:
    """Why ``folder`` is not a prepared data folder (None: it is one, complete or left half-installed by an older
    release): every entry is a name :func:`prepare_corpus` writes, and there is a ``meta.json`` of ours or else a
    shard or the old ``.partial`` (a tokenizer folder alone is not one)."""
    meta = folder / PREPARED_META_FILE
    if meta.is_file():
        try:
            ok = read_json(meta, "data meta.json").get("format") == META_FORMAT
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            return f"its meta.json is not a {META_FORMAT} meta.json"
    elif not any(n == LEGACY_STAGING or SHARD_NAME.fullmatch(n) for n in os.listdir(folder)):
        return "it has no meta.json"  # (one an older release left half-installed has shards or its .partial)
    extra = [n for n in os.listdir(folder) if n not in DATA_NAMES and not SHARD_NAME.fullmatch(n)]
    if extra:
        return f"it holds files a prepared data folder does not: {describe_entries(folder, extra)}"
    return None


DATA_FOLDER = OutputKind("prepared data folder", data_folder_foreign)


def _input_paths(sources: list[InputSource], specs: list[str] | None, tokenizer: str | Path | None) -> list[Path]:
    """Every path ``prepare_corpus`` reads: each ``--input`` as given and the files it resolved to (the package's
    corpus for ``embedded``), and ``--tokenizer``."""
    paths = [Path(s) for s in specs or [] if os.path.exists(s)]
    for src in sources:
        paths.extend([EMBEDDED_DIR] if src.kind == "embedded" else src.files)
    return paths + ([Path(tokenizer)] if tokenizer is not None else [])


def _write_meta(staging: Path, tok: Tokenizer, tokenizer: str | Path | None, dtype: str, seed: int,
                val_fraction: float, records: list[dict], splits: dict, val_ids: list[str],
                mixture: dict | None = None) -> dict:
    tok_bytes = tokenizer_bytes(tok)
    (staging / TOKENIZER_FILE).write_bytes(tok_bytes)
    (staging / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    meta = {
        "format": META_FORMAT, "format_version": 2, "package_version": _package_version(),
        "tokenizer_file": TOKENIZER_FILE, "tokenizer_sha256": sha256_bytes(tok_bytes),
        "tokenizer_source": str(tokenizer) if tokenizer is not None else "trained",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True), "eos_token": EOS_TOKEN,
        "eos_token_id": tok.token_to_id(EOS_TOKEN), "special_tokens": special_tokens_of(tok), "dtype": dtype,
        "seed": seed, "val_fraction": val_fraction, "sources": records, "splits": splits,
        "val_document_ids": val_ids,
    }
    if mixture is not None:  # absent: the sources concatenated (every folder before --mix)
        meta["mixture"] = mixture
    form = unicode_normalization(tok)
    if form:  # absent: the text as read (every trained tokenizer; every folder before this field)
        meta["text_normalization"] = form
    (staging / PREPARED_META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta


# ------------------------------------------------------------------------------------------------------------------
# prepare


def prepare_corpus(out_dir: str | Path, inputs: list[str] | None = None, *, vocab_size: int = 8192,
                   tokenizer: str | Path | None = None, val_fraction: float = 0.05, seed: int = 0,
                   dtype: str = "auto", progress: bool = True, log: Callable[[str], None] | None = print,
                   workers: int | None = None, text_column: str = "text",
                   tokenizer_sample_bytes: int = TOKENIZER_SAMPLE_BYTES, special_tokens: list[str] | None = None,
                   shard_tokens: int = SHARD_TOKENS, txt_piece_chars: int = TXT_PIECE_CHARS,
                   overwrite: bool = False, wait_s: float = 0.0, if_missing: bool = False,
                   mix: list[float] | None = None) -> dict:
    """Split documents, train (or load) a tokenizer, and write ``tokenizer.json``, ``tokenizer_config.json``, the
    ``train-*.bin`` / ``val-*.bin`` shards and ``meta.json`` to ``out_dir``; returns the meta dict.

    ``inputs``: see :mod:`depthattn.data.inputs` (default: the embedded corpus). ``tokenizer``: an existing
    ``tokenizer.json`` or tokenizer folder with an ``<|endoftext|>`` token, used as is (``vocab_size`` is then
    ignored). ``special_tokens``: extra special tokens, one id each, never learned as merges (added to a given
    tokenizer; ValueError if one is an ordinary token of it). ``dtype``: ``auto`` picks uint16 up to 65,536 tokens,
    else uint32. ``workers``: encoding processes (default: all cores); the output does not depend on it.
    ``text_column``: the text field of jsonl / parquet / datasets inputs. ``tokenizer_sample_bytes``: UTF-8 bytes
    of training documents the BPE is trained on. ``shard_tokens``: tokens per shard file. ``txt_piece_chars``: the
    document size a lone ``.txt`` input is cut into. ``log`` (None: silent): one-line notes. ``overwrite``:
    replace an existing ``out_dir`` (only a prepared data folder; an empty folder needs no ``overwrite``).
    ``wait_s``: how long to wait for another process writing ``out_dir`` (0: refuse at once);
    ``if_missing``: once this process holds the folder's ``.partial``, return the folder's meta without preparing
    when another process has prepared it meanwhile. Bad input, an ``out_dir`` that is or holds an input, or one
    that is not ours raises one ValueError naming the file or option (nothing written).

    ``mix``: one weight per input, the token shares of the training split (>= 0, adding up to 1 within
    ``mixture.SUM_TOLERANCE``); sources are up- or downsampled to them (:mod:`depthattn.data.mixture`; checked before
    any work) and ``meta.json`` records ``mixture``. None: the inputs concatenated as they are."""
    out_dir = Path(out_dir)
    if mix is not None:
        mix = check_mix(list(mix), [str(s) for s in inputs or ["embedded"]])
    workers = default_workers() if workers is None else workers
    special_tokens = list(special_tokens or [])
    tok = _check_options(out_dir, vocab_size, tokenizer, val_fraction, dtype, special_tokens, workers,
                         tokenizer_sample_bytes)
    if shard_tokens < 1:
        raise ValueError(f"--shard-tokens must be positive, got {shard_tokens}")
    log = log or (lambda _msg: None)
    sources = resolve_inputs(inputs, text_column, txt_piece_chars, log)
    out_dir = check_output(out_dir, _input_paths(sources, inputs, tokenizer), DATA_FOLDER, overwrite)
    with claimed(out_dir, log, wait_s) as staging:
        if if_missing and (out_dir / PREPARED_META_FILE).is_file():
            return read_json(out_dir / PREPARED_META_FILE, "data meta.json")
        check_output(out_dir, (), DATA_FOLDER, overwrite)  # again: it may have changed while this one waited
        lengths, records = _scan(sources)
        is_val = split_by_lengths(lengths, val_fraction, seed)
        note = split_share_note(lengths, is_val, val_fraction)
        if note:
            log(note)
        if tok is None:
            tok = _train_tokenizer(sources, is_val, vocab_size, tokenizer_sample_bytes, special_tokens, progress,
                                   log)
        dtype = _resolve_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))
        written: dict = {}

        def fill(folder: str) -> None:
            touch(Path(folder))  # the tokenizer is ready: waiters on other hosts see the writer is alive
            splits, val_ids, mixture = _encode_all(
                sources, is_val, tok, dtype, Path(folder), workers, shard_tokens, tokenizer, int(lengths.sum()),
                progress, _Mix(mix, seed, records, lengths) if mix is not None else None)
            written.update(_write_meta(Path(folder), tok, tokenizer, dtype, seed, val_fraction, records, splits,
                                       val_ids, mixture))

        write_folder_atomically(out_dir, fill, manifest=False, staging=staging)
    return written
