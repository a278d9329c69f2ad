"""Train the parts of a study that are not done (``depthattn study run``), on this machine.

Each part is one ``depthattn compare`` process (``Study.compare_argv``), so everything compare decides — which runs
to reuse, which to resume from their newest checkpoint, which settings a finished run must share, its lock, its
report — is decided by compare itself. Running a study again therefore trains only what is missing and resumes
what was interrupted; a part another process is running is left alone (its lock says so).

Locally the parts run as a pool of at most ``jobs`` child processes (``run_local``), not through submitit's
``LocalExecutor``: each part already is a process, the pool needs nothing beyond the standard library (submitit is
the optional ``cluster`` extra), and a child's output goes to a plain log file, ``OUT/logs/PART.log``, that a
failure's message quotes; each start of a part is recorded in ``OUT/logs/PART.jsonl`` (``invocations``: commit,
machine, parts at once). A launcher stopped by SIGTERM (SLURM, the end of a session, ``kill``) or Ctrl-C stops its
children first (each compare writes the checkpoint of its current step and exits). On SLURM the same command runs as
one task of a job array (``study.slurm``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .invocations import LOG_DIR, invocation
from .spec import Part, Study
from .status import part_status


def command(study: Study, part: Part) -> list[str]:
    """The process that trains ``part``: this interpreter running ``depthattn compare`` with the part's arguments."""
    return [sys.executable, "-c", "import sys; from depthattn.cli import main; sys.exit(main())",
            *study.compare_argv(part)]


def log_file(study: Study, part: Part) -> Path:
    """Where ``run_local`` writes a part's output (outside the part's folder, which only compare writes)."""
    return study.out / LOG_DIR / f"{part.name}.log"


def prepare_data(study: Study, progress: bool = False) -> Path:
    """The study's data, ready before any part starts: ``data`` checked (``data.load_prepared``), or the embedded
    corpus prepared once into ``OUT/data`` (``compare.prepare_default_data``), so parallel parts never prepare it
    twice. Raises ``FileNotFoundError``/``ValueError`` naming a missing or unprepared folder."""
    from ..compare.settings import prepare_default_data
    from ..data import load_prepared

    if study.data is None:
        return prepare_default_data(study.out, progress)
    load_prepared(study.data)
    return study.data


def todo(study: Study, parts: list[Part], log: Callable[[str], None] = print) -> list[Part]:
    """The parts of ``parts`` to train: those missing or incomplete (running ones are named and left out)."""
    out = []
    for part in parts:
        status = part_status(study, part)
        state = status.state
        if state == "running":
            log(f"{part.name}: running in another process; left alone")
        elif state == "stale":
            log(f"{part.name}: done with other settings than the study file's ({status.why}); left alone: move "
                f"{part.folder} aside to train it again")
        elif state != "done":
            out.append(part)
    return out


def tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a text file, indented (``(no output)`` when empty or missing)."""
    text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines() if path.is_file() else []
    return "\n".join("    " + line for line in text[-lines:]) or "    (no output)"


class StopGate:
    """SIGTERM as an exception: ``handler`` raises ``SystemExit(128 + n)`` (so ``finally`` clauses run, as on
    Ctrl-C), except within ``held()``, which defers it to the block's end (a child started and not yet recorded
    would be left running)."""

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum, _frame) -> None:
        if self.holding:
            self.pending = signum
            return
        raise SystemExit(128 + signum)

    @contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending is not None:
                raise SystemExit(128 + self.pending)


@contextmanager
def sigterm_raises() -> Iterator[StopGate]:
    """Within the block, SIGTERM goes to a ``StopGate`` (it raises); the old handler is restored after. Outside the
    main thread (where no handler can be set) SIGTERM keeps its handler."""
    gate = StopGate()
    if threading.current_thread() is not threading.main_thread():
        yield gate
        return
    old = signal.signal(signal.SIGTERM, gate.handler)
    try:
        yield gate
    finally:
        signal.signal(signal.SIGTERM, old)


def run_local(study: Study, parts: list[Part], jobs: int = 1, log: Callable[[str], None] = print,
              poll_s: float = 0.5, commit: str | None = None,
              on_done: Callable[[Part], str] | None = None) -> list[str]:
    """Train ``parts`` with at most ``jobs`` compare processes at once, in order, each one's output in
    ``log_file`` and each start recorded (``invocations``; ``commit``: the code's, where the checkout has no git
    history); returns the names of the parts that failed (each named through ``log`` with its log's last lines;
    the others go on). ``on_done(part)``, called as each part finishes, returns a line to log (e.g. where it was
    published); a ``ValueError`` or ``OSError`` it raises is named and the part counted as failed. SIGTERM or
    Ctrl-C stops the running children (``terminate``: they checkpoint) and waits for them before the exception goes
    on. Raises ``ValueError`` for ``jobs`` < 1."""
    if jobs < 1:
        raise ValueError(f"--jobs {jobs} must be at least 1")
    pending, running, failed = list(parts), {}, []
    with sigterm_raises() as gate:
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    part = pending.pop(0)
                    path = log_file(study, part)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    invocation(study, part, jobs, commit).record()
                    with open(path, "a", encoding="utf-8") as f, gate.held():  # started, then recorded
                        f.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command(study, part))}\n")
                        f.flush()
                        proc = subprocess.Popen(command(study, part), stdout=f, stderr=subprocess.STDOUT,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
                        running[part.name] = (part, proc, time.perf_counter())
                    log(f"{part.name}: started ({len(running)} running, {len(pending)} waiting); log {path}")
                time.sleep(poll_s)
                for name, (part, proc, t0) in list(running.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    del running[name]
                    if rc != 0:
                        failed.append(name)
                        log(f"{name}: failed (exit {rc}); run the study again to resume it. The end of "
                            f"{log_file(study, part)}:\n{tail(log_file(study, part))}")
                        continue
                    log(f"{name}: done in {time.perf_counter() - t0:.0f} s")
                    if on_done is not None:
                        try:
                            log(f"{name}: {on_done(part)}")
                        except (ValueError, OSError) as e:
                            failed.append(name)
                            log(f"{name}: trained, but not published: {e}")
        finally:
            for _, proc, _ in running.values():  # a stopped launcher stops its children (they checkpoint first)
                proc.terminate()
            for _, proc, _ in running.values():
                proc.wait()
    return failed
