"""SWORD ``zText`` / ``zCom`` / ``zCom4`` modules (the format of Debian's ``sword-*`` packages), read in pure Python.

One document per compressed block; a block is one book or one chapter, as the module's ``BlockType`` says.
OSIS/ThML markup is reduced to plain text by :func:`clean_osis`.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from depthattn.data.document import Document
from depthattn.data.sources.text import normalize_text

_OSIS_DROP = re.compile(r"<note\b[^>]*>.*?</note>|<title\b[^>]*>\s*</title>", re.DOTALL)
_OSIS_BREAK = re.compile(r"<(?:lb|p|l)\b[^>]*/>|<div\b[^>]*\beID=[^>]*/>|</title>|<chapter\b[^>]*sID=[^>]*/>|"
                         r"<div\b[^>]*type=\"book\"[^>]*/>|<br\s*/?>|</p>")
_TAG = re.compile(r"<[^>]*>")
_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?’”)\]])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[“‘]) +")


def clean_osis(markup: str) -> str:
    """OSIS/ThML markup to plain text: drop footnotes, paragraph tags become newlines, other tags spaces."""
    text = _OSIS_DROP.sub(" ", markup)
    text = _OSIS_BREAK.sub("\n", text)
    text = _TAG.sub(" ", text)
    text = text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    text = re.sub(r"[ \t\u00a0]+", " ", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    text = _SPACE_AFTER_OPEN.sub(r"\1", text)
    text = re.sub(r" *\n *", "\n", text)
    return normalize_text(text)


def read_sword_blocks(moddir: str | Path) -> Iterator[tuple[str, int, bytes]]:
    """Yield ``(testament, block_index, raw_bytes)`` for every non-empty block of a zText/zCom module.

    Each testament (``ot``, ``nt``) has a block index ``{t}.?zs`` (``b``ook / ``c``hapter / ``v``erse blocks) of
    12-byte little-endian records ``(offset, compressed_size, uncompressed_size)`` into the zlib data ``{t}.?zz``.
    """
    moddir = Path(moddir)
    found = False
    for testament in ("ot", "nt"):
        idx_files = sorted(moddir.glob(f"{testament}.?zs"))
        if not idx_files:
            continue
        idx_path = idx_files[0]
        data_path = idx_path.with_suffix(idx_path.suffix[:-1] + "z")
        index, data = idx_path.read_bytes(), data_path.read_bytes() if data_path.exists() else b""
        if len(index) % 12:
            raise ValueError(f"{idx_path}: size {len(index)} is not a multiple of 12")
        for i, (off, csize, usize) in enumerate(struct.iter_unpack("<III", index)):
            if csize == 0:
                continue
            found = True
            try:
                raw = zlib.decompress(data[off:off + csize])
            except zlib.error as e:
                raise ValueError(f"{data_path}: block {i}: cannot read: corrupt zlib stream ({e})") from e
            if len(raw) != usize:
                raise ValueError(f"{data_path}: block {i} inflated to {len(raw)} bytes, index says {usize}")
            yield testament, i, raw
    if not found:
        raise ValueError(f"{moddir}: no SWORD block index (ot.?zs / nt.?zs) with data")


def read_sword_module(moddir: str | Path, name: str, min_chars: int = 200) -> list[Document]:
    """One document per block, markup removed; blocks shorter than ``min_chars`` (testament headers) are skipped."""
    docs = []
    for testament, i, raw in read_sword_blocks(moddir):
        text = clean_osis(raw.decode("utf-8", errors="replace"))
        if len(text) < min_chars:
            continue
        title = text.split("\n", 1)[0].strip()[:80]
        docs.append(Document(id=f"{name}/{testament}/{i:04d}", text=text, source=name, title=title))
    return docs


def read_sword_conf(conf_path: str | Path) -> dict[str, str]:
    """The ``key=value`` pairs of a SWORD ``mods.d/*.conf`` file (first occurrence wins)."""
    out: dict[str, str] = {}
    for line in Path(conf_path).read_text(encoding="utf-8", errors="replace").splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), v.strip())
    return out


def find_sword_modules(root: str | Path) -> list[str]:
    """Module directories under an unpacked SWORD tree (helper for exploring new ``sword-*`` packages)."""
    return sorted(glob.glob(os.path.join(str(root), "usr/share/sword/modules/*/*/*")))
