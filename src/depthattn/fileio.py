"""Atomic file writes and sha256 hashes: the one place the package writes a file in place of another.

Every writer assembles its output under a temporary name beside the target (same folder, so the final
``os.replace`` is a rename on one file system) and renames it into place only when it is complete; on any error the
temporary file or folder is removed and the target is left as it was. This module imports nothing from
``depthattn`` (it is the bottom of the import graph).

- :func:`atomic_write_text` -- one text file, fsync'd before the rename (configs, run records, results).
- :func:`atomic_paths` / :func:`atomic_path` -- temporary paths to fill, renamed onto their targets in order
  (prepared-data folders, corpus files); :func:`atomic_write_bytes` and :func:`atomic_write_json` build on them.
- :func:`write_folder_atomically` -- a whole folder (checkpoints, exported models).
- :func:`sha256_bytes` / :func:`sha256_file` -- hex digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# ------------------------------------------------------------------------------------------------------------------
# files


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    The temporary file (``.tmp-<name>`` plus a random part, mode 0600 as ``mkstemp`` creates it) is flushed and
    fsync'd before the rename, and removed if anything fails; the folder is created if missing."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_paths(paths: Sequence[str | Path]) -> Iterator[list[Path]]:
    """Yield one temporary path beside each of ``paths`` (``.<name>.<random>.tmp``, created empty); when the block
    succeeds, each is made mode 0644 and renamed onto its target, in the order given (put the file that vouches
    for the others last). If the block raises, every temporary file is removed and no target is touched.

    Parent folders are created if missing."""
    targets = [Path(p) for p in paths]
    temps: list[Path] = []
    try:
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            temps.append(Path(tmp))
        yield list(temps)
        for target in targets:
            os.chmod(temps[0], 0o644)  # mkstemp creates 0600; written files are ordinary data files
            os.replace(temps[0], target)
            temps.pop(0)
    finally:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path`` (``os.replace``), else is removed."""
    with atomic_paths([path]) as (tmp,):
        yield tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | Path, obj: object) -> None:
    """``obj`` as indented UTF-8 JSON (non-ASCII kept as is) with a final newline."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


# ------------------------------------------------------------------------------------------------------------------
# folders


def write_folder_atomically(path: str | os.PathLike, fill: Callable[[str], None]) -> None:
    """Create folder ``path`` by calling ``fill(tmpdir)`` on a temporary sibling, then renaming it into place.

    An existing folder at ``path`` is replaced only after ``fill`` succeeded.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".tmp-{os.path.basename(path)}-")
    try:
        fill(tmp)
        if os.path.exists(path):
            old = tempfile.mkdtemp(dir=parent, prefix=f".old-{os.path.basename(path)}-")
            os.rmdir(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------------------------------------
# hashes


def sha256_bytes(data: bytes) -> str:
    """sha256 of ``data``, as 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's contents, as 64 hex digits (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------------------------
# staged folders (many files, one index written last)


def install_staged_files(staging: str | Path, folder: str | Path, names: Sequence[str],
                         stale: Sequence[str] = ()) -> None:
    """Move files ``names`` from folder ``staging`` into ``folder`` (both on one file system), ``names[-1]`` (the
    index that vouches for the others) last.

    The index already in ``folder`` is removed first, so an interruption part-way leaves a folder without an index
    (never an old index beside new files); then each file is fsync'd and renamed into place, the files in ``stale``
    (left over from a previous content, not in ``names``) are deleted, and ``folder`` is fsync'd."""
    staging, folder = Path(staging), Path(folder)
    with contextlib.suppress(FileNotFoundError):
        (folder / names[-1]).unlink()
    for name in names:
        with open(staging / name, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(staging / name, 0o644)
        os.replace(staging / name, folder / name)
    for name in stale:
        if name not in names:
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
