"""The run folder's owner and its lock (docs/reliability.md, "One trainer per run folder"): a second trainer (fresh
or ``--resume``) or a second ``compare`` on a folder in use exits 2 naming the holder and touches nothing; a kill -9
leaves no stale lock; the heartbeat fallback where ``flock`` is refused, with ``depthattn unlock``; readers (eval,
export) work while the run trains, and pruning leaves a checkpoint being read for the next prune."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from depthattn import layout, locking
from depthattn.checkpoint import checkpoint_dirs, open_checkpoint
from depthattn.cli import main
from depthattn.data import load_prepared
from depthattn.training import RunFolder, RunFolderLocked, RunLock, TrainConfig, read_summary, resolve_model_config
from depthattn.training import loop as loop_module
from depthattn.training import train
from depthattn.run.checkpoints import prune_checkpoints

from helpers import torchrun


STEPS = 6
CFG = dict(steps=STEPS, batch_size=2, seq_len=32, lr=3e-3, warmup=0.1, eval_every=0, eval_windows=2,
           eval_batch_size=2, save_every=2, keep_last=2, tensorboard=False)
TRAIN_FLAGS = ["--preset", "tiny", "--no-progress", "--steps", str(STEPS), "--set", "batch_size=2", "--set",
               "seq_len=32", "--set", "eval_every=0", "--set", "eval_windows=2", "--set", "save_every=2"]


@pytest.fixture(scope="module")
def model_cfg(data_dir):
    return resolve_model_config("tiny", {}, load_prepared(data_dir).vocab_size, "tokenizer.json")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, model_cfg, data_dir) -> Path:
    folder = tmp_path_factory.mktemp("finished") / "run"
    train(folder, model_cfg, TrainConfig(**CFG), data_dir, progress=False, log=lambda _: None)
    return folder


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def paused_trainer(folder: Path, model_cfg, data_dir, pause_at: int) -> tuple[int, Path]:
    """A forked child that trains ``folder`` and pauses (forever) after logging step ``pause_at``; (pid, the file it
    touches when paused). Forking skips a fresh interpreter's imports (seconds each on CI)."""
    ready = folder.parent / f"{folder.name}.paused"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            torch.set_num_threads(1)
            RunLock.HEARTBEAT_S = 3600.0  # no heartbeat rewrite while the parent compares bytes
            real = loop_module.fault_point
            seen = [0]

            def pause(phase: str) -> None:
                real(phase)
                if phase == "logged":
                    seen[0] += 1
                    if seen[0] == pause_at:
                        ready.touch()
                        while True:
                            time.sleep(1)

            loop_module.fault_point = pause
            train(folder, model_cfg, TrainConfig(**CFG), data_dir, progress=False, log=lambda _: None)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert time.monotonic() < deadline, "the trainer did not reach its pause"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the trainer died before its pause"
        time.sleep(0.05)
    return pid, ready


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_second_trainer_fresh_or_resume_exits_2_naming_the_holder_then_kill_9_leaves_no_stale_lock(
        tmp_path, model_cfg, data_dir, capsys):
    folder = tmp_path / "run"
    pid, _ = paused_trainer(folder, model_cfg, data_dir, pause_at=3)  # after the checkpoint of step 2
    try:
        (folder / ".tmp-inflightmetrics.jsonl").write_text("the holder's temporary file")  # survives the 2nd start
        before = snapshot(folder)
        holder = json.loads((folder / layout.LOCK_FILE).read_text())
        assert holder["pid"] == pid and holder["host"] == socket.gethostname()
        with pytest.raises(RunFolderLocked) as fresh:
            train(folder, model_cfg, TrainConfig(**CFG), data_dir, progress=False, log=print)
        assert f"pid {pid} on host {socket.gethostname()}, started {holder['started']}" in str(fresh.value)
        assert main(["train", *TRAIN_FLAGS, "--data", str(data_dir), "--out", str(folder)]) == 2
        assert main(["train", "--resume", str(folder), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and all(line.startswith("depthattn train: error: ") and f"pid {pid} on host" in line
                                     and "in use by another trainer" in line for line in err), err
        assert snapshot(folder) == before  # nothing written, nothing deleted
    finally:
        kill(pid)
    assert (folder / layout.LOCK_FILE).exists()  # the dead holder's file stays; the kernel dropped its flock
    lines: list[str] = []
    train(folder, model_cfg, TrainConfig(**CFG), data_dir, resume=True, progress=False, log=lines.append)
    assert any(line.startswith(f"resuming {folder} from step 2") for line in lines), lines
    assert read_summary(folder)["steps"] == STEPS
    assert not (folder / layout.LOCK_FILE).exists() and not (folder / ".tmp-inflightmetrics.jsonl").exists()


def test_a_failed_fresh_start_leaves_no_folder_and_a_held_lock_is_released_on_error(tmp_path, model_cfg, data_dir):
    folder = tmp_path / "new"
    with pytest.raises(ValueError, match="seq_len"):
        train(folder, model_cfg, TrainConfig(**{**CFG, "seq_len": 10 ** 6}), data_dir, progress=False)
    assert not folder.exists()


def no_flock(monkeypatch) -> None:
    def refuse(fd, op):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(locking.fcntl, "flock", refuse)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_heartbeat_fallback_and_unlock_where_flock_is_refused(tmp_path, monkeypatch, capsys):
    no_flock(monkeypatch)
    monkeypatch.setattr(RunLock, "HEARTBEAT_S", 0.05)
    folder = tmp_path / "run"
    lock = RunLock(folder).acquire()
    try:
        assert lock.mechanism == "heartbeat"
        first = lock.holder().heartbeat
        time.sleep(0.3)
        assert lock.holder().heartbeat > first  # refreshed by the holder
        with pytest.raises(RunFolderLocked, match=f"pid {os.getpid()} on host .*depthattn unlock {folder}"):
            RunLock(folder).acquire()
        assert main(["unlock", str(folder)]) == 2  # a live holder of this host
        assert "refusing to unlock" in capsys.readouterr().err
    finally:
        lock.release()
    assert not folder.exists()  # the lock made the folder; released with nothing else in it, it goes too
    folder.mkdir()

    # a holder killed -9: its file stays; unlock refuses while the heartbeat is fresh, removes it once stale
    gone = {"host": "node-7", "pid": dead_pid(), "started": "2026-12-03T09:00:00Z", "command": "depthattn train",
            "heartbeat": time.time(), "mechanism": "heartbeat"}
    (folder / layout.LOCK_FILE).write_text(json.dumps(gone))
    with pytest.raises(RunFolderLocked, match="in use by another trainer: pid .* on host node-7"):
        RunLock(folder).acquire()
    assert main(["unlock", str(folder)]) == 2
    assert "the heartbeat is fresh" in capsys.readouterr().err
    gone["heartbeat"] = time.time() - 2 * RunLock.STALE_S
    (folder / layout.LOCK_FILE).write_text(json.dumps(gone))
    os.utime(folder / layout.LOCK_FILE, (gone["heartbeat"], gone["heartbeat"]))  # stale on the disk's clock
    assert main(["unlock", str(folder)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"removed the stale lock of {folder}: pid {gone['pid']} on host node-7")
    with RunLock(folder):
        pass


def test_unlock_removes_the_file_of_a_killed_holder_where_flock_works(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / layout.LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": dead_pid(), "started": "x", "command": "c", "heartbeat": time.time(),
         "mechanism": "flock"}))
    assert main(["unlock", str(folder)]) == 0  # the kernel's lock is free: nobody holds it
    assert not (folder / layout.LOCK_FILE).exists()
    assert main(["unlock", str(folder)]) == 0 and "is not locked" in capsys.readouterr().out


def test_second_compare_on_one_out_exits_2_and_touches_nothing(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    with RunLock(out, "compare"):
        (out / "results.json").write_text("{}")
        before = snapshot(out)
        assert main(["compare", "--preset", "tiny", "--no-progress", "--methods", "none", "--steps", "2",
                     "--data", str(data_dir), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "in use by another compare" in err[0] and f"pid {os.getpid()}" in err[0], err
        assert snapshot(out) == before


def fake_checkpoint(folder: Path, step: int) -> Path:
    d = RunFolder(folder).checkpoint_path(step)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_pruning_defers_a_checkpoint_being_read_and_deletes_it_at_the_next_prune(tmp_path):
    folder = tmp_path / "run"
    old, new = fake_checkpoint(folder, 2), fake_checkpoint(folder, 4)
    lines: list[str] = []
    with open_checkpoint(old) as reading:
        assert reading == old
        prune_checkpoints(folder, 1, new, log=lines.append)
        assert checkpoint_dirs(folder) == [old, new] and (old / "config.json").is_file()
        assert lines == ["kept step_00000002 for now: being read (eval, generate, export, ...); the next prune "
                         "deletes it"]
    newer = fake_checkpoint(folder, 6)
    prune_checkpoints(folder, 1, newer, log=lines.append)
    assert checkpoint_dirs(folder) == [newer] and len(lines) == 1
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_00000006"]  # no .trash- left


def test_a_reader_of_a_run_folder_takes_the_newest_checkpoint_that_survives_pruning(tmp_path, monkeypatch):
    """``open_checkpoint`` on a run folder whose newest checkpoint is pruned between the listing and the lock
    resolves again."""
    folder = tmp_path / "run"
    first, second = fake_checkpoint(folder, 2), fake_checkpoint(folder, 4)
    real = locking.lock_folder
    calls = []

    def prune_first(path, exclusive, wait):
        calls.append(Path(path).name)
        if len(calls) == 1:
            RunFolder(folder).delete_checkpoints([Path(path)])
            fake_checkpoint(folder, 6)
        return real(path, exclusive, wait)

    monkeypatch.setattr("depthattn.checkpoint.lock_folder", prune_first)
    with open_checkpoint(folder) as got:
        assert got.name == "step_00000006" and calls == ["step_00000004", "step_00000006"]
    assert first.is_dir() and not second.exists()


def test_eval_and_export_of_a_run_work_while_its_lock_is_held(finished_run, tmp_path, capsys):
    with RunLock(finished_run):
        assert main(["eval", str(finished_run), "--max-tokens", "64", "--batch-size", "2"]) == 0
        assert "perplexity" in capsys.readouterr().out
        assert main(["export", str(finished_run), "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "model.safetensors").is_file()


@pytest.mark.dist
def test_under_torchrun_every_rank_gets_rank_0s_verdict_and_exits_2(tmp_path, data_dir):
    """Rank 0 takes the lock and broadcasts its verdict: with the folder held, both ranks print the one line and
    exit 2 together (none hangs in a collective, none writes)."""
    folder = tmp_path / "run"
    with RunLock(folder):
        before = snapshot(folder)
        res = torchrun(["-m", "depthattn.cli", "train", *TRAIN_FLAGS, "--data", str(data_dir), "--out", str(folder),
                        "--set", "data_parallel=ddp", "--set", "device=cpu"], tmp_path, timeout_s=300, check=False)
        assert snapshot(folder) == before
    lines = [line for line in (res.stdout + res.stderr).splitlines() if "in use by another trainer" in line]
    assert res.returncode != 0 and len(lines) == 2, res.stdout + res.stderr
    assert all(line.strip().endswith("choose another --out") and f"pid {os.getpid()} on host" in line
               for line in lines), lines
    assert "exitcode  : 2" in res.stdout + res.stderr or "exit code: 2" in res.stdout + res.stderr, res.stderr[-3000:]
