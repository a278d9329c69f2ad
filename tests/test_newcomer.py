"""A newcomer's first hour (issue 25): a mistyped flag gets a suggestion, a bad value in a config file names the
file, output piped into ``head`` ends quietly, and the package ships its ``py.typed`` marker."""

from __future__ import annotations

import importlib.resources
import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.cli import main


def test_a_mistyped_flag_gets_did_you_mean(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--stpes", "3"])
    assert e.value.code == 2
    assert "unrecognized arguments: --stpes 3 (did you mean --steps?)" in capsys.readouterr().err


def test_a_flag_with_no_close_match_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


@pytest.mark.parametrize("table,line,expected", [
    ("train", 'steps = "ten"', "[train] TrainConfig.steps='ten' is invalid"),
    ("model", 'hidden_size = "x"', "[model] ModelConfig.hidden_size='x' is invalid"),
])
def test_a_bad_value_in_a_config_file_names_the_file(tmp_path, capsys, table, line, expected):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"[{table}]\n{line}\n", encoding="utf-8")
    assert main(["train", "--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"depthattn train: error: {cfg}: {expected}")
    assert len(err.splitlines()) == 1


def test_the_same_bad_value_from_set_does_not_name_a_file(capsys):
    assert main(["train", "--set", "hidden_size=x", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("depthattn train: error: ModelConfig.hidden_size='x' is invalid")


def test_output_piped_into_head_ends_quietly():
    proc = subprocess.run(f"{sys.executable} -m depthattn.cli train --preset tiny --dry-run | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("dry run:")
    assert proc.stderr == ""


def test_the_package_ships_py_typed():
    """pyproject.toml declares the marker as package data; the file must exist for the wheel to carry it."""
    assert importlib.resources.files("depthattn").joinpath("py.typed").is_file()
    assert '"py.typed"' in (Path(__file__).parents[1] / "pyproject.toml").read_text()


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
