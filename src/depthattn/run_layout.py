"""The names of a run folder's files and the shared lock on a checkpoint folder being read.

The library half of the run folder (``depthattn.training.run_folder.RunFolder`` owns its life: the trainer's
exclusive lock, run.json, metrics, pruning, start-up cleanup, summary): the names are here so that
``depthattn.checkpoint`` (which finds a run's checkpoints for eval, generate, export, analyze and convert) and the
training layer spell them once. A run folder holds::

    run.json            the run record (resolved configs, data, precision, versions)
    param_groups.json   which parameters get weight decay
    metrics.jsonl       one JSON object per logged step
    summary.json        written when the run reaches its last step
    diverged.json       written when the divergence guard or a non-finite value stopped the run (removed when it
                        restarts)
    wandb.json          the Weights & Biases run id (``wandb_project`` set): a resumed run logs into the same W&B run
    depthattn.lock      the trainer's lock: host, pid, start time, command, heartbeat (only while it runs, or
                        after a kill; ``RunFolder`` / ``depthattn unlock``)
    checkpoints/step_XXXXXXXX/   one checkpoint folder per saved step

Readers (``checkpoint.open_checkpoint``) hold a shared ``fcntl.flock`` on the checkpoint folder they read, taken on
the folder itself (so the checkpoint's files and checksums stay as they are); pruning tries an exclusive
non-blocking ``flock`` on the same folder and leaves a folder someone reads for the next prune. Where the file
system has no ``flock`` (``ENOSYS``, ``EOPNOTSUPP``, ``ENOLCK``, ...) both sides go on without it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no flock, every lock is the fallback
    fcntl = None  # type: ignore[assignment]

from .layout import (CHECKPOINT_DIR, DEBRIS_PREFIXES, DIVERGED_FILE, LOCK_FILE, METRICS_FILE,  # noqa: F401
                     PARAM_GROUPS_FILE, RUN_FILE, STEP_DIR, SUMMARY_FILE, WANDB_FILE, step_dir_name)

#: ``errno`` values with which a file system refuses ``flock`` (Lustre mounted ``noflock``: ENOSYS; some FUSE and
#: network file systems: EOPNOTSUPP / ENOLCK / EINVAL; a directory on an NFS emulation: EBADF).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF,
                             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def flock(fd: int, exclusive: bool, wait: bool) -> bool:
    """``fcntl.flock`` on ``fd``: True when held, False when the file system has no ``flock`` (``NO_FLOCK_ERRNOS``).
    Raises ``BlockingIOError`` when ``wait`` is False and another process holds a conflicting lock."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        raise
    except OSError as e:
        if e.errno in NO_FLOCK_ERRNOS:
            return False
        raise


def lock_folder(folder: str | os.PathLike, exclusive: bool, wait: bool) -> int | None:
    """Open ``folder`` and ``flock`` it (shared: a reader; exclusive: pruning). Returns the descriptor (close it to
    release), or None when the file system refuses ``flock`` (then nothing is held: callers go on without it).

    Raises ``FileNotFoundError`` when the folder is gone or was renamed away (pruned) while we waited for the lock,
    ``BlockingIOError`` when another process holds a conflicting lock and not ``wait``."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if not flock(fd, exclusive, wait):
            os.close(fd)
            return None
        if os.stat(folder).st_ino != os.fstat(fd).st_ino:
            raise FileNotFoundError(errno.ENOENT, "renamed away while waiting for its lock", os.fspath(folder))
    except BaseException:
        os.close(fd)
        raise
    return fd
