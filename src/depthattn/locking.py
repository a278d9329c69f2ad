"""``flock`` on files and folders, and whether a process is alive: the primitives the run folder's lock
(``run.lock.RunLock``), checkpoint readers and pruning (``checkpoint.open_checkpoint``, ``run.folder``) and data
staging (``data.staging``) share. Where the file system has no ``flock`` (``NO_FLOCK_ERRNOS``) the callers go on
without it.
"""

from __future__ import annotations

import errno
import os

try:
    import fcntl
except ImportError:  # not POSIX: no flock, every lock is the fallback
    fcntl = None  # type: ignore[assignment]

#: ``errno`` values with which a file system refuses ``flock`` (Lustre mounted ``noflock``: ENOSYS; some FUSE and
#: network file systems: EOPNOTSUPP / ENOLCK / EINVAL; a directory on an NFS emulation: EBADF).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF,
                             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


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
