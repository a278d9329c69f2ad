"""The duration estimate a comparison logs once per run it trains: its first steps timed, the training still left
extrapolated from them (``DurationEstimate``)."""

from __future__ import annotations

import time
from typing import Callable


class DurationEstimate:
    """Times the first optimizer steps of each run this invocation trains and says, in one line per run, how long
    the training still left will take: ``ESTIMATE_STEPS`` steps after the run's first (its warm-up: compile,
    allocation) at their mean wall time (validation and saves included), for the rest of this run and every run not
    yet started (an upper bound: a finished run found on disk is reused, not trained). Each run measures again, so
    the estimate follows the machine's load. The final evaluations and samples come on top (said, not timed)."""

    ESTIMATE_STEPS = 10

    def __init__(self, runs_to_go: int, log: Callable[[str], None]):
        self.runs_to_go, self.log = runs_to_go, log
        self.t0: float | None = None
        self.first: int | None = None
        self.done = False

    def next_run(self) -> None:
        """A new run starts: its first steps are timed afresh."""
        self.runs_to_go -= 1
        self.t0, self.first, self.done = None, None, False

    def on_step(self, step: int, total: int) -> None:
        if self.done:
            return
        if self.t0 is None:  # the first step of this session: its warm-up is not timed
            self.t0, self.first = time.perf_counter(), step
            return
        timed = step - self.first
        if timed < min(self.ESTIMATE_STEPS, total - self.first):
            return
        self.done = True
        per_step = (time.perf_counter() - self.t0) / timed
        left = (total - step) + total * self.runs_to_go
        runs = f" and {self.runs_to_go} more run{'s' if self.runs_to_go != 1 else ''}" if self.runs_to_go else ""
        self.log(f"estimate: about {_duration(per_step * left)} of training left for this run{runs} ({per_step:.2f} s "
                 f"per step over steps {self.first + 1}-{step}, validation and saves included), plus each run's final "
                 f"evaluation and sample")


def _duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
