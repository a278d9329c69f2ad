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
    tensorboard/        TensorBoard event files (``tensorboard`` set)
    eval.json, zero_shot/   ``compare``'s evaluation of the run (cached) and its zero-shot predictions

A compare folder (``depthattn compare --out``) holds ``results.json``, ``report.md``, ``loss_curves.png``, one run
folder per (method, seed) under ``runs/``, the embedded corpus prepared into ``data/`` when no ``--data`` is given,
and its lock. ``depthattn.outputs`` checks that a new run or compare writes into a folder of only these names
(:data:`RUN_FOLDER_NAMES`, :data:`COMPARE_FOLDER_NAMES`); start-up cleanup removes only :func:`is_debris` names.

Readers (``checkpoint.open_checkpoint``) hold a shared ``fcntl.flock`` on the checkpoint folder they read, taken on
the folder itself (so the checkpoint's files and checksums stay as they are); pruning tries an exclusive
non-blocking ``flock`` on the same folder and leaves a folder someone reads for the next prune. Where the file
system has no ``flock`` (``ENOSYS``, ``EOPNOTSUPP``, ``ENOLCK``, ...) both sides go on without it.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .fileio import is_temporary

try:
    import fcntl
except ImportError:  # not POSIX: no flock, every lock is the fallback
    fcntl = None  # type: ignore[assignment]

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
DIVERGED_FILE = "diverged.json"
PARAM_GROUPS_FILE = "param_groups.json"
LOCK_FILE = "depthattn.lock"
WANDB_FILE = "wandb.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
EVAL_CACHE_FILE = "eval.json"
ZERO_SHOT_DIR = "zero_shot"
#: The files of a run folder that its writers replace atomically (``fileio.atomic_write_text``).
RUN_FILES = (RUN_FILE, PARAM_GROUPS_FILE, METRICS_FILE, SUMMARY_FILE, DIVERGED_FILE, WANDB_FILE, EVAL_CACHE_FILE)
#: Every name the project's writers create in a run folder.
RUN_FOLDER_NAMES = RUN_FILES + (LOCK_FILE, CHECKPOINT_DIR, TENSORBOARD_DIR, ZERO_SHOT_DIR)
#: Name prefixes of leftovers of interrupted writes and prunes (fileio temporaries, replaced and trashed folders).
DEBRIS_PREFIXES = (".tmp-", ".old-", ".trash-")
_STEP_DIR = re.compile(r"^step_(\d{8})$")
#: ``.trash-step_XXXXXXXX``: a pruned checkpoint folder renamed before it is deleted (``RunFolder.delete_checkpoints``).
_TRASHED_STEP = re.compile(r"^\.trash-step_\d{8}$")

COMPARE_RESULTS_FILE = "results.json"
COMPARE_RUNS_DIR = "runs"
COMPARE_DATA_DIR = "data"
#: The files of a compare folder that ``compare`` replaces atomically (the report and plot only beside its results).
COMPARE_FILES = (COMPARE_RESULTS_FILE, "report.md", "loss_curves.png")
#: Every name ``compare`` creates in its folder (``.data.partial``: ``data.staging``'s folder while it prepares
#: ``data/``), and the logs ``scripts/study.py`` keeps beside each compare it runs (compare never writes them).
COMPARE_FOLDER_NAMES = COMPARE_FILES + (COMPARE_RUNS_DIR, COMPARE_DATA_DIR, ".data.partial", LOCK_FILE, "study.log",
                                        "study_invocations.jsonl")

#: ``errno`` values with which a file system refuses ``flock`` (Lustre mounted ``noflock``: ENOSYS; some FUSE and
#: network file systems: EOPNOTSUPP / ENOLCK / EINVAL; a directory on an NFS emulation: EBADF).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.EBADF,
                             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)})


def is_debris(name: str) -> bool:
    """Whether ``name``, an entry of a run folder or of its ``checkpoints/``, is a leftover of an interrupted write or
    prune of the project's own writers: a ``fileio`` temporary of one of :data:`RUN_FILES` or of a folder
    (``.tmp-<random>run.json``, ``.tmp-step_XXXXXXXX-<random>``, ``.old-step_XXXXXXXX-<random>``,
    ``.tmp-step_XXXXXXXX-dcp``) or a trashed checkpoint (``.trash-step_XXXXXXXX``). Every such name starts with one of
    :data:`DEBRIS_PREFIXES`; a user's file that does too (``.tmp-notes.txt``) is not debris."""
    return name.startswith(DEBRIS_PREFIXES) and (is_temporary(name, RUN_FILES) or bool(_TRASHED_STEP.match(name)))


def step_dir_name(step: int) -> str:
    """``step_XXXXXXXX``: the name of the checkpoint folder of a global step."""
    return f"step_{step:08d}"


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name))


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
