"""Shard integrity: the sha256 of every shard file recorded in ``meta.json`` is checked when a prepared folder is
first loaded for training or evaluation (:func:`verify_files`).

A file that matched is remembered in ``<folder>/.verified.json`` by its size, modification time (ns), status-change
time (ns) and inode number, so later loads hash nothing; a file with any of these changed is hashed again. Every
write through the file system changes the ctime, and user space cannot set it back (``os.utime`` restores the
mtime but sets the ctime to now), so an edit that restores the mtime is caught too, as is a copy or a replacement
(new inode). A file whose ctime lies within one timestamp tick of the start of its hash (``fileio.is_racy``: 10 ms,
2 s on a file system that keeps whole seconds) is not remembered, so a rewrite within that tick cannot keep its
key (git's "racy clean" rule). Not caught from the cache: a change below the file system (bit rot on the medium, a raw-device write),
which alters no metadata -- a load without the cache catches it (``recheck=True``, or delete ``.verified.json``).
``verify=False`` / ``--no-verify`` skips hashing deliberately. The cache is written atomically and only as a
convenience: a read-only folder is verified on every load.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from depthattn.fileio import atomic_write_json, is_racy, read_json, sha256_file

VERIFY_CACHE = ".verified.json"


def _read_cache(folder: Path) -> dict:
    try:
        cache = read_json(folder / VERIFY_CACHE, "verification cache")
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


def cache_key(st: os.stat_result, digest: str) -> list:
    """What ``.verified.json`` remembers of a verified file: size, mtime_ns, ctime_ns, inode and the digest."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest]


def verify_files(folder: str | Path, expected: dict[str, str], recheck: bool = False) -> None:
    """Check that each file ``name`` of ``folder`` has sha256 ``expected[name]``; ValueError naming the first file
    that does not (one line: the file, both digests, what to do). Files verified before with the same size, mtime,
    ctime and inode are not hashed again, unless ``recheck`` (hash every file, whatever the cache says)."""
    folder = Path(folder)
    cache = {} if recheck else _read_cache(folder)
    changed = False
    for name, digest in expected.items():
        path = folder / name
        st = path.stat()
        key = cache_key(st, digest)
        if cache.get(name) == key:
            continue
        started = time.time_ns()
        got = sha256_file(path)
        if got != digest:
            raise ValueError(f"{path}: sha256 {got[:16]}... does not match meta.json ({digest[:16]}...): the shard "
                             f"is corrupt or was changed; prepare the data again (or restore the file)")
        if not is_racy(st, started):
            cache[name] = key
            changed = True
    if changed:
        with contextlib.suppress(OSError):
            atomic_write_json(folder / VERIFY_CACHE, cache)
