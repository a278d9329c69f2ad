"""Issue 13, command line and inputs: every failure at the CLI is one line on stderr naming the file or flag, with
exit code 2 for bad input and 1 for a runtime failure (full disk, read-only file system, divergence); ``--debug``
shows the traceback. Faults are injected by patching (``os.replace`` raising ENOSPC / EROFS), which works as root
too, where a read-only folder made with chmod would not stop a write."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthattn import cli
from depthattn.checkpoint import load_state
from depthattn.cli import main

from helpers import machine_timeout


TINY = ["--preset", "tiny", "--no-progress", "--cross-layer", "none", "--set", "batch_size=2", "--set", "seq_len=32",
        "--set", "eval_windows=2", "--set", "eval_every=2", "--set", "save_every=2", "--set", "keep_last=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("rel_runs") / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "4", "--out", str(run)]) == 0
    return run


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path / "cache"))


def one_line(capsys, prefix: str) -> str:
    """The single stderr line (asserted single, no traceback, starting with ``prefix``)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if not line.startswith("note:")]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------------- OSError
def _fail_replace(monkeypatch, code: int, with_name: bool) -> None:
    """Every rename into place fails with ``code`` (ENOSPC without a file name, as a ``write`` reports it; EROFS with
    the names, as ``rename`` reports it)."""
    def fail(src, dst, *a, **k):
        if with_name:
            raise OSError(code, os.strerror(code), os.fspath(src), None, os.fspath(dst))
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "replace", fail)
    monkeypatch.setattr(os, "rename", fail)


def _commands(run_dir: Path, data_dir: Path, tmp: Path) -> dict[str, list[str]]:
    resumable = tmp / "resumable"
    shutil.copytree(run_dir, resumable)
    shutil.rmtree(resumable / "checkpoints/step_00000004")
    return {
        "train": ["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(tmp / "new")],
        "train --resume": ["train", "--resume", str(resumable), "--no-progress"],
        "data prepare": ["data", "prepare", "--input", str(data_dir.parent / "slice.jsonl"), "--tokenizer",
                         str(data_dir / "tokenizer.json"), "--out", str(tmp / "prepared"), "--quiet", "--workers", "1"],
        "eval": ["eval", str(run_dir), "--max-tokens", "64", "--no-progress", "--out", str(tmp / "eval.json")],
        "convert": ["convert", "--to-qwen3", str(run_dir), "--out", str(tmp / "hf")],
    }


@pytest.mark.parametrize("command", ["train", "train --resume", "data prepare", "eval", "convert"])
@pytest.mark.parametrize("code, with_name", [(errno.ENOSPC, False), (errno.EROFS, True)])
def test_os_errors_are_one_line_with_exit_1(run_dir, data_dir, tmp_path, monkeypatch, capsys, command, code,
                                            with_name):
    argv = _commands(run_dir, data_dir, tmp_path)[command]
    _fail_replace(monkeypatch, code, with_name)
    assert main(argv) == 1
    line = one_line(capsys, f"depthattn {command.split(' --')[0]}: error: {os.strerror(code)} "
                            f"[{errno.errorcode[code]}]: ")
    if with_name:  # the file the system refused
        assert str(tmp_path) in line
    else:  # no file in the error: the file being replaced (fileio names it, issue 24), else the output flag
        flag = "--resume" if "resume" in command else "--out"
        value = argv[argv.index(flag) + 1]
        assert f"while writing {flag} {value}" in line or f": {value}" in line, line


def test_debug_shows_the_traceback(run_dir, data_dir, tmp_path, monkeypatch, capsys):
    argv = _commands(run_dir, data_dir, tmp_path)["eval"]
    _fail_replace(monkeypatch, errno.ENOSPC, False)
    assert main(["--debug", *argv]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "OSError: [Errno 28]" in err
    assert err.strip().splitlines()[-1].startswith("depthattn eval: error: No space left on device")
    assert main([*argv, "--debug"]) == 1  # after the sub-command too
    assert "Traceback" in capsys.readouterr().err


def test_divergence_is_one_line_with_exit_1(data_dir, tmp_path, capsys):
    """A real divergence (lr = 1e6): the trainer's NonFiniteError, one line, exit 1, no checkpoint of NaNs."""
    from depthattn.training import NonFiniteError

    assert issubclass(NonFiniteError, FloatingPointError)
    out = tmp_path / "r"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "6", "--set", "lr=1e6", "--out", str(out)]) == 1
    line = one_line(capsys, "depthattn train: error: ")
    assert "error: training diverged at step " in line and "on_nonfinite=skip" in line, line
    assert not (out / "checkpoints").is_dir() or all(
        torch.isfinite(t).all() for d in (out / "checkpoints").glob("step_*") for t in load_state(d).values())


def test_an_unexpected_exception_is_one_line_and_points_to_debug(run_dir, monkeypatch, capsys):
    from depthattn.commands import eval_cmd

    def broken(*a, **k):
        raise RuntimeError("something inside")

    monkeypatch.setattr(eval_cmd, "load_for_inference", broken)
    assert main(["eval", str(run_dir)]) == 1
    line = one_line(capsys, "depthattn eval: internal error: RuntimeError: something inside")
    assert "--debug" in line


# ---------------------------------------------------------------------------------------------------- decoding errors
def test_prompt_bytes_that_are_not_utf8(run_dir):
    """Real argv bytes (Python decodes them with surrogateescape): one line naming --prompt and the byte."""
    p = subprocess.run([sys.executable, "-m", "depthattn.cli", "generate", os.fsencode(str(run_dir)), "--prompt",
                        b"caf\xe9 au lait", "--max-new-tokens", "2"], capture_output=True, timeout=machine_timeout(300),
                       env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2 and p.stdout == b"" and "Traceback" not in err
    assert err.strip().splitlines() == ["depthattn generate: error: --prompt is not valid UTF-8 text: byte e9 that is "
                                        "not UTF-8 at character 3"]


def test_prompt_lone_surrogate_in_process(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "ab\ud800", "--max-new-tokens", "2"]) == 2
    assert "--prompt is not valid UTF-8 text: lone surrogate '\\ud800'" in one_line(capsys, "depthattn generate:")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("text, named", [
    ("data = 5\n", "`data = 5` must be a non-empty string"),
    ('preset = ["tiny"]\n', "`preset = ['tiny']` must be a non-empty string"),
    ('[model]\nhidden_size = "wide"\n', "hidden_size"),
    ("model = 3\n", "[model] must be a table"),
])
def test_bad_toml_values_name_the_file(tmp_path, capsys, text, named):
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    assert main(["train", "--config", str(cfg), "--steps", "1"]) == 2
    line = one_line(capsys, "depthattn train: error: ")
    assert named in line and (str(cfg) in line or "ModelConfig" in line)


def test_binary_toml_names_the_file(tmp_path, capsys):
    cfg = tmp_path / "weights.toml"
    cfg.write_bytes(bytes(range(256)) * 4)
    assert main(["train", "--config", str(cfg)]) == 2
    line = one_line(capsys, "depthattn train: error: ")
    assert f"{cfg}: not a TOML file (not UTF-8 text" in line


def test_truncated_tokenizer_json_in_convert_names_the_file(run_dir, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert main(["convert", "--to-qwen3", str(run_dir), "--out", str(hf)]) == 0
    tok = hf / "tokenizer.json"
    (hf / "checksums.json").unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value itself
    tok.write_bytes(tok.read_bytes()[:1500])
    capsys.readouterr()
    assert main(["convert", "--from-qwen3", str(hf), "--out", str(tmp_path / "back")]) == 2
    line = one_line(capsys, "depthattn convert: error: ")
    assert f"{tok}: not a valid tokenizer.json" in line and "truncated or corrupt" in line
    assert not (tmp_path / "back").exists()  # nothing that looks valid was written
    ck = tmp_path / "ck"  # the other direction: a checkpoint whose tokenizer.json is cut
    shutil.copytree(run_dir / "checkpoints/step_00000004", ck)
    (ck / "checksums.json").unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value itself
    (ck / "tokenizer.json").write_bytes(tok.read_bytes())
    assert main(["convert", "--to-qwen3", str(ck), "--out", str(tmp_path / "hf2")]) == 2
    assert f"{ck / 'tokenizer.json'}: not a valid tokenizer.json" in one_line(capsys, "depthattn convert: error: ")


def test_corrupt_train_config_json_names_the_file(run_dir, tmp_path, capsys):
    ck = tmp_path / "ck"
    shutil.copytree(run_dir / "checkpoints/step_00000004", ck)
    (ck / "checksums.json").unlink()  # issue 24: a sealed folder refuses any edit as damage; without it the value itself
    (ck / "train_config.json").write_text('{"seq_len": 3')
    assert main(["eval", str(ck), "--data", str(json.loads((run_dir / "run.json").read_text())["data"]),
                 "--no-progress"]) == 2
    line = one_line(capsys, "depthattn eval: error: ")
    assert f"{ck / 'train_config.json'}: not a valid JSON file" in line and "--seq-len" in line
    (ck / "train_config.json").write_bytes(b"\xff\xfe\x00")
    assert main(["eval", str(ck), "--data", str(json.loads((run_dir / "run.json").read_text())["data"])]) == 2
    assert f"{ck / 'train_config.json'}: not a valid JSON file" in one_line(capsys, "depthattn eval: error: ")


def test_lone_surrogate_in_jsonl_names_the_file_and_line(data_dir, tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "a first, ordinary document"}\n{"text": "broken \\udc80 half pair"}\n', encoding="utf-8")
    out = tmp_path / "out"
    assert main(["data", "prepare", "--input", str(src), "--tokenizer", str(data_dir / "tokenizer.json"),
                 "--out", str(out), "--quiet", "--workers", "1"]) == 2
    line = one_line(capsys, "depthattn data prepare: error: ")
    assert f"{src}:2: field `text` holds a lone surrogate '\\udc80' at character 7" in line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------- eval, generate
def test_eval_without_train_config_says_which_seq_len(run_dir, data_dir, tmp_path, capsys):
    ck = tmp_path / "ck"
    shutil.copytree(run_dir / "checkpoints/step_00000004", ck)
    (ck / "checksums.json").unlink()  # issue 24: a sealed folder missing a listed file is incomplete
    (ck / "train_config.json").unlink()
    assert main(["eval", str(ck), "--data", str(data_dir), "--max-tokens", "64", "--no-progress"]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and f"{ck / 'train_config.json'} does not exist" in notes[0]
    assert "evaluating at seq_len 256 (min(1024, max_position_embeddings=256))" in notes[0]  # tiny: 256 positions
    assert "--seq-len" in notes[0] and "seq_len 256)" in captured.out  # the result line says it too
    assert main(["eval", str(ck), "--data", str(data_dir), "--max-tokens", "64", "--no-progress",
                 "--seq-len", "32"]) == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.err and "seq_len 32)" in captured.out


def test_eval_of_a_nan_model_exits_1_without_printing_nan(run_dir, tmp_path, monkeypatch, capsys):
    """The weights are made NaN after loading (a checkpoint writer may refuse to save them)."""
    import torch

    from depthattn.commands import eval_cmd

    load = eval_cmd.load_for_inference

    def nan_model(*a, **k):
        model, tok, folder, dev = load(*a, **k)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        return model, tok, folder, dev

    monkeypatch.setattr(eval_cmd, "load_for_inference", nan_model)
    out = tmp_path / "eval.json"
    assert main(["eval", str(run_dir), "--max-tokens", "64", "--no-progress", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "nan" not in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthattn eval: error: ") and "not finite" in lines[0]
    assert not out.exists()


def test_generate_output_ends_with_a_newline(run_dir, capsys):
    """Held before this issue too; kept as a guard."""
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--max-new-tokens", "5", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The whale") and out.endswith("\n") and not out.endswith("\n\n")


# ---------------------------------------------------------------------------------------------------- argparse hygiene
def test_no_parser_accepts_abbreviations():
    parsers = cli.all_parsers(cli.build_parser())
    assert len(parsers) >= 12 and all(p.allow_abbrev is False for p in parsers)


@pytest.mark.parametrize("argv, prog, message", [
    (["train", "--preset", "tiny", "--dry-run", "--step", "10"], "depthattn train",
     "unrecognized arguments: --step 10 (did you mean --steps?)"),
    (["train", "--bogus"], "depthattn train", "unrecognized arguments: --bogus"),
    (["eval", "somewhere", "--max-tok", "5"], "depthattn eval", "unrecognized arguments: --max-tok 5"),
    (["data", "prepare", "--out", "x", "--bogus"], "depthattn data prepare", "unrecognized arguments: --bogus"),
    (["generate", "x", "--prompt", "a", "--temperature", "hot"], "depthattn generate",
     "argument --temperature: invalid float value: 'hot'"),
    (["trian"], "depthattn", "invalid choice: 'trian'"),
])
def test_a_subcommand_error_is_one_line_naming_that_subcommand(argv, prog, message, capsys):
    """No usage block (13 lines before the one that matters): the error, argparse's or our did-you-mean, and where
    the usage is."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "usage:" not in err
    assert err.startswith(f"{prog}: error: ") and message in err and err.rstrip().endswith(f"see {prog} --help")
    if argv == ["trian"]:
        assert "(did you mean train?)" in err


@pytest.mark.parametrize("argv, named", [
    (["eval", "{x}"], "CHECKPOINT {x} does not exist"),
    (["generate", "{x}", "--prompt", "a"], "CHECKPOINT {x} does not exist"),
    (["train", "--resume", "{x}"], "--resume {x} does not exist"),
    (["train", "--preset", "tiny", "--steps", "1", "--data", "{x}"], "--data {x} does not exist"),
    (["convert", "--to-qwen3", "{x}", "--out", "{x}-hf"], "--to-qwen3 {x} does not exist"),
    (["export", "{x}", "--out", "{x}-out"], "CHECKPOINT {x} does not exist"),
    (["data", "prepare", "--input", "{x}.txt", "--out", "{x}-out"], "--input {x}.txt does not exist"),
])
def test_a_missing_path_is_reported_as_missing(tmp_path, capsys, argv, named):
    x = str(tmp_path / "nowhere")
    assert main([a.format(x=x) for a in argv]) == 2
    line = one_line(capsys, "depthattn ")
    assert named.format(x=x) in line and "neither" not in line
