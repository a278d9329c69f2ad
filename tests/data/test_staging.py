"""The ``.partial`` folder of a data prepare (``data.staging``): one left by a dead writer on this host is removed
with one line; one from another host is reported (host, pid, age, what to do) and kept; one whose writer is alive is
not touched; a second preparer waits for the first and uses its folder.

* (``dist``) ``torchrun`` of two ranks on an empty cache: one process prepares the embedded corpus (a stale
  ``.partial`` from a dead pid left there beforehand is removed with one line), the other waits and verifies, and
  the run trains.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.data import load_prepared, prepare_corpus
from depthattn.data import staging

from helpers import EMBEDDED_TRAIN_SHA, machine_timeout, snapshot, torchrun


def _stale_partial(out: Path, host: str, pid: int, age_s: float = 0.0) -> Path:
    partial = staging.partial_path(out)
    (partial / staging.CONTENT_DIR).mkdir(parents=True)
    (partial / staging.CONTENT_DIR / "train-00000.bin").write_bytes(b"\1\2\3\4")
    record = {"host": host, "pid": pid, "started": time.time() - age_s}
    (partial / staging.WRITER_FILE).write_text(json.dumps(record))
    if age_s:
        for p in partial.rglob("*"):
            os.utime(p, (time.time() - age_s,) * 2)
        os.utime(partial, (time.time() - age_s,) * 2)
    return partial


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_partial_of_a_dead_writer_is_removed_with_one_line(data_dir, tmp_path):
    src = data_dir.parent / "slice.jsonl"
    out = tmp_path / "out"
    partial = _stale_partial(out, socket.gethostname(), _dead_pid(), age_s=3600)
    lines: list[str] = []
    meta = prepare_corpus(out, [str(src)], tokenizer=data_dir / "tokenizer.json", val_fraction=0.2, progress=False,
                          log=lines.append, workers=1)
    stale = [line for line in lines if "stale" in line]
    assert len(stale) == 1 and str(partial) in stale[0] and "that process is gone" in stale[0], lines
    assert "on host" in stale[0] and "started 60 min ago" in stale[0]
    assert not partial.exists() and load_prepared(out).meta == meta
    # a live pid whose writer.json is not locked by it (the pid was reused after the writer died): gone as well
    partial = _stale_partial(tmp_path / "out2", socket.gethostname(), os.getppid())
    assert staging.writer_state(partial)[0] == "gone"


def test_partial_from_another_host_is_reported_and_kept(data_dir, tmp_path):
    src = data_dir.parent / "slice.jsonl"
    out = tmp_path / "out"
    partial = _stale_partial(out, "node-elsewhere-7", 4242, age_s=7200)
    before = snapshot(partial)
    for wait_s in (0.0, 1.0):  # waiting does not help: it has not changed for longer than the wait
        with pytest.raises(ValueError) as e:
            prepare_corpus(out, [str(src)], tokenizer=data_dir / "tokenizer.json", progress=False, log=None,
                           wait_s=wait_s)
        msg = str(e.value)
        assert "\n" not in msg and "pid 4242 on host node-elsewhere-7, started 2.0 h ago" in msg, msg
        assert "has not changed for 2.0 h" in msg and f"rm -r {partial}" in msg and "it is kept" in msg
        assert snapshot(partial) == before and not out.exists()
    rc = main(["data", "prepare", "--input", str(src), "--tokenizer", str(data_dir / "tokenizer.json"),
               "--out", str(out), "--quiet"])
    assert rc == 2 and snapshot(partial) == before


def test_partial_of_a_live_writer_is_left_alone(data_dir, tmp_path):
    out = tmp_path / "out"
    partial = _stale_partial(out, socket.gethostname(), os.getpid())
    fd = os.open(partial / staging.WRITER_FILE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as its writer holds it
    try:
        assert staging.writer_state(partial)[0] == "alive"
        with pytest.raises(ValueError, match=r"another process is writing it \(pid \d+ on host"):
            prepare_corpus(out, [str(data_dir.parent / "slice.jsonl")], tokenizer=data_dir / "tokenizer.json",
                           progress=False, log=None)
        assert (partial / staging.CONTENT_DIR / "train-00000.bin").is_file()
    finally:
        os.close(fd)
    assert staging.writer_state(partial)[0] == "gone"  # its writer let go


_SLOW_WRITER = """
import sys, time
from depthattn.data import prepare as p
real = p._encode_all
def slow(*a, **k):
    time.sleep(3)  # long enough for the test's process to find this one writing
    return real(*a, **k)
p._encode_all = slow
p.prepare_corpus(sys.argv[1], [sys.argv[2]], tokenizer=sys.argv[3], val_fraction=0.2, progress=False, log=None,
                 workers=1)
"""


def test_a_second_preparer_waits_for_the_first_and_uses_its_folder(data_dir, tmp_path):
    """What a second node's LOCAL_RANK 0 does on a shared cache (here: a second process on this host)."""
    out, src, tok = tmp_path / "out", data_dir.parent / "slice.jsonl", data_dir / "tokenizer.json"
    writer = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(out), str(src), str(tok)])
    partial = staging.partial_path(out)
    deadline = time.time() + 120
    while not (partial / staging.WRITER_FILE).is_file() and writer.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    lines: list[str] = []
    meta = prepare_corpus(out, [str(src)], tokenizer=tok, val_fraction=0.2, seed=9, progress=False,
                          log=lines.append, overwrite=True, wait_s=120, if_missing=True)
    assert writer.wait(timeout=machine_timeout(120)) == 0
    assert any(f"waiting for pid {writer.pid} on host" in line for line in lines), lines
    assert meta["seed"] == 0 == load_prepared(out).meta["seed"]  # the first one's folder, not prepared again
    assert not partial.exists()


def test_ranks_that_do_not_prepare_wait_at_most_the_run_timeout(tmp_path, monkeypatch):
    from depthattn.commands.train_cmd import ensure_data

    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"waited 0.5 s \(dist_timeout_s\) for LOCAL_RANK 0 to prepare"):
        ensure_data(None, timeout_s=0.5)
    assert time.monotonic() - t0 < 5 and not any(tmp_path.iterdir())  # waited, wrote nothing


def test_a_dead_writers_lock_held_by_its_exiting_workers_is_waited_out(data_dir, tmp_path):
    import threading

    out = tmp_path / "out"
    partial = _stale_partial(out, socket.gethostname(), _dead_pid())
    fd = os.open(partial / staging.WRITER_FILE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the killed writer's forked workers hold it until they have exited
    threading.Timer(0.5, os.close, (fd,)).start()
    lines: list[str] = []
    t0 = time.monotonic()
    with staging.claimed(out, lines.append, wait_s=0.0) as content:  # data prepare's: no waiting otherwise
        assert content.is_dir() and not any(content.iterdir())
    assert 0.4 < time.monotonic() - t0 < staging.EXIT_GRACE_S
    assert len(lines) == 1 and "removed a stale" in lines[0], lines
    assert not partial.exists()


# ---------------------------------------------------------------------------------------------------- torchrun
@pytest.mark.dist
def test_torchrun_on_an_empty_cache_prepares_once(tmp_path):
    cache = tmp_path / "cache"
    folder = cache / "data" / "embedded"
    partial = _stale_partial(folder, socket.gethostname(), _dead_pid(), age_s=600)  # a killed first launch's
    sets = dict(batch_size=2, seq_len=32, eval_windows=2, eval_batch_size=2, log_every=1, device="cpu",
                data_parallel="ddp", tensorboard="false")
    res = torchrun(["-m", "depthattn.cli", "train", "--preset", "tiny", "--steps", "2", "--no-progress", "--out",
                    str(tmp_path / "run"), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]], tmp_path,
                   env={"DEPTHATTN_CACHE": str(cache)}, timeout_s=300, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("preparing the embedded corpus") == 1, out[-4000:]  # one process prepared it
    assert out.count("removed a stale") == 1 and str(partial) in out, out[-4000:]
    assert "trained 2 steps" in res.stdout
    assert not partial.exists()
    assert load_prepared(folder).meta["splits"]["train"]["sha256"] == EMBEDDED_TRAIN_SHA
