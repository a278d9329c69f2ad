"""Tokenised, memory-mappable shards: ``prepare_corpus`` writes them, ``load_prepared`` reads them back, and
``TokenBatches`` samples training windows from them as a pure function of ``(seed, step)``.

Legend: ``B`` batch, ``T`` sequence length (a window holds ``T + 1`` tokens: inputs and shifted targets),
``N`` tokens in a split.

A prepared folder holds::

    tokenizer.json   byte-level BPE (trained on the training documents only, or copied from --tokenizer)
    train.bin        raw little-endian uint16 (uint32 when the vocabulary exceeds 65,536) token ids; each
    val.bin          document is followed by <|endoftext|>; read with numpy.memmap
    meta.json        tokenizer sha256, vocab_size, eos_token_id, dtype, and per split: tokens, bytes (UTF-8 bytes
                     of the document texts, for bits per byte), characters, documents, sha256 of the .bin file;
                     sources, seed, val_fraction, val_document_ids, version

``data_fingerprint(meta)`` condenses what determines the token streams (tokenizer hash, dtype, seed, val_fraction,
held-out document ids, per-split counts and .bin hashes) into one hash: runs record it and refuse to resume on
other data.

Bits per byte counts each token's bytes with ``tokenizer.token_byte_lengths`` (the byte-level alphabet), so prepare
checks, document by document, that the tokens' byte lengths add up to the text's UTF-8 bytes, and refuses a tokenizer
for which they do not (a normalizer, a Metaspace pre-tokenizer, unknown tokens).

Every file is first written under a temporary name in the folder and renamed only when all of them are complete,
with meta.json last, so a failed run leaves the previous contents of the folder as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from depthattn.data.inputs import read_inputs
from depthattn.data.sources import Document
from depthattn.data.tokenizer import (EOS_TOKEN, load_tokenizer, sha256_bytes, token_byte_lengths, tokenizer_bytes,
                                      train_bpe)

META_FORMAT = "depthattn-prepared"
SPLITS = ("train", "val")
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
UINT16_MAX_VOCAB = 1 << 16


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
# prepare


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
    if tokenizer is None:  # fail fast on options before any work
        if vocab_size < 257:
            raise ValueError(f"--vocab-size must be at least 257 (256 bytes + {EOS_TOKEN}), got {vocab_size}")
        _resolve_dtype(dtype, vocab_size)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: --out exists and is not a folder")
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    if tok is not None:
        _resolve_dtype(dtype, tok.get_vocab_size(with_added_tokens=True))

    log = log or (lambda _msg: None)
    docs, records = read_inputs(inputs, log)
    train_docs, val_docs = split_documents(docs, val_fraction, seed)
    if tok is None:
        if progress:
            log(f"training a byte-level BPE tokenizer (vocabulary {vocab_size:,d}) on {len(train_docs):,d} "
                f"documents, {sum(len(d.text) for d in train_docs):,d} characters")
        # the tokenizers library's own progress display prints blank lines to stdout: keep it off
        tok = train_bpe((d.text for d in train_docs), vocab_size=vocab_size, show_progress=False)
        if tok.get_vocab_size(with_added_tokens=True) < vocab_size:
            log(f"note: the trained vocabulary has {tok.get_vocab_size(with_added_tokens=True):,d} tokens, fewer "
                f"than --vocab-size {vocab_size:,d}: the training text has no more pairs that occur at least twice")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = _resolve_dtype(dtype, vocab)
    eos_id = tok.token_to_id(EOS_TOKEN)
    tok_bytes = tokenizer_bytes(tok)

    out_dir.mkdir(parents=True, exist_ok=True)
    finals = {"tokenizer": out_dir / "tokenizer.json", "train": out_dir / "train.bin", "val": out_dir / "val.bin",
              "meta": out_dir / "meta.json"}
    temps: dict[str, Path] = {}
    try:
        for key, final in finals.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=out_dir)
            os.close(fd)
            temps[key] = Path(tmp)
        temps["tokenizer"].write_bytes(tok_bytes)
        splits = {}
        for name, split_docs in (("train", train_docs), ("val", val_docs)):
            splits[name] = _encode_split(tok, split_docs, eos_id, dtype, temps[name], f"encode {name}", progress)
            splits[name]["file"] = finals[name].name
            bad = splits[name].pop("byte_mismatch", None)
            if bad is not None:
                source = f"tokenizer {tokenizer}" if tokenizer is not None else "the trained tokenizer"
                raise ValueError(
                    f"{source} does not preserve bytes: the tokens of {name} document {bad['document']!r} stand for "
                    f"{bad['token_bytes']} bytes by the byte-level alphabet, but its text has {bad['utf8_bytes']} "
                    f"UTF-8 bytes; bits per byte needs a byte-level BPE without normalizer (ByteLevel pre-tokenizer "
                    f"and decoder, no normalizer), e.g. one trained by `depthattn data prepare` without --tokenizer")
        meta = {
            "format": META_FORMAT, "format_version": 1, "package_version": _package_version(),
            "tokenizer_file": "tokenizer.json", "tokenizer_sha256": sha256_bytes(tok_bytes),
            "tokenizer_source": str(tokenizer) if tokenizer is not None else "trained",
            "vocab_size": vocab, "eos_token": EOS_TOKEN, "eos_token_id": eos_id, "dtype": dtype,
            "seed": seed, "val_fraction": val_fraction, "sources": records, "splits": splits,
            "val_document_ids": [d.id for d in val_docs],
        }
        temps["meta"].write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        for key in ("tokenizer", "train", "val", "meta"):  # meta.json last: it vouches for the others
            os.chmod(temps[key], 0o644)
            os.replace(temps.pop(key), finals[key])
    finally:
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return meta


# ------------------------------------------------------------------------------------------------------------------
# load


def data_fingerprint(meta: dict) -> str:
    """sha256 (hex) of what determines a prepared folder's token streams, from its ``meta.json``: tokenizer sha256,
    dtype, seed, val_fraction, held-out document ids, and per split tokens, bytes, documents and the sha256 of the
    .bin file (absent in folders prepared before it was recorded; the counts stand in). Paths and versions are left
    out, so a copied or moved folder keeps its fingerprint."""
    splits = {name: {k: info.get(k) for k in ("tokens", "bytes", "documents", "sha256")}
              for name, info in sorted(meta.get("splits", {}).items())}
    keyed = {"tokenizer_sha256": meta.get("tokenizer_sha256"), "dtype": meta.get("dtype"), "seed": meta.get("seed"),
             "val_fraction": meta.get("val_fraction"), "val_document_ids": meta.get("val_document_ids"),
             "splits": splits}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode("utf-8")).hexdigest()


@dataclasses.dataclass
class PreparedData:
    """A prepared folder, loaded: ``train`` / ``val`` are read-only 1-D ``numpy.memmap`` token arrays."""

    path: Path
    meta: dict
    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_token_id(self) -> int:
        return int(self.meta["eos_token_id"])

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
        return self.train if name == "train" else self.val

    @property
    def fingerprint(self) -> str:
        """``data_fingerprint(meta)``: equal for two folders that hold the same token streams, different otherwise
        (for folders prepared before the .bin hashes were recorded: otherwise unless the counts coincide)."""
        return data_fingerprint(self.meta)

    def num_tokens(self, split: str) -> int:
        return int(self.meta["splits"][split]["tokens"])

    def num_bytes(self, split: str) -> int:
        """UTF-8 bytes of the split's document texts (EOS separators count zero bytes)."""
        return int(self.meta["splits"][split]["bytes"])

    def bytes_per_token(self, split: str = "val") -> float:
        """Bits per byte = mean loss in nats per token / ln 2 / bytes_per_token (EOS tokens included)."""
        return self.num_bytes(split) / self.num_tokens(split)


def load_prepared(path: str | Path) -> PreparedData:
    """Load and validate a folder written by :func:`prepare_corpus` (ValueError naming the bad file)."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        if path.is_dir() and any(path.iterdir()):  # e.g. a folder of raw text: do not suggest writing into it
            raise ValueError(f"{path} is not a prepared data folder (no meta.json); if it holds text, prepare it "
                             f"with `depthattn data prepare --input {path} --out NEW_DIR` and pass NEW_DIR")
        raise ValueError(f"{meta_path}: not found; prepare a data folder with `depthattn data prepare --input TEXT "
                         f"--out {path}` first")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from e
    required = ("format", "tokenizer_sha256", "vocab_size", "eos_token_id", "dtype", "splits")
    missing = [k for k in required if k not in meta]
    if meta.get("format") != META_FORMAT or missing:
        raise ValueError(f"{meta_path}: not a {META_FORMAT} meta.json (missing keys: {', '.join(missing) or 'format'})")
    if meta["dtype"] not in DTYPES:
        raise ValueError(f"{meta_path}: unknown dtype {meta['dtype']!r}")
    tok_path = path / meta.get("tokenizer_file", "tokenizer.json")
    if not tok_path.is_file():
        raise ValueError(f"{tok_path}: not found")
    if sha256_bytes(tok_path.read_bytes()) != meta["tokenizer_sha256"]:
        raise ValueError(f"{tok_path}: sha256 does not match meta.json (the tokenizer was changed or replaced)")
    tok = load_tokenizer(tok_path)
    arrays = {}
    itemsize = np.dtype(DTYPES[meta["dtype"]]).itemsize
    for split in SPLITS:
        info = meta["splits"].get(split)
        if not isinstance(info, dict) or "tokens" not in info:
            raise ValueError(f"{meta_path}: missing splits.{split}.tokens")
        bin_path = path / info.get("file", f"{split}.bin")
        if not bin_path.is_file():
            raise ValueError(f"{bin_path}: not found")
        expected = int(info["tokens"]) * itemsize
        size = bin_path.stat().st_size
        if size != expected:
            raise ValueError(f"{bin_path}: {size} bytes, but meta.json says {info['tokens']} {meta['dtype']} tokens "
                             f"({expected} bytes); the file is truncated or stale")
        arrays[split] = (np.memmap(bin_path, dtype=DTYPES[meta["dtype"]], mode="r") if size
                         else np.zeros(0, dtype=DTYPES[meta["dtype"]]))
    return PreparedData(path=path, meta=meta, tokenizer=tok, train=arrays["train"], val=arrays["val"])


# ------------------------------------------------------------------------------------------------------------------
# batches


@dataclasses.dataclass(frozen=True)
class TokenBatches:
    """Random training windows whose order is a pure function of ``(seed, step, micro_step, rank)``.

    ``batch(step, micro_step)`` draws ``B`` window starts uniformly from ``[0, N - T - 1]`` with a fresh
    ``numpy.random.Generator`` seeded by ``SeedSequence([seed, step, micro_step, rank])`` and returns the windows as
    an int64 tensor ``[B, T + 1]`` (inputs ``w[:, :-1]``, targets ``w[:, 1:]``). No state is carried between calls,
    so resuming at step ``k`` reproduces exactly the batches of an uninterrupted run, and data-parallel ranks draw
    independent windows. Windows may cross document boundaries (documents are separated by EOS).
    """

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int = 0
    rank: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive, got {self.batch_size}, {self.seq_len}")
        if len(self.tokens) < self.seq_len + 1:
            raise ValueError(f"split has {len(self.tokens)} tokens, fewer than seq_len + 1 = {self.seq_len + 1}")

    def starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step, micro_step, self.rank])
        return rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size, dtype=np.int64)

    def batch(self, step: int, micro_step: int = 0) -> torch.Tensor:
        T1 = self.seq_len + 1
        w_BT1 = np.stack([np.asarray(self.tokens[s:s + T1], dtype=np.int64) for s in self.starts(step, micro_step)])
        return torch.from_numpy(w_BT1)

    __call__ = batch


def sequential_batches(tokens: np.ndarray, batch_size: int, seq_len: int,
                       max_batches: int | None = None) -> Iterator[torch.Tensor]:
    """Non-overlapping windows ``[b, T + 1]`` (stride ``T``) from the start of ``tokens``, for evaluation.

    Every token after the first is a target exactly once, up to the last full window; ``b <= batch_size``.
    """
    n_windows = (len(tokens) - 1) // seq_len
    for done, first in enumerate(range(0, n_windows, batch_size)):
        if max_batches is not None and done >= max_batches:
            return
        idx = range(first, min(first + batch_size, n_windows))
        yield torch.from_numpy(np.stack([np.asarray(tokens[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                                         for i in idx]))
