"""The ``.partial`` folder a data folder is written in, and who is writing it.

``prepare_corpus(OUT)`` claims ``<parent>/.<name>.partial`` with ``mkdir`` (atomic on every POSIX file system,
NFS and Lustre included: of several processes, on one host or many, exactly one succeeds). The claimant records
itself in ``writer.json`` (``host``, ``pid``, ``started``: Unix seconds) and holds an exclusive ``flock`` on it for
as long as it writes; the new folder is filled in ``.partial/folder/`` and renamed onto ``OUT``
(:func:`depthattn.fileio.write_folder_atomically`), and the ``.partial`` is removed.

A process that finds a ``.partial`` asks :func:`writer_state` who wrote it:

* ``"gone"``: written on this host and its writer is dead: the ``flock`` is free (the kernel drops it when the
  process dies, whatever happens to its pid afterwards), or, where the file system refuses ``flock``, no process has
  its pid. It is removed with one line and the claim is taken.
* ``"alive"``: this host, lock held (or pid alive where there is no ``flock``). ``data prepare`` says who and stops;
  ``train``'s default data waits for it (:func:`claimed` with ``wait_s``). A lock still held after the writer's pid
  died (its forked encoding workers, which share the lock, are exiting) is waited for up to ``EXIT_GRACE_S``.
* ``"foreign"``: written on another host (or too damaged to say by whom): this host cannot check that process, so
  the ``.partial`` is never deleted. A waiter waits while it is being written (something in it changed within
  ``wait_s``) and otherwise reports host, pid and age, and what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from depthattn.fileio import read_json
from depthattn.locking import flock, pid_alive

WRITER_FILE = "writer.json"
CONTENT_DIR = "folder"
#: A ``.partial`` younger than this without a ``writer.json`` is taken to be starting (its claimant about to write
#: the record) rather than damaged.
START_GRACE_S = 30.0
POLL_S = 0.2
#: How long a ``.partial`` whose writer's pid is dead may keep its lock held: its forked encoding workers (which
#: share the lock) are exiting. Waited out even by ``data prepare``, which otherwise does not wait.
EXIT_GRACE_S = 10.0


def partial_path(out: str | os.PathLike) -> Path:
    """``<parent>/.<name>.partial``: where ``out`` is written before it is renamed into place."""
    out = Path(os.path.abspath(os.fspath(out)))
    return out.parent / f".{out.name}.partial"


def read_writer(partial: Path) -> dict | None:
    """The ``writer.json`` record of a ``.partial`` (None when missing or unreadable)."""
    try:
        record = read_json(partial / WRITER_FILE, "writer record")
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("pid"), int) and isinstance(record.get("host"), str)
    return record if ok else None


def writer_state(partial: Path) -> tuple[str, dict | None]:
    """``("gone" | "alive" | "foreign", writer record)`` of an existing ``.partial`` (see the module docstring)."""
    record = read_writer(partial)
    if record is None:
        try:
            young = time.time() - partial.stat().st_mtime < START_GRACE_S
        except FileNotFoundError:
            return "gone", None  # removed meanwhile
        return ("alive" if young else "foreign"), None
    if record["host"] != socket.gethostname():
        return "foreign", record
    try:
        fd = os.open(partial / WRITER_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return "gone", record
    try:
        if flock(fd, exclusive=True, wait=False):
            return "gone", record  # nobody holds it: its writer is dead (released at once: the fd is closed below)
        # no flock on this file system (locking.NO_FLOCK_ERRNOS): the writer's pid decides
        return ("alive" if pid_alive(record["pid"]) and record["pid"] != os.getpid() else "gone"), record
    except BlockingIOError:
        return "alive", record
    finally:
        os.close(fd)


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _newest_mtime(partial: Path) -> float:
    """The newest modification time in the ``.partial`` (itself, its record, its content folder and files)."""
    newest = 0.0
    for root, _dirs, names in os.walk(partial):
        for p in [root, *(os.path.join(root, n) for n in names)]:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, os.stat(p).st_mtime)
    return newest


def describe_writer(record: dict | None, partial: Path) -> str:
    """``"pid 123 on host node7, started 3 min ago"`` (or what is known of it)."""
    if record is None:
        return "a writer that left no writer.json"
    started = record.get("started")
    since = f", started {_age(time.time() - started)} ago" if isinstance(started, (int, float)) else ""
    return f"pid {record['pid']} on host {record['host']}{since}"


def _remove_stale(partial: Path, record: dict | None, log: Callable[[str], None]) -> None:
    """Rename a dead writer's ``.partial`` aside (one process wins if several try) and delete it, with one line."""
    aside = partial.with_name(f"{partial.name}.stale-{os.getpid()}-{time.monotonic_ns()}")
    try:
        if read_writer(partial) != record:  # re-claimed meanwhile by a live writer: leave it
            return
        os.rename(partial, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)
    log(f"removed a stale {partial} (left by {describe_writer(record, partial)}; that process is gone)")


def _start(partial: Path) -> int | None:
    """Claim ``partial`` (mkdir); the fd of its ``writer.json`` with our ``flock`` held, or None if it exists."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.mkdir()
    except FileExistsError:
        return None
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    fd = os.open(partial / WRITER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        flock(fd, exclusive=True, wait=False)  # held until the writer ends (none where there is no flock)
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
        (partial / CONTENT_DIR).mkdir()
    except BaseException:
        os.close(fd)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return fd


@contextlib.contextmanager
def claimed(out: str | os.PathLike, log: Callable[[str], None] = print, wait_s: float = 0.0) -> Iterator[Path]:
    """Claim ``out``'s ``.partial`` and yield its empty content folder (to fill and rename onto ``out``); the
    ``.partial`` is removed on exit, whatever happened. A stale one (its writer gone) is removed first with one line
    on ``log``. Another live writer: with ``wait_s`` 0, ``ValueError`` naming it; else wait for it to finish, up to
    ``wait_s`` seconds (for one on another host: while it is still being written), then ``ValueError`` naming it
    (host, pid, age) and what to do; the caller should check afterwards whether ``out`` is now complete."""
    partial = partial_path(out)
    started = time.monotonic()
    deadline = started + wait_s
    said = False
    while (fd := _start(partial)) is None:
        state, record = writer_state(partial)
        if state == "gone":
            _remove_stale(partial, record, log)
            continue
        active = time.time() - _newest_mtime(partial) < max(wait_s, START_GRACE_S)
        exiting = state == "alive" and record is not None and not pid_alive(record["pid"])
        if exiting:
            deadline = max(deadline, started + EXIT_GRACE_S)
        if time.monotonic() < deadline and (state == "alive" or active):
            if not said and not exiting:
                log(f"waiting for {describe_writer(record, partial)}, which is writing {out} ({partial})")
                said = True
            time.sleep(POLL_S)
            continue
        who = describe_writer(record, partial)
        if state == "alive":
            raise ValueError(f"{out}: another process is writing it ({who}; {partial}); wait for it to finish or "
                             f"stop it, then run again")
        quiet = _age(time.time() - _newest_mtime(partial))
        raise ValueError(f"{partial} was left by {who} and has not changed for {quiet}; this host cannot tell "
                         f"whether that process still runs, so it is kept: if nothing is writing {out} there, "
                         f"delete it (rm -r {partial}) and run again")
    try:
        yield partial / CONTENT_DIR
    finally:
        os.close(fd)
        shutil.rmtree(partial, ignore_errors=True)


def touch(content: Path) -> None:
    """Mark the ``.partial`` holding ``content`` as being written (its ``writer.json``'s mtime): between phases that
    write nothing, so that waiters on other hosts see it is alive."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(content.parent / WRITER_FILE)
