"""Which code and which machine trained a study's part: one JSON line per start of the part, in
``OUT/logs/PART.jsonl`` (beside ``runner.log_file``'s ``PART.log``; the part's own folder is compare's alone).

A part interrupted and run again (another session, a requeued SLURM task, another machine) gets one line per start,
so its published file (``study.publish``) names every commit and machine it ran on. A line::

    {"started_utc": "2026-12-05T02:46:59Z", "commit": "59964c94", "hardware": "NVIDIA H200 (CUDA), torch 2.11.0",
     "jobs": 2, "command": "depthattn compare --methods none --seeds 0 --out ..."}

``commit`` is ``short_commit`` of ``run.record.git_revision`` (``unknown`` outside a git checkout, unless the
launcher was told the commit); ``jobs`` the parts its launcher ran at once; ``command`` the compare it started.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from .spec import Part, Study

LOG_DIR = "logs"


def invocations_file(study: Study, part: Part) -> Path:
    """Where the starts of ``part`` are recorded: ``OUT/logs/PART.jsonl``."""
    return study.out / LOG_DIR / f"{part.name}.jsonl"


def compare_command(study: Study, part: Part) -> str:
    """The ``depthattn compare`` command line of ``part``, shell-quoted."""
    return "depthattn " + shlex.join(study.compare_argv(part))


def part_device(study: Study, part: Part) -> str:
    """The part's ``TrainConfig.device`` setting (``Study.part_settings``: [set], its cell's, [method_set]), else
    ``auto``."""
    return str(study.part_settings(part).get("device", "auto"))


def short_commit(revision: str | None) -> str:
    """A ``git_revision`` (``<sha>`` or ``<sha>-dirty``) as published: 8 digits, ``+dirty`` kept; ``unknown`` for
    None."""
    if not revision:
        return "unknown"
    return revision[:8] + ("+dirty" if revision.endswith("-dirty") else "")


@functools.lru_cache(maxsize=None)
def hardware(device: str = "auto") -> str:
    """What a part with device setting ``device`` trains on, in words, with torch's version: the GPU's name
    (``NVIDIA H200 (CUDA), torch 2.11.0``) for ``cuda``/``cuda:N``, or ``auto`` where CUDA is available; else the
    CPU's model and core count (``AMD EPYC, 2 cores, torch 2.13.0+cpu``)."""
    import torch

    from ..devices import accelerator_name, cpu_name

    name = accelerator_name(device)
    if name is not None:
        return f"{name} (CUDA), torch {torch.__version__}"
    return f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}"


@dataclass(frozen=True)
class Invocation:
    """One start of a part, to record where it runs (picklable: a SLURM task records it on its node).
    ``commit`` None: this checkout's (``run.record.git_revision``)."""

    file: Path
    command: str
    device: str
    jobs: int
    commit: str | None = None

    def record(self) -> dict:
        """Append this start's line (module docstring) to ``file``, flushed and fsync'd, after a line break where
        the file ends in a torn line (a launcher killed while writing it), so that line alone is lost; returns it.
        Raises ``OSError`` if the file cannot be written."""
        from ..run.record import git_revision

        row = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "commit": self.commit or short_commit(git_revision()), "hardware": hardware(self.device),
               "jobs": self.jobs, "command": self.command}
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a+b") as f:
            line = (json.dumps(row) + "\n").encode("utf-8")
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return row


def invocation(study: Study, part: Part, jobs: int, commit: str | None = None) -> Invocation:
    """The ``Invocation`` of starting ``part`` with ``jobs`` parts at once (``commit``: the code's, where the checkout
    has no git history)."""
    return Invocation(invocations_file(study, part), compare_command(study, part), part_device(study, part), jobs,
                      commit)


def read_invocations(study: Study, part: Part) -> list[dict]:
    """The recorded starts of ``part``, oldest first (none without a file; a torn line, from a launcher killed while
    writing it, left out)."""
    path = invocations_file(study, part)
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows
