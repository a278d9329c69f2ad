"""Fault injection for tests: kill the process, or send it a signal, the n-th time a named phase is reached.

``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` SIGKILLs the process; ``DEPTHATTN_FAULT_SIGNAL=SIG@PHASE:N[>parent],...``
sends ``SIG`` (TERM, INT, USR1, ...) to it, or with ``>parent`` from global rank 0 to its parent (torchrun). The
phases are named where the trainer and the checkpoint writers call :func:`fault_point`. Both variables are unset
outside tests, and then nothing happens.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

FAULT_SIGNAL_ENV = "DEPTHATTN_FAULT_SIGNAL"
FAULT_ENV = "DEPTHATTN_FAULT_PHASE"


_fault_counts: dict[str, int] = {}


def fault_point(phase: str) -> None:
    """Test hook: with ``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` set, SIGKILL this process the n-th time ``phase`` is
    reached (phases: ``step`` after an optimizer step, ``logged`` after its metrics row, ``save`` inside a
    checkpoint write, ``saved`` after the rename before pruning, ``prune`` after a folder moved to the trash).
    Does nothing when the variable is unset. ``DEPTHATTN_FAULT_SIGNAL`` sends a signal at a phase instead
    (``deliver_fault_signal``; further phases: ``micro`` after each micro-batch's backward pass, ``eval``
    between validation batches)."""
    deliver_fault_signal(phase)
    spec = os.environ.get(FAULT_ENV)
    if not spec or spec.partition(":")[0] != phase:
        return
    _fault_counts[phase] = _fault_counts.get(phase, 0) + 1
    if _fault_counts[phase] == int(spec.partition(":")[2] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def watch(request: Any) -> None:
    """Tell the signal hook which stop request to wait on (``preemption.stop_signals``; None when it ends)."""
    global _active
    _active = request


_signal_counts: dict[str, int] = {}
_active = None  # the stop request of the training loop in force (``watch``): the signal hook waits on it


def deliver_fault_signal(phase: str) -> None:
    """Test hook (``fault_point``): with ``DEPTHATTN_FAULT_SIGNAL=SIG@PHASE:N[>parent],...`` set, send each
    spec's signal the N-th time ``phase`` is reached (``>parent``: from global rank 0 to the parent process, i.e.
    torchrun). Does nothing when the variable is unset. ``ValueError`` naming the variable for a bad spec."""
    spec = os.environ.get(FAULT_SIGNAL_ENV)
    if not spec:
        return
    for item in spec.split(","):
        sig, at, rest = item.strip().partition("@")
        where, _, target = rest.partition(">")
        name, _, nth = where.partition(":")
        if not at or not name or target not in ("", "parent") or not (nth or "1").isdigit():
            raise ValueError(f"{FAULT_SIGNAL_ENV}={spec!r}: {item!r} is not SIG@PHASE:N[>parent]")
        if name != phase:
            continue
        _signal_counts[item] = _signal_counts.get(item, 0) + 1
        if _signal_counts[item] != int(nth or 1):
            continue
        signum = getattr(signal, f"SIG{sig.upper().removeprefix('SIG')}", None)
        if not isinstance(signum, signal.Signals):
            raise ValueError(f"{FAULT_SIGNAL_ENV}={spec!r}: {sig!r} is not a signal name (TERM, INT, USR1, ...)")
        if target != "parent":
            os.kill(os.getpid(), signum)
        elif int(os.environ.get("RANK", "0")) == 0:
            os.kill(os.getppid(), signum)
            deadline = time.monotonic() + 30  # until torchrun's forwarded signal is here: the phase decides the step
            while time.monotonic() < deadline and not (_active is not None and _active.requested):
                time.sleep(0.005)
