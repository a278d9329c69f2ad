"""Issue 24 items 9-11: bounds before allocation, integrity without exceptions, one plain line for the user's or
the machine's faults. Each fault is tried through the CLI as a user meets it (``main([...])`` in process: one
line on stderr, no traceback, exit 2 for a bad file, 1 for a full disk). Full disks are real where a small tmpfs can
be mounted (root), and patched writers besides, so both the real error path and the translation are covered."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from depthattn import accounting, checkpoint as ckpt, fileio
from depthattn.cli import main
from depthattn.config import MAX_DEPTH_CANDIDATES, ModelConfig


TINY = ["--preset", "tiny", "--no-progress", "--cross-layer", "depth_attention", "--set", "batch_size=2", "--set",
        "seq_len=32", "--set", "eval_windows=2", "--set", "eval_every=2", "--set", "save_every=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("bounds_runs") / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(run)]) == 0
    return run


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path / "cache"))


def checkpoint_copy(run_dir: Path, dst: Path, manifest: bool = True) -> Path:
    shutil.copytree(run_dir / "checkpoints" / "step_00000002", dst)
    if not manifest:  # a folder edited by hand, its checksums.json deleted as the refusal says
        (dst / fileio.MANIFEST_NAME).unlink()
    return dst


def one_line(capsys, *needles: str) -> str:
    """The single stderr line (no traceback, no second line), containing every needle."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def edit_config(folder: Path, **values) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture
def only_meta_models(monkeypatch):
    """Fail the test if a model is built anywhere but on the meta device (the shape check's is allowed)."""
    import depthattn.model

    real = depthattn.model.Backbone.__init__

    def only_meta(self, cfg, *args, **kwargs):
        if torch.empty(0).device.type != "meta":
            raise AssertionError("a model was built")
        real(self, cfg, *args, **kwargs)

    monkeypatch.setattr(depthattn.model.Backbone, "__init__", only_meta)


GENERATE = ["--prompt", "Call me Ishmael.", "--max-new-tokens", "4", "--temperature", "0"]


# ---------------------------------------------------------------------------------------------------- item 9: bounds
def test_loop_bomb_in_config_json_is_one_line_before_any_model_is_built(run_dir, tmp_path, capsys,
                                                                         only_meta_models):
    bad = checkpoint_copy(run_dir, tmp_path / "bomb", manifest=False)
    edit_config(bad, num_loops=1_000_000)
    assert main(["generate", str(bad), *GENERATE]) == 2
    one_line(capsys, str(bad / "config.json"), "num_loops=1000000", "4e+06 virtual layers", "MAX_VIRTUAL_LAYERS")


def test_depth_candidates_are_bounded_without_building_the_plan():
    with pytest.raises(ValueError, match="MAX_DEPTH_CANDIDATES") as e:
        ModelConfig.from_preset("tiny", cross_layer="depth_attention", num_loops=16384, depth_attention_stride=1)
    assert "2.15e+09 depth candidates" in str(e.value) and "\n" not in str(e.value)
    from depthattn.cross_layer.depth_attention import candidate_count, candidate_plan

    for layers, stride, window in [(1, 1, 0), (13, 3, 2), (48, 24, 0), (48, 1, 5), (20, 7, 50)]:
        assert candidate_count(layers, stride, window) == sum(map(len, candidate_plan(layers, stride, window)))
    assert candidate_count(48 * 4, 1, 0) < MAX_DEPTH_CANDIDATES  # the paper's deepest looped shape stays valid


def test_kv_cache_and_parameters_beyond_available_memory_are_refused_before_allocation(run_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    import depthattn.cache

    looped = checkpoint_copy(run_dir, tmp_path / "looped", manifest=False)
    edit_config(looped, num_loops=256)  # 1024 virtual layers: 256 KiB of float32 K/V per token
    cfg = ckpt.load_config(looped)
    need = accounting.kv_cache_bytes(cfg, 1, 4 + 4, torch.float32)  # "Call me Ishmael." is 4+ tokens
    params = accounting.num_params(cfg) * 4
    assert params < need
    monkeypatch.setattr(accounting, "available_memory", lambda device="cpu": params + 1024)

    def no_cache(*args, **kwargs):
        raise AssertionError("a KV cache was allocated")

    monkeypatch.setattr(depthattn.cache.KVCache, "__init__", no_cache)
    assert main(["generate", str(looped), *GENERATE]) == 2
    one_line(capsys, "the KV cache for 1 × ", "over 1024 virtual layers needs", "available on cpu", "--max-new-tokens")
    monkeypatch.setattr(accounting, "available_memory", lambda device="cpu": params // 2)
    assert main(["generate", str(looped), *GENERATE]) == 2
    one_line(capsys, str(looped), "parameters in float32 needs", "available on cpu")
    monkeypatch.undo()
    free = accounting.available_memory("cpu")  # the real reading on this machine: known and plausible
    assert free is not None and 0 < free < 1 << 50


def test_a_huge_tokenizer_json_is_refused_by_size_before_it_is_parsed(run_dir, tmp_path, capsys, monkeypatch):
    import tokenizers

    big = checkpoint_copy(run_dir, tmp_path / "big", manifest=False)
    with open(big / "tokenizer.json", "r+b") as f:
        f.truncate(100 << 20)  # 100 MB, sparse: costs nothing to make
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", lambda *a: pytest.fail("tokenizer.json was parsed"))
    for command in (["generate", str(big), *GENERATE], ["export", str(big), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        one_line(capsys, str(big / "tokenizer.json"), "104857600 bytes", "vocab_size=512")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_with_more_added_tokens_than_the_vocabulary_is_refused_before_parsing(run_dir, tmp_path,
                                                                                          capsys, monkeypatch):
    import tokenizers

    bad = checkpoint_copy(run_dir, tmp_path / "added", manifest=False)
    tok = json.loads((bad / "tokenizer.json").read_text())
    tok["added_tokens"] += [{"id": 512 + i, "content": f"<|x{i}|>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(600)]
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", lambda *a: pytest.fail("tokenizer.json was parsed"))
    assert main(["generate", str(bad), *GENERATE]) == 2
    one_line(capsys, str(bad / "tokenizer.json"), "declares 601 added tokens, more than 512")


def test_deeply_nested_json_is_one_line_for_every_reader(run_dir, data_dir, tmp_path, capsys):
    deep = "[" * 10**6 + "]" * 10**6
    bad = checkpoint_copy(run_dir, tmp_path / "deep", manifest=False)
    (bad / "config.json").write_text(deep)
    assert main(["generate", str(bad), *GENERATE]) == 2
    one_line(capsys, str(bad / "config.json"), "nested more than 128 levels", "MAX_JSON_DEPTH")
    sealed = checkpoint_copy(run_dir, tmp_path / "deep_manifest")
    (sealed / fileio.MANIFEST_NAME).write_text('{"sha256": ' + "[" * 200 + "]" * 200 + "}")  # parses, too deep
    with pytest.raises(fileio.IntegrityError, match="nested more than 128"):
        fileio.read_manifest(sealed)
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    (data / "meta.json").write_text(deep)
    assert main(["eval", str(run_dir), "--data", str(data), "--no-progress"]) == 2
    one_line(capsys, str(data / "meta.json"), "nested more than 128")
    with pytest.raises(ValueError, match="nested more than 128"):
        fileio.loads_json(deep, "x.jsonl:3")
    assert fileio.loads_json("[" * 128 + "]" * 128, "ok") == fileio.loads_json("[" * 128 + "]" * 128, "ok")
    with pytest.raises(ValueError, match=r"ok2: JSON nested more than 128"):
        fileio.loads_json("[" * 129 + "]" * 129, "ok2")


# ------------------------------------------------------------------------------------------------ item 10: integrity
def test_a_corrupt_file_with_a_newer_mtime_than_the_manifest_is_refused(run_dir, data_dir, tmp_path, capsys):
    bad = checkpoint_copy(run_dir, tmp_path / "newer")
    config = bad / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": 64 '))  # same meaning
    sealed = (bad / fileio.MANIFEST_NAME).stat().st_mtime_ns
    os.utime(config, ns=(sealed + 10**9, sealed + 10**9))
    for command in (["generate", str(bad), *GENERATE], ["export", str(bad), "--out", str(tmp_path / "out")],
                    ["eval", str(bad), "--data", str(data_dir), "--max-tokens", "64", "--no-progress"]):
        assert main(command) == 2
        one_line(capsys, str(config), "does not match checksums.json")
    tokenizer = checkpoint_copy(run_dir, tmp_path / "newer_tok") / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:-40])  # a torn copy, newer than the manifest
    assert main(["generate", str(tokenizer.parent), *GENERATE]) == 2
    one_line(capsys, str(tokenizer), "does not match checksums.json")


def test_save_pretrained_into_a_sealed_folder_rewrites_its_manifest_entries(run_dir, tmp_path):
    from depthattn.hf.modeling import DepthAttnForCausalLM

    folder = checkpoint_copy(run_dir, tmp_path / "hf")
    model = DepthAttnForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight.add_(0.01)
    before = fileio.read_manifest(folder)
    model.save_pretrained(folder)
    after = fileio.read_manifest(folder)
    assert after["model.safetensors"] != before["model.safetensors"]
    assert after["model.safetensors"] == fileio.sha256_file(folder / "model.safetensors")
    assert after["tokenizer.json"] == before["tokenizer.json"]  # untouched: its recorded digest is kept
    assert set(fileio.verify_manifest(folder)) == set(after)  # the folder re-verifies, every file
    assert torch.equal(ckpt.load_model(folder).lm_head.weight, model.lm_head.weight.detach())
    model.config.save_pretrained(folder)  # the config alone
    assert fileio.read_manifest(folder)["config.json"] == fileio.sha256_file(folder / "config.json")
    ckpt.verify_folder(folder)
    tok = folder / "tokenizer.json"  # a file the writer did not touch is still checked against its old digest
    tok.write_bytes(tok.read_bytes().replace(b"<|endoftext|>", b"<|endoftexT|>"))
    with pytest.raises(fileio.IntegrityError, match="tokenizer.json"):
        ckpt.load_model(folder)


def test_verified_files_are_hashed_once_per_process_and_a_rewrite_is_hashed_again(run_dir, tmp_path, monkeypatch):
    folder = checkpoint_copy(run_dir, tmp_path / "once")
    weights = folder / "model.safetensors"
    hashed = []
    real = fileio.sha256_file
    monkeypatch.setattr(fileio, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    st = weights.stat()
    monkeypatch.setattr(fileio, "is_racy", lambda s, started: False)  # copied just now: not racy for this test
    ckpt.load_model(folder)
    assert hashed.count("model.safetensors") == 1  # the shape check verified it; load_state did not hash again
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the ctime still changed
    with pytest.raises(fileio.IntegrityError):
        ckpt.load_model(folder)
    assert hashed.count("model.safetensors") == 2
    monkeypatch.undo()
    fresh = os.stat(weights)
    assert fileio.is_racy(fresh, fresh.st_ctime_ns + fileio.RACY_FINE_NS // 2)
    assert not fileio.is_racy(fresh, fresh.st_ctime_ns + 2 * fileio.RACY_FINE_NS + 1)


def _header_offset(file: Path, needle: bytes) -> int:
    data = file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return 8 + data[8:8 + n].index(needle)


def test_a_flipped_bit_in_the_safetensors_header_is_an_integrity_error_not_a_parse_error(run_dir, tmp_path,
                                                                                        capsys, monkeypatch):
    from depthattn import checkpoint_files

    bad = checkpoint_copy(run_dir, tmp_path / "header")
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[_header_offset(weights, b'"shape":[') + 9] ^= 0x01  # a digit of the first shape: valid JSON still
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(checkpoint_files, "safetensors_shapes", lambda f: pytest.fail("header parsed first"))
    for command in (["generate", str(bad), *GENERATE], ["export", str(bad), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        one_line(capsys, str(weights), "does not match checksums.json")
    monkeypatch.undo()
    plain = checkpoint_copy(run_dir, tmp_path / "header_plain", manifest=False)  # no manifest: still one line
    weights = plain / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[_header_offset(weights, b'"shape"') + 5] ^= 0x01  # "shape" -> "shapd": valid JSON, no shape
    weights.write_bytes(bytes(data))
    assert main(["generate", str(plain), *GENERATE]) == 2
    one_line(capsys, str(weights), "not a safetensors header")


# --------------------------------------------------------------------------------------- item 11: export's tokenizer
def test_a_truncated_tokenizer_json_in_export_is_one_line(run_dir, tmp_path, capsys):
    sealed = checkpoint_copy(run_dir, tmp_path / "trunc")
    plain = checkpoint_copy(run_dir, tmp_path / "trunc_plain", manifest=False)
    for folder, needle in ((sealed, "does not match checksums.json"), (plain, "not a valid tokenizer.json")):
        tok = folder / "tokenizer.json"
        tok.write_bytes(tok.read_bytes()[:100])
        assert main(["export", str(folder), "--out", str(tmp_path / "out")]) == 2
        one_line(capsys, str(tok), needle)
        assert not (tmp_path / "out").exists()


def test_a_symlinked_tokenizer_json_in_export(run_dir, tmp_path, capsys):
    dangling = checkpoint_copy(run_dir, tmp_path / "dangling", manifest=False)
    (dangling / "tokenizer.json").unlink()
    (dangling / "tokenizer.json").symlink_to(tmp_path / "gone.json")
    assert main(["export", str(dangling), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, str(dangling / "tokenizer.json"), "symbolic link", "gone.json", "does not exist")
    assert not (tmp_path / "out").exists()
    sealed = checkpoint_copy(run_dir, tmp_path / "dangling_sealed")  # with the manifest: listed, missing
    (sealed / "tokenizer.json").unlink()
    (sealed / "tokenizer.json").symlink_to(tmp_path / "gone.json")
    assert main(["export", str(sealed), "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, str(sealed / "tokenizer.json"), "missing, but checksums.json lists it")
    linked = checkpoint_copy(run_dir, tmp_path / "linked")  # a link to the right bytes: verified, copied as a file
    shutil.move(linked / "tokenizer.json", tmp_path / "elsewhere.json")
    (linked / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    assert main(["export", str(linked), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out" / "tokenizer.json"
    assert not out.is_symlink() and out.read_bytes() == (tmp_path / "elsewhere.json").read_bytes()
    ckpt.verify_folder(tmp_path / "out")


# ------------------------------------------------------------------------------------- item 11: full disks (tmpfs)
@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a tmpfs of ``size`` (e.g. "64k") mounted in ``tmp_path`` (root only; skipped where
    mounting is refused), unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"fs_{size}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:  # lazily if a writer that met the full disk still holds a file open there
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _full_disk_line(capsys, where: Path) -> str:
    return one_line(capsys, "No space left on device [ENOSPC]", str(where), "free of", "on the file system of")


def test_full_disk_during_export_safetensors_is_one_line_and_leaves_nothing(run_dir, tmp_path, capsys, small_fs):
    fs = small_fs("64k")
    assert main(["export", str(run_dir), "--out", str(fs / "model")]) == 1
    line = _full_disk_line(capsys, fs)
    assert "model.safetensors" in line and "--out" in line
    assert os.listdir(fs) == []  # no temporary folder, no half-written export


@pytest.mark.parametrize("size", ["8k", "12k", "16k", "24k"])
def test_full_disk_during_training_is_one_line(data_dir, tmp_path, capsys, small_fs, size):
    """A disk that fills at each of the run's first writes (tmpfs counts 4 KiB pages; measured on this layout: 8 KiB
    param_groups.json, 12 KiB TensorBoard's first event, 16 KiB the first metrics.jsonl row, 24 KiB the checkpoint):
    one line naming the file that could not be written, and what was written before is still there."""
    fs = small_fs(size)
    out = fs / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(out)]) == 1
    line = _full_disk_line(capsys, fs)
    named = line.split("[ENOSPC]: ")[1].split(" (")[0]
    assert named.startswith(f"{out}/") and named.split("/")[-1] in (
        "param_groups.json", "run.json", "tensorboard", "metrics.jsonl", "model.safetensors"), line
    if size == "24k":  # the checkpoint is far larger than anything written before it
        assert named.endswith("/model.safetensors")
    assert (out / "run.json").is_file()  # what was written before the disk filled is still there
    assert not list(out.glob("checkpoints/*"))  # no checkpoint, complete or temporary, is left


def test_full_disk_during_data_prepare_is_one_line_and_leaves_nothing(data_dir, tmp_path, capsys, small_fs):
    fs = small_fs("16k")
    assert main(["data", "prepare", "--input", str(data_dir.parent / "slice.jsonl"), "--tokenizer",
                 str(data_dir / "tokenizer.json"), "--out", str(fs / "prepared"), "--quiet", "--workers", "1"]) == 1
    _full_disk_line(capsys, fs)
    assert not (fs / "prepared" / "meta.json").exists()


def test_full_disk_during_a_dcp_save_is_an_oserror_naming_the_folder(run_dir, data_dir, tmp_path, small_fs):
    """The real DCP writer in a one-rank gloo group, into a full tmpfs: torch reports it as a RuntimeError inside
    a CheckpointException (a BaseException); save_sharded raises the OSError the CLI reports."""
    import torch.distributed as dist

    from depthattn.model import DecoderLM
    from depthattn.training.config import TrainConfig
    from depthattn.run.dcp import save_sharded

    fs = small_fs("64k")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = DecoderLM(ckpt.load_config(run_dir / "checkpoints" / "step_00000002"))
        optimizer = torch.optim.AdamW(model.parameters())
        with pytest.raises(OSError) as e:
            save_sharded(fs / "run", model, optimizer, TrainConfig(), data_dir, {"step": 2})
    finally:
        dist.destroy_process_group()
    assert e.value.errno == errno.ENOSPC and str(fs / "run") in e.value.filename
    assert "DCP could not write its shards" in e.value.strerror


# ----------------------------------------------------------------------------------- item 11: full disks (patched)
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_patched_safetensors_write_failure_is_one_line_naming_the_file(run_dir, tmp_path, capsys, monkeypatch,
                                                                       code):
    import safetensors.torch
    from safetensors import SafetensorError

    def fail(state, file, metadata=None):
        raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})")

    monkeypatch.setattr(ckpt, "save_file", fail)
    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    assert main(["export", str(run_dir), "--out", str(tmp_path / "out")]) == 1
    one_line(capsys, f"[{errno.errorcode[code]}]", "model.safetensors", "free of", str(tmp_path))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


def test_patched_trainer_state_and_metrics_write_failures_are_one_line(data_dir, tmp_path, capsys, monkeypatch):
    real_save = torch.save

    def fail_on_files(obj, f, *args, **kwargs):
        if hasattr(f, "write"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a full disk gives a Python file's write
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fail_on_files)
    out = tmp_path / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(out)]) == 1
    one_line(capsys, "[ENOSPC]", "trainer_state.pt", "free of")
    assert not list((out / "checkpoints").glob("step_*"))


def test_dcp_write_failure_translation(tmp_path, monkeypatch):
    from torch.distributed.checkpoint.api import CheckpointException

    from depthattn.run import dcp

    own = CheckpointException("write", {0: (OSError(errno.EDQUOT, "Disk quota exceeded", "/x/0.distcp"), [])})
    e = dcp.write_failure(own, tmp_path)
    assert (e.errno, e.filename) == (errno.EDQUOT, "/x/0.distcp")
    opaque = CheckpointException("write", {0: (RuntimeError("[enforce fail] unexpected pos 704 vs 598"), [])})
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0))
    e = dcp.write_failure(opaque, tmp_path)
    assert e.errno == errno.ENOSPC and "unexpected pos" in e.strerror and e.filename == str(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 0, 1 << 30))
    assert dcp.write_failure(opaque, tmp_path).errno == errno.EIO  # space left: not called a full disk
