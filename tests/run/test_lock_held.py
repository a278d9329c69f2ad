"""The run folder's lock is never broken while held (docs/reliability.md, "One trainer per run folder"): where
``flock`` works, ``depthattn unlock`` refuses while anyone holds it and a refused trainer is not told to unlock,
however far the holder's clock is off; where ``flock`` is refused, the heartbeat's age is judged on the file
system's own clock (the lock file's mtime against a file created beside it), never on the holder's clock."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import traceback
from pathlib import Path

import pytest

from depthattn import layout
from depthattn.run import lock as run_lock
from depthattn.cli import main
from depthattn.training import RunFolderLocked, RunLock

SKEW_S = 2 * RunLock.STALE_S  # another node's clock, this far from ours


def holder(folder: Path, host: str, skew_s: float, die: bool = False) -> int:
    """A forked child on "``host``" (another node sharing the file system) whose clock is ``skew_s`` seconds ahead
    of ours (negative: behind), which takes ``RunLock(folder)`` and then waits to be killed, or dies at once
    (``die``: like a kill -9, its lock file stays); its pid."""
    ready = folder.parent / f"{folder.name}.held"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            real = time.time
            time.time = lambda: real() + skew_s
            socket.gethostname = lambda: host
            RunLock(folder).acquire()
            if die:
                os._exit(0)
            ready.touch()
            while True:
                time.sleep(1)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    if die:
        assert os.waitpid(pid, 0)[1] == 0, "the holder failed to take the lock"
        return pid
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0), "the holder did not start"
        time.sleep(0.02)
    return pid


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_unlock_refuses_and_a_second_trainer_is_not_told_to_unlock_while_the_flock_is_held(tmp_path, data_dir,
                                                                                            capsys):
    folder = tmp_path / "run"
    pid = holder(folder, "node-7", -SKEW_S)  # its heartbeat looks 600 s old to us; it holds the flock
    try:
        record = (folder / layout.LOCK_FILE).read_bytes()
        assert len(record) == 1024 and json.loads(record)["mechanism"] == "flock"
        assert time.time() - json.loads(record)["heartbeat"] > RunLock.STALE_S
        assert main(["unlock", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"depthattn unlock: error: refusing to unlock {folder}: "), err
        assert f"pid {pid} on host node-7" in err[0] and "holds its lock" in err[0], err
        with pytest.raises(RunFolderLocked, match="refusing to unlock"):
            RunLock.unlock(folder, log=lambda _: None)
        assert (folder / layout.LOCK_FILE).read_bytes() == record

        assert main(["train", "--preset", "tiny", "--no-progress", "--steps", "2", "--data", str(data_dir),
                     "--out", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by another trainer: pid {pid} on host node-7" in err[0], err
        assert err[0].endswith("it holds the lock, so it is running: wait for it to finish or stop it, or choose "
                               "another --out"), err
        assert "depthattn unlock" not in err[0], err
        assert names(folder) == [layout.LOCK_FILE]
    finally:
        kill(pid)
    assert main(["unlock", str(folder)]) == 0  # the kernel dropped the flock with its holder: removed at once
    assert not (folder / layout.LOCK_FILE).exists()


def test_without_flock_the_heartbeats_age_is_judged_on_the_file_systems_clock(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_lock, "flock", lambda fd, exclusive, wait: False)  # as for NO_FLOCK_ERRNOS
    folder = tmp_path / "run"
    file = folder / layout.LOCK_FILE

    # a live holder on another node whose clock is 600 s behind: just written (its mtime), so fresh
    pid = holder(folder, "node-7", -SKEW_S)
    try:
        record = file.read_bytes()
        assert len(record) == 1024 and json.loads(record)["mechanism"] == "heartbeat"
        assert time.time() - json.loads(record)["heartbeat"] > RunLock.STALE_S
        with pytest.raises(RunFolderLocked, match=f"pid {pid} on host node-7.*depthattn unlock {folder}"):
            RunLock(folder).acquire()
        assert main(["unlock", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"refusing to unlock {folder}: the heartbeat is fresh" in err[0], err
        assert file.read_bytes() == record and names(folder) == [layout.LOCK_FILE]  # the probe is gone too
    finally:
        kill(pid)
    file.unlink()

    # a dead holder on a node whose clock is 600 s ahead: its heartbeat looks fresh to us, but the file system says
    # the file was last written 600 s before a file created beside it now
    holder(folder, "node-8", SKEW_S, die=True)
    record = file.read_bytes()
    assert json.loads(record)["heartbeat"] > time.time()
    old = time.time() - SKEW_S
    os.utime(file, (old, old))
    assert main(["unlock", str(folder)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"removed the stale lock of {folder}: pid ") and "node-8" in out[0]
    assert names(folder) == []
