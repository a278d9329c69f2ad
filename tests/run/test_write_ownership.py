"""Every command that writes writes only what it owns: ``train`` and ``compare`` start only in a new or empty folder
or one of their own, start-up cleanup removes only the temporaries the project's writers name, ``eval --out`` never
replaces a file of a run or checkpoint folder, ``analyze --out`` never replaces a file it did not write nor writes
into a checkpoint folder (``depthattn.outputs``).

Each refusal exits 2 with one line naming the ``--out`` and what is there, and leaves the sha256 of every file under
the test's folder as it was (and adds none); the legitimate uses (an empty folder, a resumed run, a re-run compare
reusing its runs, an earlier result of the same command) keep working.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.outputs import describe_entries

STEPS = 4
TRAIN = ["--preset", "tiny", "--no-progress", "--set", "batch_size=2", "--set", "seq_len=32", "--set", "eval_every=0",
         "--set", "eval_windows=2", "--set", "eval_batch_size=2", "--set", "save_every=2", "--set", "keep_last=2"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Never prepare into the user's cache folder from a test."""
    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir) -> Path:
    """A finished Depth-Attention run of 4 steps (checkpoints of steps 2 and 4)."""
    folder = tmp_path_factory.mktemp("owned") / "run"
    assert main(["train", *TRAIN, "--steps", str(STEPS), "--cross-layer", "depth_attention", "--data", str(data_dir),
                 "--out", str(folder)]) == 0
    return folder


def hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (symlinks as their target), by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(str(p.readlink()).encode() if p.is_symlink() else p.read_bytes()
                                                        ).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


def refused(capsys, argv: list[str], tmp: Path, *needles: str) -> str:
    """``main(argv)`` exits 2 with one line holding every needle, and every file under ``tmp`` is as it was."""
    before = hashes(tmp)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"depthattn {argv[0]}: error: "), err
    for needle in needles:
        assert needle in err, err
    assert hashes(tmp) == before
    return err


def user_folder(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True)
    for i, name in enumerate(names):
        (folder / name).write_text(f"the user's {name}, version {i}\n")
    return folder


# ---------------------------------------------------------------------------------------------------- train
def test_train_out_on_a_user_folder_is_refused_listing_its_files(data_dir, tmp_path, capsys):
    user = user_folder(tmp_path / "mine", ["notes.txt", ".tmp-notes.txt", ".old-draft.md", "metrics.jsonl",
                                           "summary.json", "param_groups.json"])
    line = refused(capsys, ["train", *TRAIN, "--steps", "2", "--data", str(data_dir), "--out", str(user)], tmp_path,
                   f"--out {user} holds files that train did not write: ", describe_entries(user))
    assert ".old-draft.md, .tmp-notes.txt, metrics.jsonl, notes.txt, param_groups.json and 1 more (6 entries)" in line
    # --resume-if-exists does not take such a folder for a new run either
    refused(capsys, ["train", *TRAIN, "--steps", "2", "--data", str(data_dir), "--out", str(user),
                     "--resume-if-exists"], tmp_path, f"--out {user} holds files but no run.json", ".tmp-notes.txt")


def test_train_out_empty_folder_or_a_killed_first_start_works(data_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", *TRAIN, "--steps", "2", "--data", str(data_dir), "--out", str(empty)]) == 0
    assert json.loads((empty / "summary.json").read_text())["steps"] == 2
    killed = tmp_path / "killed"  # a first start killed after its lock and empty log, mid-write of run.json
    killed.mkdir()
    (killed / "depthattn.lock").write_text("{}")
    (killed / "metrics.jsonl").write_text("")
    (killed / ".tmp-k3x9q_2arun.json").write_text("{")
    assert main(["train", *TRAIN, "--steps", "2", "--data", str(data_dir), "--out", str(killed)]) == 0
    names = sorted(p.name for p in killed.iterdir())
    assert {"run.json", "summary.json", "checkpoints"} <= set(names), names
    assert not [n for n in names if n.startswith(".") or n == "depthattn.lock"], names  # leftovers removed
    # its own finished run: the ownership check lets it through, and the trainer refuses to start it afresh
    refused(capsys, ["train", *TRAIN, "--steps", "2", "--data", str(data_dir), "--out", str(empty)], tmp_path,
            f"run folder {empty} already holds checkpoints; pass --resume")


def test_a_users_tmp_file_in_a_run_folder_survives_a_resume(run, data_dir, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    shutil.rmtree(folder / "checkpoints" / "step_00000004")
    (folder / ".tmp-notes.txt").write_text("my notes on this run\n")  # the user's
    (folder / "checkpoints" / ".tmp-notes.txt").write_text("more notes\n")
    (folder / ".tmp-my-notes").write_text("shaped like a temporary folder's name\n")
    (folder / ".old-draft-v2").mkdir()
    (folder / ".old-draft-v2" / "notes.txt").write_text("a user's folder\n")
    (folder / ".tmp-qz1_8ab2metrics.jsonl").write_text('{"step": 1}\n')  # a killed atomic_write_text
    (folder / "checkpoints" / ".tmp-step_00000004-a1b2c3d4").mkdir()  # a killed checkpoint write
    (folder / "checkpoints" / ".trash-step_00000000").mkdir()  # a killed prune
    mine = {k: v for k, v in hashes(folder).items() if k.endswith((".tmp-notes.txt", ".tmp-my-notes", "notes.txt"))}
    capsys.readouterr()
    assert main(["train", "--resume", str(folder), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {folder} from step 2 of {STEPS}" in out
    removed = [line for line in out.splitlines() if line.startswith("removed leftovers of an interrupted write")]
    assert removed == [f"removed leftovers of an interrupted write in {folder}: .tmp-qz1_8ab2metrics.jsonl, "
                       f"checkpoints/.tmp-step_00000004-a1b2c3d4, checkpoints/.trash-step_00000000"]
    assert {k: v for k, v in hashes(folder).items()
            if k.endswith((".tmp-notes.txt", ".tmp-my-notes", "notes.txt"))} == mine and len(mine) == 4
    assert json.loads((folder / "summary.json").read_text())["steps"] == STEPS
    # --resume-if-exists on its own finished run keeps working (and keeps the user's file)
    assert main(["train", *TRAIN, "--steps", str(STEPS), "--cross-layer", "depth_attention", "--data", str(data_dir),
                 "--out", str(folder), "--resume-if-exists"]) == 0
    assert f"{folder} already finished at step {STEPS}" in capsys.readouterr().out
    assert {k: v for k, v in hashes(folder).items()
            if k.endswith((".tmp-notes.txt", ".tmp-my-notes", "notes.txt"))} == mine


# ---------------------------------------------------------------------------------------------------- compare
COMPARE = ["compare", "--preset", "tiny", "--no-progress", "--methods", "none", "--steps", "2", "--eval-tokens", "128",
           "--set", "batch_size=2", "--set", "seq_len=32", "--set", "eval_every=0", "--set", "eval_windows=2",
           "--set", "eval_batch_size=2", "--set", "save_every=2"]


def test_compare_out_on_a_user_folder_is_refused_listing_its_files(data_dir, tmp_path, capsys):
    user = user_folder(tmp_path / "mine", ["report.md", "notes.txt", ".tmp-notes.txt"])
    (user / "results.json").write_text('{"my": "results"}\n')
    (user / "loss_curves.png").write_bytes(b"\x89PNG my plot")
    line = refused(capsys, [*COMPARE, "--data", str(data_dir), "--out", str(user)], tmp_path,
                   f"--out {user} holds files that compare did not write: ")
    assert ".tmp-notes.txt, loss_curves.png, notes.txt, report.md, results.json (5 entries)" in line
    # a folder with only a results.json of the same name, not a compare's: refused too
    # beside a killed compare's lock file: checked under the lock; the stale lock file, compare's own, is removed
    stale = user_folder(tmp_path / "stale", ["notes.txt"])
    (stale / "depthattn.lock").write_text(json.dumps({"host": "gone", "pid": 1 << 22, "started": "x", "command": "c",
                                                     "heartbeat": 0.0, "mechanism": "flock"}))
    mine = hashlib.sha256((stale / "notes.txt").read_bytes()).hexdigest()
    assert main([*COMPARE, "--data", str(data_dir), "--out", str(stale)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("depthattn compare: error: ") and (
        f"--out {stale} holds files that compare did not write: notes.txt (1 entry)" in err), err
    assert hashes(stale) == {"notes.txt": mine}
    only = tmp_path / "only"
    only.mkdir()
    (only / "results.json").write_text('{"methods": "mine"}\n')
    refused(capsys, [*COMPARE, "--data", str(data_dir), "--out", str(only)], tmp_path,
            f"--out {only} holds files that compare did not write: results.json (1 entry)")


def test_compare_rerun_on_its_own_folder_reuses_its_runs(data_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [*COMPARE, "--data", str(data_dir), "--out", str(out)]
    assert main(argv) == 0
    first = json.loads((out / "results.json").read_text())
    (out / "study.log").write_text("the study driver's log\n")  # an earlier study runner's log beside the outputs
    runs = {k: v for k, v in hashes(out).items() if k.startswith("runs/") and "/checkpoints/" in k}
    capsys.readouterr()
    assert main(argv) == 0
    assert f"reusing finished run {out / 'runs' / 'none-seed0'}" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert [h["runs"]["none-seed0"]["action"] for h in again["history"]] == ["trained", "reused"]
    assert again["methods"]["none"]["mean"]["val_loss"] == first["methods"]["none"]["mean"]["val_loss"]
    assert {k: v for k, v in hashes(out).items() if k.startswith("runs/") and "/checkpoints/" in k} == runs
    assert (out / "study.log").read_text() == "the study driver's log\n"
    (out / "runs" / "none-seed1").mkdir()
    (out / "runs" / "none-seed1" / "notes.txt").write_text("not a run\n")
    refused(capsys, argv, tmp_path, f"--out {out} holds files that compare did not write: runs/none-seed1/notes.txt "
                                    f"(1 entry)")


# ---------------------------------------------------------------------------------------------------- eval --out
def _eval(run: Path, data_dir: Path, out: Path) -> list[str]:
    return ["eval", str(run), "--data", str(data_dir), "--max-tokens", "64", "--no-progress", "--out", str(out)]


def test_eval_out_into_a_run_folder_is_refused(run, data_dir, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    summary = folder / "summary.json"
    assert json.loads(summary.read_text())["checkpoint"]  # what the old rule took for an eval result
    refused(capsys, _eval(folder, data_dir, summary), tmp_path,
            f"--out {summary} exists and is not an eval result file", "not replaced")
    new = folder / "eval-result.json"
    refused(capsys, _eval(folder, data_dir, new), tmp_path,
            f"--out {new} lies inside the run or checkpoint folder {folder} (it has run.json)")
    inside = folder / "checkpoints" / "step_00000004" / "eval.json"
    refused(capsys, _eval(folder, data_dir, inside), tmp_path,
            f"--out {inside} lies inside the run or checkpoint folder {inside.parent} (it has checksums.json)")
    copy = tmp_path / "summary-copy.json"  # the trainer's summary outside its run is not an eval result either
    copy.write_bytes(summary.read_bytes())
    refused(capsys, _eval(folder, data_dir, copy), tmp_path, f"--out {copy} exists and is not an eval result file")
    out = tmp_path / "eval.json"
    assert main(_eval(folder, data_dir, out)) == 0
    first = json.loads(out.read_text())
    assert first["written_by"] == "depthattn eval" and first["tokens"] == 64
    out.write_text(json.dumps({**first, "loss": -1.0}))
    assert main(_eval(folder, data_dir, out)) == 0  # its own earlier result is replaced
    assert json.loads(out.read_text()) == first


# ---------------------------------------------------------------------------------------------------- analyze --out
def _analyze(run: Path, data_dir: Path, out: Path) -> list[str]:
    return ["analyze", str(run), "--data", str(data_dir), "--seq-len", "32", "--windows", "1", "--out", str(out)]


def test_analyze_out_over_a_users_depth_weights_is_refused(run, data_dir, tmp_path, capsys):
    user = user_folder(tmp_path / "mine", ["depth_weights.json", "notes.txt"])
    refused(capsys, _analyze(run, data_dir, user), tmp_path,
            f"--out {user} holds depth_weights.json (1 entry) not written there as analyze's depth weights")
    plot = user_folder(tmp_path / "plot", ["depth_weights.png"])  # a heat map beside no analyze JSON
    refused(capsys, _analyze(run, data_dir, plot), tmp_path, f"--out {plot} holds depth_weights.png (1 entry)")
    out = tmp_path / "analysis"
    assert main(_analyze(run, data_dir, out)) == 0
    first = json.loads((out / "depth_weights.json").read_text())
    assert first["written_by"] == "depthattn analyze" and first["num_tokens"] == 32
    legacy = {k: v for k, v in first.items() if k != "written_by"}  # what analyze wrote before its mark
    (out / "depth_weights.json").write_text(json.dumps(legacy))
    assert main(_analyze(run, data_dir, out)) == 0  # its own earlier files are replaced
    assert json.loads((out / "depth_weights.json").read_text()) == first
    assert (out / "depth_weights.png").read_bytes()[:4] == b"\x89PNG"


def test_analyze_out_into_a_checkpoint_folder_is_refused(run, data_dir, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    ck = folder / "checkpoints" / "step_00000004"
    refused(capsys, _analyze(folder, data_dir, ck), tmp_path,
            f"--out {ck} is the run or checkpoint folder {ck} (it has checksums.json)")
    refused(capsys, _analyze(folder, data_dir, ck / "analysis"), tmp_path,
            f"--out {ck / 'analysis'} lies inside the run or checkpoint folder {ck} (it has checksums.json)")
    refused(capsys, _analyze(folder, data_dir, folder), tmp_path,
            f"--out {folder} is the run or checkpoint folder {folder} (it has run.json)")
