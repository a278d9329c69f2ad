"""Preemption: SIGTERM, SIGINT and SIGUSR1 ask a training run to stop after its current optimizer step.

What SLURM (``--signal``, ``scancel``, the time limit) and Kubernetes (pod deletion, eviction) send is a signal and a
grace period. While ``train()`` runs, ``stop_signals`` replaces the handlers of ``STOP_SIGNALS`` with one that only
records the signal (``StopRequest``); the loop reads it once per optimizer step, folded into the all-reduce the step
already makes (``loop._step_verdict``), so every rank stops after the same step, writes the checkpoint of that step
and raises ``TrainingPreempted``. A second signal while that checkpoint is written is recorded too and changes
nothing: the handler never raises, and the checkpoint is written atomically anyway. The old handlers come back when
``train()`` returns. A signal the process was started with ignored (``SIG_IGN``: ``nohup``, a non-interactive
shell's ``&`` for SIGINT) stays ignored, as POSIX launchers expect.

``DEPTHATTN_FAULT_SIGNAL`` (tests only, ``depthattn.run.faults``) delivers a signal at a named point of the loop.

Exit status (``TrainingPreempted.exit_status``, the CLI's table): 128 + the signal's number (SIGTERM 143, SIGINT 130,
SIGUSR1 138): what a shell reports for a process that the signal ended, so a batch script, SLURM's accounting and a
Kubernetes ``podFailurePolicy`` see a preempted run as ended by that signal, not as a failure of its own (1, 2) and
not as finished (0, which would mark a Kubernetes Job complete).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from ..run import faults

#: The signals that ask a run to stop (what schedulers send; SIGUSR1 is SLURM's customary advance warning).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def clock() -> float:
    """Seconds of a monotonic clock: what time-based checkpoints measure (rank 0's decides)."""
    return time.monotonic()


class StopRequest:
    """A signal handler that only records: ``signum`` is the first stop signal received (None: none yet),
    ``count`` how many arrived."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0

    def __call__(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextlib.contextmanager
def stop_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """Record ``signals`` in a ``StopRequest`` inside the ``with``; restore the previous handlers after it. Outside
    the main thread (where Python cannot install handlers) the request is never set."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    old = {}
    for s in signals:
        if signal.getsignal(s) is not signal.SIG_IGN:
            old[s] = signal.signal(s, request)
    faults.watch(request)
    try:
        yield request
    finally:
        faults.watch(None)
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingPreempted(BaseException):
    """A stop signal ended the run after the checkpoint of ``step`` (``checkpoint``) was written: resumable, bit for
    bit. A ``BaseException`` like ``KeyboardInterrupt``: not a failure that ``except Exception`` should swallow (a
    ``compare`` must stop, not train its next method). ``exit_status`` is 128 + the signal's number."""

    def __init__(self, run_dir: Path, step: int, checkpoint: Path | None, signum: int):
        self.run_dir, self.step, self.checkpoint, self.signum = Path(run_dir), step, checkpoint, signum
        super().__init__(self.line())

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def line(self, resume: str | None = None) -> str:
        """``preempted at step N (SIGTERM); checkpoint PATH; resume with: RESUME`` (default
        ``depthattn train --resume RUN``)."""
        resume = resume or f"depthattn train --resume {self.run_dir}"
        return (f"preempted at step {self.step} ({signal_name(self.signum)}); checkpoint {self.checkpoint}; "
                f"resume with: {resume}")
