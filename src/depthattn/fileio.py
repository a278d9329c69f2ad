"""Atomic, durable file writes and sha256 hashes: the one place the package writes a file in place of another.

Every writer assembles its output under a temporary name beside the target (same folder, so the final
``os.replace`` is a rename on one file system) and renames it into place only when it is complete; on any error the
temporary file or folder is removed and the target is left as it was. Writes are durable: each file is fsync'd
before its rename and the folder that holds the new name is fsync'd after it, so after a power cut the target is
either the old content or the complete new one. Files get the mode the umask gives ordinary files
(``0o666 & ~umask``), folders ``0o777 & ~umask`` (``mkstemp`` / ``mkdtemp`` alone would make them 0600 / 0700,
unreadable to the rest of a shared group). This module imports only ``depthattn.layout`` (the names; it is the
bottom of the import graph).

- :func:`atomic_write_text` -- one text file (configs, run records, results).
- :func:`atomic_paths` / :func:`atomic_path` -- temporary paths to fill, renamed onto their targets in order
  (prepared-data folders, corpus files); :func:`atomic_write_bytes` and :func:`atomic_write_json` build on them.
- :func:`write_folder_atomically` -- a whole folder (checkpoints, exported models), with a ``checksums.json``
  manifest of its files' sha256 (:func:`verify_manifest` checks a file against it when it is read).
- :func:`is_temporary` -- whether a name is a leftover of one of these writers (killed mid-write).
- :func:`sha256_bytes` / :func:`sha256_file` -- hex digests.
- :func:`read_json` / :func:`loads_json` -- every JSON file the package reads, with its size and nesting depth
  bounded (a ``config.json`` nested 10⁶ deep is one ``ValueError``, not a ``RecursionError``).
- :func:`finite_or_none` / :func:`json_line` -- strict JSON out (a non-finite number is written as null).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .layout import MANIFEST_FILE

#: The manifest :func:`write_folder_atomically` writes last into each folder: ``{"sha256": {relative path: hex}}``.
MANIFEST_NAME = MANIFEST_FILE
_CHUNK = 1 << 20  # hash and copy in 1 MiB pieces


class IntegrityError(ValueError):
    """A file's sha256 differs from the one recorded when it was written (bit rot, a torn copy, an edit)."""


# ------------------------------------------------------------------------------------------------------------------
# bounded JSON reading

#: Deepest nesting accepted in a JSON document read from disk (ours are at most 4 deep; serde_json, which reads
#: ``tokenizer.json`` inside ``tokenizers``, stops at 128 as well). Python's own parser would raise
#: ``RecursionError`` near 1000 levels, and deep values would make every later recursive walk fail too.
MAX_JSON_DEPTH = 128
#: Largest JSON file :func:`read_json` reads unless the caller states another bound (configs, manifests, run
#: records and metadata are kilobytes; a safetensors header has its own bound).
MAX_JSON_BYTES = 64 << 20


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` and ``{}`` are 1), walked without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            todo.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads_json(text: str | bytes, source: str, max_depth: int = MAX_JSON_DEPTH, **kwargs) -> object:
    """``json.loads(text, **kwargs)`` with the nesting depth bounded: ``ValueError`` naming ``source`` (a file, or
    ``file:line``) for a document nested deeper than ``max_depth``. Parse errors are ``json.JSONDecodeError`` (a
    ``ValueError``) as usual."""
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:  # Python's parser gives up near sys.getrecursionlimit() levels, in microseconds
        value = None
        too_deep = True
    else:
        too_deep = json_depth(value) > max_depth
    if too_deep:
        raise ValueError(f"{source}: JSON nested more than {max_depth} levels deep (depthattn.fileio.MAX_JSON_DEPTH); "
                         f"the file is damaged or not one depthattn reads")
    return value


def read_json(path: str | os.PathLike, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, **kwargs) -> object:
    """The parsed JSON of file ``path``, its size checked before it is read and its depth after
    (:func:`loads_json`). Raises ``ValueError`` naming ``what`` and the file when it is larger than ``max_bytes``,
    not UTF-8, not JSON or too deep; ``OSError`` (``FileNotFoundError`` included) as the file system reports it."""
    path = os.fspath(path)
    size = os.stat(path).st_size
    if size > max_bytes:
        raise ValueError(f"{what} {path} is {size} bytes, above the bound of {max_bytes} bytes for such a file; it "
                         f"is not one depthattn wrote")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    try:
        return loads_json(data.decode("utf-8"), path, max_depth, **kwargs)
    except UnicodeDecodeError as e:
        raise ValueError(f"cannot read {what} {path}: not UTF-8 ({e})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot read {what} {path}: {e}") from e


# ------------------------------------------------------------------------------------------------------------------
# modes and fsync

_UMASK: int | None = None


def umask() -> int:
    """The process umask, read once (``os.umask`` can only be read by setting it; it is restored at once) and
    cached: call it from the main thread before starting threads that create files."""
    global _UMASK
    if _UMASK is None:
        current = os.umask(0o022)
        os.umask(current)
        _UMASK = current
    return _UMASK


def file_mode() -> int:
    """The mode ``open()`` gives a new ordinary file: ``0o666 & ~umask`` (0644 under umask 022)."""
    return 0o666 & ~umask()


def folder_mode() -> int:
    """The mode ``mkdir`` gives a new folder: ``0o777 & ~umask`` (0755 under umask 022)."""
    return 0o777 & ~umask()


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a folder by path (a folder: so that the names created or renamed in it are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------------------------
# files


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same folder and ``os.replace``.

    The temporary file (``.tmp-<name>`` plus a random part) is fsync'd and given :func:`file_mode` before the
    rename, the folder is fsync'd after it, and the temporary is removed if anything fails; the folder is created
    if missing."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(folder)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:  # a full disk names no file
            raise OSError(e.errno, e.strerror, path) from e
        raise


@contextlib.contextmanager
def atomic_paths(paths: Sequence[str | Path]) -> Iterator[list[Path]]:
    """Yield one temporary path beside each of ``paths`` (``.<name>.<random>.tmp``, created empty); when the block
    succeeds, each is fsync'd, given :func:`file_mode` and renamed onto its target, in the order given (put the
    file that vouches for the others last), and each target folder is fsync'd. If the block raises, every
    temporary file is removed and no target is touched.

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
        for tmp in temps:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fchmod(fd, file_mode())
                os.fsync(fd)
            finally:
                os.close(fd)
        for target in targets:
            os.replace(temps[0], target)
            temps.pop(0)
        for folder in dict.fromkeys(t.parent for t in targets):
            fsync_path(folder)
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


def _files_under(folder: str) -> list[str]:
    """Relative paths (``/``-separated, sorted) of the regular files under ``folder``, the manifest excepted."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, folder).replace(os.sep, "/")
            if rel != MANIFEST_NAME and os.path.isfile(full) and not os.path.islink(full):
                out.append(rel)
    return sorted(out)


def seal_folder(folder: str | os.PathLike, manifest: bool, unhashed: Sequence[str] = ()) -> None:
    """Give every file and folder under ``folder`` the umask's modes, write the manifest (last) when asked, and
    fsync every file and then every folder, deepest first. Files whose relative path starts with one of
    ``unhashed`` (e.g. ``"dcp/"``: shards too large to hash on one rank) are fsync'd but left out of the manifest."""
    folder = os.fspath(folder)
    names = _files_under(folder)
    digests = {}
    for rel in names:
        full = os.path.join(folder, rel)
        os.chmod(full, file_mode())
        if manifest and not rel.startswith(tuple(unhashed)):
            digests[rel] = sha256_file(full)
        fsync_path(full)
    if manifest:
        body = json.dumps({"algorithm": "sha256", "sha256": digests}, indent=2, sort_keys=True) + "\n"
        with open(os.path.join(folder, MANIFEST_NAME), "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fchmod(f.fileno(), file_mode())
            os.fsync(f.fileno())
    folders = [root for root, _dirs, _names in os.walk(folder)]
    for sub in sorted(folders, key=lambda p: -p.count(os.sep)):
        os.chmod(sub, folder_mode())
        fsync_path(sub)


def write_folder_atomically(path: str | os.PathLike, fill: Callable[[str], None], manifest: bool = True,
                            staging: str | os.PathLike | None = None) -> None:
    """Create folder ``path`` by calling ``fill(tmpdir)`` on a temporary sibling, then renaming it into place.

    After ``fill`` every file under the temporary folder gets :func:`file_mode` (folders :func:`folder_mode`), and,
    with ``manifest``, their sha256 go into ``checksums.json`` (:data:`MANIFEST_NAME`, written last); every file
    and folder is fsync'd, the folder is renamed into place and the parent is fsync'd. An existing folder at
    ``path`` is replaced only after all that succeeded: it is renamed aside (``.old-<name>-*``), the new one renamed
    into place, and only then is the old one deleted; if the second rename fails the old one is renamed back, so
    ``path`` is at every moment the old folder or the new one (deciding *whether* ``path`` may be replaced is the
    caller's: :mod:`depthattn.outputs`). ``staging``: an empty folder on the same file system to fill instead of a
    new random ``.tmp-<name>-*`` sibling (e.g. one inside a ``.partial`` that records its writer); it is consumed
    by the rename, or removed on failure like the random one. Hashing reads every byte once more: 0.33 GiB/s
    measured on one shared core of the 2-core CI-class machine, i.e. about 3 s per GiB written (a 3B model's fp32
    weights and Adam state, ~36 GB, take ~2 minutes per checkpoint); pass ``manifest=False`` to skip it."""
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.fspath(staging) if staging is not None else tempfile.mkdtemp(
        dir=parent, prefix=f".tmp-{os.path.basename(path)}-")
    try:
        fill(tmp)
        seal_folder(tmp, manifest)
        replace_folder(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_folder(new: str | os.PathLike, path: str | os.PathLike) -> None:
    """Rename the finished folder ``new`` to ``path`` (same file system) so that ``path`` is at every moment the old
    folder or the new one: an existing ``path`` is renamed aside (``.old-<name>-*``, a leftover a run's start-up
    cleanup removes) first, put back if the second rename fails, and deleted after it (a symlink there is unlinked,
    never what it points to); the parent is fsync'd."""
    new, path = os.fspath(new), os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if not os.path.lexists(path):
        os.replace(new, path)
        fsync_path(parent)
        return
    old = tempfile.mkdtemp(dir=parent, prefix=f".old-{os.path.basename(path)}-")
    os.rmdir(old)
    os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(old, path)  # put the old folder back: never neither
        raise
    fsync_path(parent)
    if os.path.islink(old) or not os.path.isdir(old):
        os.unlink(old)
    else:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(folder: str | os.PathLike) -> dict[str, str] | None:
    """``{relative path: sha256}`` of a folder's ``checksums.json``; None when it has none (folders written before
    manifests existed, or by other tools). Raises :class:`IntegrityError` naming it if it is unreadable."""
    file = os.path.join(os.fspath(folder), MANIFEST_NAME)
    try:
        values = read_json(file, "checksum manifest")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise IntegrityError(f"{file}: unreadable checksum manifest ({e}); the folder is damaged") from e
    digests = values.get("sha256") if isinstance(values, dict) else None
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise IntegrityError(f"{file}: not a checksum manifest (expected {{\"sha256\": {{file: hex}}}}); the folder "
                             f"is damaged")
    return digests


#: Files this process has hashed and found as their manifest says: real path -> (size, mtime_ns, ctime_ns, inode,
#: device, sha256). A later check of the same file in the same process (the shape check, then the weight read) is
#: skipped while all of these are unchanged. Every write through the file system sets the ctime to the current
#: time, and user space cannot set it back (``os.utime`` sets the mtime and makes the ctime *now*), so a rewrite,
#: a copy over it or a rename onto it is hashed again -- unless it lands in the same timestamp tick as the ctime
#: recorded, which :func:`is_racy` rules out by never remembering a file changed within a tick of its hash (git's
#: "racy clean" rule). Not caught, as by any stat-keyed cache: a change below the file system (bit rot, a
#: raw-device write) during the process's life.
_VERIFIED: dict[str, tuple] = {}
#: How long after its last change a file is too fresh to be remembered as verified: a timestamp tick of the file
#: system. Linux stamps files from the kernel's coarse clock (one tick, at most 10 ms at HZ=100) on ext4, xfs,
#: btrfs and tmpfs; a file system that keeps whole seconds (ctime a multiple of 1 s) gets 2 s (FAT, ext3, some NFS).
RACY_FINE_NS = 10_000_000
RACY_NS = 2_000_000_000


def is_racy(st: os.stat_result, started_ns: int) -> bool:
    """Whether a file with status ``st``, hashed from ``time.time_ns() == started_ns`` on, changed so shortly
    before that a later rewrite could keep its (size, mtime, ctime, inode): then it must not be remembered as
    verified (:data:`_VERIFIED`, ``data.integrity``'s ``.verified.json``)."""
    window = RACY_NS if st.st_ctime_ns % 1_000_000_000 == 0 else RACY_FINE_NS
    return started_ns - st.st_ctime_ns <= window


def _stat_key(st: os.stat_result) -> tuple:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


def verify_manifest(folder: str | os.PathLike, names: Sequence[str] | None = None,
                    skip: Sequence[str] = ()) -> list[str]:
    """Check files of ``folder`` against its ``checksums.json``: those in ``names`` (relative paths) that the
    manifest lists, or with ``names=None`` every file it lists but those in ``skip``; whatever their modification
    time (a file rewritten after the manifest is checked like any other: our own writers that rewrite a file of a
    sealed folder rewrite its entry, :func:`rewrite_manifest_entries`). Returns the names checked (empty without
    a manifest: nothing to check against). Reads each file once per process (see :data:`_VERIFIED`).
    Raises :class:`IntegrityError` naming the first file whose sha256 differs (with both digests' first 16 hex
    digits) or that is missing (a dangling symlink included)."""
    digests = read_manifest(folder)
    if digests is None:
        return []
    checked = []
    wanted = [n for n in sorted(digests) if n not in skip] if names is None else [n for n in names if n in digests]
    for rel in wanted:
        file = os.path.join(os.fspath(folder), rel)
        if not os.path.isfile(file):
            raise IntegrityError(f"{file}: missing, but {MANIFEST_NAME} lists it; the folder is incomplete")
        want, real = digests[rel], os.path.realpath(file)
        st = os.stat(real)
        if _VERIFIED.get(real) == (*_stat_key(st), want):
            checked.append(rel)
            continue
        started = time.time_ns()
        got = sha256_file(real)
        if got != want:
            raise IntegrityError(f"{file}: sha256 {got[:16]}… does not match {MANIFEST_NAME} ({want[:16]}…): the file "
                                 f"is truncated or corrupt; restore it or use another checkpoint (if you replaced it "
                                 f"on purpose, delete {MANIFEST_NAME})")
        if not is_racy(st, started) and _stat_key(os.stat(real)) == _stat_key(st):
            _VERIFIED[real] = (*_stat_key(st), want)
        checked.append(rel)
    return checked


def file_states(folder: str | os.PathLike) -> dict[str, tuple]:
    """``{relative path: (size, mtime_ns, ctime_ns, inode, device)}`` of the regular files under ``folder`` (the
    manifest excepted; empty for a folder that does not exist): what :func:`rewrite_manifest_entries` compares."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return {}
    return {rel: _stat_key(os.stat(os.path.join(folder, rel))) for rel in _files_under(folder)}


def rewrite_manifest_entries(folder: str | os.PathLike, before: dict[str, tuple]) -> list[str]:
    """After a writer of ours rewrote files of a sealed ``folder`` in place (``save_pretrained`` into a checkpoint
    folder): hash the files that are new or changed since ``before`` (:func:`file_states` taken before the write),
    drop the entries of files the writer removed, and write ``checksums.json`` again (atomically). Files the writer
    did not touch keep their recorded digest, so damage they had before is still caught. Nothing happens in a
    folder without a manifest. Returns the relative paths (re)hashed."""
    digests = read_manifest(folder)
    if digests is None:
        return []
    now = file_states(folder)
    changed = [rel for rel, key in now.items() if before.get(rel) != key]
    for rel in changed:
        digests[rel] = sha256_file(os.path.join(os.fspath(folder), rel))
    for rel in [r for r in digests if r not in now and r in before]:
        del digests[rel]
    body = json.dumps({"algorithm": "sha256", "sha256": digests}, indent=2, sort_keys=True) + "\n"
    atomic_write_text(os.path.join(os.fspath(folder), MANIFEST_NAME), body)
    return changed


# ------------------------------------------------------------------------------------------------------------------
# the names of temporaries

#: The random part ``tempfile`` puts in the temporary names above (8 of ``[a-z0-9_]``; any length is matched).
_RANDOM = r"[a-z0-9_]+"


def is_temporary(name: str, files: Iterable[str] = (), folders: Iterable[str] = ()) -> bool:
    """Whether ``name`` (an entry of a folder) is what one of this module's writers leaves when it is killed
    mid-write, for one of the names the folder's writers write: ``.tmp-<random><file>`` (:func:`atomic_write_text`)
    or ``.<file>.<random>.tmp`` (:func:`atomic_paths`) for one of ``files``; ``.tmp-<folder>-<random>`` /
    ``.old-<folder>-<random>`` (:func:`write_folder_atomically`, :func:`replace_folder`) for a folder whose name
    matches one of the regular expressions ``folders``. A name a user chose (``.tmp-notes.txt``, ``.old-draft-v2``)
    is none of these."""
    if any(re.fullmatch(rf"\.(?:tmp|old)-(?:{f})-{_RANDOM}", name) for f in folders):
        return True
    return any(re.fullmatch(rf"\.tmp-{_RANDOM}{re.escape(f)}|\.{re.escape(f)}\.{_RANDOM}\.tmp", name) for f in files)


# ------------------------------------------------------------------------------------------------------------------
# hashes


def sha256_bytes(data: bytes) -> str:
    """sha256 of ``data``, as 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's contents, as 64 hex digits (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------------------------
# staged folders (many files, one index written last)


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, recursively: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def json_line(row: Mapping[str, Any]) -> str:
    """One ``metrics.jsonl`` line: strict JSON (a non-finite number is written as null), newline-terminated."""
    return json.dumps(finite_or_none(row), allow_nan=False) + "\n"
