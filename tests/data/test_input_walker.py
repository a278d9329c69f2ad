"""One walker for every ``data prepare --input``: a file, a folder or a glob (``**`` too) is read once per real file.

Real text from the embedded corpus. Equivalences: a symbolic-link loop under ``**`` gives the files once; a
symbolically linked sub-folder is read like a real one; files of the same name in different sub-folders prepare
(their default ids are the path below the input); layouts whose file names are unique keep the fingerprint and
held-out ids the original walker gave them.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from depthattn.data import embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.data.inputs import resolve_inputs, walk_input

#: ``load_prepared(out).fingerprint`` and ``val_document_ids`` of the two layouts of
#: ``test_unique_names_keep_their_ids_and_fingerprint``, as the walker before this one prepared them.
FOLDER_FINGERPRINT = "e2ccdb7d59f4372c79fa8cec15872ee712299ed738575bd2373ed529bb9669e8"
FOLDER_VAL_IDS = ["part-0.parquet:1", "corpus/plays/macbeth.txt"]
TWO_INPUTS_FINGERPRINT = "61d741dae6613d81525b8a6f3a364ec365692a1030e80f30a07d3a2d07141c52"
TWO_INPUTS_VAL_IDS = ["sotu.jsonl:3", "part-0.parquet:1"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Openings of eight corpus documents (2,000 to 5,500 characters)."""
    docs = dict(embedded_corpus_documents())
    ids = ("sotu/1790_george_washington_n", "sotu/1810_james_madison_dr", "sotu/1951_harry_s_truman_d",
           "sotu/1969_lyndon_b_johnson_d", "shakespeare/hamlet", "shakespeare/macbeth", "austen/persuasion",
           "moby_dick/moby_dick")
    return [docs[i][:2000 + 500 * k] for k, i in enumerate(ids)]


def _prepare(out: Path, inputs: list[str], log=None) -> dict:
    return prepare_corpus(out, inputs, vocab_size=300, val_fraction=0.3, seed=0, progress=False, log=log)


def _documents(meta: dict) -> int:
    return meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]


def _jsonl(path: Path, rows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows), encoding="utf-8")


def _parquet(path: Path, rows: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": rows}), path)


def test_symlink_loop_under_double_star_reads_each_file_once(tmp_path, texts):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    files = [d / "a.txt", d / "b.txt", d / "sub" / "c.txt"]
    for f, t in zip(files, texts):
        f.write_text(t, encoding="utf-8")
    (d / "sub" / "loop").symlink_to(d, target_is_directory=True)
    spec = f"{d}/**/*.txt"
    [src] = resolve_inputs([spec])
    assert src.files == tuple(files)
    meta = _prepare(tmp_path / "out", [spec])
    assert meta["sources"][0]["documents"] == 3 and _documents(meta) == 3
    data = load_prepared(tmp_path / "out")
    train = data.tokenizer.decode(data.train.tolist())
    held = [str(f) in meta["val_document_ids"] for f in files]
    assert sum(held) == 1 and [t[:300] in train for t in texts[:3]] == [not h for h in held]


def test_symlinked_subfolder_is_read_once(tmp_path, texts):
    d, other = tmp_path / "d", tmp_path / "other"
    d.mkdir()
    (other / "x").mkdir(parents=True)
    for f, t in zip([d / "a.txt", d / "b.txt", other / "x" / "c.txt", other / "x" / "e.txt"], texts):
        f.write_text(t, encoding="utf-8")
    (d / "more").symlink_to(other / "x", target_is_directory=True)
    (d / "same").symlink_to(other / "x", target_is_directory=True)  # a second way to the same folder
    (d / "up").symlink_to(d, target_is_directory=True)  # and a loop
    lines: list[str] = []
    [src] = resolve_inputs([str(d)], log=lines.append)
    assert src.files == (d / "a.txt", d / "b.txt", d / "more" / "c.txt", d / "more" / "e.txt")
    assert lines == [f"{d}: 2 symbolic links lead to files or folders already read (same, up); each is read once"]
    meta = _prepare(tmp_path / "out", [str(d)])
    assert meta["sources"][0]["documents"] == 4 and _documents(meta) == 4


def test_repeated_file_names_in_subfolders_prepare(tmp_path, texts):
    d = tmp_path / "shards"
    _jsonl(d / "a" / "part-0.jsonl", texts[0:2])
    _jsonl(d / "b" / "part-0.jsonl", texts[2:4])
    _parquet(d / "a" / "part-1.parquet", texts[4:6])
    _parquet(d / "b" / "part-1.parquet", texts[6:8])
    [src] = resolve_inputs([str(d)])
    assert [(doc.id, doc.text) for doc in src.documents()] == list(zip(
        ["a/part-0.jsonl:1", "a/part-0.jsonl:2", "a/part-1.parquet:0", "a/part-1.parquet:1",
         "b/part-0.jsonl:1", "b/part-0.jsonl:2", "b/part-1.parquet:0", "b/part-1.parquet:1"],
        texts[0:2] + texts[4:6] + texts[2:4] + texts[6:8]))
    [glob_src] = resolve_inputs([f"{d}/*/part-0.jsonl"])
    assert [doc.id for doc in glob_src.documents()] == ["a/part-0.jsonl:1", "a/part-0.jsonl:2",
                                                        "b/part-0.jsonl:1", "b/part-0.jsonl:2"]
    meta = _prepare(tmp_path / "out", [str(d)])
    assert _documents(meta) == 8 and set(meta["val_document_ids"]) < {doc.id for doc in src.documents()}
    two = _prepare(tmp_path / "two", [str(d / "a"), str(d / "b")])  # the same name below two inputs: the path
    assert _documents(two) == 8
    assert {i.rsplit(":", 1)[0] for i in two["val_document_ids"]} <= {
        f"{d}/{s}/{n}" for s in "ab" for n in ("part-0.jsonl", "part-1.parquet")}


def test_unique_names_keep_their_ids_and_fingerprint(tmp_path, texts, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative inputs: the .txt ids (their paths as given) do not name tmp_path
    _jsonl(tmp_path / "corpus" / "speeches" / "sotu.jsonl", texts[0:3])
    for name, t in zip(("hamlet.txt", "macbeth.txt"), texts[4:6]):
        (tmp_path / "corpus" / "plays" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "corpus" / "plays" / name).write_text(t, encoding="utf-8")
    _parquet(tmp_path / "corpus" / "novels" / "part-0.parquet", [texts[3], texts[6], texts[7]])
    meta = _prepare(tmp_path / "folder", ["corpus"])
    assert (load_prepared(tmp_path / "folder").fingerprint, meta["val_document_ids"]) == (
        FOLDER_FINGERPRINT, FOLDER_VAL_IDS)
    meta = _prepare(tmp_path / "two", ["corpus/*/*.jsonl", "corpus/novels/part-0.parquet"])
    assert (load_prepared(tmp_path / "two").fingerprint, meta["val_document_ids"]) == (
        TWO_INPUTS_FINGERPRINT, TWO_INPUTS_VAL_IDS)


def _glob_then_folders(spec: str) -> tuple[Path, ...]:
    """The files ``glob.glob(spec, recursive=True)`` names, each matched folder replaced by every file below it."""
    out: list[Path] = []
    for m in sorted(Path(p) for p in glob.glob(spec, recursive=True)):
        out.extend(sorted(p for p in m.rglob("*") if p.is_file()) if m.is_dir() else [m])
    return tuple(dict.fromkeys(out))


def test_patterns_without_links_match_what_glob_matches(tmp_path, texts, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = ["d/a.txt", "d/b1.txt", "d/b2.jsonl", "d/.hidden.txt", "d/sub/c.txt", "d/sub/.h/g.txt",
            "d/sub/deep/e.txt", "d/.git/x.txt", "d/sub2/f.txt", "d-x/y.txt"]
    for name, t in zip(tree, texts + texts):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(t[:300], encoding="utf-8")
    patterns = ["d/*.txt", "d/b?.*", "d/[ab]*", "d/**/*.txt", "d/*/*.txt", "d/sub/**", "d/**", "d/*", "d/**/deep/*",
                "*/*.txt", "d*/**/*.txt", f"{tmp_path}/d/**/e.txt", "./d/.*", "d/*/"]
    for spec in patterns:
        assert walk_input(spec).files == _glob_then_folders(spec), spec
    assert len(walk_input("d/**").files) == 9 and len(walk_input("d/**/*.txt").files) == 5


def test_one_file_reached_by_two_inputs_is_refused(tmp_path, texts):
    _jsonl(tmp_path / "d" / "a.jsonl", texts[:2])
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "d" / "a.jsonl")
    with pytest.raises(ValueError) as e:
        resolve_inputs([str(tmp_path / "d"), str(tmp_path / "link.jsonl")])
    assert str(e.value) == (f"{tmp_path / 'link.jsonl'}: both --input {tmp_path / 'd'} and --input "
                            f"{tmp_path / 'link.jsonl'} read it; give each file to one --input")
