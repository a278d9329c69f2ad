"""Unpack downloaded packages in pure Python: ``.tar.*`` / ``.tgz`` / ``.zip`` / ``.whl``, and ``.deb`` (an ``ar``
archive whose ``data.tar.*`` member holds the files). Regular files only; a member that would land outside the
extraction folder is refused.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path


def _safe_members(tf: tarfile.TarFile, root: Path) -> Iterator[tarfile.TarInfo]:
    for m in tf.getmembers():
        if not (m.isfile() or m.isdir()):
            continue  # links and devices are never needed for text
        target = (root / m.name).resolve()
        if root.resolve() not in target.parents and target != root.resolve():
            raise ValueError(f"archive member escapes the extraction folder: {m.name}")
        yield m


def extract_archive(path: str | Path, dest: str | Path) -> Path:
    """Unpack a ``.tar.*`` / ``.tgz`` / ``.zip`` / ``.whl`` / ``.deb`` into ``dest`` (regular files only)."""
    path, dest = Path(path), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".deb"):
        return extract_deb(path, dest)
    if name.endswith((".zip", ".whl")):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                target = (dest / info.filename).resolve()
                if dest.resolve() not in target.parents:
                    raise ValueError(f"archive member escapes the extraction folder: {info.filename}")
            zf.extractall(dest)
        return dest
    with tarfile.open(path) as tf:
        tf.extractall(dest, members=list(_safe_members(tf, dest)))
    return dest


def extract_deb(path: str | Path, dest: str | Path) -> Path:
    """Unpack the ``data.tar.*`` member of a Debian package (an ``ar`` archive) in pure Python."""
    path, dest = Path(path), Path(dest)
    raw = path.read_bytes()
    if raw[:8] != b"!<arch>\n":
        raise ValueError(f"{path}: not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos:pos + 60]
        member = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        body = raw[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if member.startswith("data.tar"):
            if member.endswith(".zst"):
                raise ValueError(f"{path}: zstd-compressed data member; unpack it with `dpkg-deb -x` instead")
            with tarfile.open(fileobj=io.BytesIO(body)) as tf:
                tf.extractall(dest, members=list(_safe_members(tf, dest)))
            return dest
    raise ValueError(f"{path}: no data.tar member found")
