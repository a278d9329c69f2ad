"""Pretraining-scale data preparation: input formats, parallel streaming encode, shards, integrity, special tokens.

Every test runs on real text from the embedded corpus. Equivalences: every input format of the same documents gives
the same token streams; 1 and 2 workers give the same bytes; encoding a document in pieces gives its whole-document
tokens; many shards give the same windows as one; a killed prepare re-run equals an uninterrupted one; the
embedded corpus gives the token streams it gave before shards existed (the README's `compare` result depends on it).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from depthattn.data import (EOS_TOKEN, ShardedTokens, TokenBatches, embedded_corpus_documents, load_prepared,
                            prepare_corpus, sequential_batches)
from depthattn.data import encode as encode_module
from depthattn.data import integrity
from depthattn.data import prepare as prepare_module
from depthattn.data import staging
from depthattn.data.encode import encode_pieces
from depthattn.data.inputs import cut_piece
from depthattn.data.tokenizer import train_bpe

from helpers import EMBEDDED_TRAIN_SHA, machine_timeout

SLICE_IDS = ("sotu/1790_george_washington_n", "sotu/1810_james_madison_dr", "sotu/1951_harry_s_truman_d",
             "sotu/1969_lyndon_b_johnson_d")
#: sha256 of the embedded corpus's val token stream and tokenizer.json at the default settings, recorded with the
#: single-file prepare (main at e38c03e) before shards existed (the train stream's: helpers.EMBEDDED_TRAIN_SHA).
EMBEDDED_VAL_SHA = "2dad56ea5efac4eebd0f3da83bb749009a13dd43648b70a5a9537c82064520ed"
EMBEDDED_TOKENIZER_SHA = "d11c85a4c309c6cdcb77dee06cf913e9d28ed921f8992d24c54844fd7ded9f24"


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return dict(embedded_corpus_documents())


@pytest.fixture(scope="module")
def rows(docs) -> list[dict]:
    return [{"id": i, "text": docs[i]} for i in SLICE_IDS]


@pytest.fixture(scope="module")
def ref(tmp_path_factory, rows) -> Path:
    """The slice as .jsonl, prepared with a trained 400-token BPE (the reference every format must reproduce)."""
    folder = tmp_path_factory.mktemp("ref")
    src = folder / "slice.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare_corpus(folder / "out", [str(src)], vocab_size=400, val_fraction=0.25, seed=1, progress=False, log=None)
    return folder / "out"


def _prep(out: Path, inputs: list[str], ref: Path, **kw) -> dict:
    return prepare_corpus(out, inputs, tokenizer=ref / "tokenizer.json", val_fraction=0.25, seed=1,
                          progress=False, log=None, **kw)


def _streams(meta: dict) -> dict:
    return {s: (meta["splits"][s]["tokens"], meta["splits"][s]["sha256"]) for s in ("train", "val")}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".verified.json"}


# ------------------------------------------------------------------------------------------------------------------
# the default path is unchanged


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Path:
    """The embedded corpus at the default settings (the `compare` data), in shards of 20,000 tokens."""
    out = tmp_path_factory.mktemp("embedded") / "data"
    prepare_corpus(out, None, progress=False, log=None, shard_tokens=20_000)
    return out


def test_embedded_corpus_token_streams_unchanged(embedded):
    meta = json.loads((embedded / "meta.json").read_text())
    assert len(meta["splits"]["train"]["shards"]) == 40
    assert meta["tokenizer_sha256"] == EMBEDDED_TOKENIZER_SHA
    assert meta["splits"]["train"]["sha256"] == EMBEDDED_TRAIN_SHA
    assert meta["splits"]["val"]["sha256"] == EMBEDDED_VAL_SHA
    assert (meta["splits"]["train"]["tokens"], meta["splits"]["val"]["tokens"]) == (797_455, 59_014)


# ------------------------------------------------------------------------------------------------------------------
# formats


def _write_formats(tmp: Path, rows: list[dict]) -> dict[str, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    lines = "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")
    (tmp / "s.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp / "s.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (tmp / "pq").mkdir()
    for k, part in enumerate((rows[:2], rows[2:])):  # a folder of two parquet files, column "body"
        pq.write_table(pa.table({"body": [r["text"] for r in part], "n": [1] * len(part)}),
                       tmp / "pq" / f"part-{k}.parquet", row_group_size=1)
    (tmp / "txt").mkdir()
    for k, r in enumerate(rows):
        (tmp / "txt" / f"{k}.txt").write_text(r["text"], encoding="utf-8")
    return {"jsonl.gz": [str(tmp / "s.jsonl.gz")], "jsonl.zst": [str(tmp / "s.jsonl.zst")],
            "parquet folder": [str(tmp / "pq")], "parquet glob": [str(tmp / "pq" / "*.parquet")],
            "txt folder": [str(tmp / "txt")], "txt glob": [str(tmp / "txt" / "*.txt")]}


def test_every_format_gives_the_same_token_streams(ref, rows, tmp_path):
    want = _streams(json.loads((ref / "meta.json").read_text()))
    for name, inputs in _write_formats(tmp_path, rows).items():
        meta = _prep(tmp_path / name.replace(" ", "_"), inputs, ref, text_column="body" if "parquet" in name
                     else "text")
        assert _streams(meta) == want, name
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": [r["text"] for r in rows]}).save_to_disk(str(tmp_path / "hf"))
    assert _streams(_prep(tmp_path / "hf_out", [str(tmp_path / "hf")], ref)) == want


def test_lone_txt_is_cut_into_documents_at_blank_lines(ref, docs, tmp_path):
    book = docs["moby_dick/moby_dick"][:200_000]
    (tmp_path / "input.txt").write_text(book, encoding="utf-8")
    meta = _prep(tmp_path / "out", [str(tmp_path / "input.txt")], ref, txt_piece_chars=20_000)
    n = meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]
    assert n >= 10 and meta["sources"][0]["documents"] == n
    data = load_prepared(tmp_path / "out")
    pieces, rest = [], book
    while len(rest) > 20_000:
        cut = cut_piece(rest, 20_000)
        assert rest[cut - 2:cut] == "\n\n" and rest[cut] != "\n"  # a blank-line run ends each piece
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    assert "".join(pieces) == book and len(pieces) == n
    ids = data.train.tolist()
    cuts = [i for i, t in enumerate(ids) if t == data.eos_token_id]
    texts = [data.tokenizer.decode(ids[a + 1:b]) for a, b in zip([-1] + cuts[:-1], cuts)]
    held = set(meta["val_document_ids"])
    assert texts == [p for k, p in enumerate(pieces) if f"{tmp_path / 'input.txt'}#{k}" not in held]


# ------------------------------------------------------------------------------------------------------------------
# parallel, streaming, shards


def test_pieces_encode_to_the_whole_document_tokens(ref, docs):
    tok = load_prepared(ref).tokenizer
    for text in (docs["moby_dick/moby_dick"][:60_000], docs["shakespeare/hamlet"][:60_000]):
        pieces = list(encode_pieces(text, 3_000))
        assert "".join(pieces) == text and len(pieces) > 20 and max(map(len, pieces)) <= 3_000
        assert all(p[0] == " " and not p[1].isspace() for p in pieces[1:])
        joined = [i for p in pieces for i in tok.encode(p).ids]
        assert joined == tok.encode(text).ids


def test_workers_and_shards_do_not_change_the_bytes(ref, rows, tmp_path, monkeypatch):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr(prepare_module, "UNIT_CHARS", 4_000)  # many work units in flight
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", 2_500)  # documents encoded in pieces
    one = _prep(tmp_path / "w1", [str(src)], ref, workers=1, shard_tokens=3_000)
    two = _prep(tmp_path / "w2", [str(src)], ref, workers=2, shard_tokens=3_000)
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2") and one == two
    assert len(one["splits"]["train"]["shards"]) > 3
    assert _streams(one) == _streams(json.loads((ref / "meta.json").read_text()))  # == one big shard, whole docs


def test_many_shards_give_the_windows_of_one(ref, rows, tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    _prep(tmp_path / "many", [str(src)], ref, shard_tokens=1_000)
    many, one = load_prepared(tmp_path / "many"), load_prepared(ref)
    assert isinstance(many.train, ShardedTokens) and len(many.train.parts) > 5 and isinstance(one.train, np.memmap)
    np.testing.assert_array_equal(np.asarray(many.train), one.train)
    rng = np.random.default_rng(0)
    for a in rng.integers(0, len(one.train), 200):
        b = int(a + rng.integers(0, 3_000))
        np.testing.assert_array_equal(many.train[a:b], one.train[a:b])
        assert many.train[int(a)] == one.train[int(a)]
    for step in range(20):
        for micro in (0, 1):
            assert torch.equal(TokenBatches(many.train, 8, 64, seed=2).batch(step, micro),
                               TokenBatches(one.train, 8, 64, seed=2).batch(step, micro))
    for x, y in zip(sequential_batches(many.val, 4, 32), sequential_batches(one.val, 4, 32), strict=True):
        assert torch.equal(x, y)


def test_ranks_split_one_global_batch(ref):
    tokens = load_prepared(ref).train
    B, T, W = 3, 16, 4
    whole = TokenBatches(tokens, B * W, T, seed=5, world_size=1)
    for step in (0, 7):
        parts = [TokenBatches(tokens, B, T, seed=5, rank=r, world_size=W).batch(step, 1) for r in range(W)]
        assert torch.equal(torch.cat(parts), whole.batch(step, 1))
        assert torch.equal(TokenBatches(tokens, B, T, seed=5, world_size=1).batch(step, 1),
                           TokenBatches(tokens, B, T, seed=5).batch(step, 1))  # W = 1: today's batches
    with pytest.raises(ValueError, match="rank 4 is not in"):
        TokenBatches(tokens, B, T, rank=4, world_size=4)


_CHILD = textwrap.dedent("""
    import json, resource, sys
    from depthattn.data import prepare_corpus
    out, src, tok, workers = sys.argv[1:5]
    prepare_corpus(out, [src], tokenizer=tok, val_fraction=0.5, progress=False, log=None, workers=int(workers))
    # this process's own peak: VmHWM of its memory map (ru_maxrss would carry over the peak of the forked or
    # vforked pytest process it was exec'd from: Linux keeps the larger of the two across execve)
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"self": hwm, "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""")


@pytest.mark.slow
def test_a_50_mb_document_prepares_under_1_gb(ref, docs, tmp_path):
    book = docs["moby_dick/moby_dick"]
    text = (book * (50_000_000 // len(book) + 1))[:50_000_000]  # real prose, one 50 MB document
    src = tmp_path / "big.jsonl"
    src.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": book[:20_000]}) + "\n")
    n_bytes = len(text.encode("utf-8")) + len(book[:20_000].encode("utf-8"))
    del text
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "out"), str(src), str(ref / "tokenizer.json"),
                          "2"], capture_output=True, text=True, timeout=machine_timeout(900))
    assert run.returncode == 0, run.stderr[-2000:]
    rss = json.loads(run.stdout.strip().splitlines()[-1])
    assert max(rss.values()) < 1_000_000, rss  # KiB: the main process and every encoding worker
    data = load_prepared(tmp_path / "out")
    assert data.num_bytes("train") + data.num_bytes("val") == n_bytes
    assert data.meta["splits"]["train"]["documents"] + data.meta["splits"]["val"]["documents"] == 2


_KILLED = textwrap.dedent("""
    import sys
    from depthattn.data import prepare_corpus
    prepare_corpus(sys.argv[1], None, tokenizer=sys.argv[2], progress=False, log=None, workers=1,
                   shard_tokens=20_000)
""")


def test_killed_prepare_leaves_nothing_valid_and_a_rerun_equals_an_uninterrupted_one(embedded, tmp_path):
    out, tok = tmp_path / "out", embedded / "tokenizer.json"
    child = subprocess.Popen([sys.executable, "-c", _KILLED, str(out), str(tok)], start_new_session=True)
    partial = staging.partial_path(out) / staging.CONTENT_DIR
    deadline = time.time() + 120
    while time.time() < deadline and len(list(partial.glob("train-*.bin"))) < 3:
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert len(list(partial.glob("train-*.bin"))) >= 3, "prepare did not reach the encode pass"
    assert not (out / "meta.json").exists()
    with pytest.raises(ValueError, match="meta.json: not found|not a prepared data folder"):
        load_prepared(out)
    lines = []  # the killed writer's .partial is removed with one line
    meta = prepare_corpus(out, None, tokenizer=tok, progress=False, log=lines.append, workers=2, shard_tokens=20_000)
    assert [line for line in lines if "removed a stale" in line and "that process is gone" in line], lines
    assert not partial.parent.exists()
    got, want = _files(out), _files(embedded)  # the uninterrupted prepare (which trained this tokenizer)
    assert got.pop("meta.json") and want.pop("meta.json") and got == want
    clean = json.loads((embedded / "meta.json").read_text())
    assert {**meta, "tokenizer_source": "trained"} == clean
    assert load_prepared(out).meta["splits"]["train"]["sha256"] == EMBEDDED_TRAIN_SHA


# ------------------------------------------------------------------------------------------------------------------
# integrity


def test_flipped_byte_refused_at_load_and_cache_skips_rehashing(ref, tmp_path, monkeypatch):
    for p in ref.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    from depthattn import fileio

    coarse = (tmp_path / "meta.json").stat().st_ctime_ns % 1_000_000_000 == 0
    time.sleep((fileio.RACY_NS if coarse else fileio.RACY_FINE_NS) / 1e9 + 0.02)  # past the racy-clean tick
    load_prepared(tmp_path)  # hashes, remembers
    assert (tmp_path / integrity.VERIFY_CACHE).is_file()
    monkeypatch.setattr(integrity, "sha256_file", lambda path: pytest.fail(f"re-hashed {path}"))
    load_prepared(tmp_path)
    monkeypatch.undo()
    shard = tmp_path / "train-00000.bin"
    time.sleep(0.05)  # a later mtime than the verified copy's, even on a file system with coarse timestamps
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))  # same size, new mtime
    with pytest.raises(ValueError) as e:
        load_prepared(tmp_path)
    assert str(shard) in str(e.value) and "does not match meta.json" in str(e.value) and "\n" not in str(e.value)
    assert len(load_prepared(tmp_path, verify=False).train) == len(raw) // 2


# ------------------------------------------------------------------------------------------------------------------
# tokenizers


def test_special_tokens_one_id_never_in_merges(docs, tmp_path):
    text = docs["moby_dick/moby_dick"][:100_000]
    parts = [text[k:k + 25_000].replace(".\n", f".{EOS_TOKEN}<|im_start|>\n") for k in range(0, 100_000, 25_000)]
    assert sum(p.count("<|im_start|>") for p in parts) > 100  # hundreds of literal special tokens
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in parts))
    meta = prepare_corpus(tmp_path / "out", [str(src)], vocab_size=600, special_tokens=["<|im_start|>", "<|pad|>"],
                          val_fraction=0.25, progress=False, log=None)
    assert meta["special_tokens"] == [EOS_TOKEN, "<|im_start|>", "<|pad|>"]
    tok = load_prepared(tmp_path / "out").tokenizer
    assert [tok.token_to_id(t) for t in meta["special_tokens"]] == [0, 1, 2]
    vocab = set(tok.get_vocab()) - set(meta["special_tokens"])
    assert not [t for t in vocab if "<|" in t or "|>" in t or "endofte" in t or "im_st" in t]
    assert [i for i in tok.encode("x<|im_start|>y<|pad|>").ids if i < 3] == [1, 2]
    merges = json.loads((tmp_path / "out" / "tokenizer.json").read_text())["model"]["merges"]
    assert not [m for m in merges if "<|" in "".join(m) or "|>" in "".join(m)]
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert auto.eos_token == auto.pad_token == EOS_TOKEN and auto.eos_token_id == 0
    assert auto("a<|im_start|>b")["input_ids"].count(1) == 1
    assert auto.decode(auto(text[:3000])["input_ids"]) == text[:3000]


def test_tokenizer_trained_on_a_sample(docs, tmp_path):
    texts = [docs[i] for i in SLICE_IDS]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    meta = prepare_corpus(tmp_path / "out", [str(src)], vocab_size=400, tokenizer_sample_bytes=30_000,
                          val_fraction=0.25, seed=1, progress=False, log=None)
    train = [t for t, i in zip(texts, SLICE_IDS) if i not in meta["val_document_ids"]]
    sample, left = [], 30_000
    for t in train:
        raw = t.encode("utf-8")
        sample.append(raw[:left].decode("utf-8", errors="ignore"))
        left -= len(raw)
        if left <= 0:
            break
    want = train_bpe(sample, vocab_size=400)
    assert load_prepared(tmp_path / "out").tokenizer.to_str() == want.to_str()
    assert want.to_str() != train_bpe(train, vocab_size=400).to_str()


def test_existing_tokenizer_folder_used_as_is(ref, rows, tmp_path):
    folder = tmp_path / "hf_tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((ref / "tokenizer.json").read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}))
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    meta = prepare_corpus(tmp_path / "out", [str(src)], tokenizer=folder, val_fraction=0.25, seed=1,
                          progress=False, log=None)
    assert _streams(meta) == _streams(json.loads((ref / "meta.json").read_text()))
    assert meta["tokenizer_sha256"] == json.loads((ref / "meta.json").read_text())["tokenizer_sha256"]


# ------------------------------------------------------------------------------------------------------------------
# bad input: one line naming the file, nothing left that looks valid


def _bad(tmp: Path, rows: list[dict], ref: Path) -> dict[str, tuple[list[str], dict, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    good = tmp / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp / "junk.parquet").write_bytes(b"PAR1" + rows[0]["text"][:3000].encode() + b"PAR1")
    pq.write_table(pa.table({"body": [r["text"] for r in rows]}), tmp / "body.parquet")
    z = zstandard.ZstdCompressor().compress(good.read_bytes())
    (tmp / "cut.jsonl.zst").write_bytes(z[:len(z) // 2])
    prose = rows[0]["text"][:4000]
    (tmp / "latin.txt").write_bytes(prose.encode("utf-8") + "é".encode("latin-1") + b" more text")
    (tmp / "blank.jsonl").write_text(json.dumps({"text": "  \n"}) + "\n" + json.dumps({"text": ""}) + "\n")
    (tmp / "no_tok").mkdir()
    (tmp / "no_tok" / "tokenizer_config.json").write_text("{}")
    the = load_prepared(ref).tokenizer.id_to_token(300)
    g = [str(good)]
    return {
        "unreadable parquet": ([str(tmp / "junk.parquet")], {}, "junk.parquet: not a readable parquet file"),
        "missing text column": ([str(tmp / "body.parquet")], {}, "body.parquet: no column `text` (columns: body)"),
        "corrupt zst": ([str(tmp / "cut.jsonl.zst")], {}, "cut.jsonl.zst: cannot read"),
        "non-utf8": ([str(tmp / "latin.txt")], {}, f"latin.txt: not UTF-8 text (invalid continuation byte at "
                                                   f"byte {len(prose.encode('utf-8'))})"),
        "empty corpus": ([str(tmp / "blank.jsonl")], {}, "blank.jsonl: input has no non-empty documents"),
        "no tokenizer.json": (g, {"tokenizer": tmp / "no_tok"}, "no_tok: tokenizer folder has no tokenizer.json"),
        "special in vocab": (g, {"tokenizer": ref / "tokenizer.json", "special_tokens": [the]},
                             f"--special-tokens: {the!r} is already in the vocabulary"),
        "special is a byte": (g, {"special_tokens": ["@"]}, "--special-tokens: '@' is already in the vocabulary"),
        "no glob match": ([str(tmp / "none" / "*.parquet")], {}, "*.parquet: the pattern matches no files"),
    }


@pytest.mark.parametrize("case", ["unreadable parquet", "missing text column", "corrupt zst", "non-utf8",
                                  "empty corpus", "no tokenizer.json", "special in vocab", "special is a byte",
                                  "no glob match"])
def test_bad_input_one_line_nothing_valid_left(case, rows, ref, tmp_path):
    inputs, kw, needle = _bad(tmp_path, rows, ref)[case]
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:
        prepare_corpus(out, inputs, vocab_size=400, progress=False, log=None, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not out.exists()


_REAL_ENCODE_UNIT = encode_module.encode_unit


def _fail_on_korea(pieces):
    """encode_unit, failing on the unit that holds the 1951 address (a late unit): a worker's error mid-run."""
    if any("Korea" in p for p, _ in pieces):
        raise OSError("disk full")
    return _REAL_ENCODE_UNIT(pieces)


def test_failure_in_a_worker_leaves_previous_folder(ref, rows, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for p in ref.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    before = _files(out)
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr(encode_module, "encode_unit", _fail_on_korea)  # the forked workers see it too
    monkeypatch.setattr(prepare_module, "UNIT_CHARS", 4_000)
    with pytest.raises(OSError, match="disk full"):
        _prep(out, [str(src)], ref, workers=2, shard_tokens=2_000, overwrite=True)
    assert _files(out) == before and not staging.partial_path(out).exists()


def test_reprepare_removes_stale_shards_and_old_layout_loads(ref, rows, tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    _prep(out, [str(src)], ref, shard_tokens=1_000)
    assert len(list(out.glob("train-*.bin"))) > 5
    load_prepared(out)
    _prep(out, [str(src)], ref, overwrite=True)  # one shard per split now: the others are gone, the cache too
    assert sorted(p.name for p in out.glob("*.bin")) == ["train-00000.bin", "val-00000.bin"]
    assert not (out / integrity.VERIFY_CACHE).exists()
    # a folder of format_version 1 (one train.bin / val.bin, the split's sha256 that of the file) still loads
    meta = json.loads((out / "meta.json").read_text())
    for split in ("train", "val"):
        (out / f"{split}-00000.bin").rename(out / f"{split}.bin")
        info = meta["splits"][split]
        del info["shards"]
        info["file"] = f"{split}.bin"
    meta["format_version"] = 1
    (out / "meta.json").write_text(json.dumps(meta))
    old = load_prepared(out)
    np.testing.assert_array_equal(old.train, load_prepared(ref).train)
    raw = bytearray((out / "val.bin").read_bytes())
    raw[0] ^= 0x01
    time.sleep(0.05)
    (out / "val.bin").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"val\.bin: sha256 .* does not match meta\.json"):
        load_prepared(out)


def test_pieces_of_text_without_spaces_stay_bounded(docs):
    words = docs["moby_dick/moby_dick"][:50_000]
    for text in (words.replace(" ", ""), words.replace(" ", "").replace("\n", "")):
        pieces = list(encode_pieces(text, 1_000))
        assert "".join(pieces) == text and max(map(len, pieces)) <= 1_000 and min(map(len, pieces[:-1])) > 500


def test_cli_prepare_new_options(ref, rows, tmp_path, capsys):
    import argparse

    from depthattn.commands import data_cmd

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": [r["text"] for r in rows]}), tmp_path / "s.parquet")
    p = argparse.ArgumentParser()
    data_cmd.register(p.add_subparsers(dest="command"))
    args = p.parse_args(["data", "prepare", "--out", str(tmp_path / "out"), "--input", str(tmp_path / "*.parquet"),
                         "--text-column", "body", "--workers", "2", "--shard-tokens", "5000", "--vocab-size", "400",
                         "--special-tokens", "<|im_start|>,<|im_end|>", "--special-tokens", "<|pad|>",
                         "--tokenizer-sample-bytes", "40000", "--val-fraction", "0.25", "--quiet"])
    assert args.func(args) == 0
    meta = load_prepared(tmp_path / "out").meta
    assert meta["special_tokens"] == [EOS_TOKEN, "<|im_start|>", "<|im_end|>", "<|pad|>"]
    assert meta["sources"][0]["kind"] == "glob" and meta["sources"][0]["documents"] == len(rows)
    assert len(meta["splits"]["train"]["shards"]) > 1
    assert "shard files" in capsys.readouterr().out


def test_cli_full_disk_is_one_line(ref, rows, tmp_path, monkeypatch, capsys):
    import errno

    from depthattn import cli

    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / ".partial" / "meta.json"))

    monkeypatch.setattr(prepare_module, "_write_meta", full)
    rc = cli.main(["data", "prepare", "--out", str(tmp_path / "out"), "--input", str(src), "--tokenizer",
                   str(ref / "tokenizer.json"), "--val-fraction", "0.25", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "\n" not in err and "No space left on device [ENOSPC]" in err and "meta.json" in err
    assert not (tmp_path / "out").exists()


def test_boundary_token_check_scans_shards_without_concatenating(monkeypatch):
    """The trainer's value check of a multi-shard split walks each shard in chunks (never ``np.asarray`` of the whole
    split, which would load a corpus larger than memory) and still finds a bad id in any shard and chunk."""
    import depthattn.checks as checks
    from depthattn.data.tokenstream import ShardedTokens

    def no_concat(self, dtype=None, copy=None):
        raise AssertionError("the whole split was materialised")

    monkeypatch.setattr(ShardedTokens, "__array__", no_concat)
    monkeypatch.setattr(checks, "_SCAN_CHUNK", 7)
    good = ShardedTokens([np.arange(20, dtype=np.uint16) % 10, np.full(15, 9, dtype=np.uint16)])
    checks.check_token_array(good, 10, "train split")  # every id < 10
    bad = ShardedTokens([np.zeros(20, dtype=np.uint16), np.array([1] * 10 + [12] + [1] * 4, dtype=np.uint16)])
    with pytest.raises(ValueError, match=r"^train split contains token id 12 outside the vocabulary \[0, 10\)"):
        checks.check_token_array(bad, 10, "train split")
