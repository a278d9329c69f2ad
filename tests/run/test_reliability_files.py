"""Reliability of files (issue 13): durable atomic writes (fsync of the file and of its folder), the umask's
permissions on every artefact, checksums of checkpoints and token shards verified when read, and hostile
``config.json`` sizes refused before any model is built. docs/reliability.md, "Files and integrity"."""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from depthattn import DecoderLM, ModelConfig, fileio
from depthattn import checkpoint as ckpt
from depthattn.data import embedded_corpus_documents, integrity, load_prepared, prepare_corpus
from depthattn.training import TrainConfig, resolve_model_config, train

TRAIN = dict(steps=4, batch_size=2, seq_len=32, eval_every=2, eval_windows=1, save_every=2, keep_last=2,
             device="cpu", tensorboard=False)


# ------------------------------------------------------------------------------------------------------------------
# fixtures: everything is written under umask 022 (the usual shared-group setting)


@pytest.fixture
def umask(monkeypatch):
    """Set the process umask for one test (and drop fileio's cached copy); restored afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)

    def set_to(mask: int) -> None:
        os.umask(mask)
        monkeypatch.setattr(fileio, "_UMASK", None)

    yield set_to
    os.umask(previous)
    fileio._UMASK = None


def _under_umask_022(fn):
    previous = os.umask(0o022)
    fileio._UMASK = None
    try:
        return fn()
    finally:
        os.umask(previous)
        fileio._UMASK = None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Real text: 12,000 characters of four embedded documents, BPE vocab 512 (prepared under umask 022)."""
    folder = tmp_path_factory.mktemp("corpus")
    src = folder / "slice.jsonl"
    src.write_text("".join(json.dumps({"text": text[:12000]}) + "\n" for _, text in embedded_corpus_documents()[:4]),
                   encoding="utf-8")
    return _under_umask_022(lambda: (prepare_corpus(folder / "data", [str(src)], vocab_size=512, val_fraction=0.25,
                                                    progress=False, workers=1), folder / "data")[1])


@pytest.fixture(scope="module")
def tiny_cfg(data_dir) -> ModelConfig:
    return resolve_model_config("tiny", {"cross_layer": "depth_attention"}, load_prepared(data_dir).vocab_size,
                                "tokenizer.json")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir, tiny_cfg) -> Path:
    """A finished four-step run (checkpoints at steps 2 and 4), written under umask 022."""
    run = tmp_path_factory.mktemp("runs") / "run"
    _under_umask_022(lambda: train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, progress=False))
    return run


def _checkpoint(run_dir: Path) -> Path:
    return ckpt.checkpoint_dirs(run_dir)[-1]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _flip(file: Path, offset: int, keep_mtime: bool = True) -> None:
    """Flip the lowest bit of byte ``offset`` in place (same size), as bit rot does: the mtime is put back (unless
    ``keep_mtime=False``)."""
    st = file.stat()
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))
    if keep_mtime:
        os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


def _tensor_data_offset(file: Path) -> int:
    """A byte in the middle of a safetensors file's tensor data (past the 8-byte length and the JSON header)."""
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return 8 + n + (file.stat().st_size - 8 - n) // 2


def _largest_zip_member_offset(file: Path) -> int:
    """A byte in the middle of the largest stored member of a torch.save zip (a tensor's raw data)."""
    with zipfile.ZipFile(file) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(file, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg


# ------------------------------------------------------------------------------------------------------------------
# durability: fsync of every file and of the folder holding the new name


@pytest.fixture
def fsyncs(monkeypatch):
    """Every ``os.fsync`` and ``os.replace`` in order: ("fsync", "file" | "dir", path) and ("replace", src, dst)."""
    events: list[tuple[str, str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append(("fsync", kind, os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_atomic_file_write_fsyncs_the_file_before_and_the_folder_after_the_rename(tmp_path, fsyncs):
    for write, name in ((lambda p: fileio.atomic_write_text(p, "x\n"), "a.txt"),
                        (lambda p: fileio.atomic_write_json(p, {"k": 1}), "b.json")):
        fsyncs.clear()
        write(tmp_path / name)
        (replace,) = [i for i, e in enumerate(fsyncs) if e[0] == "replace"]
        tmp, dst = fsyncs[replace][1:]
        assert dst == str(tmp_path / name)
        assert ("fsync", "file", tmp) in fsyncs[:replace]  # the content is on disk before the name points at it
        assert ("fsync", "dir", str(tmp_path)) in fsyncs[replace + 1:]  # and the new name is on disk after


def test_folder_write_fsyncs_every_file_and_folder_then_the_parent_after_the_rename(tmp_path, fsyncs):
    def fill(tmp: str) -> None:
        Path(tmp, "sub").mkdir()
        Path(tmp, "a.bin").write_bytes(b"\x00" * 10)
        Path(tmp, "sub", "b.txt").write_text("b")

    fileio.write_folder_atomically(tmp_path / "ck", fill)
    (replace,) = [i for i, e in enumerate(fsyncs) if e[0] == "replace"]
    tmp = fsyncs[replace][1]
    before = fsyncs[:replace]
    for rel in ("a.bin", "sub/b.txt", fileio.MANIFEST_NAME):
        assert ("fsync", "file", os.path.join(tmp, rel)) in before, rel
    assert ("fsync", "dir", tmp) in before and ("fsync", "dir", os.path.join(tmp, "sub")) in before
    assert fsyncs[replace + 1:] == [("fsync", "dir", str(tmp_path))]


# ------------------------------------------------------------------------------------------------------------------
# permissions: what the umask gives ordinary files and folders


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_every_fileio_writer_gives_the_umask_modes(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    fileio.atomic_write_text(tmp_path / "report.md", "# r\n")
    fileio.atomic_write_json(tmp_path / "results.json", {})
    with fileio.atomic_paths([tmp_path / "data" / "x.bin"]) as (tmp,):
        tmp.write_bytes(b"1")
    fileio.write_folder_atomically(tmp_path / "ck", lambda d: (Path(d, "sub").mkdir(), Path(d, "sub", "f").write_text(
        "f"), Path(d, "w.bin").write_bytes(b"w")))
    modes = _modes(tmp_path)
    files = {k: v for k, v in modes.items() if (tmp_path / k).is_file()}
    folders = {k: v for k, v in modes.items() if (tmp_path / k).is_dir() and k not in (".", "data")}
    assert set(files) == {"report.md", "results.json", "data/x.bin", "ck/sub/f", "ck/w.bin", "ck/checksums.json"}
    assert files == dict.fromkeys(files, file_mode)
    assert folders == {"ck": dir_mode, "ck/sub": dir_mode}


def test_umask_is_read_once_and_left_as_it_was(umask):
    umask(0o027)
    assert fileio.file_mode() == 0o640 and fileio.folder_mode() == 0o750
    assert os.umask(0o027) == 0o027  # unchanged by reading it
    os.umask(0o002)  # cached: a later change is not seen (read once, at the first write)
    assert fileio.file_mode() == 0o640


def test_run_checkpoint_metrics_and_prepared_data_are_group_readable_under_umask_022(run_dir, data_dir):
    """Every file of a run folder (run.json, metrics.jsonl, summary.json, param_groups.json, the checkpoint folder
    and its files) and of the prepared data folder is 0644, every folder 0755."""
    for root in (run_dir, data_dir):
        modes = _modes(root)
        wrong = {k: oct(v) for k, v in modes.items()
                 if v != (0o755 if (root / k).is_dir() else 0o644)}
        assert not wrong, wrong
        names = {Path(k).name for k in modes}
        want = ({"run.json", "metrics.jsonl", "summary.json", "param_groups.json", "model.safetensors",
                 "trainer_state.pt", "checksums.json"} if root == run_dir else {"meta.json", "train-00000.bin"})
        assert want <= names


def test_eval_json_and_hf_exports_are_group_readable_under_umask_022(run_dir, data_dir, tmp_path, umask):
    from depthattn.cli import main

    umask(0o022)
    assert main(["eval", str(run_dir), "--data", str(data_dir), "--max-tokens", "256", "--no-progress",
                 "--out", str(tmp_path / "eval.json")]) == 0
    assert main(["export", str(run_dir), "--out", str(tmp_path / "export")]) == 0
    ck = DecoderLM(ModelConfig.from_preset("tiny"))
    from depthattn.hf.convert import save_qwen3

    save_qwen3(ck, tmp_path / "qwen3", tokenizer_dir=_checkpoint(run_dir))
    modes = _modes(tmp_path)
    assert modes["eval.json"] == 0o644
    for folder in ("export", "qwen3"):
        assert modes[folder] == 0o755
        inside = {k: v for k, v in modes.items() if k.startswith(folder + "/")}
        assert inside and set(inside.values()) == {0o644}, inside


# ------------------------------------------------------------------------------------------------------------------
# integrity: checksums.json written with every folder, verified by every loader


def test_manifest_lists_every_file_of_a_checkpoint_and_verifies(run_dir):
    folder = _checkpoint(run_dir)
    digests = fileio.read_manifest(folder)
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {fileio.MANIFEST_NAME}
    assert set(digests) == files and {"model.safetensors", "trainer_state.pt", "config.json"} <= files
    assert all(digests[f] == fileio.sha256_file(folder / f) for f in files)
    assert fileio.verify_manifest(folder) == sorted(files)


def test_a_rewrite_after_the_manifest_is_refused_whatever_its_mtime(run_dir, tmp_path):
    """Issue 24 item 10: a file rewritten after checksums.json (newer mtime: a bad copy, a tool that rewrote it) is
    verified like any other and refused; with the old mtime restored too. Our own writers rewrite the entry
    (tests/run/test_bounds_integrity.py: save_pretrained)."""
    from safetensors.torch import save_file

    folder = _copy(_checkpoint(run_dir), tmp_path / "edited")
    weights = folder / "model.safetensors"
    state = ckpt.load_state(folder)
    key = sorted(state)[0]
    state[key] = state[key] + 0.01
    sealed = (folder / fileio.MANIFEST_NAME).stat().st_mtime_ns
    save_file(state, str(weights), metadata={"format": "pt"})
    for mtime in (sealed + 10**9, sealed):  # written a second after the manifest, then looking untouched
        os.utime(weights, ns=(mtime, mtime))
        with pytest.raises(ckpt.IntegrityError) as e:
            ckpt.load_state(folder)
        _one_line(e, str(weights), "if you replaced it on purpose, delete checksums.json")


def test_bit_flip_in_model_safetensors_is_refused_by_every_loader(run_dir, data_dir, tmp_path, capsys):
    from depthattn.cli import main
    from depthattn.hf.convert import load_any_model

    bad = _copy(_checkpoint(run_dir), tmp_path / "bad")
    weights = bad / "model.safetensors"
    good = ckpt.load_model(bad)
    _flip(weights, _tensor_data_offset(weights))
    # without the manifest the flip loads silently (what the code did before manifests): one tensor differs
    plain = _copy(bad, tmp_path / "plain")
    (plain / fileio.MANIFEST_NAME).unlink()
    flipped = ckpt.load_state(plain)
    assert sum(not torch.equal(flipped[k], v) for k, v in ckpt.model_state_dict(good).items()) == 1
    for load in (ckpt.load_model, load_any_model, ckpt.load_state):
        with pytest.raises(ckpt.IntegrityError) as e:
            load(bad)
        _one_line(e, str(weights), "does not match checksums.json")
    assert isinstance(e.value, ValueError)
    for argv in (["eval", str(bad), "--data", str(data_dir), "--no-progress"],
                 ["generate", str(bad), "--prompt", "The", "--max-new-tokens", "2"],
                 ["convert", "--to-qwen3", str(bad), "--out", str(tmp_path / "q3")],
                 ["export", str(bad), "--out", str(tmp_path / "exp")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert str(weights) in err and "does not match checksums.json" in err and err.count("\n") == 1, err
    assert not (tmp_path / "q3").exists() and not (tmp_path / "exp").exists()
    cfg = TrainConfig(**TRAIN)
    with pytest.raises(ckpt.IntegrityError) as e:  # --init-from
        train(tmp_path / "init", ckpt.load_config(bad), cfg.replace(steps=1), data_dir, progress=False,
              init_from=bad)
    _one_line(e, str(weights))


def test_bit_flip_in_trainer_state_refuses_resume_naming_the_file(run_dir, data_dir, tiny_cfg, tmp_path):
    run = _copy(run_dir, tmp_path / "run")
    shutil.rmtree(_checkpoint(run))  # resume from step 2 of 4
    state = _checkpoint(run) / "trainer_state.pt"
    _flip(state, _largest_zip_member_offset(state))
    # the only checkpoint left is unreadable: resume has nothing to fall back on (test_reliability_train covers the
    # fallback to an older one) and says why, naming the file
    with pytest.raises(ValueError) as e:
        train(run, tiny_cfg, TrainConfig(**TRAIN), data_dir, progress=False, resume=True)
    _one_line(e, "no readable checkpoint", str(state), "does not match checksums.json")


def test_bit_flips_in_config_json_are_refused_naming_it(run_dir, tmp_path):
    bad = _copy(_checkpoint(run_dir), tmp_path / "bad")
    config = bad / "config.json"
    text = config.read_bytes()
    original = text
    # a flip in the syntax: not JSON
    _flip(config, text.index(b"{"))
    with pytest.raises(ValueError) as e:
        ckpt.load_model(bad)
    _one_line(e, str(config))
    # a flip in a digit: num_hidden_layers 4 -> 5, which the weights do not have
    config.write_bytes(original)
    _flip(config, text.index(b'"num_hidden_layers": ') + len(b'"num_hidden_layers": '))
    assert json.loads(config.read_text())["num_hidden_layers"] == 5
    with pytest.raises(ckpt.IntegrityError) as e:  # issue 24: every listed file is verified before it is parsed
        ckpt.load_model(bad)
    _one_line(e, str(config), "does not match checksums.json")
    (bad / fileio.MANIFEST_NAME).unlink()  # without the manifest the value itself is refused
    with pytest.raises(ValueError) as e:
        ckpt.load_model(bad)
    _one_line(e, str(config), "num_hidden_layers=5", "4 layers")


def test_folders_without_a_manifest_load_unchecked_and_a_damaged_manifest_is_refused(run_dir, tmp_path):
    old = _copy(_checkpoint(run_dir), tmp_path / "old")
    (old / fileio.MANIFEST_NAME).unlink()
    ref = ckpt.load_model(_checkpoint(run_dir))
    assert all(torch.equal(a, b) for a, b in zip(ckpt.load_model(old).state_dict().values(),
                                                 ref.state_dict().values()))
    damaged = _copy(_checkpoint(run_dir), tmp_path / "damaged")
    (damaged / fileio.MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ckpt.IntegrityError) as e:
        ckpt.load_model(damaged)
    _one_line(e, str(damaged / fileio.MANIFEST_NAME))


def test_bit_flip_in_a_qwen3_export_is_refused(tmp_path):
    from depthattn.hf.convert import load_qwen3, save_qwen3

    save_qwen3(DecoderLM(ModelConfig.from_preset("tiny")), tmp_path / "q3")
    weights = tmp_path / "q3" / "model.safetensors"
    _flip(weights, _tensor_data_offset(weights))
    with pytest.raises(ckpt.IntegrityError) as e:
        load_qwen3(tmp_path / "q3")
    _one_line(e, str(weights))


# ------------------------------------------------------------------------------------------------------------------
# token shards


def test_shard_bit_flip_that_keeps_size_and_mtime_is_refused_by_train_and_eval(run_dir, data_dir, tiny_cfg,
                                                                                tmp_path, capsys):
    from depthattn.cli import main

    data = _copy(data_dir, tmp_path / "data")
    load_prepared(data)  # verified once: the cache now vouches for every shard
    assert (data / integrity.VERIFY_CACHE).is_file()
    shard = data / "val-00000.bin"
    _flip(shard, shard.stat().st_size // 2, keep_mtime=True)
    with pytest.raises(ValueError) as e:
        train(tmp_path / "run", tiny_cfg, TrainConfig(**TRAIN), data, progress=False)
    _one_line(e, str(shard), "does not match meta.json")
    assert not (tmp_path / "run").exists()
    assert main(["eval", str(run_dir), "--data", str(data), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(shard) in err and err.count("\n") == 1


def test_shard_change_below_the_file_system_is_caught_by_recheck(data_dir, tmp_path):
    """A change no metadata shows (bit rot on the medium): simulated by re-recording the cache after the flip.
    The cached load accepts it (documented); ``recheck=True`` (or a load without the cache) refuses it."""
    data = _copy(data_dir, tmp_path / "data")
    load_prepared(data)
    shard = data / "train-00000.bin"
    _flip(shard, shard.stat().st_size // 2)
    cache = json.loads((data / integrity.VERIFY_CACHE).read_text())
    cache[shard.name] = integrity.cache_key(shard.stat(), cache[shard.name][-1])
    (data / integrity.VERIFY_CACHE).write_text(json.dumps(cache))
    load_prepared(data)  # the cache vouches for it
    with pytest.raises(ValueError) as e:
        load_prepared(data, recheck=True)
    _one_line(e, str(shard))
    (data / integrity.VERIFY_CACHE).unlink()
    with pytest.raises(ValueError):
        load_prepared(data)


# ------------------------------------------------------------------------------------------------------------------
# hostile configs: refused before any model is built


@pytest.fixture
def no_model_built(monkeypatch):
    """Fail the test if a ``DecoderLM`` (meta-device ones included) is constructed."""
    import depthattn.model

    def refuse(self, *args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(depthattn.model.Backbone, "__init__", refuse)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**9), ("vocab_size", 10**9),
                                          ("hidden_size", 10**6), ("num_hidden_layers", 5000)])
def test_hostile_config_json_is_refused_before_allocation(run_dir, tmp_path, no_model_built, field, value):
    bad = _copy(_checkpoint(run_dir), tmp_path / "bad")
    (bad / fileio.MANIFEST_NAME).unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value itself
    values = json.loads((bad / "config.json").read_text())
    values[field] = value
    (bad / "config.json").write_text(json.dumps(values))
    from depthattn.hf.modeling import DepthAttnForCausalLM

    for load in (ckpt.load_model, ckpt.check_folder_shapes, DepthAttnForCausalLM.from_pretrained):
        with pytest.raises(ValueError) as e:
            load(bad)
        _one_line(e, str(bad / "config.json"), field)
    from depthattn.run.dcp import export_checkpoint

    with pytest.raises(ValueError) as e:
        export_checkpoint(bad, tmp_path / "out")
    _one_line(e, field)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**9), ("vocab_size", 10**9),
                                          ("intermediate_size", 10**8)])
def test_hostile_qwen3_config_is_refused_before_allocation(tmp_path, monkeypatch, field, value):
    from depthattn.hf.convert import load_qwen3, save_qwen3

    save_qwen3(DecoderLM(ModelConfig.from_preset("tiny")), tmp_path / "q3")
    (tmp_path / "q3" / fileio.MANIFEST_NAME).unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value itself
    values = json.loads((tmp_path / "q3" / "config.json").read_text())
    values[field] = value
    (tmp_path / "q3" / "config.json").write_text(json.dumps(values))
    import depthattn.model

    real = depthattn.model.Backbone.__init__

    def only_meta(self, cfg, *args, **kwargs):  # the shape check's meta-device model is allowed, nothing else
        if torch.empty(0).device.type != "meta":
            pytest.fail("a model was built")
        real(self, cfg, *args, **kwargs)

    monkeypatch.setattr(depthattn.model.Backbone, "__init__", only_meta)
    with pytest.raises(ValueError) as e:
        load_qwen3(tmp_path / "q3")
    _one_line(e, str(tmp_path / "q3" / "config.json"), field)


def test_model_config_upper_bounds_name_the_size():
    with pytest.raises(ValueError) as e:
        ModelConfig.from_preset("tiny", num_hidden_layers=10**9)
    _one_line(e, "num_hidden_layers=1000000000", "MAX_LAYERS")
    with pytest.raises(ValueError) as e:
        ModelConfig.from_preset("tiny", vocab_size=10**12)
    _one_line(e, "vocab_size=1000000000000", "1.28e+14 parameters", "5.12e+14 bytes", "MAX_PARAMETER_BYTES")
    with pytest.raises(ValueError, match="MAX_PARAMETER_BYTES"):
        ModelConfig.from_preset("tiny", cross_layer="mhc", mhc_num_streams=10**5)
    assert ModelConfig.from_preset("3b").num_hidden_layers == 48  # the paper's largest preset stays valid
    with pytest.raises(ValueError) as e:  # a flat (previous-format) config.json names its file too
        ckpt.files.model_config_from_json({"vocab_size": 10**12}, "x/config.json")
    _one_line(e, "x/config.json", "vocab_size")
