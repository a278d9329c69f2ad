"""What a command may write: an ``--out`` is checked against the command's sources and against what is there.

``export``, ``convert`` and ``data prepare`` (and ``data fetch``) call :func:`check_output` before any work:

* an ``--out`` that is a source, lies inside one or contains one is refused (real paths: symlinks resolved), with
  one line naming both paths, so no command can replace the run or corpus it reads;
* an ``--out`` that does not exist, or is an empty folder, is written;
* an existing ``--out`` is refused unless ``overwrite``, and then replaced only when it is itself the command's
  kind of artefact (:class:`OutputKind`: a model folder whose every file its ``checksums.json`` lists, a prepared
  data folder with ``meta.json``); anything else is refused with one line listing what is there.

``eval --out FILE`` (one result file, no ``--overwrite``) goes through :func:`check_result_file`: it replaces only
an earlier result file, never a file of what it reads or a folder.

The replacement itself is :func:`depthattn.fileio.write_folder_atomically` (written beside, renamed in, the old one
deleted last). A refused command has written nothing. Errors are ``ValueError`` (the CLI: exit 2, one line).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .fileio import MANIFEST_NAME, IntegrityError, read_json, read_manifest

#: How many names a refusal lists before "and N more".
SHOWN_NAMES = 5
#: Files that mark a training checkpoint or run folder (never replaced by an exported model).
TRAINING_MARKERS = ("trainer_state.pt", "run.json", "train_config.json")


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """A kind of folder a command writes: ``name`` for messages, and ``foreign(folder)``: why ``folder`` is not of
    this kind (None: it is, and may be replaced)."""

    name: str
    foreign: Callable[[Path], str | None]


def describe_entries(folder: Path, names: Iterable[str] | None = None) -> str:
    """``"a.txt, b/, c.bin and 4 more (7 entries)"``: the first :data:`SHOWN_NAMES` of ``names`` (default: the
    folder's entries), folders marked with ``/``."""
    names = sorted(os.listdir(folder) if names is None else names)
    shown = [n + ("/" if (folder / n).is_dir() and not (folder / n).is_symlink() else "") for n in names[:SHOWN_NAMES]]
    more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
    return f"{', '.join(shown)}{more} ({len(names)} entr{'y' if len(names) == 1 else 'ies'})"


def _files_under(folder: Path) -> list[str]:
    out = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            out.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return sorted(out)


def model_folder_foreign(folder: Path) -> str | None:
    """Why ``folder`` is not a model folder written by depthattn (``export`` / ``convert`` / ``save_model``):
    one has a readable ``checksums.json`` that lists every file in it, and no training-run files."""
    if not (folder / MANIFEST_NAME).is_file():
        return f"it has no {MANIFEST_NAME} (depthattn's model folders have one)"
    try:
        listed = read_manifest(folder) or {}
    except IntegrityError:
        return f"its {MANIFEST_NAME} is unreadable"
    marks = [m for m in TRAINING_MARKERS if (folder / m).exists()]
    if marks:
        return f"it is a training checkpoint or run folder (it has {', '.join(marks)})"
    extra = [f for f in _files_under(folder) if f != MANIFEST_NAME and f not in listed]
    if extra:
        return f"it holds files its {MANIFEST_NAME} does not list: {describe_entries(folder, extra)}"
    return None


MODEL_FOLDER = OutputKind("depthattn model folder", model_folder_foreign)


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.fspath(path)))


def check_sources(out: str | os.PathLike, sources: Iterable[str | os.PathLike], flag: str = "--out") -> None:
    """``ValueError`` if ``out`` is one of ``sources``, lies inside one or contains one (compared as real paths;
    the first of these that holds is named)."""
    real_out = _real(out)
    found = {}
    for source in sources:
        real_src = _real(source)
        if real_out == real_src:
            found.setdefault("is", (source, real_src))
        elif real_out.is_relative_to(real_src):
            found.setdefault("lies inside", (source, real_src))
        elif real_src.is_relative_to(real_out):
            found.setdefault("contains", (source, real_src))
    for relation in ("is", "lies inside", "contains"):
        if relation in found:
            source, real_src = found[relation]
            resolved = "" if (os.fspath(out), os.fspath(source)) == (str(real_out), str(real_src)) else (
                f" ({real_out} and {real_src} once symlinks are resolved)")
            raise ValueError(f"{flag} {os.fspath(out)} {relation} the source {os.fspath(source)}{resolved}; writing "
                             f"there would replace what is being read: choose an {flag} outside it")


def check_output(out: str | os.PathLike, sources: Iterable[str | os.PathLike], kind: OutputKind, overwrite: bool,
                 flag: str = "--out") -> Path:
    """Check that a command may write folder ``out`` (see the module docstring) and return the path to write: the
    real path of ``out`` (so a symlink to a folder keeps pointing at the new folder). Raises ``ValueError`` with
    one line naming ``out`` (and the source, or what is there) otherwise; nothing is touched."""
    check_sources(out, sources, flag)
    given = Path(os.fspath(out))
    if not os.path.lexists(given):
        return given
    real = _real(given)
    if not real.is_dir():
        what = "a file" if real.exists() else f"a symlink to {real}, which does not exist"
        raise ValueError(f"{flag} {given} is {what}, not a folder; choose another {flag}")
    if not any(real.iterdir()):
        return real
    if not overwrite:
        raise ValueError(f"{flag} {given} already exists; pass --overwrite (overwrite=True) to replace it (only a "
                         f"{kind.name}), or choose another {flag}")
    why = kind.foreign(real)
    if why is not None:
        raise ValueError(f"{flag} {given} is not a {kind.name} (the only kind of folder this command replaces): "
                         f"{why}; it holds {describe_entries(real)}; choose another {flag} (or move its files away "
                         f"yourself)")
    return real


#: Result files larger than this are not read to see whether they are ours (a results JSON is a few KiB).
MAX_RESULT_BYTES = 16 << 20


def check_result_file(out: str | os.PathLike, sources: Iterable[str | os.PathLike], is_own: Callable[[object], bool],
                      what: str, flag: str = "--out") -> None:
    """Check that a command may write the one file ``out``: not one of ``sources``, not a folder, and, if it exists
    (inside a source or anywhere else), a JSON document of its own (``is_own(parsed JSON)``; ``what`` names the
    kind), so a checkpoint's or the user's file is never replaced. ``ValueError`` with one line otherwise; nothing
    is touched."""
    given = Path(os.fspath(out))
    real = _real(given)
    for source in sources:
        if real == _real(source):
            raise ValueError(f"{flag} {given} is the source {os.fspath(source)}; writing there would replace it: "
                             f"choose another {flag}")
    if not os.path.lexists(given):
        return
    if real.is_dir():
        raise ValueError(f"{flag} {given} is a folder; give a file name (e.g. {given / 'results.json'})")
    try:
        own = real.stat().st_size <= MAX_RESULT_BYTES and is_own(read_json(real, "result file"))
    except (OSError, ValueError, UnicodeDecodeError):
        own = False
    if not own:
        raise ValueError(f"{flag} {given} exists and is not {what}, so it is not replaced; choose another {flag} (or "
                         f"move it away yourself)")
