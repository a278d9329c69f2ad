"""fileio: atomic writes leave either the old file or the complete new one, never a temporary; sha256 helpers."""

from __future__ import annotations

import os
import stat

import pytest

from depthattn import fileio

ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2, "abc"


def _listing(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_sha256_helpers_agree_with_the_reference_digest(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")
    assert fileio.sha256_bytes(b"abc") == fileio.sha256_file(tmp_path / "abc") == ABC_SHA256


def test_atomic_paths_renames_in_order_as_plain_data_files(tmp_path):
    targets = [tmp_path / "sub" / "a.bin", tmp_path / "sub" / "meta.json"]
    with fileio.atomic_paths(targets) as (a, meta):
        assert a.parent == meta.parent == tmp_path / "sub" and a.name.startswith(".a.bin.") and a.suffix == ".tmp"
        a.write_bytes(b"\x00\x01")
        meta.write_text("{}\n")
    assert _listing(tmp_path / "sub") == {"a.bin": b"\x00\x01", "meta.json": b"{}\n"}
    assert all(stat.S_IMODE(os.stat(t).st_mode) == 0o666 & ~fileio.umask() for t in targets)


def test_atomic_paths_failure_keeps_previous_files_and_removes_temporaries(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"old")
    before = _listing(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        with fileio.atomic_paths([tmp_path / "a.bin", tmp_path / "b.bin"]) as (a, b):
            a.write_bytes(b"new")
            raise OSError("disk full")
    assert _listing(tmp_path) == before == {"a.bin": b"old"}


def test_atomic_write_text_and_json(tmp_path):
    fileio.atomic_write_text(tmp_path / "deep" / "x.txt", "héllo\n")
    fileio.atomic_write_json(tmp_path / "x.json", {"k": "é"})
    assert (tmp_path / "deep" / "x.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "x.json").read_bytes() == '{\n  "k": "é"\n}\n'.encode("utf-8")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "x.json", "x.txt"]


def test_atomic_write_text_failure_removes_the_temporary(tmp_path, monkeypatch):
    (tmp_path / "x.txt").write_text("old")

    def fail(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(fileio.os, "replace", fail)
    with pytest.raises(OSError, match="rename failed"):
        fileio.atomic_write_text(tmp_path / "x.txt", "new")
    assert _listing(tmp_path) == {"x.txt": b"old"}


def test_write_folder_atomically_replaces_only_after_fill_succeeds(tmp_path):
    target = tmp_path / "ckpt"

    def fill(text):
        def write(tmp):
            with open(os.path.join(tmp, "f"), "w") as f:
                f.write(text)
        return write

    fileio.write_folder_atomically(target, fill("one"))

    def broken(tmp):
        fill("two")(tmp)
        raise RuntimeError("crash while saving")

    with pytest.raises(RuntimeError, match="crash"):
        fileio.write_folder_atomically(target, broken)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"] and (target / "f").read_text() == "one"
    fileio.write_folder_atomically(target, fill("three"))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"] and (target / "f").read_text() == "three"
