"""Read ``depthattn data prepare --input`` arguments as streams of documents.

Accepted inputs (one document is the unit of the train/validation split):

=============================================  ================================================================
``embedded`` (or no input)                      the corpus shipped in the package (one novel / play / address each)
a folder with a corpus ``manifest.json``        a ``depthattn data fetch`` output (same format as the embedded one)
a ``.txt`` file                                 one file = one document; when it is the only input, it is cut
                                                into pieces of about ``txt_piece_chars`` characters at blank-line
                                                runs (the nanoGPT ``input.txt``), each piece one document
a ``.jsonl`` / ``.jsonl.gz`` / ``.jsonl.zst``   one line = one document, from its ``text_column`` field
a ``.parquet`` file                             one row = one document, from its ``text_column`` column
a ``datasets`` ``save_to_disk`` folder          one row = one document, ``text_column`` column (all splits)
any other folder                                every file above in it (recursive, sorted); other files are
                                                skipped with one line saying how many
a glob pattern (``data/*.parquet``, ``**``)     every matching file, and every file in a matching folder, sorted
=============================================  ================================================================

Folders and patterns are walked by one function, :func:`walk_input`: symbolic links are followed and every real
file is read once (a folder reached again through a link is not walked again). The default id of a ``.jsonl`` line
or ``.parquet`` row starts with the file's name, or with its path below the input's folder where the inputs hold
two files of that name (:func:`resolve_inputs`).

An :class:`InputSource` can be iterated several times (``documents()`` reopens its files), so prepare streams the
corpus instead of holding it: only one document (one jsonl line, parquet batch or ``.txt`` piece) is in memory at a
time. A ``.txt`` file read as one document is held whole. Non-UTF-8 text is an error naming the file and the byte
offset (never skipped). Every problem raises one ValueError that names the file: missing, empty, not UTF-8,
unreadable, a missing text column, an unknown type.
"""

from __future__ import annotations

import codecs
import dataclasses
import fnmatch
import glob
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from depthattn.data.corpus import EMBEDDED_DIR, is_corpus_dir, read_corpus_dir, read_jsonl
from depthattn.data.document import Document

#: Default size of the documents a lone ``.txt`` input is cut into (characters).
TXT_PIECE_CHARS = 1 << 20
DOC_SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
_BLOCK = 1 << 20


# ------------------------------------------------------------------------------------------------------------------
# .txt


def _utf8_blocks(path: Path) -> Iterator[str]:
    """The text of ``path`` in blocks of about 1 MiB; ValueError naming the byte offset of the first non-UTF-8 byte."""
    dec = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(_BLOCK)
                pending = len(dec.getstate()[0])
                try:
                    text = dec.decode(block, final=not block)
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {offset - pending + e.start})") from e
                if offset == 0:
                    text = text.removeprefix("\ufeff")
                offset += len(block)
                if text:
                    yield text
                if not block:
                    return
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from e


def cut_piece(text: str, limit: int) -> int:
    """Where to end a piece of at most ``limit`` characters of ``text`` (``len(text) > limit``): after the last
    blank-line run in its second half, else after its last line end, else at its last whitespace, else at ``limit``."""
    lo = limit // 2
    i = text.rfind("\n\n", lo, limit)
    if i >= 0:
        while i < limit and text[i] == "\n":
            i += 1
        return i
    i = text.rfind("\n", lo, limit)
    if i >= 0:
        return i + 1
    for j in range(limit - 1, lo, -1):
        if text[j].isspace():
            return j
    return limit


def _txt_documents(path: Path, piece_chars: int | None) -> Iterator[Document]:
    """One document (``piece_chars`` None) or consecutive pieces ``path#0``, ``path#1``, ... of ``path``."""
    if piece_chars is None:
        text = "".join(_utf8_blocks(path))
        if not text.strip():
            raise ValueError(f"{path}: input file is empty")
        yield Document(id=str(path), text=text, source=path.parent.name, title=path.stem)
        return
    buf, k = "", 0
    for block in _utf8_blocks(path):
        buf += block
        while len(buf) > piece_chars:
            cut = cut_piece(buf, piece_chars)
            if buf[:cut].strip():
                yield Document(id=f"{path}#{k}", text=buf[:cut], source=path.parent.name, title=f"{path.stem}#{k}")
                k += 1
            buf = buf[cut:]
    if buf.strip():
        yield Document(id=f"{path}#{k}", text=buf, source=path.parent.name, title=f"{path.stem}#{k}")
        k += 1
    if k == 0:
        raise ValueError(f"{path}: input file is empty")


# ------------------------------------------------------------------------------------------------------------------
# parquet, datasets folders


def _text_values(where: str, column, text_column: str) -> list:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.to_pylist()
    raise ValueError(f"{where}: column `{text_column}` has type {column.type}, not string")


def read_parquet(path: str | Path, text_column: str = "text", id_name: str | None = None) -> Iterator[Document]:
    """Documents from a parquet file, one per row with a non-blank ``text_column`` (read in record batches); the
    ``id`` column is the document id when present, else ``<id_name>:<row>`` (default ``id_name``: the file name).
    ValueError naming the file when it cannot be read as parquet or has no such string column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"{path}: not a readable parquet file ({e})") from e
    names = pf.schema_arrow.names
    if text_column not in names:
        raise ValueError(f"{path}: no column `{text_column}` (columns: {', '.join(names)}); "
                         f"choose one with --text-column")
    columns = [text_column] + (["id"] if "id" in names and text_column != "id" else [])
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=1024, columns=columns):
            texts = _text_values(str(path), batch.column(0), text_column)
            ids = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for text, doc_id in zip(texts, ids):
                if text is not None and text.strip():
                    yield Document(id=str(doc_id) if doc_id is not None else f"{id_name or path.name}:{row}", text=text,
                                   source=path.stem)
                row += 1
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"{path}: cannot read parquet row group ({e})") from e


def _is_hf_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (
        path / "dataset_dict.json").is_file()


def read_hf_dataset(path: str | Path, text_column: str = "text") -> Iterator[Document]:
    """Documents of a ``datasets`` ``save_to_disk`` folder (``Dataset`` or ``DatasetDict``, every split, in
    batches from the memory-mapped arrow files); needs the ``datasets`` package, never touches the hub."""
    path = Path(path)
    try:
        import datasets  # optional dependency, imported only for this input type
    except ImportError as e:
        raise ValueError(f"{path}: reading a Hugging Face dataset folder needs the `datasets` package; "
                         f"install it with `pip install datasets`") from e
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a bad folder
        raise ValueError(f"{path}: cannot load with datasets.load_from_disk ({e})") from e
    splits = dict(ds.items()) if isinstance(ds, datasets.DatasetDict) else {"": ds}
    for split, d in splits.items():
        if text_column not in d.column_names:
            raise ValueError(f"{path}: dataset{' split ' + split if split else ''} has no `{text_column}` column "
                             f"(columns: {', '.join(d.column_names)}); choose one with --text-column")
    for split, d in splits.items():
        i = 0
        for batch in d.select_columns([text_column]).iter(batch_size=1024):
            for text in batch[text_column]:
                if isinstance(text, str) and text.strip():
                    yield Document(id=f"{path}:{split + ':' if split else ''}{i}", text=text, source=path.name)
                i += 1


# ------------------------------------------------------------------------------------------------------------------
# sources


@dataclasses.dataclass(frozen=True)
class InputSource:
    """One ``--input`` argument, resolved: ``documents()`` streams its documents (and can be called again).

    ``labels``: each file's path below the input's folder (:meth:`Walked.below`); ``id_names``: what the default ids
    of each ``.jsonl`` / ``.parquet`` file's documents start with (:func:`resolve_inputs`; default the file name)."""

    name: str
    kind: str
    files: tuple[Path, ...] = ()
    text_column: str = "text"
    txt_piece_chars: int | None = None
    labels: tuple[str, ...] = ()
    id_names: tuple[str, ...] = ()

    def documents(self) -> Iterator[Document]:
        if self.kind == "embedded":
            yield from read_corpus_dir(EMBEDDED_DIR)
        elif self.kind == "corpus":
            yield from read_corpus_dir(self.files[0])
        elif self.kind == "hf_dataset":
            yield from read_hf_dataset(self.files[0], self.text_column)
        else:
            for path, id_name in zip(self.files, self.id_names or [p.name for p in self.files]):
                yield from _file_documents(path, self.text_column, self.txt_piece_chars, id_name)


def _file_documents(path: Path, text_column: str, txt_piece_chars: int | None, id_name: str) -> Iterator[Document]:
    if path.name.endswith(".txt"):
        yield from _txt_documents(path, txt_piece_chars)
    elif path.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        yield from read_jsonl(path, text_column, source=path.name, id_name=id_name)
    elif path.name.endswith(".parquet"):
        yield from read_parquet(path, text_column, id_name)
    else:
        raise ValueError(f"{path}: unknown input type; expected `embedded`, a .txt, .jsonl[.gz|.zst] or .parquet "
                         f"file, a folder or glob pattern of them, a `data fetch` folder or a datasets "
                         f"save_to_disk folder")


def _scandir(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise ValueError(f"{folder}: cannot read the folder ({e.strerror or e})") from e


def _part_matches(head: str, name: str) -> bool:
    """One path part against one pattern part; a wildcard does not match a leading ``.`` (as :mod:`glob`)."""
    if glob.has_magic(head) and name.startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, head)


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...], prefix: bool = False) -> bool:
    """Whether the path ``parts`` matches the glob ``pattern`` parts (``prefix``: begins a path that can): ``**`` is
    any number of parts not starting with ``.``; other wildcards match within one part."""
    if not parts:
        return prefix or all(head == "**" for head in pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return _matches(pattern[1:], parts, prefix) or (not parts[0].startswith(".")
                                                        and _matches(pattern, parts[1:], prefix))
    return _part_matches(pattern[0], parts[0]) and _matches(pattern[1:], parts[1:], prefix)


def _walk_folder(root: Path, pattern: tuple[str, ...] | None = None,
                 dirs_only: bool = False) -> tuple[list[Path], list[Path]]:
    """``(files, again)``: every file below ``root`` (with ``pattern``: that matches it, or lies below a folder that
    does; ``dirs_only``: only the latter) once per real file, sorted, and the symbolic links that led to a file or
    folder already reached. What is reached without a link comes first; links are then followed in sorted order (a
    folder walked once, so a loop ends), each to what was not reached yet. Broken links are ignored."""
    files: list[Path] = []
    again: list[Path] = []
    links: list[Path] = []
    seen: set[str] = set()

    def wanted(path: Path, is_dir: bool) -> bool:
        if pattern is None:
            return True
        parts = path.relative_to(root).parts
        if any(_matches(pattern, parts[:j]) for j in range(len(parts))):
            return True
        return _matches(pattern, parts, prefix=True) if is_dir else not dirs_only and _matches(pattern, parts)

    def first(path: Path) -> bool:
        real = os.path.realpath(path)
        if real in seen:
            again.append(path)
            return False
        seen.add(real)
        return True

    def reach(path: Path, is_dir: bool, is_file: bool) -> None:
        if is_dir and wanted(path, True) and first(path):
            for entry in _scandir(path):
                if entry.is_symlink():
                    links.append(path / entry.name)
                else:
                    reach(path / entry.name, entry.is_dir(), entry.is_file())
        elif is_file and wanted(path, False) and first(path):
            files.append(path)

    reach(root, True, False)
    while links:
        batch = sorted(links)
        links.clear()
        for path in batch:
            reach(path, path.is_dir(), path.is_file())
    return sorted(files), again


@dataclasses.dataclass(frozen=True)
class Walked:
    """What :func:`walk_input` found below ``root`` (the folder, a pattern's folder, a lone file's folder):
    ``files`` as reached (``root`` as given joined with the names below it), the files of other types below a
    folder (``skipped``), and the symbolic links that led to a file or folder already reached (``again``)."""

    root: Path
    files: tuple[Path, ...]
    skipped: tuple[Path, ...] = ()
    again: tuple[Path, ...] = ()

    def below(self, path: Path) -> str:
        """``path`` below ``root``, POSIX separators (a lone file: its name)."""
        return path.relative_to(self.root).as_posix()


def walk_input(spec: str | Path) -> Walked:
    """Every document file one ``--input`` names, once per real file (``os.path.realpath``), in sorted order.

    ``spec`` is a file (itself), a folder (every file below it) or a glob pattern (``*``, ``?``, ``[...]`` within a
    name; a ``**`` part for any number of folders): every matching file, and every file below a matching folder.
    Symbolic links to files and folders are followed, a folder at most once (a link loop ends there). Files of a
    type other than ``DOC_SUFFIXES`` below a folder are ``skipped``; a lone or matched file of another type, a
    missing input, a pattern without matches or a folder without documents is a ValueError naming ``spec``."""
    spec = str(spec)
    if glob.has_magic(spec):
        parts = Path(spec).parts
        k = next(i for i, part in enumerate(parts) if glob.has_magic(part))
        root, pattern = Path(*parts[:k]) if k else Path("."), parts[k:]
        found, again = _walk_folder(root, pattern, spec.endswith("/")) if root.is_dir() else ([], [])
        if not found:
            raise ValueError(f"{spec}: the pattern matches no files")
        rels = [f.relative_to(root).parts for f in found]
        inside = [any(_matches(pattern, r[:j]) for j in range(len(r))) for r in rels]  # below a matching folder
        for f in (f for f, i in zip(found, inside) if not i):  # matched itself
            _check_type(f)
        under = [f for f, i in zip(found, inside) if i]
    else:
        root = Path(spec)
        if not root.exists():
            raise ValueError(f"--input {root} does not exist")
        if not root.is_dir():
            _check_type(root)
            return Walked(root.parent, (root,))
        under, again = _walk_folder(root)
        found = under
    skipped = tuple(f for f in under if not f.name.endswith(DOC_SUFFIXES))
    files = tuple(f for f in found if f.name.endswith(DOC_SUFFIXES))  # a file matched itself is of one of them
    if not files:
        raise ValueError(f"{spec if glob.has_magic(spec) else root}: folder has no .txt, .jsonl[.gz|.zst] or "
                         f".parquet files, no corpus manifest.json and no dataset_info.json / state.json; cannot "
                         f"tell what to read")
    return Walked(root, files, skipped, tuple(again))


def _note(name: str, walked: Walked, log: Callable[[str], None] | None) -> None:
    """One line each for the skipped files and for the links that led to files or folders already read."""
    if log is None:
        return
    if walked.skipped:
        n = len(walked.skipped)
        log(f"{name}: skipped {n} file{'s' if n > 1 else ''} that {'are' if n > 1 else 'is'} not .txt, "
            f".jsonl[.gz|.zst] or .parquet (e.g. {walked.below(walked.skipped[0])})")
    if walked.again:
        n = len(walked.again)
        log(f"{name}: {n} symbolic link{'s lead' if n > 1 else ' leads'} to files or folders already read "
            f"({', '.join(walked.below(p) for p in walked.again[:3])}{', ...' if n > 3 else ''}); "
            f"each is read once")


def resolve_input(spec: str | Path, text_column: str = "text", txt_piece_chars: int | None = None,
                  log: Callable[[str], None] | None = None) -> InputSource:
    """The :class:`InputSource` of one ``--input`` argument (ValueError naming it if it cannot be read)."""
    spec = str(spec)
    if spec == "embedded":
        return InputSource("embedded", "embedded")
    path = Path(spec)
    if not glob.has_magic(spec) and path.is_dir():
        if is_corpus_dir(path):
            return InputSource(spec, "corpus", (path,))
        if _is_hf_dataset(path):
            return InputSource(spec, "hf_dataset", (path,), text_column)
    walked = walk_input(spec)
    _note(spec if glob.has_magic(spec) else str(path), walked, log)
    if glob.has_magic(spec):
        kind = "glob"
    elif path.is_dir():
        kind = "txt_dir" if all(f.name.endswith(".txt") for f in walked.files) else "folder"
    else:
        if path.stat().st_size == 0:
            raise ValueError(f"{path}: input file is empty")
        kind = next(s for s in (".jsonl.gz", ".jsonl.zst", ".jsonl", ".parquet", ".txt") if path.name.endswith(s))[1:]
        kind = kind.replace(".", "_")
    return _named([InputSource(spec, kind, walked.files, text_column, txt_piece_chars if kind == "txt" else None,
                               tuple(walked.below(f) for f in walked.files))])[0]


def _check_type(path: Path) -> None:
    if not path.name.endswith(DOC_SUFFIXES):
        raise ValueError(f"{path}: unknown input type; expected `embedded`, a .txt, .jsonl[.gz|.zst] or .parquet "
                         f"file, a folder or glob pattern of them, a `data fetch` folder or a datasets "
                         f"save_to_disk folder")


def _named(sources: list[InputSource]) -> list[InputSource]:
    """``sources`` with the default-id names of their files: the file name where no other file of ``sources`` has
    it, else the path below its input's folder where that is unique, else the path as reached (POSIX)."""
    files = [(f, label) for src in sources for f, label in zip(src.files, src.labels)]
    names, labels = Counter(f.name for f, _ in files), Counter(label for _, label in files)
    return [dataclasses.replace(src, id_names=tuple(
        f.name if names[f.name] == 1 else label if labels[label] == 1 else f.as_posix()
        for f, label in zip(src.files, src.labels))) for src in sources]


def resolve_inputs(specs: list[str] | None, text_column: str = "text", txt_piece_chars: int = TXT_PIECE_CHARS,
                   log: Callable[[str], None] | None = None) -> list[InputSource]:
    """Resolve every ``--input`` (default: the embedded corpus). A lone ``.txt`` file is cut into pieces of about
    ``txt_piece_chars`` characters (see :func:`cut_piece`); every other ``.txt`` is one document. A file that two
    inputs both reach (the same real path) is a ValueError naming it and both."""
    specs = [str(s) for s in specs or ["embedded"]]
    lone_txt = len(specs) == 1 and specs[0].endswith(".txt") and not glob.has_magic(specs[0])
    sources = [resolve_input(s, text_column, txt_piece_chars if lone_txt else None, log) for s in specs]
    owner: dict[str, InputSource] = {}
    for src in sources:
        for f in src.files:
            other = owner.setdefault(os.path.realpath(f), src)
            if other is not src:
                raise ValueError(f"{f}: both --input {other.name} and --input {src.name} read it; "
                                 f"give each file to one --input")
    return _named(sources)
