"""What a command may write: an ``--out`` is checked against the command's sources and against what is there.

``export``, ``convert`` and ``data prepare`` (and ``data fetch``) call :func:`check_output` before any work:

* an ``--out`` that is a source, lies inside one or contains one is refused (real paths: symlinks resolved), with
  one line naming both paths, so no command can replace the run or corpus it reads;
* an ``--out`` that does not exist, or is an empty folder, is written;
* an existing ``--out`` is refused unless ``overwrite``, and then replaced only when it is itself the command's
  kind of artefact (:class:`OutputKind`: a model folder whose every file its ``checksums.json`` lists, a prepared
  data folder with ``meta.json``); anything else is refused with one line listing what is there.

``train --out`` (a new run, ``--decay-from`` included) and ``compare --out`` call :func:`check_new_output` with
:data:`RUN_FOLDER` / :data:`COMPARE_FOLDER`: a missing or empty folder, or one holding only what the command's own
writers put there (an earlier start of the run, a compare's results and runs, and the leftovers of their interrupted
writes, ``is_debris``), is written; anything else is refused with one line listing the files it did not
write. Whether an existing run may be started again is the trainer's (``training.resume.resume_point``).

``eval --out FILE`` (one result file, no ``--overwrite``) goes through :func:`check_result_file`: it replaces only
an earlier result file, never a file of what it reads or a folder, and writes nothing inside a run or checkpoint
folder. ``analyze --out DIR`` goes through :func:`check_result_folder`: it replaces its files in ``DIR`` only when
they are its own, and writes nothing into a run or checkpoint folder. A command's own result JSON is told by the key
:data:`WRITTEN_BY` (``"written_by": "depthattn eval"``, :func:`written_by`), which no other writer uses.

The replacement itself is :func:`depthattn.fileio.write_folder_atomically` (written beside, renamed in, the old one
deleted last). A refused command has written nothing. Errors are ``ValueError`` (the CLI: exit 2, one line).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .fileio import MANIFEST_NAME, IntegrityError, is_temporary, read_json, read_manifest
from .layout import (COMPARE_DATA_DIR, COMPARE_FILES, COMPARE_FOLDER_NAMES, COMPARE_RUNS_DIR, DEBRIS_PREFIXES,
                     LOCK_FILE, METRICS_FILE, RUN_FILE, RUN_FILES, RUN_FOLDER_NAMES, STEP_DIR,
                     TRAINER_STATE_FILE, TRAIN_CONFIG_FILE, TRASHED_STEP_DIR)
from .layout import RESULTS_FILE as COMPARE_RESULTS_FILE

#: How many names a refusal lists before "and N more".
SHOWN_NAMES = 5
#: Files that mark a training checkpoint or run folder (never replaced by an exported model).
TRAINING_MARKERS = (TRAINER_STATE_FILE, RUN_FILE, TRAIN_CONFIG_FILE)


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
        raise ValueError(f"{flag} {given} already exists; pass --overwrite to replace it (only a "
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
    """Check that a command may write the one file ``out``: not one of ``sources``, not a folder, if it exists
    (inside a source or anywhere else) a JSON document of its own (``is_own(parsed JSON)``; ``what`` names the
    kind), so a checkpoint's or the user's file is never replaced, and not inside a run or checkpoint folder
    (:func:`enclosing_run_or_checkpoint`: a run's ``summary.json`` is the trainer's). ``ValueError`` with one line
    otherwise; nothing is touched."""
    given = Path(os.fspath(out))
    real = _real(given)
    for source in sources:
        if real == _real(source):
            raise ValueError(f"{flag} {given} is the source {os.fspath(source)}; writing there would replace it: "
                             f"choose another {flag}")
    if not os.path.lexists(given):
        _refuse_inside_run_or_checkpoint(given, next(p for p in given.absolute().parents if os.path.lexists(p)), flag)
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
    _refuse_inside_run_or_checkpoint(given, real.parent, flag)


# ------------------------------------------------------------------------------------------------ a command's marks
#: The key of a result JSON that names the command that wrote it: ``{"written_by": "depthattn eval", ...}``.
WRITTEN_BY = "written_by"


def written_by(command: str) -> dict[str, str]:
    """``{"written_by": "depthattn <command>"}``: the mark a command puts into the result JSON it writes."""
    return {WRITTEN_BY: f"depthattn {command}"}


def is_written_by(doc: object, command: str) -> bool:
    """Whether parsed JSON ``doc`` carries ``command``'s mark (:func:`written_by`)."""
    return isinstance(doc, dict) and doc.get(WRITTEN_BY) == f"depthattn {command}"


def enclosing_run_or_checkpoint(path: str | os.PathLike) -> tuple[Path, str] | None:
    """The nearest folder at or above ``path`` (real paths) that is a run folder or a checkpoint or model folder,
    with the file that marks it (``checksums.json``, ``trainer_state.pt``, ``run.json``, ``train_config.json``);
    None when there is none. Only the trainer, ``export`` and ``convert`` write such folders."""
    real = _real(path)
    for folder in (real, *real.parents):
        for mark in (MANIFEST_NAME, *TRAINING_MARKERS):
            if (folder / mark).is_file():
                return folder, mark
    return None


def _refuse_inside_run_or_checkpoint(given: Path, folder_of_out: Path, flag: str) -> None:
    found = enclosing_run_or_checkpoint(folder_of_out)
    if found is not None:
        folder, mark = found
        where = "is" if _real(given) == folder else "lies inside"
        raise ValueError(f"{flag} {given} {where} the run or checkpoint folder {folder} (it has {mark}), which only "
                         f"the trainer, export and convert write; choose an {flag} outside it")


# ------------------------------------------------------------------------------ the folder of a new run or compare
def _is_run_record(file: Path) -> bool:
    try:
        doc = read_json(file, "run record")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("model"), dict) and isinstance(doc.get("train"), dict)


def is_debris(name: str) -> bool:
    """Whether ``name``, an entry of a run folder or of its ``checkpoints/``, is a leftover of an interrupted write or
    prune of the run's own writers: a ``fileio`` temporary of one of ``RUN_FILES`` (``.tmp-<random>run.json``), of
    a checkpoint folder (``.tmp-step_XXXXXXXX-<random>``, ``.old-step_XXXXXXXX-<random>``, DCP's
    ``.tmp-step_XXXXXXXX-dcp``), a trashed checkpoint (``.trash-step_XXXXXXXX``) or the lock's clock probe
    (``.tmp-depthattn.lock-clock-<random>``). A user's file or folder is not debris, whatever its name starts with
    (``.tmp-notes.txt``, ``.old-draft-v2/``)."""
    return name.startswith(DEBRIS_PREFIXES) and (
        is_temporary(name, RUN_FILES, folders=(STEP_DIR.pattern.strip("^$"),))
        or bool(TRASHED_STEP_DIR.match(name)) or bool(_LOCK_PROBE.fullmatch(name)))


#: ``run.lock``'s probe of the file system's clock, beside the lock file (removed at once; a kill may leave it).
_LOCK_PROBE = re.compile(rf"\.tmp-{re.escape(LOCK_FILE)}-clock-[a-z0-9_]+")


def run_folder_foreign_entries(folder: Path) -> list[str]:
    """The entries of ``folder`` that no depthattn trainer put there, sorted: with a run record (a ``run.json``
    holding ``model`` and ``train``), any name but ``layout.RUN_FOLDER_NAMES``; without one (a first start
    killed before it wrote its record), any name but the lock file and an empty ``metrics.jsonl``. Leftovers of
    interrupted writes (``is_debris``) are the trainer's either way."""
    if _is_run_record(folder / RUN_FILE):
        own = set(RUN_FOLDER_NAMES)
    else:
        metrics = folder / METRICS_FILE
        own = {LOCK_FILE} | ({METRICS_FILE} if metrics.is_file() and metrics.stat().st_size == 0 else set())
    return sorted(n for n in os.listdir(folder) if n not in own and not is_debris(n))


def compare_folder_foreign_entries(folder: Path) -> list[str]:
    """The entries of ``folder`` that no ``compare`` put there, sorted (``runs/NAME/ENTRY`` for those of its runs):
    any name but ``layout.COMPARE_FOLDER_NAMES`` and temporaries of its files; a ``results.json`` that is not a
    compare's (a JSON object with ``settings`` and ``methods``), and ``report.md`` / ``loss_curves.png`` beside
    none; under ``runs/``, anything but a run folder of the trainer's (:func:`run_folder_foreign_entries`)."""
    names = sorted(os.listdir(folder))
    foreign = [n for n in names if n not in COMPARE_FOLDER_NAMES
               and not is_temporary(n, COMPARE_FILES, folders=(re.escape(COMPARE_DATA_DIR),))]
    try:
        results = read_json(folder / COMPARE_RESULTS_FILE, "compare results")
        own_results = isinstance(results, dict) and "settings" in results and "methods" in results
    except (OSError, ValueError):
        own_results = False
    if not own_results:
        foreign += [n for n in COMPARE_FILES if os.path.lexists(folder / n)]
    runs = folder / COMPARE_RUNS_DIR
    if runs.is_dir() and not runs.is_symlink():
        for name in sorted(os.listdir(runs)):
            run = runs / name
            if not run.is_dir() or run.is_symlink():
                foreign.append(f"{COMPARE_RUNS_DIR}/{name}")
            else:
                foreign += [f"{COMPARE_RUNS_DIR}/{name}/{n}" for n in run_folder_foreign_entries(run)]
    elif os.path.lexists(runs):
        foreign.append(COMPARE_RUNS_DIR)
    return sorted(set(foreign))


@dataclasses.dataclass(frozen=True)
class FolderKind:
    """A kind of folder a command writes into (and adds to) rather than replaces: ``name`` for messages, the
    ``command`` that writes it, and ``foreign_entries(folder)``: the entries it did not write there."""

    name: str
    command: str
    foreign_entries: Callable[[Path], list[str]]


RUN_FOLDER = FolderKind("depthattn run folder", "train", run_folder_foreign_entries)
COMPARE_FOLDER = FolderKind("depthattn compare folder", "compare", compare_folder_foreign_entries)


def check_new_output(out: str | os.PathLike, kind: FolderKind, flag: str = "--out") -> None:
    """Check that a command may start writing folder ``out`` (see the module docstring): missing, empty, or
    holding only what ``kind.command`` wrote there. Raises ``ValueError`` with one line naming ``out`` and listing
    the other files (:func:`describe_entries`); nothing is touched."""
    given = Path(os.fspath(out))
    if not os.path.lexists(given):
        return
    real = _real(given)
    if not real.is_dir():
        what = "a file" if real.exists() else f"a symlink to {real}, which does not exist"
        raise ValueError(f"{flag} {given} is {what}, not a folder; choose another {flag}")
    foreign = kind.foreign_entries(real)
    if foreign:
        raise ValueError(f"{flag} {given} holds files that {kind.command} did not write: "
                         f"{describe_entries(real, foreign)}; {kind.command} writes only into a new or empty folder "
                         f"or a {kind.name} of its own, so nothing there is replaced or deleted: choose another "
                         f"{flag} (or move those files away yourself)")


# ------------------------------------------------------------------------------------- a folder of result files
def check_result_folder(out: str | os.PathLike, files: Sequence[str], is_own: Callable[[object], bool], what: str,
                        flag: str = "--out") -> None:
    """Check that a command may write ``files`` into folder ``out`` (created when missing): not a file, not a run
    or checkpoint folder nor inside one (:func:`enclosing_run_or_checkpoint`), and ``files`` that exist there are
    its own: ``files[0]``, the JSON written first, is ``is_own`` (``what`` names the kind), and the others are
    replaced only beside such a JSON. ``ValueError`` with one line naming ``out`` otherwise; nothing is touched."""
    given = Path(os.fspath(out))
    if os.path.lexists(given) and not _real(given).is_dir():
        raise ValueError(f"{flag} {given} is a file, not a folder; choose another {flag}")
    nearest = next(p for p in (given.absolute(), *given.absolute().parents) if os.path.lexists(p))
    _refuse_inside_run_or_checkpoint(given, nearest, flag)
    present = [f for f in files if os.path.lexists(given / f)]
    if not present:
        return
    try:
        own = files[0] in present and (given / files[0]).stat().st_size <= MAX_RESULT_BYTES and is_own(
            read_json(given / files[0], "result file"))
    except (OSError, ValueError, UnicodeDecodeError):
        own = False
    if not own:
        raise ValueError(f"{flag} {given} holds {describe_entries(_real(given), present)} not written there as "
                         f"{what}, so nothing is replaced; choose another {flag} (or move them away yourself)")
