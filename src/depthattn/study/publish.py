"""Publish a study's parts that are done (``depthattn study publish``): one small file per part, ``TO/PART.json``
(``partfile``; the format in results/README.md), to commit beside the study file.

A part's file is its compare's results.json (``partfile.compact``) with the study's record of it, ``study``:

    part      the part's name              group   the study's name
    label     the cell's settings in words ("lr=0.001, depth_attention_window=2"; "" for a study of one cell)
    command   the compare its last start ran (``invocations``), else the one it would run now
    commit    every commit it ran under, in order: its starts' (``invocations``), then any other its runs' run.json
              name (``git_revision``, the last session's), 8 digits, ``+dirty`` kept; ``unknown`` when none says
    corpus    "embedded" when the study trains on the embedded corpus (absent with a ``data`` folder: settings.data
              names it)
    hardware  every machine it ran on, in order, joined by "; then " (absent when no start was recorded)
    jobs      the most parts its launcher ran at once (with hardware)

and its runs' depth statistics (``depth.extract``). Paths are written as the study file names its folders
(``Study.named``, ``portable``), so a file names no folder of the machine that ran it. A file is replaced only when
it is a published part of the same part and study (``outputs.check_result_file``): anything else at ``TO/PART.json``
is refused and left as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..fileio import atomic_write_text, read_json
from ..layout import RESULTS_FILE
from ..outputs import check_result_file
from . import depth as study_depth
from . import partfile
from .invocations import compare_command, read_invocations, short_commit
from .spec import Part, Study, check_portable, set_value
from .status import part_status


def label(study: Study, part: Part) -> str:
    """The part's cell in words: ``key=value`` of each of its settings, ", "-joined (strings unquoted); "" for a
    study of one cell."""
    if len(study.cells()) <= 1:
        return ""
    return ", ".join(f"{k}={v if isinstance(v, str) else set_value(v)}" for k, v in part.axes)


def portable(study: Study, text: str) -> str:
    """``text`` with every form of the study's ``out`` and ``data`` folders on this machine (absolute, and with
    symlinks resolved) replaced by the folder as the study file names it; the longest first, each only where a
    whole path component ends."""
    pairs = {}
    for named in study.named.values():
        folder = Path(named).absolute()
        for form in (str(folder), os.path.realpath(folder)):
            pairs.setdefault(form, os.path.normpath(named))
    for form in sorted(pairs, key=len, reverse=True):
        text = re.sub(re.escape(form) + r'(?=[/"\s]|$)', lambda _m, to=pairs[form]: to, text)
    return text


def commits(results: dict, starts: list[dict]) -> str:
    """The ``commit`` of the part's record (module docstring)."""
    found = [row["commit"] for row in starts if row.get("commit")]
    for m in results["methods"].values():
        for r in m["runs"]:
            path = Path(r["run_dir"]) / "run.json"
            rev = read_json(path, "run record").get("git_revision") if path.is_file() else None
            if rev:
                found.append(short_commit(rev))
    return ", ".join(dict.fromkeys(c for c in found if c != "unknown")) or "unknown"


def record(study: Study, part: Part, results: dict) -> dict:
    """The ``study`` record of the part (module docstring), from its compare ``results`` and its recorded starts."""
    starts = read_invocations(study, part)
    ran = next((r["command"] for r in reversed(starts) if r.get("command")), None)  # as run, not as it would be now
    out = {"part": part.name, "group": study.name, "label": label(study, part),
           "command": ran or compare_command(study, part), "commit": commits(results, starts)}
    if study.data is None:
        out["corpus"] = "embedded"
    machines = list(dict.fromkeys(r["hardware"] for r in starts if r.get("hardware")))
    if machines:
        out |= {"hardware": "; then ".join(machines), "jobs": max(int(r.get("jobs", 1)) for r in starts)}
    return out


def depth_rows(results: dict) -> dict[str, dict[str, list[dict]]]:
    """``{method: {str(seed): rows}}`` of the runs that log depth statistics (``depth.extract``)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for method, m in results["methods"].items():
        for r in m["runs"]:
            found = study_depth.extract(Path(r["run_dir"]))
            if found:
                out.setdefault(method, {})[str(r["seed"])] = found
    return out


def is_own(doc: object, part: str, group: str) -> bool:
    """Whether parsed JSON ``doc`` is the published file of part ``part`` of study ``group`` (``partfile.FORMAT``)."""
    return (isinstance(doc, dict) and doc.get("format") == partfile.FORMAT and isinstance(doc.get("study"), dict)
            and doc["study"].get("part") == part and doc["study"].get("group") == group)


def target(study: Study, part: Part, to: Path) -> Path:
    """``TO/PART.json``, checked writable (module docstring); ``ValueError`` in one line naming it otherwise."""
    out = partfile.path(to, part.name)
    check_result_file(out, [part.folder / RESULTS_FILE], lambda doc: is_own(doc, part.name, study.name),
                      f"the published part {part.name} of study {study.name}", flag="--to")
    return out


def not_done(study: Study, parts: list[Part]) -> list[tuple[Part, str]]:
    """``(part, state)`` for each of ``parts`` that is not done (``status.part_status``)."""
    states = [(p, part_status(study, p).state) for p in parts]
    return [(p, state) for p, state in states if state != "done"]


def publish_part(study: Study, part: Part, to: Path) -> Path:
    """Write the published file of ``part``, which must be done, to ``TO/PART.json``; returns its path. Raises
    ``ValueError`` (one line) for a part not done, a study whose folders are absolute paths, or a file at the target
    that is not this part's published file; ``OSError`` from the write."""
    check_portable(study)
    for _, state in not_done(study, [part]):
        raise ValueError(f"{study.path}: part {part.name} is {state}, not done; `depthattn study run {study.path} "
                         f"{part.name}` trains it")
    out = target(study, part, to)
    results = read_json(part.folder / RESULTS_FILE, "compare results")
    results["study"] = record(study, part, results)
    atomic_write_text(out, portable(study, partfile.dumps(partfile.compact(results, depth_rows(results)))))
    return out
