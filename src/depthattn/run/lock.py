"""The exclusive lock of a run (or compare) folder (``RunLock``).

A trainer (fresh or resumed; under torchrun global rank 0, the other ranks wait for its verdict) and
``compare`` (on its ``--out``) take ``RunLock`` before they write anything, start-up cleanup included. The lock is
an ``fcntl.flock`` on ``depthattn.lock``: the kernel drops it when the process dies, so a kill -9 leaves no stale
lock (the file stays, with the dead holder's details, and the next trainer takes it). Where the file system refuses
``flock`` (``locking.NO_FLOCK_ERRNOS``: Lustre mounted ``noflock``) the lock is the file itself, created
exclusively (``O_EXCL``), with a heartbeat the holder refreshes every ``HEARTBEAT_S`` seconds; ``depthattn unlock
RUN`` removes one whose heartbeat is older than ``STALE_S`` on the file system's own clock (the file's mtime against
a file created beside it: no host's clock enters) and whose holder, when on this host, is gone. ``unlock`` never
removes a file whose ``flock`` anyone holds (on NFS, where ``flock`` is emulated with NFS locks, a dead client's
lasts until its lease expires) (docs/training-at-scale.md, "The run folder's lock"). A second trainer gets
``RunFolderLocked`` (a ``ValueError``: exit 2 at the CLI) naming the holder, and writes nothing; it is told of
``depthattn unlock`` only where the lock is the heartbeat file.

Readers hold a shared ``flock`` on the checkpoint folder they read (``locking.lock_folder``); pruning tries an
exclusive non-blocking one on the same folder and leaves a folder someone reads for the next prune.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..fileio import read_json
from ..layout import LOCK_FILE
from ..locking import flock, pid_alive

class RunFolderLocked(ValueError):
    """Another process holds the run (or compare) folder's lock, or ``unlock`` refused to break a live one. The
    message is one line naming the folder and the holder (pid, host, start time)."""


# ---------------------------------------------------------------------------------------------------- the lock
@dataclass
class LockHolder:
    """What a lock file records about the process that holds it (``heartbeat``: seconds since the epoch)."""

    host: str
    pid: int
    started: str  # UTC, ISO 8601
    command: str
    heartbeat: float
    mechanism: str  # "flock" or "heartbeat"

    def describe(self, now: float | None = None, age: float | None = None) -> str:
        """One line naming the holder; the heartbeat's ``age`` in seconds, or ``now`` (default: this host's
        clock) minus the recorded heartbeat."""
        if age is None:
            age = (time.time() if now is None else now) - self.heartbeat
        return (f"pid {self.pid} on host {self.host}, started {self.started} (heartbeat {age:.0f} s ago; "
                f"command: {self.command})")

    def alive_here(self) -> bool:
        """Whether the holder is a live process of this host (False for another host: unknown here)."""
        return self.host == socket.gethostname() and pid_alive(self.pid)


#: A lock file is rewritten in place at this size (JSON padded with spaces), so a reader never sees a shorter
#: rewrite's stale tail.
_RECORD_BYTES = 1024


def _read_holder(file: Path) -> LockHolder | None:
    """The holder a lock file names; None when it is missing or unreadable (read again once: a heartbeat may be
    rewriting it)."""
    for attempt in range(3):
        try:
            values = read_json(file, "lock file")
            return LockHolder(**{k: values[k] for k in LockHolder.__dataclass_fields__})
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.02)
    return None


class RunLock:
    """The exclusive lock of a run (or compare) folder; see the module docstring for the mechanisms.

    ``with RunLock(folder, "trainer"):`` or ``acquire()`` / ``release()``. ``acquire`` creates ``folder`` when it
    does not exist (and ``release`` removes it again when it is still empty: a start that failed leaves nothing).
    Raises ``RunFolderLocked`` naming the holder when another process holds it; an ``OSError`` of the file system.
    """

    #: Seconds between heartbeats; a heartbeat older than ``STALE_S`` marks a holder that stopped.
    HEARTBEAT_S = 30.0
    STALE_S = 300.0

    def __init__(self, folder: str | os.PathLike, what: str = "trainer"):
        self.folder, self.what = Path(folder), what
        self.file = self.folder / LOCK_FILE
        self.mechanism: str | None = None
        self._fd: int | None = None
        self._created_folder = False
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._holder: LockHolder | None = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> LockHolder | None:
        """The process the lock file names (None without a readable one)."""
        return _read_holder(self.file)

    def _refusal(self) -> RunFolderLocked:
        holder = self.holder()
        who = holder.describe() if holder else "another process (its details are not written yet)"
        if self.mechanism == "flock":  # the kernel's lock is held: its holder is running (unlock refuses too)
            return RunFolderLocked(f"{self.folder} is in use by another {self.what}: {who}; it holds the lock, so it "
                                   f"is running: wait for it to finish or stop it, or choose another --out")
        return RunFolderLocked(f"{self.folder} is in use by another {self.what}: {who}; wait for it to finish or "
                               f"stop it, or choose another --out; if that process is gone, run: depthattn unlock "
                               f"{self.folder} (refused while the heartbeat is fresh)")

    def acquire(self) -> "RunLock":
        if self._fd is not None:
            return self
        if not self.folder.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self._created_folder = True
        try:
            self._acquire_flock() or self._acquire_exclusive_file()
        except BaseException:
            self._remove_created_folder()
            raise
        self._holder = LockHolder(socket.gethostname(), os.getpid(),
                                  datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                  " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])[:500],
                                  time.time(), self.mechanism or "flock")
        try:
            self._write_holder()
        except BaseException:  # a full disk: hold nothing, leave nothing
            self.release()
            raise
        self._thread = threading.Thread(target=self._beat, name=f"depthattn-lock-{self.folder.name}", daemon=True)
        self._thread.start()
        return self

    def _acquire_flock(self) -> bool:
        """Take the ``flock`` (True), or False when the file system refuses ``flock``."""
        for _ in range(10):
            try:
                fd, created = os.open(self.file, os.O_RDWR), False
            except FileNotFoundError:
                try:
                    fd, created = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
                except FileExistsError:
                    continue  # created by another process meanwhile: open that one
            try:
                if not flock(fd, exclusive=True, wait=False):
                    os.close(fd)
                    if created:  # ours, and without flock the file itself is the lock: start from nothing
                        self.file.unlink(missing_ok=True)
                    return False
            except BlockingIOError:
                os.close(fd)
                self.mechanism = "flock"
                raise self._refusal() from None
            try:  # the file may have been removed (a release, depthattn unlock) between our open and our lock
                same = os.stat(self.file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd, self.mechanism = fd, "flock"
                return True
            os.close(fd)
        raise OSError(errno.EAGAIN, "the lock file keeps being replaced", str(self.file))

    def _acquire_exclusive_file(self) -> None:
        self.mechanism = "heartbeat"
        try:
            self._fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise self._refusal() from None

    def _write_holder(self) -> None:
        """Rewrite the lock file in place (the ``flock`` is on its inode: no rename) with a new heartbeat."""
        with self._write_lock:
            if self._fd is None or self._holder is None:
                return
            self._holder.heartbeat = time.time()
            data = json.dumps(self._holder.__dict__).encode().ljust(_RECORD_BYTES - 1) + b"\n"
            os.pwrite(self._fd, data, 0)
            if os.fstat(self._fd).st_size != len(data):
                os.ftruncate(self._fd, len(data))
            os.fsync(self._fd)

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_S):
            try:
                self._write_holder()
            except OSError:  # a full disk or a lost mount: the next beat tries again
                pass

    def release(self) -> None:
        """Drop the lock and remove its file (nothing when not held)."""
        if self._fd is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._write_lock:
            try:
                if os.stat(self.file).st_ino == os.fstat(self._fd).st_ino:
                    self.file.unlink()  # while still holding it: a waiter re-checks the inode (_acquire_flock)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
        self._remove_created_folder()

    def _remove_created_folder(self) -> None:
        if self._created_folder:
            try:
                self.folder.rmdir()  # only when still empty
            except OSError:
                pass
            self._created_folder = False

    @classmethod
    def unlock(cls, folder: str | os.PathLike, log: Callable[[str], None] = print) -> bool:
        """``depthattn unlock``: remove the lock file of a holder that is gone; False (said through ``log``) when
        the folder is not locked. Raises ``RunFolderLocked`` while anyone holds the file's ``flock``; where the
        file system refuses ``flock``, while the holder is a live process of this host or its heartbeat is fresh:
        the lock file was written less than ``STALE_S`` seconds ago on the file system's own clock
        (``_heartbeat_age``), whatever the holder's or this host's clock says."""
        file = Path(folder) / LOCK_FILE
        if not file.exists():
            log(f"{folder} is not locked (no {LOCK_FILE})")
            return False
        holder = _read_holder(file)
        who = holder.describe() if holder else "an unreadable lock file"
        state, probe = cls._flock_state(file)
        try:  # our probe lock (when "free") is held until the file is gone: no trainer can take it meanwhile
            if state == "held":
                raise RunFolderLocked(f"refusing to unlock {folder}: a running process holds its lock (flock): "
                                      f"{who}; wait for it to finish or stop it")
            if state != "free":
                if holder is not None and holder.alive_here():
                    raise RunFolderLocked(f"refusing to unlock {folder}: its holder is running on this host: {who}")
                age = _heartbeat_age(file)
                who = holder.describe(age=age) if holder else who
                if age < cls.STALE_S:
                    raise RunFolderLocked(f"refusing to unlock {folder}: the heartbeat is fresh (under "
                                          f"{cls.STALE_S:.0f} s): {who}; if the holder is gone, try again after the "
                                          f"heartbeat is stale")
            file.unlink(missing_ok=True)
        finally:
            if probe is not None:
                os.close(probe)
        log(f"removed the stale lock of {folder}: {who}")
        return True

    @classmethod
    def in_use(cls, folder: str | os.PathLike) -> bool:
        """Whether a live process holds ``folder``'s lock, judged as ``unlock`` judges it: another process holds the
        lock file's ``flock``; or, where the file system refuses ``flock``, the holder is a live process of this host
        or the heartbeat is under ``STALE_S`` seconds old. False without a lock file (or with one a dead holder left).
        Never takes or breaks the lock."""
        file = Path(folder) / LOCK_FILE
        if not file.exists():
            return False
        state, probe = cls._flock_state(file)
        if probe is not None:
            os.close(probe)
        if state != "none":
            return state == "held"
        holder = _read_holder(file)
        if holder is not None and holder.alive_here():
            return True
        try:
            return _heartbeat_age(file) < cls.STALE_S
        except OSError:
            return False

    @staticmethod
    def _flock_state(file: Path) -> tuple[str, int | None]:
        """``("held", None)`` (another process holds ``file``'s ``flock``, or replaced the file meanwhile),
        ``("free", fd)`` with our shared lock held on ``fd`` (close it to drop it), or ``("none", None)`` (the file
        system refuses ``flock``, or ``file`` cannot be opened to try). The probe is a shared lock on a read-only
        descriptor: it conflicts with a holder's exclusive lock and needs no write permission on the file."""
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            return "none", None
        try:
            if not flock(fd, exclusive=False, wait=False):
                os.close(fd)
                return "none", None
            if os.stat(file).st_ino != os.fstat(fd).st_ino:  # a trainer took over a new file since we opened it
                os.close(fd)
                return "held", None
            return "free", fd
        except BlockingIOError:
            os.close(fd)
            return "held", None
        except OSError:
            os.close(fd)
            raise


def _heartbeat_age(file: Path) -> float:
    """Seconds since ``file`` was last written, on its file system's clock: its mtime against the mtime of a probe
    file created (and touched) beside it now, then removed (``.tmp-`` named: a leftover is debris). Neither the
    writer's clock nor this host's enters, so a skew between nodes cannot make a fresh heartbeat look stale.
    Raises ``OSError`` (the folder not writable, the file gone)."""
    fd = os.open(file, os.O_RDONLY)  # an open revalidates cached attributes (NFS: close-to-open)
    try:
        written = os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
    probe_fd, probe = tempfile.mkstemp(dir=file.parent, prefix=f".tmp-{file.name}-clock-")
    try:
        os.close(probe_fd)
        os.utime(probe)  # "now" as the file system sets it (NFS: the server's time)
        now = os.stat(probe).st_mtime_ns
    finally:
        os.unlink(probe)
    return (now - written) / 1e9


class _NoLock:
    """What a rank other than 0 holds under torchrun: rank 0 holds the lock for the job."""

    held = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def release(self) -> None:
        pass
