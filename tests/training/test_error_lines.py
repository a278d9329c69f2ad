"""Schedules and error lines: a one-step WSD decay ends at the floor, ``decay_fraction``'s validation refuses what
training would refuse, a full disk inside ``torch.save``'s zip writer, a corrupt compressed input and bad
``--mix`` weights are each one line naming the file or flag, with the CLI's exit code and nothing left behind."""

from __future__ import annotations

import errno
import gzip
import io
import os
import struct
import zlib
from pathlib import Path

import pytest
import torch

import depthattn.checkpoint as ckpt
from depthattn.cli import main
from depthattn.data.corpus import EMBEDDED_DIR
from depthattn.training import TrainConfig
from depthattn.training.optim import build_scheduler, lr_factor, schedule_factor

TINY = ["--preset", "tiny", "--no-progress", "--cross-layer", "none", "--set", "batch_size=2", "--set", "seq_len=32",
        "--set", "eval_windows=2", "--set", "eval_every=2", "--set", "save_every=2"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path / "cache"))


def one_line(capsys, *needles: str) -> str:
    """The single stderr line (no traceback, no internal error), containing every needle."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_a_one_step_decay_trains_its_last_step_at_the_floor(shape):
    """``--decay-steps 1`` and a ``decay_fraction`` that rounds to one step: the last step is the floor, the step
    before it the peak. Longer decays keep the values of ``q = (step - start) / (n - 1)`` exactly."""
    assert lr_factor(9, 2, 10, 0.1, "wsd", 1, shape) == 0.1
    assert [lr_factor(s, 2, 10, 0.1, "wsd", 1, shape) for s in (2, 8)] == [1.0, 1.0]
    rounded = TrainConfig(steps=10, warmup=0.1, min_lr_ratio=0.25, lr_schedule="wsd", decay_fraction=0.05,
                          decay_shape=shape)
    assert rounded.decay_steps() == 1 and schedule_factor(rounded, 9) == 0.25 and schedule_factor(rounded, 8) == 1.0
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = build_scheduler(opt, 1, 3, 0.1, "wsd", 1, shape)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [2.0, 2.0, 2.0 * 0.1]
    for n in range(2, 12):  # the formula every longer decay had, value for value
        for step in range(20 - n, 20):
            q = min(1.0, (step - (20 - n)) / max(1, n - 1))
            want = 0.1 + (1.0 - 0.1) * (1.0 - (q ** 0.5 if shape == "1-sqrt" else q))
            assert lr_factor(step, 1, 20, 0.1, "wsd", n, shape) == want
        assert lr_factor(19, 1, 20, 0.1, "wsd", n, shape) == pytest.approx(0.1, abs=1e-15)


def test_decay_fraction_validation_refuses_what_training_refuses(tmp_path, capsys):
    """A decay over every step starts at step 0, inside the (at least one-step) warm-up: refused when the config is
    built, naming the field; the largest fractions validation accepts do train."""
    for warmup in (0.0, 0.1):
        with pytest.raises(ValueError, match=r"^TrainConfig.decay_fraction=1 is invalid: must be a fraction of the "
                                             r"steps in \(0, 1\)"):
            TrainConfig(steps=10, warmup=warmup, lr_schedule="wsd", decay_fraction=1)
    cfg = TrainConfig(steps=10, warmup=0.0, lr_schedule="wsd", decay_fraction=0.9)
    assert cfg.decay_steps() == 9 and [schedule_factor(cfg, s) for s in (0, 1)] == [1.0, 1.0]
    assert schedule_factor(cfg, 9) == pytest.approx(0.1, abs=1e-15)
    out = tmp_path / "never"
    assert main(["train", "--preset", "tiny", "--steps", "10", "--set", "lr_schedule=wsd", "--set", "warmup=0",
                 "--set", "decay_fraction=1", "--out", str(out), "--no-progress"]) == 2
    one_line(capsys, "TrainConfig.decay_fraction=1 is invalid")
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ full disk
class _FullDisk(io.FileIO):
    """A file that takes its first 100 bytes, then refuses every write as a full disk does."""

    def write(self, b) -> int:
        if self.tell() + len(b) > 100:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def _full_trainer_state(monkeypatch) -> None:
    """``trainer_state.pt`` fills the disk inside ``torch.save``'s zip writer (which then raises RuntimeError
    "unexpected pos" from its end-of-file record, the OSError as its context)."""
    def fake_open(file, mode="r", *args, **kwargs):
        if os.fspath(file).endswith("trainer_state.pt") and mode == "wb":
            return _FullDisk(file, "wb")
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(ckpt, "open", fake_open, raising=False)


def test_a_full_disk_inside_torch_save_is_the_os_error_naming_the_file(tmp_path, monkeypatch):
    _full_trainer_state(monkeypatch)
    with pytest.raises(OSError) as e:
        ckpt.save_torch({"step": 2, "x": torch.zeros(64)}, tmp_path / "trainer_state.pt")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(tmp_path / "trainer_state.pt"))


def test_a_full_disk_inside_trainer_state_is_one_line_and_leaves_no_checkpoint(data_dir, tmp_path, monkeypatch,
                                                                               capsys):
    _full_trainer_state(monkeypatch)
    out = tmp_path / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(out)]) == 1
    one_line(capsys, "No space left on device [ENOSPC]", "trainer_state.pt", "free of")
    assert (out / "run.json").is_file() and os.listdir(out / "checkpoints") == []


# ------------------------------------------------------------------------------------------------ corrupt inputs
def _corrupt(raw: bytes) -> bytes:
    """``raw`` with the 64 bytes from offset 100 inverted."""
    return raw[:100] + bytes(b ^ 0xFF for b in raw[100:164]) + raw[164:]


def test_a_corrupt_gzip_or_zstd_input_is_one_line_naming_it(tmp_path, capsys):
    import zstandard

    text = gzip.decompress((Path(EMBEDDED_DIR) / "sotu.jsonl.gz").read_bytes())
    bad_gz = tmp_path / "sotu.jsonl.gz"
    bad_gz.write_bytes(_corrupt(gzip.compress(text)))
    with pytest.raises(zlib.error):  # the stream is broken, not merely truncated
        gzip.decompress(bad_gz.read_bytes())
    bad_zst = tmp_path / "sotu.jsonl.zst"
    bad_zst.write_bytes(_corrupt(zstandard.ZstdCompressor(write_checksum=True).compress(text)))
    for bad, what in ((bad_gz, "corrupt gzip stream"), (bad_zst, "corrupt zstandard stream")):
        out = tmp_path / f"out_{bad.suffix[1:]}"
        assert main(["data", "prepare", "--input", str(bad), "--out", str(out), "--quiet", "--workers", "1"]) == 2
        one_line(capsys, f"depthattn data prepare: error: {bad}: cannot read: {what}")
        assert not out.exists() and sorted(os.listdir(tmp_path)) == ["sotu.jsonl.gz", "sotu.jsonl.zst"]


def test_a_corrupt_stream_in_a_source_package_is_one_value_error_naming_the_file(tmp_path):
    """The package readers of ``data build``: a gzip'd documentation page and a zlib block of a SWORD module."""
    from depthattn.data.sources.readers import read_linux_doc
    from depthattn.data.sources.sword import read_sword_module

    text = gzip.decompress((Path(EMBEDDED_DIR) / "sotu.jsonl.gz").read_bytes())[:20000]
    page = tmp_path / "usr/share/doc/linux-doc-6.1/Documentation/admin-guide/sotu.rst.gz"
    page.parent.mkdir(parents=True)
    page.write_bytes(_corrupt(gzip.compress(text)))
    with pytest.raises(ValueError, match=rf"^{page}: cannot read: corrupt gzip stream \(Error -3 "):
        read_linux_doc(tmp_path)
    block = _corrupt(zlib.compress(text))
    (tmp_path / "ot.bzs").write_bytes(struct.pack("<III", 0, len(block), len(text)))
    (tmp_path / "ot.bzz").write_bytes(block)
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'ot.bzz'}: block 0: cannot read: corrupt zlib stream"):
        read_sword_module(tmp_path, "sotu")


# ------------------------------------------------------------------------------------------------ --mix
@pytest.mark.parametrize("argv, needle", [
    (["--mix", "1e308,1e308"], "--mix 1e+308,1e+308: the weights add up to inf, not 1"),
    (["--mix", "-0.5,1.5"], "--mix -0.5,1.5: weight -0.5 is negative"),
    (["--mix=-0.5,1.5"], "--mix -0.5,1.5: weight -0.5 is negative"),
    (["--mix", "-.5,1.5"], "--mix -0.5,1.5: weight -0.5 is negative"),
    (["--mix", "nan,1"], "--mix nan,1: weight nan is not finite"),
    (["--mix", "0,0"], "--mix 0,0: the weights add up to 0, not 1"),
])
def test_bad_mix_weights_are_one_line_naming_the_flag(argv, needle, tmp_path, capsys):
    inputs = [str(Path(EMBEDDED_DIR) / "austen.jsonl.gz"), str(Path(EMBEDDED_DIR) / "sotu.jsonl.gz")]
    out = tmp_path / "out"
    assert main(["data", "prepare", "--input", *inputs, *argv, "--out", str(out), "--quiet"]) == 2
    one_line(capsys, f"depthattn data prepare: error: {needle}")
    assert not out.exists()
