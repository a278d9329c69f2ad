"""Whether weights, a run and a data folder belong together: one check for every command that pairs them.

``train`` (a fresh start from a checkpoint, a resume, a decay, a reuse by ``compare``) and ``eval`` each pair a
model with data; they agree on what must match through ``check_pairing``:

* the tokenizer (the sha256 of ``tokenizer.json``): token ids mean nothing under another tokenizer, even one of the
  same size. A training command may accept a change on purpose (``allow_tokenizer_change``); ``eval`` never does.
* the data (``data.shards.data_fingerprint``: documents, split, seed, tokens; the folder's path does not count),
  when both sides know theirs: a run continues on the data it trained on.

An unknown value on either side (``None``: an older ``run.json``, a checkpoint without ``tokenizer.json``) is not a
difference. The model's shape and vocabulary are checked where the weights are read (``checkpoint.load_weights_into``;
a vocabulary larger than the tokenizer's is a padded one, ``config.check_vocab_size``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .fileio import sha256_file
from .layout import TOKENIZER_FILE


@dataclass(frozen=True)
class Side:
    """One side of a pairing: what messages call it (``name``: a folder's path, or words such as ``"the run RUN"``),
    its tokenizer's sha256 and its data fingerprint (None: unknown)."""

    name: str
    tokenizer_sha256: str | None = None
    data_fingerprint: str | None = None

    @classmethod
    def of_folder(cls, name: str, folder: str | os.PathLike, fingerprint: str | None = None) -> "Side":
        """A checkpoint or prepared-data folder: the sha256 of its ``tokenizer.json`` (None when it has none)."""
        tok = Path(folder) / TOKENIZER_FILE
        return cls(name, sha256_file(tok) if tok.is_file() else None, fingerprint)

    @classmethod
    def of_run(cls, name: str, run: Mapping[str, Any]) -> "Side":
        """A run's ``run.json``: the tokenizer and data it trained on, as recorded."""
        return cls(name, run.get("tokenizer_sha256"), run.get("data_fingerprint"))

    @classmethod
    def of_data(cls, name: str, meta: Mapping[str, Any], fingerprint: str) -> "Side":
        """A prepared data folder, from its ``meta.json`` (``data.load_prepared``) and fingerprint."""
        return cls(name, meta.get("tokenizer_sha256"), fingerprint)


def _short(value: str | None) -> str:
    return (value or "unknown")[:12]


def tokenizer_differs(a: Side, b: Side) -> bool:
    """Whether both sides know their tokenizer and the two differ."""
    return None not in (a.tokenizer_sha256, b.tokenizer_sha256) and a.tokenizer_sha256 != b.tokenizer_sha256


def data_differs(a: Side, b: Side) -> bool:
    """Whether both sides know their data fingerprint and the two differ."""
    return None not in (a.data_fingerprint, b.data_fingerprint) and a.data_fingerprint != b.data_fingerprint


def check_pairing(what: str, model: Side, data: Side, remedy: str, allow_tokenizer_change: bool = False,
                  check_data: bool = True) -> None:
    """Refuse in one ``ValueError`` line (``"WHAT: ...; REMEDY"``) pairing ``model`` (a checkpoint or a run) with
    ``data`` when their tokenizers differ (unless ``allow_tokenizer_change``) or, with ``check_data``, their data
    fingerprints differ. Both messages name the two sides and the first 12 hex digits of the two hashes."""
    if tokenizer_differs(model, data) and not allow_tokenizer_change:
        raise ValueError(f"{what}: data folder {data.name} has another tokenizer than {model.name} (tokenizer.json "
                         f"sha256 {_short(data.tokenizer_sha256)} vs {_short(model.tokenizer_sha256)}); {remedy}")
    if check_data and data_differs(model, data):
        raise ValueError(f"{what}: data folder {data.name} holds other data than {model.name} (fingerprint "
                         f"{_short(data.data_fingerprint)} vs {_short(model.data_fingerprint)}: other documents, "
                         f"split, seed or tokens); {remedy}")
