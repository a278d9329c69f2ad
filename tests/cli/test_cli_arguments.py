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
    assert '"py.typed"' in (Path(__file__).parents[2] / "pyproject.toml").read_text()


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


@pytest.mark.docs
def test_the_documented_lm_eval_command_runs_offline_and_matches_the_native_scorer(tmp_path):
    """`depthattn data lm-eval-tasks --out DIR`, then lm-eval's own CLI (`--model hf`, `--include_path DIR`) on a
    checkpoint, offline: the accuracies equal depthattn's native scorer on the same documents."""
    pytest.importorskip("lm_eval", reason="lm-eval==0.4.13 not installed (optional extra depthattn[lm-eval])")
    import json
    import os
    import shutil

    from depthattn.eval.inference import load_for_inference
    from depthattn.eval.zero_shot import evaluate_task

    from release_fixtures import FIXTURES

    # a checkpoint as this release writes it: the fixture's copied configuration.py predates later model fields
    # (docs/hf.md, "Checkpoints of older releases"), which lm-eval's trust_remote_code process would read
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--upgrade", str(FIXTURES / "run" / "checkpoints" / "step_00000004"), "--out",
                 str(ckpt)]) == 0
    tasks = tmp_path / "tasks"
    assert main(["data", "lm-eval-tasks", "--out", str(tasks), "--tasks", "arc_easy,winogrande"]) == 0
    lm_eval = Path(sys.executable).with_name("lm_eval")
    cmd = [str(lm_eval) if lm_eval.exists() else shutil.which("lm_eval"), "--model", "hf", "--model_args",
           f"pretrained={ckpt},trust_remote_code=True", "--device", "cpu", "--include_path", str(tasks),
           "--tasks", "depthattn_arc_easy,depthattn_winogrande", "--limit", "4", "--output_path",
           str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    model, tok, _, _ = load_for_inference(ckpt, device="cpu")
    for name in ("arc_easy", "winogrande"):
        native = evaluate_task(model, tok, name, limit=4, progress=False)["metrics"]
        assert results[f"depthattn_{name}"]["acc,none"] == pytest.approx(native["acc"], abs=1e-12)
        if "acc_norm" in native:
            assert results[f"depthattn_{name}"]["acc_norm,none"] == pytest.approx(native["acc_norm"], abs=1e-12)


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


def test_the_report_says_its_curves_and_its_table_use_other_validation_sets():
    """The plot's periodic validation (a few windows) and the table's final evaluation (the whole split) differ;
    the report says so rather than leaving two numbers that disagree."""
    from depthattn.compare import render_report

    from helpers import hand_made_results as results

    res = results()
    res["settings"]["train"]["eval_windows"] = 16
    text = render_report(res)
    assert "on at most 16 windows (" in text and "so the two need not agree" in text


@pytest.mark.slow
def test_compare_quick_runs_the_whole_job_and_estimates_its_duration(tmp_path, capsys):
    """--quick: the tiny preset and the quick budget where no flag says otherwise (here a shorter --steps and a
    prepared --data), one estimate line once the first steps are timed, the report, the plot."""
    import json

    from release_fixtures import copy_release_fixture

    copy_release_fixture("reference", tmp_path)  # brings the prepared data folder
    out = tmp_path / "quick"
    assert main(["compare", "--quick", "--steps", "13", "--data", str(tmp_path / "data"), "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    estimates = [ln for ln in text.splitlines() if ln.startswith("estimate: about ")]
    assert len(estimates) == 1 and "and 1 more run" in estimates[0] and "over steps 2-11" in estimates[0]
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["preset"] == "tiny" and res["settings"]["eval_tokens"] == 16384
    assert res["settings"]["train"]["steps"] == 13 and res["settings"]["train"]["seq_len"] == 64
    assert (out / "loss_curves.png").read_bytes()[:4] == b"\x89PNG" and (out / "report.md").is_file()


def test_the_estimate_counts_the_runs_still_to_go():
    from depthattn.compare import DurationEstimate

    lines: list[str] = []
    est = DurationEstimate(3, lines.append)
    est.next_run()
    for step in range(1, 13):
        est.on_step(step, 100)
    assert len(lines) == 1 and lines[0].startswith("estimate: about ") and "and 2 more runs" in lines[0]
    assert "over steps 2-11" in lines[0]


_TOKENIZER_PROBE = """
import sys
from transformers import AutoTokenizer, PreTrainedTokenizerFast
path, how = sys.argv[1], sys.argv[2]
if how == "plain-class":
    tok = PreTrainedTokenizerFast.from_pretrained(path)
elif how == "auto-trusted":
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
else:
    tok = AutoTokenizer.from_pretrained(path)
print("EOS", tok.eos_token, tok("To be, or not to be").input_ids)
"""


def _load_tokenizer(ckpt: Path, how: str) -> subprocess.CompletedProcess:
    """The probe in a fresh interpreter with an open stdin holding "n" (as a terminal user would answer)."""
    import os
    return subprocess.run([sys.executable, "-c", _TOKENIZER_PROBE, str(ckpt), how], input="n\n", text=True,
                          capture_output=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.docs
def test_the_documented_tokenizer_routes_load_with_no_prompt_and_no_warning(tmp_path):
    """docs/hf.md: `PreTrainedTokenizerFast.from_pretrained(CKPT)` (no argument) and `AutoTokenizer` with
    `trust_remote_code=True` load the checkpoint's tokenizer silently and encode as `tokenizers` does; plain
    `AutoTokenizer` asks the question the page explains (if transformers stops asking, the page must change)."""
    from tokenizers import Tokenizer

    from release_fixtures import copy_release_fixture

    old = copy_release_fixture("run", tmp_path) / "checkpoints" / "step_00000004"
    ckpt = tmp_path / "ckpt"  # a checkpoint as this release writes it (its configuration.py is today's)
    assert main(["convert", "--upgrade", str(old), "--out", str(ckpt)]) == 0
    ids = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode("To be, or not to be").ids
    for how in ("plain-class", "auto-trusted"):
        res = _load_tokenizer(ckpt, how)
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.strip() == f"EOS <|endoftext|> {ids}", how
        said = res.stdout + res.stderr
        assert "custom code" not in said and "model of type" not in said, (how, said[-2000:])
    asked = _load_tokenizer(ckpt, "auto-plain")
    assert "Do you wish to run the custom code?" in asked.stdout + asked.stderr
