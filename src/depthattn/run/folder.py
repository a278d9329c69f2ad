"""The run folder: one owner of its layout and its life (``RunFolder``).

A run folder holds (the names: ``depthattn.layout``)::

    run.json            resolved model + train config, data folder and fingerprint, resolved precision, package
                        versions, git revision (written by the trainer at start)
    param_groups.json   which parameters get weight decay (optim.py)
    metrics.jsonl       one JSON object per logged step: step, tokens, loss, lr, grad_norm, tokens_per_s,
                        and val_loss when measured
    summary.json        written when the run reaches its last step (strict JSON: an unknown number is null)
    depthattn.lock      the exclusive lock of the trainer that runs in it: host, pid, start time, command, heartbeat
    tensorboard/        TensorBoard event files (``TrainConfig.tensorboard``)
    checkpoints/step_XXXXXXXX/   a Hugging Face model folder plus train_config.json and trainer_state.pt
                                 (``run.checkpoints``; an FSDP run's: dcp/ shards instead, ``run.dcp``)

**The lock** is ``depthattn.run.lock.RunLock``.

**Readers** (eval, generate, inspect, analyze, export of a run) take no lock on the run folder: they hold a shared
``flock`` on the checkpoint folder they read (``checkpoint.open_checkpoint``), and ``delete_checkpoints`` leaves a
checkpoint so held in place (one line), to be deleted at the next prune. Checkpoints are assembled under a
temporary name and renamed into place (``fileio.write_folder_atomically``; DCP: ``run.dcp``), so a reader never
sees a half-written one.

**Crash consistency** (docs/reliability.md, "Training runs"): a torn last line of ``metrics.jsonl`` is dropped with a
note; pruned checkpoints are renamed to ``.trash-step_XXXXXXXX`` before they are deleted; leftovers of interrupted
writes (the temporaries the project's writers name: ``.tmp-<random>run.json``, ``.tmp-step_XXXXXXXX-<random>``,
``.old-…``, ``.trash-step_XXXXXXXX``; ``outputs.is_debris``) are removed when the lock holder starts
(``remove_debris``); other files, a user's ``.tmp-notes.txt`` included, are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import layout
from ..checkpoint import checkpoint_dirs
from ..fileio import atomic_write_text, finite_or_none, json_line, loads_json, read_json
from ..locking import lock_folder
from ..outputs import is_debris
from .lock import RunFolderLocked, RunLock, _NoLock


# ---------------------------------------------------------------------------------------------------- the folder
class RunFolder:
    """A run folder (``path``): the names of its files, reading and writing them, its checkpoints, pruning, start-up
    cleanup and its lock. Methods that write are called by the lock holder (rank 0 under torchrun)."""

    RUN_FILE = layout.RUN_FILE
    METRICS_FILE = layout.METRICS_FILE
    SUMMARY_FILE = layout.SUMMARY_FILE
    DIVERGED_FILE = layout.DIVERGED_FILE
    PARAM_GROUPS_FILE = layout.PARAM_GROUPS_FILE
    LOCK_FILE = layout.LOCK_FILE
    CHECKPOINT_DIR = layout.CHECKPOINT_DIR

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({os.fspath(self.path)!r})"

    # -- names
    @property
    def run_file(self) -> Path:
        return self.path / self.RUN_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / self.METRICS_FILE

    @property
    def summary_file(self) -> Path:
        return self.path / self.SUMMARY_FILE

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / self.CHECKPOINT_DIR

    def is_run(self) -> bool:
        """Whether the folder holds a run record (``run.json``)."""
        return self.run_file.is_file()

    # -- the lock
    def lock(self, what: str = "trainer") -> RunLock | _NoLock:
        """The folder's exclusive lock, taken (a context manager; ``release()``). Under torchrun global rank 0
        takes it and broadcasts its verdict, so every rank raises the same ``RunFolderLocked`` or none does."""
        import torch.distributed as dist

        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return RunLock(self.path, what).acquire()
        verdict: list[Any] = [None]
        lock: RunLock | _NoLock = _NoLock()
        if dist.get_rank() == 0:
            try:
                lock = RunLock(self.path, what).acquire()
            except (ValueError, OSError) as e:
                verdict = [(type(e).__name__, str(e))]
        dist.broadcast_object_list(verdict, src=0)
        dist.barrier()  # every rank has the verdict before rank 0 goes on (and, on an error, leaves the group)
        if verdict[0] is not None:
            kind, message = verdict[0]
            raise RunFolderLocked(message) if kind == RunFolderLocked.__name__ else OSError(message)
        return lock

    # -- run.json, param_groups.json, summary.json
    def read_run(self) -> dict[str, Any]:
        """The ``run.json`` (``ValueError`` / ``FileNotFoundError`` naming it)."""
        file = self.run_file
        if not file.is_file():
            raise FileNotFoundError(f"{file} not found: {os.fspath(self.path)!r} is not a depthattn run folder")
        try:
            return read_json(file, "run record")
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {file}: {e}") from e

    def write_run(self, record: Mapping[str, Any]) -> None:
        atomic_write_text(self.run_file, json.dumps(record, indent=2) + "\n")

    def write_param_groups(self, groups: Any) -> None:
        atomic_write_text(self.path / self.PARAM_GROUPS_FILE, json.dumps(groups, indent=2) + "\n")

    def read_summary(self) -> dict[str, Any] | None:
        """The ``summary.json`` if it is present and strict JSON, else None."""
        try:
            return read_json(self.summary_file, "run summary",
                             parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"non-JSON constant {c}")))
        except (OSError, ValueError):
            return None

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Write ``summary.json`` as strict JSON (non-finite numbers become null)."""
        atomic_write_text(self.summary_file, json.dumps(finite_or_none(summary), indent=2, allow_nan=False) + "\n")

    def drop_summary(self) -> None:
        self.summary_file.unlink(missing_ok=True)

    # -- diverged.json
    def write_divergence(self, record: Mapping[str, Any]) -> None:
        """Write ``diverged.json`` (strict JSON): why the run stopped (step, reason, value, ln V, best checkpoint)."""
        atomic_write_text(self.path / self.DIVERGED_FILE,
                          json.dumps(finite_or_none(record), indent=2, allow_nan=False) + "\n")

    def read_divergence(self) -> dict[str, Any] | None:
        """The ``diverged.json`` of a run the divergence guard or a non-finite value stopped, or None without a
        readable one."""
        try:
            record = read_json(self.path / self.DIVERGED_FILE, "divergence record")
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None

    # -- metrics.jsonl
    def read_metrics(self, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (empty without the file).

        A last line that does not parse (torn by a kill or a full disk mid-append) is dropped with a note through
        ``log`` (default: a ``UserWarning``) naming the file. Raises ``ValueError`` naming the file and line number
        for a bad line anywhere else, or a row that is not a JSON object with a ``step``."""
        file = self.metrics_file
        if not file.is_file():
            return []
        try:
            text = file.read_text(encoding="utf-8", errors="replace")  # a bad byte fails that line's parse
        except OSError as e:
            raise ValueError(f"cannot read {file}: {e}") from e
        lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
        rows = []
        for i, (n, line) in enumerate(lines):
            try:
                row = loads_json(line, f"{file}:{n}")
                if not (isinstance(row, dict) and "step" in row):
                    raise ValueError("not a JSON object with a step")
            except ValueError as e:
                if i == len(lines) - 1:
                    (log or (lambda m: warnings.warn(m, stacklevel=4)))(
                        f"{file}:{n}: dropped a torn last line (an interrupted write): {line[:60]!r}")
                    break
                raise ValueError(f"{file}:{n}: not a metrics row ({e}); fix or delete that line") from e
            rows.append(row)
        return rows

    def truncate_metrics(self, last_step: int, log: Callable[[str], None], log_every: int = 1) -> None:
        """Drop logged rows past ``last_step`` (logged before a crash, after the checkpoint we resume from); a
        missing log restarts empty, and a log that ends a ``log_every`` or more before ``last_step`` (rows lost),
        are said through ``log``.

        The log is rewritten only when a row (or a torn last line) is dropped, and then through
        ``fileio.atomic_write_text``: the rows are written to a temporary file beside it, fsync'd, and renamed over
        it (the folder fsync'd after), so a reader, a kill or a full disk (``OSError``, the temporary removed) at any
        moment leaves the old log whole or the new one, never no file or a part of one."""
        file = self.metrics_file
        if not file.is_file() and last_step > 0:
            log(f"{file} is missing: the metrics log restarts at step {last_step + 1} (rows of steps 1-{last_step} "
                f"are lost)")
        rows = [r for r in self.read_metrics(log) if r["step"] <= last_step]
        last_logged = max((int(r["step"]) for r in rows), default=0)
        if file.is_file() and last_step - last_logged >= max(1, log_every):
            log(f"{file} ends at step {last_logged}, before the checkpoint of step {last_step} (logging every "
                f"{log_every}): the rows in between were lost in a crash before they reached the disk; the curve "
                f"has a gap there")
        text = "".join(json_line(r) for r in rows)
        try:
            unchanged = file.read_text(encoding="utf-8") == text
        except (OSError, ValueError):  # missing, or not UTF-8 (read_metrics dropped the torn line): rewrite
            unchanged = False
        if not unchanged:
            atomic_write_text(file, text)

    # -- checkpoints
    def checkpoints(self) -> list[Path]:
        """The checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
        return checkpoint_dirs(self.path)

    def newest_checkpoint(self) -> Path | None:
        dirs = self.checkpoints()
        return dirs[-1] if dirs else None

    def checkpoint_path(self, step: int) -> Path:
        """Where the checkpoint of global ``step`` goes: ``checkpoints/step_XXXXXXXX``."""
        return self.checkpoints_dir / layout.step_dir_name(step)

    def delete_checkpoints(self, dirs: list[Path], log: Callable[[str], None] = print,
                           after_trash: Callable[[], None] | None = None) -> list[Path]:
        """Delete checkpoint folders (which ones is the caller's policy: ``checkpoints.prune_checkpoints``). Each is
        renamed to ``.trash-step_XXXXXXXX`` first, then deleted, so no half-deleted folder keeps a checkpoint's
        name. One that a reader holds (a shared ``flock``: ``checkpoint.open_checkpoint``) is left in place, said in
        one line, and deleted at the next prune. ``after_trash`` runs after each rename (a test's fault point).
        Returns the folders left in place."""
        deferred = []
        for old in dirs:
            try:
                fd = lock_folder(old, exclusive=True, wait=False)
            except BlockingIOError:
                deferred.append(old)
                continue
            except FileNotFoundError:
                continue
            try:
                trash = old.with_name(f".trash-{old.name}")
                shutil.rmtree(trash, ignore_errors=True)
                os.replace(old, trash)
                if after_trash is not None:
                    after_trash()
                shutil.rmtree(trash, ignore_errors=True)  # a leftover is removed when the run next starts
            finally:
                if fd is not None:
                    os.close(fd)
        if deferred:
            log(f"kept {', '.join(d.name for d in deferred)} for now: being read (eval, generate, export, ...); the "
                f"next prune deletes {'it' if len(deferred) == 1 else 'them'}")
        return deferred

    # -- start-up
    def remove_debris(self, log: Callable[[str], None]) -> list[str]:
        """Delete leftovers of interrupted writes in the folder and its ``checkpoints/`` (the names the project's
        writers give their temporaries: ``outputs.is_debris``; a user's ``.tmp-notes.txt`` stays), saying what was
        removed in one line; returns their names. Only the lock holder calls it (another trainer's temporary files
        are its own)."""
        removed = []
        for folder in (self.path, self.checkpoints_dir):
            if not folder.is_dir():
                continue
            for p in sorted(folder.iterdir()):
                if is_debris(p.name):
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
                    removed.append(str(p.relative_to(self.path)))
        if removed:
            log(f"removed leftovers of an interrupted write in {self.path}: {', '.join(removed)}")
        return removed

    def start(self, record: Mapping[str, Any], groups: Any, resume: bool, step: int, finished: bool = False,
              log: Callable[[str], None] = print) -> None:
        """The lock holder's first writes: leftovers of interrupted writes removed (``remove_debris``), ``run.json``
        and ``param_groups.json`` written; ``metrics.jsonl`` starts empty, or on ``resume`` keeps its rows up to
        ``step`` (a torn last line dropped, a missing log restarted: each said through ``log``). A stale
        ``summary.json`` is dropped, unless the run resumes at its last step (``finished``): then the summary
        stays and the trainer checks or re-creates it at the end; a ``diverged.json`` is dropped (judged again)."""
        self.remove_debris(log)
        if resume:
            self.truncate_metrics(step, log, int(record.get("train", {}).get("log_every", 1)))
        else:
            atomic_write_text(self.metrics_file, "")
        self.write_run(record)
        self.write_param_groups(groups)
        if not finished:
            self.drop_summary()
        (self.path / self.DIVERGED_FILE).unlink(missing_ok=True)  # this session judges again
