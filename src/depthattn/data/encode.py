"""Parallel, streaming encoding of documents into token shards (the encode pass of ``data prepare``).

- :func:`encode_pieces` cuts a long document into pieces of ``max_chars / 2`` to ``max_chars`` characters, each
  cut just before a space that precedes a non-space character. The byte-level pre-tokenizers (GPT-2's and Qwen3's
  split regexes) never join such a space to the text before it, so the pieces' tokens are exactly the whole
  document's tokens; a document with no such space in a window is cut at other whitespace, or at last at
  ``max_chars`` characters (where the tokens can differ from one whole-document call).
- :func:`parallel_encode` encodes work units (lists of pieces) in ``workers`` processes and yields the results in
  submission order, with at most ``2 * workers`` units in flight: memory is bounded by the workers and the unit
  size, and the output does not depend on the number of workers.
- :class:`ShardWriter` appends token ids to numbered shard files of ``shard_tokens`` tokens each, hashing every
  shard and the whole split as it goes.

Each worker is single-threaded (``TOKENIZERS_PARALLELISM=false``): ``--workers N`` is N encoding processes.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import multiprocessing
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from depthattn.data.tokenizer import token_byte_lengths

#: Largest piece of a document encoded in one call, in characters (the tokenizer needs ~50x a piece's size).
PIECE_CHARS = 1 << 20

_STATE: dict = {}
_LAST_SPACE = re.compile(r".*\s", re.S)


def encode_pieces(text: str, max_chars: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in consecutive pieces of at most ``max_chars`` characters (module docstring: where they are cut)."""
    start, n = 0, len(text)
    while n - start > max_chars:
        end = start + max_chars
        cut = _space_before_word(text, start + max_chars // 2, end)
        if cut is None:  # the last whitespace in the window's second half
            m = _LAST_SPACE.match(text, start + max_chars // 2 + 1, end)
            cut = m.end() - 1 if m else end
        yield text[start:cut]
        start = cut
    if start < n or n == 0:
        yield text[start:]


def _space_before_word(text: str, lo: int, hi: int) -> int | None:
    i = text.rfind(" ", lo, hi)
    while i > lo:
        if i + 1 < len(text) and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", lo, i)
    return None


# ------------------------------------------------------------------------------------------------------------------
# workers


def _init_worker(tokenizer_json: str, eos_id: int, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer.from_str(tokenizer_json)
    tok.encode_special_tokens = True  # a literal special token inside a document is ordinary text
    _STATE.update(tok=tok, byte_len=token_byte_lengths(tok), eos=eos_id, dtype=np.dtype(dtype))


def encode_unit(pieces: list[tuple[str, bool]]) -> list[tuple[np.ndarray, bool]]:
    """Token ids of each ``(text, last)`` piece (EOS appended after a document's last piece), and whether the tokens'
    byte lengths add up to the piece's UTF-8 bytes. Runs in a worker (after :func:`_init_worker`)."""
    tok, byte_len, eos, dtype = _STATE["tok"], _STATE["byte_len"], _STATE["eos"], _STATE["dtype"]
    out = []
    for (text, last), enc in zip(pieces, tok.encode_batch([p for p, _ in pieces], add_special_tokens=False)):
        ids = np.asarray(enc.ids, dtype=np.int64)
        ok = int(byte_len[ids].sum()) == len(text.encode("utf-8"))
        if last:
            ids = np.append(ids, eos)
        out.append((ids.astype(dtype), ok))
    return out


@contextlib.contextmanager
def _fork_env():
    """Set ``TOKENIZERS_PARALLELISM=false`` while the pool forks (no warning, single-threaded workers)."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def parallel_encode(units: Iterator[tuple[object, list[tuple[str, bool]]]], tokenizer_json: str, eos_id: int,
                    dtype: str, workers: int) -> Iterator[tuple[object, list[tuple[np.ndarray, bool]]]]:
    """``(tag, encode_unit(pieces))`` for each ``(tag, pieces)`` of ``units``, in order, encoded by ``workers``
    processes with at most ``2 * workers`` units submitted and not yet yielded."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with _fork_env():
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tokenizer_json, eos_id, dtype))
    try:
        pending: collections.deque = collections.deque()
        for tag, pieces in units:
            pending.append((tag, pool.apply_async(encode_unit, (pieces,))))
            if len(pending) >= 2 * workers:
                tag0, res = pending.popleft()
                yield tag0, res.get()
        while pending:
            tag0, res = pending.popleft()
            yield tag0, res.get()
        pool.close()
        pool.join()
    finally:
        pool.terminate()


# ------------------------------------------------------------------------------------------------------------------
# shards


class ShardWriter:
    """Token ids appended to ``<folder>/<split>-00000.bin``, ``-00001.bin``, ... (raw little-endian ``dtype``),
    ``shard_tokens`` tokens per shard (the last one shorter); each file is fsync'd when full."""

    def __init__(self, folder: Path, split: str, dtype: str, shard_tokens: int):
        if shard_tokens < 1:
            raise ValueError(f"--shard-tokens must be positive, got {shard_tokens}")
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []
        self.total = hashlib.sha256()
        self.tokens = 0
        self._f = None
        self._hash = None
        self._n = 0

    def write(self, ids: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        while ids.size:
            if self._f is None:
                self._open()
            take = min(ids.size, self.shard_tokens - self._n)
            raw = ids[:take].tobytes()
            self._f.write(raw)
            self._hash.update(raw)
            self.total.update(raw)
            self._n += take
            self.tokens += take
            ids = ids[take:]
            if self._n == self.shard_tokens:
                self._close_shard()

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._f = open(self.folder / name, "wb")
        self._hash = hashlib.sha256()
        self._n = 0
        self.shards.append({"file": name, "tokens": 0, "sha256": None})

    def _close_shard(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self.shards[-1].update(tokens=self._n, sha256=self._hash.hexdigest())
        self._f = None

    def close(self) -> dict:
        """Finish the last shard; ``{"tokens", "sha256" (of all the split's tokens), "shards": [...]}``."""
        if self._f is not None:
            self._close_shard()
        if not self.shards:  # an empty split still gets one (empty) shard file
            self._open()
            self._close_shard()
        return {"tokens": self.tokens, "sha256": self.total.hexdigest(), "shards": self.shards}

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
