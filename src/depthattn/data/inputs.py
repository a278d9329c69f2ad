"""Read ``depthattn data prepare --input`` arguments into documents.

Accepted inputs (one document is the unit of the train/validation split):

=========================================  ====================================================================
``embedded`` (or no input)                  the corpus shipped in the package (one novel / play / address each)
a folder with a corpus ``manifest.json``    a ``depthattn data fetch`` output (same format as the embedded one)
a ``.txt`` file, or a folder of them        one file = one document (folders are searched recursively, sorted;
                                            other files are skipped, with one line saying how many)
a ``.jsonl`` / ``.jsonl.gz`` file           one line = one document, from its ``text`` field
a ``datasets`` ``save_to_disk`` folder      one row = one document, from its ``text`` column (all splits)
=========================================  ====================================================================

Every problem raises one ValueError that names the file: missing, empty, not UTF-8, unknown type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from depthattn.data.corpus import EMBEDDED_DIR, is_corpus_dir, read_corpus_dir, read_jsonl_documents
from depthattn.data.document import Document


def _read_txt(path: Path) -> Document:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    if not text.strip():
        raise ValueError(f"{path}: input file is empty")
    return Document(id=str(path), text=text.removeprefix("\ufeff"), source=path.parent.name, title=path.stem)


def _is_hf_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "state.json").is_file() or (
        path / "dataset_dict.json").is_file()


def _read_hf_dataset(path: Path) -> list[Document]:
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
    docs = []
    for split, d in splits.items():
        if "text" not in d.column_names:
            raise ValueError(f"{path}: dataset{' split ' + split if split else ''} has no `text` column "
                             f"(columns: {', '.join(d.column_names)})")
        for i, text in enumerate(d["text"]):
            if isinstance(text, str) and text.strip():
                docs.append(Document(id=f"{path}:{split + ':' if split else ''}{i}", text=text, source=path.name))
    return docs


def read_input(spec: str | Path, log: Callable[[str], None] | None = None) -> tuple[list[Document], dict]:
    """Documents of one input, and a record ``{"input", "kind", "documents", "characters"}`` for meta.json.
    ``log``: one-line notes (a folder's files that are not .txt and were skipped)."""
    if str(spec) == "embedded":
        docs, kind, name = read_corpus_dir(EMBEDDED_DIR), "embedded", "embedded"
    else:
        path = Path(spec)
        name = str(path)
        if not path.exists():
            raise ValueError(f"{path}: input not found")
        if path.is_dir():
            if is_corpus_dir(path):
                docs, kind = read_corpus_dir(path), "corpus"
            elif _is_hf_dataset(path):
                docs, kind = _read_hf_dataset(path), "hf_dataset"
            else:
                every = sorted(p for p in path.rglob("*") if p.is_file())
                files = [p for p in every if p.name.endswith(".txt")]
                if not files:
                    raise ValueError(f"{path}: folder has no .txt files, no corpus manifest.json and no "
                                     f"dataset_info.json / state.json; cannot tell what to read (pass .jsonl / "
                                     f".jsonl.gz files themselves as --input)")
                skipped = [p for p in every if not p.name.endswith(".txt")]
                if skipped and log is not None:
                    log(f"{path}: skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} that "
                        f"{'are' if len(skipped) > 1 else 'is'} not .txt (e.g. {skipped[0].relative_to(path)}); "
                        f"pass .jsonl / .jsonl.gz files as --input themselves")
                docs, kind = [_read_txt(p) for p in files], "txt_dir"
        elif path.name.endswith(".txt"):
            docs, kind = [_read_txt(path)], "txt"
        elif path.name.endswith((".jsonl", ".jsonl.gz")):
            if path.stat().st_size == 0:
                raise ValueError(f"{path}: input file is empty")
            docs, kind = [d for d in read_jsonl_documents(path, source=path.name) if d.text.strip()], "jsonl"
        else:
            raise ValueError(f"{path}: unknown input type; expected `embedded`, a .txt file or folder, a .jsonl / "
                             f".jsonl.gz file, a `data fetch` folder or a datasets save_to_disk folder")
    if not docs:
        raise ValueError(f"{name}: input has no non-empty documents")
    record = {"input": name, "kind": kind, "documents": len(docs), "characters": sum(len(d.text) for d in docs)}
    return docs, record


def read_inputs(specs: list[str] | None, log: Callable[[str], None] | None = None
                ) -> tuple[list[Document], list[dict]]:
    """Concatenate several inputs (default: the embedded corpus); document ids must be unique across them.
    ``log``: as for ``read_input``."""
    docs: list[Document] = []
    records = []
    for spec in specs or ["embedded"]:
        d, r = read_input(spec, log)
        docs.extend(d)
        records.append(r)
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            raise ValueError(f"document id {d.id!r} appears twice in the inputs ({', '.join(map(str, specs or []))})")
        seen.add(d.id)
    return docs, records
