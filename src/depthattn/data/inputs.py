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
a glob pattern (``data/*.parquet``, ``**``)     every matching file or folder, sorted
=============================================  ================================================================

An :class:`InputSource` can be iterated several times (``documents()`` reopens its files), so prepare streams the
corpus instead of holding it: only one document (one jsonl line, parquet batch or ``.txt`` piece) is in memory at a
time. A ``.txt`` file read as one document is held whole. Non-UTF-8 text is an error naming the file and the byte
offset (never skipped). Every problem raises one ValueError that names the file: missing, empty, not UTF-8,
unreadable, a missing text column, an unknown type.
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
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


def read_parquet(path: str | Path, text_column: str = "text") -> Iterator[Document]:
    """Documents from a parquet file, one per row with a non-blank ``text_column`` (read in record batches); the
    ``id`` column is the document id when present, else ``<file name>:<row>``. ValueError naming the file when it
    cannot be read as parquet or has no such string column."""
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
                    yield Document(id=str(doc_id) if doc_id is not None else f"{path.name}:{row}", text=text,
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
    """One ``--input`` argument, resolved: ``documents()`` streams its documents (and can be called again)."""

    name: str
    kind: str
    files: tuple[Path, ...] = ()
    text_column: str = "text"
    txt_piece_chars: int | None = None

    def documents(self) -> Iterator[Document]:
        if self.kind == "embedded":
            yield from read_corpus_dir(EMBEDDED_DIR)
        elif self.kind == "corpus":
            yield from read_corpus_dir(self.files[0])
        elif self.kind == "hf_dataset":
            yield from read_hf_dataset(self.files[0], self.text_column)
        else:
            for path in self.files:
                yield from _file_documents(path, self.text_column, self.txt_piece_chars)


def _file_documents(path: Path, text_column: str, txt_piece_chars: int | None) -> Iterator[Document]:
    if path.name.endswith(".txt"):
        yield from _txt_documents(path, txt_piece_chars)
    elif path.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        yield from read_jsonl(path, text_column, source=path.name)
    elif path.name.endswith(".parquet"):
        yield from read_parquet(path, text_column)
    else:
        raise ValueError(f"{path}: unknown input type; expected `embedded`, a .txt, .jsonl[.gz|.zst] or .parquet "
                         f"file, a folder or glob pattern of them, a `data fetch` folder or a datasets "
                         f"save_to_disk folder")


def _folder_files(path: Path, log: Callable[[str], None] | None) -> tuple[Path, ...]:
    every = sorted(p for p in path.rglob("*") if p.is_file())
    files = [p for p in every if p.name.endswith(DOC_SUFFIXES)]
    if not files:
        raise ValueError(f"{path}: folder has no .txt, .jsonl[.gz|.zst] or .parquet files, no corpus manifest.json "
                         f"and no dataset_info.json / state.json; cannot tell what to read")
    skipped = [p for p in every if not p.name.endswith(DOC_SUFFIXES)]
    if skipped and log is not None:
        log(f"{path}: skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} that "
            f"{'are' if len(skipped) > 1 else 'is'} not .txt, .jsonl[.gz|.zst] or .parquet "
            f"(e.g. {skipped[0].relative_to(path)})")
    return tuple(files)


def resolve_input(spec: str | Path, text_column: str = "text", txt_piece_chars: int | None = None,
                  log: Callable[[str], None] | None = None) -> InputSource:
    """The :class:`InputSource` of one ``--input`` argument (ValueError naming it if it cannot be read)."""
    spec = str(spec)
    if spec == "embedded":
        return InputSource("embedded", "embedded")
    if glob.has_magic(spec):
        matches = sorted(Path(p) for p in glob.glob(spec, recursive=True))
        if not matches:
            raise ValueError(f"{spec}: the pattern matches no files")
        files: list[Path] = []
        for m in matches:
            files.extend(_folder_files(m, log) if m.is_dir() else [m] if m.is_file() else [])
        for f in files:
            _check_type(f)
        return InputSource(spec, "glob", tuple(files), text_column)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"--input {path} does not exist")
    if path.is_dir():
        if is_corpus_dir(path):
            return InputSource(spec, "corpus", (path,))
        if _is_hf_dataset(path):
            return InputSource(spec, "hf_dataset", (path,), text_column)
        files = _folder_files(path, log)
        kind = "txt_dir" if all(f.name.endswith(".txt") for f in files) else "folder"
        return InputSource(spec, kind, files, text_column)
    _check_type(path)
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: input file is empty")
    kind = next(s for s in (".jsonl.gz", ".jsonl.zst", ".jsonl", ".parquet", ".txt") if path.name.endswith(s))[1:]
    return InputSource(spec, kind.replace(".", "_"), (path,), text_column,
                       txt_piece_chars if kind == "txt" else None)


def _check_type(path: Path) -> None:
    if not path.name.endswith(DOC_SUFFIXES):
        raise ValueError(f"{path}: unknown input type; expected `embedded`, a .txt, .jsonl[.gz|.zst] or .parquet "
                         f"file, a folder or glob pattern of them, a `data fetch` folder or a datasets "
                         f"save_to_disk folder")


def resolve_inputs(specs: list[str] | None, text_column: str = "text", txt_piece_chars: int = TXT_PIECE_CHARS,
                   log: Callable[[str], None] | None = None) -> list[InputSource]:
    """Resolve every ``--input`` (default: the embedded corpus). A lone ``.txt`` file is cut into pieces of about
    ``txt_piece_chars`` characters (see :func:`cut_piece`); every other ``.txt`` is one document."""
    specs = [str(s) for s in specs or ["embedded"]]
    lone_txt = len(specs) == 1 and specs[0].endswith(".txt") and not glob.has_magic(specs[0])
    return [resolve_input(s, text_column, txt_piece_chars if lone_txt else None, log) for s in specs]
