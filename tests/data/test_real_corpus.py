"""A real pretraining corpus, end to end (docs/data.md, "A real pretraining corpus, end to end"), on stand-ins built
here: parquet shards in FineWeb-Edu's layout (``sample/10BT/NNN_00000.parquet``: a ``text`` column, an ``id``
column and extra columns) written from the embedded corpus. The documented ``data prepare --input 'DIR/*.parquet'
--text-column text`` must give exactly the token streams of the same documents read from a ``.jsonl``, record its
input in meta.json, and train; a tokenizer whose normalizer is NFC (GPT-NeoX-20B's, Qwen3's) must prepare text that
is not in NFC (the Pile has such text) instead of refusing it.
"""

from __future__ import annotations

import json
import shlex
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import normalizers

from depthattn.cli import main
from depthattn.data import embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.data.tokenizer import train_bpe, unicode_normalization

from doc_blocks import TINY_FLAGS

CHARS = 30_000  # of each embedded document: 19 documents, 570,000 characters, a few seconds to prepare
SHARDS = 3
PREPARE = ["--text-column", "text", "--vocab-size", "400", "--val-fraction", "0.1", "--workers", "1", "--quiet"]


def _documents() -> list[tuple[str, str]]:
    return [(doc_id, text[:CHARS]) for doc_id, text in embedded_corpus_documents()]


def write_parquet_shards(folder: Path, docs: list[tuple[str, str]], shards: int = SHARDS,
                         text_column: str = "text") -> list[Path]:
    """``docs`` in ``shards`` parquet files ``folder/NNN_00000.parquet`` (consecutive slices, in order), with an
    ``id`` column, the text column and two extra columns (``url``, ``token_count``: FineWeb-Edu has both), row groups
    of 4 rows (several record batches per file)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, part in enumerate(np.array_split(np.arange(len(docs)), shards)):
        rows = [docs[i] for i in part]
        table = pa.table({"id": [d for d, _ in rows], "url": [f"https://example.org/{d}" for d, _ in rows],
                          text_column: [t for _, t in rows], "token_count": [len(t.split()) for _, t in rows]})
        paths.append(folder / f"{k:03d}_00000.parquet")
        pq.write_table(table, paths[-1], row_group_size=4)
    return paths


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real_corpus")
    docs = _documents()
    write_parquet_shards(root / "fineweb-edu" / "sample" / "10BT", docs)
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in docs),
                                     encoding="utf-8")
    return {"root": root, "glob": root / "fineweb-edu" / "sample" / "10BT" / "*.parquet",
            "jsonl": root / "docs.jsonl"}


@pytest.fixture(scope="module")
def prepared(inputs) -> Path:
    """The documented command on the parquet shards (through the CLI)."""
    out = inputs["root"] / "prepared"
    assert main(["data", "prepare", "--out", str(out), "--input", str(inputs["glob"]), *PREPARE]) == 0
    return out


def test_parquet_shards_prepare_to_the_tokens_of_the_same_documents_as_jsonl(inputs, prepared):
    out = inputs["root"] / "from-jsonl"
    assert main(["data", "prepare", "--out", str(out), "--input", str(inputs["jsonl"]), *PREPARE]) == 0
    a, b = json.loads((prepared / "meta.json").read_text()), json.loads((out / "meta.json").read_text())
    n_docs = len(_documents())
    for split in ("train", "val"):
        assert a["splits"][split]["tokens"] == b["splits"][split]["tokens"] > 0
        assert a["splits"][split]["sha256"] == b["splits"][split]["sha256"]
        assert a["splits"][split]["bytes"] == b["splits"][split]["bytes"]
    assert a["splits"]["train"]["documents"] + a["splits"]["val"]["documents"] == n_docs
    assert a["val_document_ids"] == b["val_document_ids"] and a["val_document_ids"]  # the `id` column is the id
    assert a["tokenizer_sha256"] == b["tokenizer_sha256"]
    # every document closed by EOS: as many EOS tokens as documents
    data = load_prepared(prepared)
    eos = sum(int((np.asarray(data.split(s)) == data.eos_token_id).sum()) for s in ("train", "val"))
    assert eos == n_docs


def test_meta_records_the_parquet_input(inputs, prepared):
    meta = json.loads((prepared / "meta.json").read_text())
    docs = _documents()
    assert meta["sources"] == [{"input": str(inputs["glob"]), "kind": "glob", "documents": len(docs),
                                "characters": sum(len(t) for _, t in docs)}]
    assert meta["tokenizer_source"] == "trained" and "text_normalization" not in meta


def test_another_text_column_and_a_folder_input_give_the_same_tokens(inputs, prepared, tmp_path):
    """``--text-column content`` on shards whose text lies in ``content`` (their ``text`` column absent), read as a
    folder rather than a pattern: the same token streams."""
    folder = tmp_path / "shards"
    write_parquet_shards(folder, _documents(), shards=2, text_column="content")
    out = tmp_path / "prepared"
    args = [a if a != "text" else "content" for a in PREPARE]
    assert main(["data", "prepare", "--out", str(out), "--input", str(folder), *args]) == 0
    a, b = json.loads((prepared / "meta.json").read_text()), json.loads((out / "meta.json").read_text())
    assert [a["splits"][s]["sha256"] for s in ("train", "val")] == [b["splits"][s]["sha256"] for s in ("train", "val")]


def test_missing_text_column_is_one_line_naming_the_file_and_columns(inputs, tmp_path, capsys):
    rc = main(["data", "prepare", "--out", str(tmp_path / "x"), "--input", str(inputs["glob"]),
               "--text-column", "content", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1
    assert "000_00000.parquet: no column `content` (columns: id, url, text, token_count)" in err
    assert not (tmp_path / "x").exists()


def test_a_short_train_on_the_prepared_shards(prepared, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--data", str(prepared), "--out", str(run), *shlex.split(TINY_FLAGS)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in steps)
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["data_fingerprint"] == load_prepared(prepared).fingerprint


# ------------------------------------------------------------------------------------------------------------------
# a given tokenizer whose normalizer is NFC (GPT-NeoX-20B's, the paper's; Qwen3's)


def _nfc_tokenizer(path: Path, normalizer) -> Path:
    tok = train_bpe([text for _, text in _documents()[:4]], vocab_size=400)
    tok.normalizer = normalizer
    tok.save(str(path))
    return path


def test_unicode_normalization_is_read_from_the_tokenizer(tmp_path):
    def form(normalizer):
        tok = train_bpe(["a b c d e f"], vocab_size=300)
        if normalizer is not None:
            tok.normalizer = normalizer
        return unicode_normalization(tok)

    assert form(None) is None
    assert form(normalizers.NFC()) == "NFC"
    assert form(normalizers.NFKD()) == "NFKD"
    assert form(normalizers.Sequence([normalizers.NFC()])) == "NFC"
    assert form(normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])) is None  # changes the text
    assert form(normalizers.Lowercase()) is None


def test_text_not_in_nfc_prepares_with_an_nfc_tokenizer(tmp_path):
    """Decomposed accents (``e`` + U+0301), as the Pile has: the tokens are those of the NFC text, its bytes are
    counted, meta.json says so, and the tokens decode to the NFC text."""
    tok_path = _nfc_tokenizer(tmp_path / "nfc.json", normalizers.NFC())
    texts = [unicodedata.normalize("NFD", f"Café {i}, naïve résumé, Ångström. " * 40) for i in range(6)]
    assert all(not unicodedata.is_normalized("NFC", t) for t in texts)
    src = tmp_path / "nfd.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)),
                   encoding="utf-8")
    meta = prepare_corpus(tmp_path / "out", [str(src)], tokenizer=tok_path, val_fraction=0.2, progress=False,
                          log=None, workers=1)
    assert meta["text_normalization"] == "NFC"
    nfc = [unicodedata.normalize("NFC", t) for t in texts]
    total = sum(meta["splits"][s]["bytes"] for s in ("train", "val"))
    assert total == sum(len(t.encode("utf-8")) for t in nfc) < sum(len(t.encode("utf-8")) for t in texts)
    data = load_prepared(tmp_path / "out")
    ids = np.asarray(data.split("train")).tolist()
    decoded = data.tokenizer.decode(ids, skip_special_tokens=True)
    train_texts = [t for i, t in enumerate(nfc) if f"d{i}" not in meta["val_document_ids"]]
    assert decoded == "".join(train_texts)
