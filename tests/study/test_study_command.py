"""``depthattn study``: a study file expands to parts (one compare each), runs what is missing, resumes what was
interrupted, reports compare's own paired statistics, and goes to SLURM as a job array (submitit, mocked sbatch)."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from depthattn.cli import build_parser, main
from depthattn.study import load_study

TOY = """
name = "toy"
out = "{out}"
data = "{data}"
preset = "tiny"
methods = ["none", "depth_attention"]
seeds = [0, 1]
steps = 3
budgets = [1, 2]
eval_tokens = 600
{extra}
[set]
batch_size = 2
seq_len = 32
eval_every = 3
eval_windows = 2
save_every = 3
keep_last = 1
"""


def write_study(tmp_path: Path, data: Path | str = "DATA", extra: str = "", body: str | None = None) -> Path:
    path = tmp_path / "toy.toml"
    path.write_text(body if body is not None else TOY.format(out=tmp_path / "out", data=data, extra=extra),
                    encoding="utf-8")
    return path


def test_a_study_expands_to_named_parts_whose_commands_compare_accepts(tmp_path):
    path = write_study(tmp_path, extra='reference = "depth_attention"\n[grid]\nlr = [1e-3, 0.002]\n'
                                      'depth_attention_window = [0, 2]\n')
    study = load_study(path)
    parts = study.parts()
    assert [p.name for p in parts][:5] == ["toy-b1-lr0.001-depth_attention_window0-s0",
                                           "toy-b1-lr0.001-depth_attention_window0-s1",
                                           "toy-b1-lr0.001-depth_attention_window2-s0",
                                           "toy-b1-lr0.001-depth_attention_window2-s1",
                                           "toy-b1-lr0.002-depth_attention_window0-s0"]
    assert len(parts) == 2 * 2 * 2 * 2 and len({p.name for p in parts}) == 16
    assert {p.steps for p in parts} == {3, 6} and study.reference == "depth_attention"
    assert {p.cell for p in parts if p.seed == 0} == {p.cell for p in parts if p.seed == 1}  # paired by seed
    part = parts[-1]  # budget 2, lr 0.002, window 2, seed 1
    args = build_parser().parse_args(study.compare_argv(part))  # the compare command line, as the CLI reads it
    assert (args.command, args.methods, args.seeds, args.steps, args.preset) == \
        ("compare", "none,depth_attention", "1", 6, "tiny")
    assert Path(args.out) == tmp_path / "out" / "toy-b2-lr0.002-depth_attention_window2-s1"
    from depthattn.training.config import parse_value

    sets = dict(item.split("=", 1) for item in args.set)
    assert {k: parse_value(v, k) for k, v in sets.items()} == {
        "batch_size": 2, "seq_len": 32, "eval_every": 3, "eval_windows": 2, "save_every": 3, "keep_last": 1,
        "lr": 0.002, "depth_attention_window": 2}
    assert args.data == "DATA" or Path(args.data) == Path("DATA").absolute()


@pytest.mark.parametrize("extra, body_edit, message", [
    ("colour = 1\n", None, r"unknown key\(s\) \['colour'\]"),
    ("", ('"depth_attention"]', '"depth_atention"]'), r"unknown method\(s\) \['depth_atention'\]"),
    ("[grid]\nseed = [1, 2]\n", None, r"`seed` in \[set\]/\[grid\]: the study sets it with `seeds`"),
    ("", ("budgets = [1, 2]", "budgets = [1, 1.5]"), r"budget 1.5 x steps 3 is not a whole number of steps"),
    ("", ("seq_len = 32", "seq_lenn = 32"), r"unknown key 'seq_lenn'"),
    ("", ("preset = \"tiny\"\n", ""), r"`preset` is missing"),
    ("[grid]\nlr = [-1.0]\n", None, r"part toy-b1-lr-1.0: .*lr"),
])
def test_a_bad_study_file_is_one_line_naming_the_file(tmp_path, capsys, extra, body_edit, message):
    text = TOY.format(out=tmp_path / "out", data="D", extra=extra)
    if body_edit:
        assert body_edit[0] in text
        text = text.replace(*body_edit)
    path = write_study(tmp_path, body=text)
    with pytest.raises(ValueError, match=message) as err:
        load_study(path)
    assert str(err.value).startswith(str(path))
    assert main(["study", "status", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"depthattn study status: error: {path}")


def run_states(path: Path) -> dict[str, str]:
    from depthattn.study.status import study_status

    return {s.part.name: s.state for s in study_status(load_study(path))}


@pytest.mark.slow
def test_run_resumes_an_interrupted_part_and_reports_compares_statistics(data_dir, tmp_path, monkeypatch):
    """The toy study (2 methods x 2 seeds x budgets 1, 2 of 3 steps): one part killed after its 5th step (its
    checkpoint of step 3 on disk) is ``incomplete``; ``run --jobs 2`` trains the rest and resumes it from step 3;
    the report's paired numbers are those ``depthattn compare`` computes over the same runs."""
    path = write_study(tmp_path, data=data_dir)
    assert set(run_states(path).values()) == {"missing"}
    monkeypatch.setenv("DEPTHATTN_FAULT_PHASE", "step:5")  # SIGKILL at the 5th optimizer step of the part's process
    assert main(["study", "run", str(path), "toy-b2-s0"]) == 1
    monkeypatch.delenv("DEPTHATTN_FAULT_PHASE")
    from depthattn.study.status import part_status

    study = load_study(path)
    killed = part_status(study, next(p for p in study.parts() if p.name == "toy-b2-s0"))
    assert killed.state == "incomplete" and killed.runs == {"none": "at step 3", "depth_attention": "not started"}
    assert main(["study", "run", str(path), "--jobs", "2"]) == 0
    assert set(run_states(path).values()) == {"done"}
    resumed = json.loads((tmp_path / "out/toy-b2-s0/results.json").read_text())
    assert {k: v["action"] for k, v in resumed["history"][-1]["runs"].items()} == \
        {"none-seed0": "resumed at step 3", "depth_attention-seed0": "trained"}
    assert main(["study", "run", str(path)]) == 0  # nothing left: no part trains again
    assert main(["study", "report", str(path)]) == 0
    report = (tmp_path / "out/report.md").read_text()

    # compare's own statistics over the same runs: the toy-b1 cell's four runs in one compare folder, reused
    cmp = tmp_path / "cmp"
    for seed in (0, 1):
        for m in ("none", "depth_attention"):
            shutil.copytree(tmp_path / f"out/toy-b1-s{seed}/runs/{m}-seed{seed}", cmp / f"runs/{m}-seed{seed}")
    argv = study.compare_argv(study.parts()[0])
    argv[argv.index("--seeds") + 1] = "0,1"
    argv[argv.index("--out") + 1] = str(cmp)
    assert main(argv) == 0
    theirs = json.loads((cmp / "results.json").read_text())
    assert {r["action"] for r in theirs["history"][-1]["runs"].values()} == {"reused"}
    from depthattn.study.report import cell_stats, collect

    ours = cell_stats(study, collect(study)["toy-b1"])["depth_attention"]
    want = theirs["paired"]["depth_attention"]
    assert ours["seeds"] == want["seeds"] == [0, 1]
    for key in ("val_loss", "bits_per_byte"):
        assert ours[key] == want[key]
    d = want["val_loss"]
    row = (f"| toy-b1 | `depth_attention` | {d['mean']:+.4f} ± {d['std']:.4f} | {d['ci95'][0]:+.4f} to "
           f"{d['ci95'][1]:+.4f} | {d['favouring']} of 2 |")
    assert row in report
    assert "### Across budget" in report and "| — | `depth_attention` |" in report
    assert "![paired Δ from `none` per cell](report_delta.png)" in report
    assert (tmp_path / "out/report_delta.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a pair trained on another device is never paired: the same run record with another device type
    from depthattn.compare import run_differences
    from depthattn.run.folder import RunFolder

    record = RunFolder(tmp_path / "out/toy-b1-s0/runs/none-seed0").read_run()
    assert run_differences(record, dict(record)) == []
    assert run_differences(record, {**record, "device": "cuda:0"}) == ["device: cpu vs cuda"]
    assert run_differences(record, {**record, "train": {**record["train"], "lr": 1.0}}, {"lr"}) == []
    assert run_differences(record, {**record, "train": {**record["train"], "compile": True}}) == []


def test_status_says_running_while_a_process_holds_a_parts_lock(tmp_path):
    from depthattn.run.lock import RunLock

    path = write_study(tmp_path)
    study = load_study(path)
    part = study.parts()[0]
    with RunLock(part.folder, "compare"):
        assert run_states(path)[part.name] == "running"
        assert RunLock.in_use(part.folder)
    assert not RunLock.in_use(part.folder) and run_states(path)[part.name] == "missing"


CHILD = """
import signal, sys, time, pathlib
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("checkpointed")
    sys.exit(138)
signal.signal(signal.SIGUSR1, stop)
pathlib.Path(sys.argv[1]).write_text("started")
time.sleep(60)
"""


def test_a_slurm_part_checkpoints_its_child_and_is_requeued_with_the_same_command(tmp_path):
    pytest.importorskip("submitit")
    import pickle

    from depthattn.study.invocations import Invocation
    from depthattn.study.slurm import PartJob

    marker = tmp_path / "marker"
    cmd = [sys.executable, "-c", CHILD, str(marker)]
    start = Invocation(tmp_path / "logs" / "part.jsonl", "depthattn compare ...", "auto", 1, "abcdef12")
    job, errors = PartJob(), []

    def call():
        try:
            job(cmd, start)
        except RuntimeError as e:
            errors.append(str(e))

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.time() + 30
    while not (marker.is_file() and marker.read_text() == "started") and time.time() < deadline:
        time.sleep(0.05)
    again = job.checkpoint(cmd, start)  # what submitit calls on SLURM's USR2 (time limit) or preemption
    thread.join(30)
    assert marker.read_text() == "checkpointed"
    assert errors and "exit 138" in errors[0]
    (row,) = [json.loads(line) for line in start.file.read_text().splitlines()]  # the task recorded its start
    assert (row["commit"], row["jobs"], row["command"]) == ("abcdef12", 1, "depthattn compare ...") and row["hardware"]
    requeued = pickle.loads(pickle.dumps(again))  # submitit pickles the requeued call
    assert isinstance(requeued.function, PartJob) and requeued.args == (cmd, start, None)
    assert requeued.function.proc is None


def test_slurm_submits_one_array_task_per_part_with_the_files_and_flags_resources(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    from submitit.core.utils import DelayedSubmission
    from submitit.slurm.test_slurm import mocked_slurm

    from depthattn.study import slurm
    from depthattn.study.invocations import invocation
    from depthattn.study.runner import command

    path = write_study(tmp_path, extra='[slurm]\npartition = "gpu"\ntimeout_min = 240\ncpus_per_task = 8\n')
    study = load_study(path)
    flags = {"gpus_per_node": 1, "timeout_min": 30, "array_parallelism": 2, "partition": None}
    assert slurm.slurm_parameters(study, flags) == {
        "name": "toy", "slurm_partition": "gpu", "timeout_min": 30, "cpus_per_task": 8, "gpus_per_node": 1,
        "slurm_array_parallelism": 2}
    with pytest.raises(ValueError, match=r"unknown \[slurm\] key\(s\) \['gpu'\]"):
        slurm.slurm_parameters(study, {"gpu": 1})
    with mocked_slurm():
        jobs = slurm.submit(study, study.parts(), flags)
    assert [j.job_id for j in jobs] == [f"12_{i}" for i in range(4)]
    (script,) = slurm.sbatch_files(study)
    text = script.read_text()
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --time=30", "#SBATCH --cpus-per-task=8", "#SBATCH --job-name=toy",
                 "#SBATCH --signal=USR2@90"):
        assert line in text.splitlines(), (line, text)
    for job, part in zip(jobs, study.parts()):
        sub = DelayedSubmission.load(job.paths.submitted_pickle)
        assert isinstance(sub.function, slurm.PartJob)
        assert sub.args == (command(study, part), invocation(study, part, 1), None)  # no `publish`: nothing to publish


def test_slurm_without_submitit_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)
    monkeypatch.delitem(sys.modules, "depthattn.study.slurm", raising=False)
    import depthattn.study

    monkeypatch.delattr(depthattn.study, "slurm", raising=False)  # an earlier test's import
    path = write_study(tmp_path)
    assert main(["study", "run", str(path), "--slurm"]) == 2
    assert "--slurm needs submitit: pip install 'depthattn[cluster]'" in capsys.readouterr().err


def test_the_documented_example_study_is_the_committed_file_and_expands_to_twelve_parts():
    root = Path(__file__).resolve().parents[2]
    committed = (root / "studies/example.toml").read_text(encoding="utf-8")
    doc = (root / "docs/study.md").read_text(encoding="utf-8")
    shown = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    assert shown == "\n".join(line for line in committed.splitlines(keepends=False)
                              if not line.startswith("#")).lstrip("\n") + "\n"
    study = load_study(root / "studies/example.toml")
    assert [p.name for p in study.parts()] == [f"example-b{b}-lr{lr}-s{s}" for b in (1, 4) for lr in ("0.001", "0.002")
                                               for s in (0, 1, 2)]
    assert {p.steps for p in study.parts()} == {400, 1600} and study.slurm["timeout_min"] == 120
