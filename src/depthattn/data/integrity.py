"""Shard integrity: the sha256 of every shard file recorded in ``meta.json`` is checked when a prepared folder is
first loaded for training or evaluation (:func:`verify_files`).

A file that matched is remembered in ``<folder>/.verified.json`` by its size and modification time (ns), so later
loads hash nothing; a file whose size or mtime changed is hashed again. (A change that keeps both -- a write that
restores the mtime -- is not detected; pass ``verify=False`` / ``--no-verify`` only to skip hashing deliberately.)
The cache is written atomically and only as a convenience: a read-only folder is verified on every load.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from depthattn.fileio import atomic_write_json, sha256_file

VERIFY_CACHE = ".verified.json"


def _read_cache(folder: Path) -> dict:
    try:
        cache = json.loads((folder / VERIFY_CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return cache if isinstance(cache, dict) else {}


def verify_files(folder: str | Path, expected: dict[str, str]) -> None:
    """Check that each file ``name`` of ``folder`` has sha256 ``expected[name]``; ValueError naming the first file
    that does not (one line: the file, both digests, what to do). Files verified before with the same size and
    mtime are not hashed again."""
    folder = Path(folder)
    cache = _read_cache(folder)
    changed = False
    for name, digest in expected.items():
        path = folder / name
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, digest]
        if cache.get(name) == key:
            continue
        got = sha256_file(path)
        if got != digest:
            raise ValueError(f"{path}: sha256 {got[:16]}... does not match meta.json ({digest[:16]}...): the shard "
                             f"is corrupt or was changed; prepare the data again (or restore the file)")
        cache[name] = key
        changed = True
    if changed:
        with contextlib.suppress(OSError):
            atomic_write_json(folder / VERIFY_CACHE, cache)
