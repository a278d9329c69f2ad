"""``depthattn study publish``: a part that is done becomes one small file (``study.partfile``) holding compare's
numbers, the commits and machines it ran on (``OUT/logs/PART.jsonl``, one line per start) and no path of this
machine; ``study run`` publishes each part as it finishes; a file the command did not write is never replaced; a
launcher stopped by SIGTERM stops its compare children."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.study import load_study, partfile

from helpers import snapshot

TOY = """
name = "toy"
out = "runs/toy"
data = "data"
{publish}
preset = "tiny"
methods = ["none", "depth_attention"]
seeds = [0]
steps = {steps}
eval_tokens = 600
{extra}
[set]
batch_size = 2
seq_len = 32
eval_every = 2
eval_windows = 2
save_every = 2
keep_last = 1
log_depth_every = 1
"""
PART = "toy-s0"


def write_toy(folder: Path, data_dir: Path, publish: str = 'publish = "pub"', steps: int = 3, extra: str = "") -> Path:
    """The toy study in ``folder`` (its ``data`` a link to the session's prepared data); returns its file."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "data").exists():
        (folder / "data").symlink_to(data_dir)
    path = folder / "toy.toml"
    path.write_text(TOY.format(publish=publish, steps=steps, extra=extra), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> Path:
    """A folder where ``depthattn study run toy.toml`` trained the toy study's one part (2 tiny runs of 3 steps)
    and published it to ``pub/``; run from that folder, as the study's relative paths say."""
    folder = tmp_path_factory.mktemp("published")
    write_toy(folder, data_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        assert main(["study", "run", "toy.toml"]) == 0
    return folder


@pytest.fixture
def here(trained, tmp_path, monkeypatch) -> Path:
    """A copy of ``trained`` (the runs, logs and published file) as the current folder, its recorded paths moved
    with it (compare's results and the start records name the folder they ran in)."""
    here = tmp_path / "w"
    shutil.copytree(trained, here, symlinks=True)
    for f in here.rglob("*"):
        if f.suffix in (".json", ".jsonl") and f.is_file() and not f.is_symlink():
            f.write_text(f.read_text(encoding="utf-8").replace(str(trained), str(here)), encoding="utf-8")
    monkeypatch.chdir(here)
    return here


def test_run_publishes_the_finished_part_with_compares_numbers_its_record_and_no_machine_path(trained, data_dir,
                                                                                                  monkeypatch):
    from depthattn.run.record import git_revision
    from depthattn.study.invocations import hardware, short_commit
    from depthattn.study.publish import depth_rows

    file = trained / "pub" / f"{PART}.json"
    text = file.read_text(encoding="utf-8")
    results = json.loads((trained / "runs/toy" / PART / "results.json").read_text())
    published = partfile.load(file)  # round-trips to compare's shape: curves and depth statistics as rows
    assert list(published["methods"]) == ["none", "depth_attention"]
    for method, m in results["methods"].items():
        (want,), (got,) = m["runs"], published["methods"][method]["runs"]
        assert got["val_loss"] == want["val_loss"] and got["curve"] == want["curve"]
        assert got["perplexity"] == want["perplexity"] and got["seed"] == want["seed"] == 0
    monkeypatch.chdir(trained)  # the runs' folders, as the study names them
    rows = depth_rows(published)["depth_attention"]["0"]
    assert published["methods"]["depth_attention"]["runs"][0]["depth"] == rows and len(rows) == 3
    assert "depth" not in published["methods"]["none"]["runs"][0]

    study = published["study"]
    assert set(study) == {"part", "group", "label", "command", "commit", "hardware", "jobs"}
    assert (study["part"], study["group"], study["label"], study["jobs"]) == (PART, "toy", "", 1)
    assert study["hardware"] == hardware("auto") and "torch" in study["hardware"]
    assert study["commit"] == short_commit(git_revision()) and study["commit"] != ""
    assert study["command"].startswith(f"depthattn compare --methods none,depth_attention --seeds 0 --out "
                                       f"runs/toy/{PART} --steps 3 --data data ")
    assert published["methods"]["none"]["runs"][0]["run_dir"] == f"runs/toy/{PART}/runs/none-seed0"
    assert published["settings"]["data"] == "data"
    for machine in {str(trained), os.path.realpath(trained), str(data_dir), os.path.realpath(data_dir)}:
        assert machine not in text
    assert partfile.dumps(json.loads(text)) == text  # the file as the writer writes it
    (start,) = [json.loads(line) for line in (trained / "runs/toy/logs" / f"{PART}.jsonl").read_text().splitlines()]
    assert set(start) == {"started_utc", "commit", "hardware", "jobs", "command"}


def test_publish_replaces_its_own_file_and_records_every_commit_and_machine(here):
    from depthattn.study.invocations import short_commit

    file = here / "pub" / f"{PART}.json"
    first = file.read_text()
    doc = json.loads(first)
    doc["study"]["label"] = "edited"
    file.write_text(json.dumps(doc))  # still this part's published file: replaced
    assert main(["study", "publish", "toy.toml"]) == 0
    assert file.read_text() == first

    log = here / "runs/toy/logs" / f"{PART}.jsonl"
    (row,) = [json.loads(line) for line in log.read_text().splitlines()]
    resumed = {**row, "commit": "0123abcd", "hardware": "NVIDIA H200 (CUDA), torch 2.11.0", "jobs": 16}
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(resumed) + "\n" + '{"started_utc": "2026-')  # a torn last line
    assert main(["study", "publish", "toy.toml", PART, "--to", "elsewhere"]) == 0
    study = partfile.load(here / "elsewhere" / f"{PART}.json")["study"]
    assert study["commit"] == f"{row['commit']}, 0123abcd"
    assert study["hardware"] == f"{row['hardware']}; then NVIDIA H200 (CUDA), torch 2.11.0"
    assert study["jobs"] == 16

    log.unlink()  # no record of the starts: the runs' run.json says which commit
    run = json.loads((here / "runs/toy" / PART / "runs/none-seed0/run.json").read_text())
    assert main(["study", "publish", "toy.toml", "--to", "bare"]) == 0
    study = partfile.load(here / "bare" / f"{PART}.json")["study"]
    assert study["commit"] == short_commit(run["git_revision"]) and "hardware" not in study


@pytest.mark.parametrize("foreign", ["notes\n", json.dumps({"format": partfile.FORMAT, "study": {
    "part": PART, "group": "other"}})])
def test_a_file_publish_did_not_write_is_refused_and_left_as_it_is(here, capsys, foreign):
    file = here / "pub" / f"{PART}.json"
    file.write_text(foreign)
    before = snapshot(here / "pub")
    assert main(["study", "publish", "toy.toml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--to {here / 'pub' / (PART + '.json')} exists" in err[0] and "not replaced" in err[0]
    assert snapshot(here / "pub") == before


def test_a_part_not_done_is_refused_by_name_and_publish_needs_a_folder(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_toy(tmp_path, data_dir, extra="[grid]\nlr = [0.001, 0.002]\n")
    assert main(["study", "publish", "toy.toml", "toy-lr0.001-s0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"depthattn study publish: error: {tmp_path / 'toy.toml'}: part(s) not done: toy-lr0.001-s0 "
                   f"(missing); `depthattn study status toy.toml` lists them"]
    assert main(["study", "publish", "toy.toml"]) == 0  # nothing done: nothing written
    assert capsys.readouterr().out.strip() == "published 0 of 2 part(s) to " + str(tmp_path / "pub") + \
        "; not done: 2"
    assert not (tmp_path / "pub").exists()
    write_toy(tmp_path, data_dir, publish="")
    assert main(["study", "publish", "toy.toml"]) == 2
    assert "names no `publish` folder; give --to DIR" in capsys.readouterr().err
    path = write_toy(tmp_path, data_dir)  # a study that publishes names its folders relative to the current one
    path.write_text(path.read_text().replace('out = "runs/toy"', f'out = "{tmp_path}/runs"'))
    assert main(["study", "status", "toy.toml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`out = '{tmp_path}/runs'` is an absolute path" in err[0]
    assert main(["study", "run", "toy.toml", "--skip-published"]) == 2  # refused before anything trains
    assert not (tmp_path / "runs").exists()


def test_label_and_portable_paths(tmp_path, data_dir, monkeypatch):
    from depthattn.study.publish import label, portable

    monkeypatch.chdir(tmp_path)
    study = load_study(write_toy(tmp_path, data_dir, extra='[grid]\nlr = [0.001]\nattnres_block_size = [2, 4]\n'))
    assert [label(study, p) for p in study.parts()] == ["lr=0.001, attnres_block_size=2",
                                                        "lr=0.001, attnres_block_size=4"]
    assert label(load_study(write_toy(tmp_path, data_dir)), study.parts()[0]) == ""
    out, data = str(tmp_path / "runs/toy"), str(tmp_path / "data")
    text = json.dumps({"a": f"{out}/p/runs", "b": out, "c": f"{out}2/x", "d": data,
                       "e": os.path.realpath(data_dir) + "/meta.json"})
    assert json.loads(portable(study, text)) == {"a": "runs/toy/p/runs", "b": "runs/toy", "c": f"{out}2/x",
                                                 "d": "data", "e": "data/meta.json"}


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that run ``depthattn compare``."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    out = []
    for child in path.read_text().split() if path.is_file() else []:
        try:
            if b"\0compare\0" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(int(child))
        except OSError:
            continue  # it ended
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads a process's children from /proc")
def test_a_launcher_stopped_by_sigterm_stops_its_compare_children(tmp_path, data_dir):
    write_toy(tmp_path, data_dir, steps=100000)
    launcher = subprocess.Popen([sys.executable, "-c", "import sys; from depthattn.cli import main; sys.exit(main())",
                                 "study", "run", "toy.toml"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    children: list[int] = []
    try:
        deadline = time.time() + 120
        while not _children(launcher.pid) and launcher.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        children = _children(launcher.pid)
        assert children, launcher.communicate(timeout=30)[0]
        launcher.send_signal(signal.SIGTERM)
        out = launcher.communicate(timeout=120)[0]
        left = [c for c in children if _alive(c)]
    finally:
        for pid in [launcher.pid] * (launcher.poll() is None) + [c for c in children if _alive(c)]:
            os.kill(pid, signal.SIGKILL)  # what this test started, if the launcher left it running
    assert left == [], f"compare children {left} run on after their launcher was stopped"
    assert launcher.returncode == 128 + signal.SIGTERM, out
    assert "1 part(s) to train" in out  # "started" is not said when the signal came as it started


def test_run_skip_published_leaves_out_the_parts_already_published(trained, tmp_path, data_dir, monkeypatch, capsys):
    """A fresh machine with the published files but no run folders trains only what is not published."""
    monkeypatch.chdir(tmp_path)
    write_toy(tmp_path, data_dir)
    shutil.copytree(trained / "pub", tmp_path / "pub")
    assert main(["study", "run", "toy.toml", "--skip-published"]) == 0
    assert "every part is done" in capsys.readouterr().out
    assert not (tmp_path / "runs" / "toy" / PART).exists()


def test_a_failed_publication_is_named_and_the_other_parts_go_on(tmp_path, data_dir, monkeypatch):
    """``run_local`` calls ``on_done`` as each part finishes (``study run`` publishes there); a part whose
    publication fails is named and counted as failed, the next one still runs and publishes, and each start is
    recorded in OUT/logs/PART.jsonl."""
    from depthattn.study import runner

    monkeypatch.chdir(tmp_path)
    study = load_study(write_toy(tmp_path, data_dir, extra="[grid]\nlr = [0.001, 0.002]\n"))
    monkeypatch.setattr(runner, "command", lambda study, part: [sys.executable, "-c", "pass"])  # a part that succeeds
    said = []

    def on_done(part):
        if part.name.startswith("toy-lr0.001"):
            raise ValueError(f"{part.name}: refused")
        return f"published {part.name}"

    failed = runner.run_local(study, study.parts(), jobs=1, log=said.append, poll_s=0.05, commit="feedc0de",
                              on_done=on_done)
    assert failed == ["toy-lr0.001-s0"]
    assert "toy-lr0.001-s0: trained, but not published: toy-lr0.001-s0: refused" in said
    assert "toy-lr0.002-s0: published toy-lr0.002-s0" in said
    for part in study.parts():
        (row,) = [json.loads(line) for line in (tmp_path / "runs/toy/logs" / f"{part.name}.jsonl").read_text()
                  .splitlines()]
        assert row["commit"] == "feedc0de" and row["jobs"] == 1 and f"--out {part.folder}" in row["command"]
