"""Prepared data folders, read back: ``load_prepared`` validates one and memory-maps its token files,
``data_fingerprint`` condenses what determines its token streams into one hash, and ``TokenBatches`` samples
training windows from them as a pure function of ``(seed, step)`` (``sequential_batches``: evaluation windows).
:mod:`depthattn.data.prepare` writes the folders.

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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from depthattn.data.tokenizer import load_tokenizer
from depthattn.fileio import sha256_bytes

META_FORMAT = "depthattn-prepared"
SPLITS = ("train", "val")
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


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
    return sha256_bytes(json.dumps(keyed, sort_keys=True).encode("utf-8"))


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
