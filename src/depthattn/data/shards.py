"""Prepared data folders, read back: ``load_prepared`` validates one and memory-maps its token files,
``data_fingerprint`` condenses what determines its token streams into one hash, and ``TokenBatches`` samples
training windows from them as a pure function of ``(seed, step)`` (``sequential_batches``: evaluation windows).
:mod:`depthattn.data.prepare` writes the folders.

Legend: ``B`` batch, ``T`` sequence length (a window holds ``T + 1`` tokens: inputs and shifted targets),
``N`` tokens in a split.

A prepared folder holds::

    tokenizer.json         byte-level BPE (trained on a sample of the training documents, or from --tokenizer)
    tokenizer_config.json  PreTrainedTokenizerFast, eos = pad = <|endoftext|>, extra special tokens
    train-00000.bin ...    raw little-endian uint16 (uint32 when the vocabulary exceeds 65,536) token ids, split
    val-00000.bin ...      into shards of shard_tokens tokens; each document is followed by <|endoftext|>
    meta.json              tokenizer sha256, vocab_size, eos_token_id, special_tokens, dtype, and per split: tokens,
                           bytes (UTF-8 bytes of the document texts, for bits per byte), characters, documents,
                           sha256 of all its tokens, and shards: [{file, tokens, sha256}]; sources, seed,
                           val_fraction, val_document_ids, version
    .verified.json         (written at load) shards whose sha256 matched, by size, mtime, ctime and inode

Folders of format_version 1 (one ``train.bin`` / ``val.bin`` per split, the split's sha256 being the file's) load
as before. A split's tokens are the concatenation of its shards in order (one global index).

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

from depthattn.data.integrity import verify_files
from depthattn.data.tokenizer import load_tokenizer
from depthattn.data.tokenstream import ShardedTokens
from depthattn.fileio import read_json, sha256_bytes
from depthattn.layout import PREPARED_META_FILE, TOKENIZER_FILE

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


def _shard_list(split: str, info: dict) -> list[dict]:
    """``[{"file", "tokens", "sha256"}]`` of a split: ``shards`` (format 2), or the one ``.bin`` of format 1."""
    if "shards" in info:
        return info["shards"]
    return [{"file": info.get("file", f"{split}.bin"), "tokens": info["tokens"], "sha256": info.get("sha256")}]


def _open_split(path: Path, meta: dict, split: str, info: dict, expected: dict[str, str]) -> np.ndarray:
    """The split's tokens: its one shard as a ``numpy.memmap``, or several as :class:`ShardedTokens`; checks each
    shard's size and that they add up to ``tokens``, and adds their sha256 to ``expected``."""
    dtype = DTYPES[meta["dtype"]]
    itemsize = np.dtype(dtype).itemsize
    parts = []
    for shard in _shard_list(split, info):
        bin_path = path / shard["file"]
        if not bin_path.is_file():
            raise ValueError(f"{bin_path}: not found")
        want = int(shard["tokens"]) * itemsize
        size = bin_path.stat().st_size
        if size != want:
            raise ValueError(f"{bin_path}: {size} bytes, but meta.json says {shard['tokens']} {meta['dtype']} "
                             f"tokens ({want} bytes); the file is truncated or stale")
        if shard.get("sha256"):
            expected[shard["file"]] = shard["sha256"]
        parts.append(np.memmap(bin_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype))
    if sum(len(p) for p in parts) != int(info["tokens"]):
        raise ValueError(f"{path / 'meta.json'}: the shards of {split} hold {sum(len(p) for p in parts)} tokens, "
                         f"but splits.{split}.tokens says {info['tokens']}")
    return parts[0] if len(parts) == 1 else ShardedTokens(parts)


def load_prepared(path: str | Path, verify: bool = True, recheck: bool = False) -> PreparedData:
    """Load and validate a folder written by :func:`prepare_corpus` (ValueError naming the bad file).

    ``verify``: check every shard's sha256 against ``meta.json`` (:mod:`depthattn.data.integrity`; remembered per
    file size, mtime, ctime and inode, so only the first load of a folder hashes it; ``recheck``: hash every shard
    again regardless). Sizes and the tokenizer's sha256 are always checked. ``train`` / ``val`` are a ``numpy.memmap`` for a one-shard split, else a :class:`ShardedTokens`."""
    path = Path(path)
    meta_path = path / PREPARED_META_FILE
    if not meta_path.is_file():
        if path.is_dir() and any(path.iterdir()):  # e.g. a folder of raw text: do not suggest writing into it
            raise ValueError(f"{path} is not a prepared data folder (no meta.json); if it holds text, prepare it "
                             f"with `depthattn data prepare --input {path} --out NEW_DIR` and pass NEW_DIR")
        raise ValueError(f"{meta_path}: not found; prepare a data folder with `depthattn data prepare --input TEXT "
                         f"--out {path}` first")
    try:
        meta = read_json(meta_path, "data meta.json")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from e
    required = ("format", "tokenizer_sha256", "vocab_size", "eos_token_id", "dtype", "splits")
    missing = [k for k in required if k not in meta]
    if meta.get("format") != META_FORMAT or missing:
        raise ValueError(f"{meta_path}: not a {META_FORMAT} meta.json (missing keys: {', '.join(missing) or 'format'})")
    if meta["dtype"] not in DTYPES:
        raise ValueError(f"{meta_path}: unknown dtype {meta['dtype']!r}")
    tok_path = path / meta.get("tokenizer_file", TOKENIZER_FILE)
    if not tok_path.is_file():
        raise ValueError(f"{tok_path}: not found")
    if sha256_bytes(tok_path.read_bytes()) != meta["tokenizer_sha256"]:
        raise ValueError(f"{tok_path}: sha256 does not match meta.json (the tokenizer was changed or replaced)")
    tok = load_tokenizer(tok_path)
    arrays = {}
    expected: dict[str, str] = {}
    for split in SPLITS:
        info = meta["splits"].get(split)
        if not isinstance(info, dict) or "tokens" not in info:
            raise ValueError(f"{meta_path}: missing splits.{split}.tokens")
        arrays[split] = _open_split(path, meta, split, info, expected)
    if verify:
        verify_files(path, expected, recheck=recheck)
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
    independent windows. Windows may cross document boundaries (documents are separated by EOS) and shard
    boundaries (``tokens`` may be a :class:`ShardedTokens`: one global index over every shard).

    With ``world_size`` W given, one global batch of ``W * B`` starts is drawn from ``SeedSequence([seed, step,
    micro_step, 0])`` and rank ``r`` takes its slice ``[r * B, (r + 1) * B)``: the ranks split one draw between them
    (disjoint slices), and together see exactly the batch of one process with ``batch_size = W * B`` (for W = 1,
    exactly the default's batches).
    """

    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int = 0
    rank: int = 0
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size is not None and not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if self.batch_size < 1 or self.seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive, got {self.batch_size}, {self.seq_len}")
        if len(self.tokens) < self.seq_len + 1:
            raise ValueError(f"split has {len(self.tokens)} tokens, fewer than seq_len + 1 = {self.seq_len + 1}")

    def starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        hi = len(self.tokens) - self.seq_len
        if self.world_size is None:
            rng = np.random.default_rng([self.seed, step, micro_step, self.rank])
            return rng.integers(0, hi, size=self.batch_size, dtype=np.int64)
        rng = np.random.default_rng([self.seed, step, micro_step, 0])
        every = rng.integers(0, hi, size=self.batch_size * self.world_size, dtype=np.int64)
        return every[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

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
