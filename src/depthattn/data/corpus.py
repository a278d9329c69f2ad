"""The document-corpus format and the embedded corpus.

A *corpus folder* (the embedded corpus under ``depthattn/data/corpus/`` and every ``depthattn data fetch`` output)
holds one ``<source>.jsonl.gz`` per source -- one JSON object per line with ``id``, ``source``, ``title`` and
``text``, one line per document -- and a ``manifest.json``::

    {"format": "depthattn-corpus", "format_version": 1, "name": ..., "documents": N, "characters": N,
     "sources": [{"name", "package", "registry", "version", "licence", "description",
                  "documents", "characters", "file", "bytes", "sha256"}, ...]}

Files are gzip-compressed with a zero timestamp and no file name, so rebuilding from the same packages gives
byte-identical files (and sha256).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from depthattn.data.document import Document, surrogate_at
from depthattn.fileio import atomic_write_bytes, atomic_write_json, loads_json, read_json, sha256_bytes, sha256_file
from depthattn.outputs import OutputKind, describe_entries

CORPUS_FORMAT = "depthattn-corpus"
EMBEDDED_DIR = Path(__file__).resolve().parent / "corpus"


def encode_documents(docs: Iterable[Document]) -> bytes:
    """Deterministic ``.jsonl.gz`` bytes for ``docs`` (gzip level 9, mtime 0, no stored file name)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for d in docs:
            gz.write((json.dumps(d.to_json(), ensure_ascii=False) + "\n").encode("utf-8"))
    return buf.getvalue()


def write_corpus(out_dir: str | Path, sources: list[tuple[dict, list[Document]]], name: str) -> dict:
    """Write one ``<source>.jsonl.gz`` per ``(manifest_entry, documents)`` pair and ``manifest.json``, atomically.

    Returns the manifest. Each file is written to a temporary name first, so an interrupted write leaves the
    previous files intact.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for entry, docs in sources:
        data = encode_documents(docs)
        file = f"{entry['name']}.jsonl.gz"
        atomic_write_bytes(out_dir / file, data)
        entries.append({**entry, "documents": len(docs), "characters": sum(len(d.text) for d in docs),
                        "file": file, "bytes": len(data), "sha256": sha256_bytes(data)})
    manifest = {"format": CORPUS_FORMAT, "format_version": 1, "name": name,
                "documents": sum(e["documents"] for e in entries),
                "characters": sum(e["characters"] for e in entries),
                "bytes": sum(e["bytes"] for e in entries), "sources": entries}
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def is_corpus_dir(path: str | Path) -> bool:
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        values = read_json(manifest, "corpus manifest")
        return isinstance(values, dict) and values.get("format") == CORPUS_FORMAT
    except (ValueError, OSError):
        return False


def corpus_folder_foreign(folder: Path) -> str | None:
    """Why ``folder`` is not a corpus folder ``write_corpus`` may update (None: it is one): a ``depthattn-corpus``
    ``manifest.json`` beside ``*.jsonl.gz`` files only."""
    if not is_corpus_dir(folder):
        return f"it has no {CORPUS_FORMAT} manifest.json"
    extra = [n for n in os.listdir(folder) if n != "manifest.json" and not n.endswith(".jsonl.gz")]
    if extra:
        return f"it holds files a corpus folder does not: {describe_entries(folder, extra)}"
    return None


#: What ``data fetch --out`` may update in place.
CORPUS_FOLDER = OutputKind("depthattn corpus folder", corpus_folder_foreign)


def read_manifest(corpus_dir: str | Path) -> dict:
    path = Path(corpus_dir) / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{path}: corpus manifest not found")
    try:
        manifest = read_json(path, "corpus manifest")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != CORPUS_FORMAT or not isinstance(manifest.get("sources"), list):
        raise ValueError(f"{path}: not a {CORPUS_FORMAT} manifest (missing `format` or `sources`)")
    return manifest


def verify_corpus(corpus_dir: str | Path) -> dict:
    """Check every file listed in the manifest against its sha256; returns the manifest or raises ValueError."""
    corpus_dir = Path(corpus_dir)
    manifest = read_manifest(corpus_dir)
    for entry in manifest["sources"]:
        path = corpus_dir / entry["file"]
        if not path.is_file():
            raise ValueError(f"{path}: listed in the manifest but missing")
        if sha256_file(path) != entry["sha256"]:
            raise ValueError(f"{path}: sha256 does not match manifest.json")
    return manifest


def _zst_lines(path: Path) -> Iterator[bytes]:
    """Lines of a zstandard file (one or more frames), decompressed in 1 MiB reads; ValueError for a truncated
    last frame or a corrupt one (a checksum or format error)."""
    import zstandard  # imported only for this input type

    dobj = zstandard.ZstdDecompressor().decompressobj()
    pending, fed = b"", False
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                data, fed = dobj.decompress(chunk), True
                while dobj.eof and dobj.unused_data:  # the next frame starts inside this chunk
                    rest, dobj = dobj.unused_data, zstandard.ZstdDecompressor().decompressobj()
                    data += dobj.decompress(rest)
                if dobj.eof:
                    dobj, fed = zstandard.ZstdDecompressor().decompressobj(), False
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                yield from (line + b"\n" for line in lines)
    except zstandard.ZstdError as e:
        raise ValueError(f"{path}: cannot read: corrupt zstandard stream ({e})") from e
    if fed:
        raise ValueError(f"{path}: cannot read: corrupt zstandard stream (truncated: the last frame is incomplete)")
    if pending:
        yield pending


def _open_lines(path: Path):
    """A context manager over the lines (bytes) of a plain, gzip or zstandard file."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        return contextlib.nullcontext(_zst_lines(path))
    return open(path, "rb")


def read_jsonl(path: str | Path, text_column: str = "text", source: str = "",
               id_name: str | None = None) -> Iterator[Document]:
    """Documents from a ``.jsonl`` / ``.jsonl.gz`` / ``.jsonl.zst`` file: one JSON object per line, the text in its
    ``text_column`` field (blank texts skipped); ``id``, ``source``, ``title`` fields are kept when present (id
    default ``<id_name>:<line>``, ``id_name`` default the file name). ValueError naming the file and line on bad
    JSON, non-UTF-8 bytes (with the byte offset in the decompressed stream), a missing field, or a corrupt /
    truncated compressed stream."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: input file is empty")
    offset = 0
    try:
        with _open_lines(path) as f:
            for lineno, raw in enumerate(f, 1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {start + e.start})") from e
                try:
                    row = loads_json(line, f"{path}:{lineno}")
                except ValueError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
                if not isinstance(row, dict) or not isinstance(row.get(text_column), str):
                    raise ValueError(f"{path}:{lineno}: expected a JSON object with a string `{text_column}` field"
                                     f"{'' if text_column != 'text' else ' (choose another with --text-column)'}")
                bad = surrogate_at(row[text_column])
                if bad is not None:
                    raise ValueError(f"{path}:{lineno}: field `{text_column}` holds a lone surrogate "
                                     f"{ascii(row[text_column][bad])} at character {bad}, which is not Unicode text "
                                     f"(a JSON \\u escape of half a UTF-16 pair); fix or drop the line")
                if row[text_column].strip():
                    yield Document(id=str(row.get("id", f"{id_name or path.name}:{lineno}")), text=row[text_column],
                                   source=str(row.get("source", source)), title=str(row.get("title", "")))
    except zlib.error as e:  # a damaged deflate stream (gzip raises BadGzipFile, an OSError, only for its frame)
        raise ValueError(f"{path}: cannot read: corrupt gzip stream ({e})") from e
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from e


def read_jsonl_documents(path: str | Path, source: str = "") -> Iterator[Document]:
    """Documents from a ``.jsonl`` / ``.jsonl.gz`` / ``.jsonl.zst`` file with a ``text`` field (:func:`read_jsonl`)."""
    return read_jsonl(path, "text", source)


def read_corpus_dir(corpus_dir: str | Path, verify: bool = True) -> list[Document]:
    """All documents of a corpus folder, in manifest order (sha256-checked when ``verify``)."""
    corpus_dir = Path(corpus_dir)
    manifest = verify_corpus(corpus_dir) if verify else read_manifest(corpus_dir)
    docs: list[Document] = []
    for entry in manifest["sources"]:
        docs.extend(read_jsonl_documents(corpus_dir / entry["file"], source=entry["name"]))
    return docs


def embedded_manifest() -> dict:
    """The manifest of the corpus shipped inside the package."""
    return read_manifest(EMBEDDED_DIR)


def embedded_corpus_documents() -> list[tuple[str, str]]:
    """The embedded corpus as ``(doc_id, text)`` pairs, in manifest order (files are sha256-checked)."""
    return [(d.id, d.text) for d in read_corpus_dir(EMBEDDED_DIR)]
