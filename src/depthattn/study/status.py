"""Where each part of a study stands (``depthattn study status``).

A part is **done** when its folder holds the ``results.json`` that ``compare`` writes last, and that file lists
every method of the part with its seed (finished or diverged) at the part's number of steps, trained with the
settings the study file gives the part (``Study.part_settings``: [set], the cell's, [method_set]); **stale** when
such a file records another value for one of those settings (the study file was edited after the part ran: ``study
run`` leaves it alone and says so, and the report leaves it out; move its folder aside to train it again; a key
removed from the file is not detected); **running**
while a live process holds the lock of the part's folder or of one of its runs (``RunLock.in_use``); **incomplete**
when it started (its folder holds runs) but is neither, e.g. a job killed mid-run: ``study run`` resumes it (compare
resumes each run from its newest checkpoint); **missing** otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..compare.settings import run_name
from ..fileio import read_json
from ..layout import COMPARE_RUNS_DIR, RESULTS_FILE
from ..run.folder import RunFolder
from ..run.lock import RunLock
from .spec import Part, Study

STATES = ("done", "stale", "running", "incomplete", "missing")


@dataclass(frozen=True)
class PartStatus:
    """A part's state (one of ``STATES``) and one word per method run (``finished``, ``diverged at step N``,
    ``at step N`` (its newest checkpoint), ``started`` (no checkpoint yet) or ``not started``); for a stale part,
    ``why``: the settings that differ, "KEY: ran with A, the study file says B"."""

    part: Part
    state: str
    runs: dict[str, str]
    why: str = ""


def run_dir(study: Study, part: Part, method: str) -> Path:
    """The run folder compare trains ``method`` of ``part`` in."""
    return part.folder / COMPARE_RUNS_DIR / run_name(method, study.loops, part.seed)


def run_state(folder: Path) -> str:
    """One word on a run folder (``PartStatus.runs``)."""
    files = RunFolder(folder)
    if not files.is_run():
        return "not started"
    verdict = files.read_divergence()
    if verdict is not None:
        return f"diverged at step {verdict.get('step')}"
    if files.summary_file.is_file() and files.checkpoints():
        return "finished"
    newest = files.newest_checkpoint()
    return f"at step {int(newest.name.split('_')[-1])}" if newest is not None else "started"


def results_cover(study: Study, part: Part) -> bool:
    """Whether the part's ``results.json`` answers the study: the part's methods, its seed, its steps."""
    path = part.folder / RESULTS_FILE
    if not path.is_file():
        return False
    try:
        res = read_json(path, "compare results")
        steps = res["settings"]["train"]["steps"]
        methods = res["methods"]
        for m in part.methods:
            seeds = {int(r["seed"]) for r in methods[m]["runs"] + methods[m].get("diverged", [])}
            if part.seed not in seeds:
                return False
    except (KeyError, TypeError, ValueError, OSError):
        return False
    return steps == part.steps


def stale_settings(study: Study, part: Part) -> str:
    """The settings of ``part`` (``Study.part_settings``) its ``results.json`` records another value for, as
    "KEY: ran with A, the study file says B" joined by "; " ("" when none differs or the file is unreadable)."""
    from ..training.config import MODEL_KEYS

    try:
        recorded = read_json(part.folder / RESULTS_FILE, "compare results")["settings"]
        model, train = recorded.get("model_overrides", {}), recorded["train"]
    except (KeyError, TypeError, ValueError, OSError):
        return ""
    said = []
    for key, want in study.part_settings(part).items():
        where = model if key in MODEL_KEYS else train  # as compare splits --set (training.config.split_overrides)
        if key in where and where[key] != want:
            said.append(f"{key}: ran with {where[key]!r}, the study file says {want!r}")
    return "; ".join(said)


def part_status(study: Study, part: Part) -> PartStatus:
    """The state of ``part`` (module docstring) and of each of its method runs."""
    runs = {m: run_state(run_dir(study, part, m)) for m in part.methods}
    folders = [part.folder] + [run_dir(study, part, m) for m in part.methods]
    if any(RunLock.in_use(f) for f in folders):
        state = "running"
    elif results_cover(study, part):
        why = stale_settings(study, part)
        if why:
            return PartStatus(part, "stale", runs, why)
        state = "done"
    elif (part.folder / COMPARE_RUNS_DIR).is_dir():
        state = "incomplete"
    else:
        state = "missing"
    return PartStatus(part, state, runs)


def study_status(study: Study, parts: list[Part] | None = None) -> list[PartStatus]:
    """``part_status`` of ``parts`` (default: every part), in the study's order."""
    return [part_status(study, p) for p in (study.parts() if parts is None else parts)]


def render_status(statuses: list[PartStatus]) -> str:
    """One line per part (name, state, each method's run), then the count per state."""
    width = max((len(s.part.name) for s in statuses), default=4)
    lines = [f"{s.part.name:{width}s}  {s.state:10s}  " + ", ".join(f"{m}: {r}" for m, r in s.runs.items())
             + (f" (study file edited since: {s.why})" if s.why else "") for s in statuses]
    counts = {k: sum(s.state == k for s in statuses) for k in STATES}
    lines.append(f"{len(statuses)} parts: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines)
