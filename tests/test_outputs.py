"""Commands write only what they own (issue 24, items 7 and 8).

* ``export``, ``convert`` and ``data prepare`` refuse an ``--out`` that is their source, contains it or lies inside
  it (symlinks resolved), and ``--overwrite`` replaces only a folder of their own kind (a model folder whose
  ``checksums.json`` lists every file; a prepared data folder); every refusal is one line and leaves every file
  under the test's folder byte for byte as it was.
* A legitimate ``--overwrite`` works, and is atomic: a failure while the new folder is filled, or while it is being
  renamed into place, leaves the old folder valid.

The ``.partial`` folders of a data prepare (a dead writer's, another host's, a live one's): tests/data/test_staging.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, fileio
from depthattn import checkpoint as ckpt
from depthattn.cli import main
from depthattn.data import load_prepared
from depthattn.data.prepare import DATA_FOLDER
from depthattn.outputs import MODEL_FOLDER, check_output

from helpers import snapshot


def _model_folder(path: Path, data_dir: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_preset("tiny", vocab_size=load_prepared(data_dir, verify=False).vocab_size)
    ckpt.save_model(DecoderLM(cfg), path, tokenizer_file=data_dir / "tokenizer.json")
    return path


@pytest.fixture
def world(tmp_path, data_dir):
    """A run folder (two checkpoints), a user's folder, and the prepared data, all under ``tmp_path``."""
    run = tmp_path / "run"
    _model_folder(run / "checkpoints" / "step_00000002", data_dir, 0)
    _model_folder(run / "checkpoints" / "step_00000004", data_dir, 1)
    (run / "run.json").write_text('{"note": "a run"}\n')
    user = tmp_path / "mine"
    (user / "sub").mkdir(parents=True)
    for i in range(7):
        (user / f"notes-{i}.txt").write_text(f"my notes {i}\n")
    (user / "sub" / "deep.bin").write_bytes(os.urandom(64))
    return {"run": run, "user": user, "tmp": tmp_path, "data": data_dir}


def one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(prefix), err
    return err


def refused(capsys, argv: list[str], tmp: Path, *needles: str) -> str:
    before = snapshot(tmp)
    assert main(argv) == 2
    line = one_line(capsys, f"depthattn {' '.join(argv[:2] if argv[0] == 'data' else argv[:1])}: error: ")
    for needle in needles:
        assert needle in line, line
    assert snapshot(tmp) == before  # every file as it was, byte for byte, and nothing added
    return line


# ---------------------------------------------------------------------------------------------------- export
def test_export_refuses_what_it_does_not_own(world, capsys):
    run, user, tmp = world["run"], world["user"], world["tmp"]
    (tmp / "link").symlink_to(run)
    data_copy = tmp / "prepared"
    data_copy.mkdir()
    for p in world["data"].iterdir():
        (data_copy / p.name).write_bytes(p.read_bytes())
    other = tmp / "other-run" / "checkpoints" / "step_00000002"
    _model_folder(other, world["data"])
    fileio.atomic_write_text(other / "trainer_state.pt", "state")  # a training checkpoint (listed or not)
    export = lambda out: ["export", str(run), "--out", str(out), "--overwrite"]  # noqa: E731

    refused(capsys, export(user), tmp, f"--out {user} is not a depthattn model folder", "no checksums.json",
            "notes-0.txt, notes-1.txt", "and 3 more (8 entries)")
    refused(capsys, export(run), tmp, f"--out {run} is the source {run}")
    refused(capsys, export(tmp), tmp, f"--out {tmp} contains the source {run}")
    refused(capsys, export(run / "exported"), tmp, f"--out {run / 'exported'} lies inside the source {run}")
    refused(capsys, export(run / "checkpoints" / "step_00000004"), tmp, "is the source")
    refused(capsys, export(tmp / "link"), tmp, "is the source", "once symlinks are resolved")
    refused(capsys, export(data_copy), tmp, "is not a depthattn model folder")
    refused(capsys, export(other), tmp, "is a training checkpoint or run folder (it has trainer_state.pt)")
    refused(capsys, ["export", str(run), "--out", str(user)], tmp, f"--out {user} already exists")
    (user / "file.txt").write_text("x")
    refused(capsys, export(user / "file.txt"), tmp, "is a file, not a folder")


def test_export_overwrites_its_own_kind_atomically(world, capsys, monkeypatch):
    run, tmp = world["run"], world["tmp"]
    out = tmp / "exported"
    assert main(["export", str(run / "checkpoints" / "step_00000002"), "--out", str(out)]) == 0
    first = snapshot(out)
    # a user's file added to the export: it is no longer only ours
    (out / "README.md").write_text("my notes on this model\n")
    refused(capsys, ["export", str(run), "--out", str(out), "--overwrite"], tmp,
            "holds files its checksums.json does not list: README.md (1 entry)")
    (out / "README.md").unlink()

    # a failure while the new folder is filled: the old one stays, valid; no temporary folder is left
    real = ckpt.save_model_files

    def half_then_fail(model, folder, *a, **k):
        real(model, folder, *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_model_files", half_then_fail)
    assert main(["export", str(run), "--out", str(out), "--overwrite"]) == 1
    capsys.readouterr()
    assert snapshot(out) == first and fileio.verify_manifest(out)
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []
    monkeypatch.setattr(ckpt, "save_model_files", real)

    assert main(["export", str(run), "--out", str(out), "--overwrite"]) == 0  # the newest checkpoint now
    assert snapshot(out) != first and fileio.verify_manifest(out)
    want = ckpt.load_state(run / "checkpoints" / "step_00000004")
    got = ckpt.load_state(out)
    assert all((got[k] == want[k]).all() for k in want)
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []


def test_write_folder_atomically_puts_the_old_folder_back_when_the_new_cannot_be_renamed(tmp_path, monkeypatch):
    target = tmp_path / "m"
    fileio.write_folder_atomically(target, lambda d: Path(d, "w.bin").write_bytes(b"old"))
    before = snapshot(target)
    real, calls = os.replace, []

    def second_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old -> aside succeeded; new -> target fails
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", second_fails)
    with pytest.raises(OSError, match="Input/output error"):
        fileio.write_folder_atomically(target, lambda d: Path(d, "w.bin").write_bytes(b"new"))
    monkeypatch.setattr(fileio.os, "replace", real)
    assert len(calls) == 3 and snapshot(target) == before  # the third rename put it back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ---------------------------------------------------------------------------------------------------- convert
def test_convert_refuses_what_it_does_not_own(world, capsys):
    run, user, tmp = world["run"], world["user"], world["tmp"]
    for mode in ("--to-qwen3", "--upgrade"):
        conv = lambda out: ["convert", mode, str(run), "--out", str(out), "--overwrite"]  # noqa: E731
        refused(capsys, conv(run), tmp, f"--out {run} is the source {run}")
        refused(capsys, conv(tmp), tmp, "contains the source")
        refused(capsys, conv(run / "checkpoints" / "hf"), tmp, "lies inside the source")
        refused(capsys, conv(user), tmp, "is not a depthattn model folder", "notes-0.txt")
    hf = tmp / "hf"
    assert main(["convert", "--to-qwen3", str(run), "--out", str(hf)]) == 0
    refused(capsys, ["convert", "--from-qwen3", str(hf), "--out", str(hf / "back")], tmp, "lies inside the source")
    assert main(["convert", "--upgrade", str(run), "--out", str(hf), "--overwrite"]) == 0  # our own: replaced
    assert json.loads((hf / "config.json").read_text())["model_type"] == "depthattn"


# ---------------------------------------------------------------------------------------------------- eval --out
def test_eval_out_replaces_only_an_earlier_result_file(world, capsys):
    run, user, tmp, data_dir = world["run"], world["user"], world["tmp"], world["data"]
    ck = run / "checkpoints" / "step_00000004"
    ev = lambda out: ["eval", str(run), "--data", str(data_dir), "--max-tokens", "64", "--no-progress",  # noqa: E731
                      "--out", str(out)]
    refused(capsys, ev(ck / "model.safetensors"), tmp, "is not an eval result file", "not replaced")
    refused(capsys, ev(ck / "config.json"), tmp, "is not an eval result file")
    refused(capsys, ev(user / "notes-0.txt"), tmp, "is not an eval result file")
    refused(capsys, ev(user), tmp, f"--out {user} is a folder")
    refused(capsys, ev(run), tmp, f"--out {run} is the source {run}")
    out = tmp / "results.json"
    out.write_text(json.dumps({"checkpoint": "an earlier run", "loss": 1.0}))
    assert main(ev(out)) == 0  # an earlier result file is replaced
    assert json.loads(out.read_text())["checkpoint"] == str(ck)


# ---------------------------------------------------------------------------------------------------- data prepare
def _prepare(out: Path, src: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["data", "prepare", "--input", str(src), "--tokenizer", str(data_dir / "tokenizer.json"),
            "--out", str(out), "--val-fraction", "0.2", "--quiet", "--workers", "1", *extra]


def test_data_prepare_refuses_what_it_does_not_own(world, capsys):
    user, tmp, data_dir = world["user"], world["tmp"], world["data"]
    texts = tmp / "texts"
    texts.mkdir()
    src = data_dir.parent / "slice.jsonl"
    (texts / "a.jsonl").write_bytes(src.read_bytes())
    model = _model_folder(tmp / "model", data_dir)
    refused(capsys, _prepare(texts, texts, data_dir, "--overwrite"), tmp, f"--out {texts} is the source {texts}")
    refused(capsys, _prepare(tmp, texts, data_dir, "--overwrite"), tmp, "contains the source")
    refused(capsys, _prepare(texts / "prepared", texts, data_dir), tmp, "lies inside the source")
    refused(capsys, _prepare(texts, texts / "a.jsonl", data_dir, "--overwrite"), tmp, "contains the source")
    refused(capsys, _prepare(user, texts, data_dir, "--overwrite"), tmp, "is not a prepared data folder",
            "it has no meta.json", "notes-0.txt")
    refused(capsys, _prepare(model, texts, data_dir, "--overwrite"), tmp, "is not a prepared data folder")
    refused(capsys, _prepare(user, texts, data_dir), tmp, "already exists; pass --overwrite")


def test_data_prepare_refuses_a_tokenizer_inside_out(world, capsys):
    tmp, data_dir = world["tmp"], world["data"]
    out = tmp / "p"
    out.mkdir()
    (out / "tokenizer.json").write_bytes((data_dir / "tokenizer.json").read_bytes())
    argv = ["data", "prepare", "--input", str(data_dir.parent / "slice.jsonl"), "--tokenizer",
            str(out / "tokenizer.json"), "--out", str(out), "--overwrite", "--quiet"]
    refused(capsys, argv, tmp, f"--out {out} contains the source {out / 'tokenizer.json'}")


def test_data_prepare_overwrites_a_prepared_folder_atomically(world, capsys, monkeypatch):
    from depthattn.data import prepare as prepare_module

    tmp, data_dir = world["tmp"], world["data"]
    src = data_dir.parent / "slice.jsonl"
    out = tmp / "prepared"
    assert main(_prepare(out, src, data_dir)) == 0
    load_prepared(out)  # writes .verified.json: still a prepared folder
    first = snapshot(out)
    real = prepare_module._write_meta

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module, "_write_meta", fail)  # the shards are written, then the fill fails
    assert main(_prepare(out, src, data_dir, "--overwrite", "--seed", "3")) == 1
    capsys.readouterr()
    assert snapshot(out) == first and load_prepared(out).meta["seed"] == 0
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []
    monkeypatch.setattr(prepare_module, "_write_meta", real)
    assert main(_prepare(out, src, data_dir, "--overwrite", "--seed", "3")) == 0
    assert load_prepared(out).meta["seed"] == 3
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".")) == []


def test_kind_checks(tmp_path, data_dir):
    old = tmp_path / "old"  # the previous release's staging inside the folder, shards half moved in
    (old / ".partial").mkdir(parents=True)
    (old / ".partial" / "pid").write_text("123")
    (old / "train-00000.bin").write_bytes(b"\0\0")
    assert DATA_FOLDER.foreign(old) is None
    (old / "mine.txt").write_text("x")
    assert "mine.txt" in DATA_FOLDER.foreign(old)
    assert DATA_FOLDER.foreign(data_dir) is None
    half = tmp_path / "half"  # the previous release failed between removing meta.json and installing the new one
    half.mkdir()
    (half / "tokenizer.json").write_text("{}")
    assert DATA_FOLDER.foreign(half) == "it has no meta.json"  # a tokenizer folder alone is the user's
    (half / "val-00000.bin").write_bytes(b"\0\0")
    assert DATA_FOLDER.foreign(half) is None
    assert MODEL_FOLDER.foreign(data_dir).startswith("it has no checksums.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_output(empty, [], MODEL_FOLDER, overwrite=False) == empty  # nothing there to lose


def test_data_fetch_updates_only_a_corpus_folder(world, capsys):
    user, tmp = world["user"], world["tmp"]
    refused(capsys, ["data", "fetch", "public-domain-mix", "--out", str(user)], tmp,
            "is not a depthattn corpus folder", "no depthattn-corpus manifest.json", "notes-0.txt")
    from depthattn.data.corpus import CORPUS_FOLDER, EMBEDDED_DIR

    assert CORPUS_FOLDER.foreign(EMBEDDED_DIR) is None  # what `data fetch` writes is its own kind
