"""The command line's arguments and config files: a mistyped flag gets a suggestion, a bad value in a config file
names the file (from ``--set`` it names none), output piped into ``head`` ends quietly, ``--set cross_layer=none`` is
the vanilla model, ``data lm-eval-tasks`` writes only into its own folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.cli import main

from helpers import machine_timeout


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
                          capture_output=True, text=True, timeout=machine_timeout(120))
    assert proc.stdout.startswith("dry run:")
    assert proc.stderr == ""


def test_lm_eval_tasks_never_writes_into_a_folder_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me", encoding="utf-8")
    assert main(["data", "lm-eval-tasks", "--out", str(mine), "--tasks", "arc_easy"]) == 2
    err = capsys.readouterr().err
    assert "was not written by `depthattn data lm-eval-tasks` (1 entries: todo.txt)" in err
    assert sorted(p.name for p in mine.iterdir()) == ["todo.txt"]
    assert main(["data", "lm-eval-tasks", "--out", str(tmp_path / "t"), "--tasks", "nope"]) == 2
    assert "unknown task name(s) ['nope']" in capsys.readouterr().err


def test_set_cross_layer_none_is_the_vanilla_model(capsys):
    """configs/tiny.toml documents `--set cross_layer=none`: 'none' is the method's name there, not 'unset'."""
    tiny = Path(__file__).parents[2] / "configs" / "tiny.toml"
    assert main(["train", "--config", str(tiny), "--set", "cross_layer=none", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("dry run: none,")
    from depthattn.training.config import parse_value

    assert parse_value("none") is None and parse_value("none", "cross_layer") == "none"
