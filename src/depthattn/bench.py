"""The benchmark harness of ``scripts/bench*.py``: interleaved rounds, per-round paired ratios, pooling, a JSON record.

In the package (not scripts/) so scripts import it as ``depthattn.bench`` without touching ``sys.path``; no library
module imports it.

Every speed number in ``docs/benchmarks.md`` comes from here. ``interleaved`` runs each case once per round, in one
order that is reversed every other round (``"abba"``: A B | B A | A B …), so a drifting machine load hits every case
alike; ``paired_ratios`` divides two cases' times round by round (each ratio compares back-to-back timings) and
summarises the per-round ratios by their median and by the geometric mean with its 95 % t-interval
(``stats.paired_difference`` on the log ratios). Rounds within one process are not independent samples of the
machine, so a claim of a few per cent rests on several processes: ``pool`` joins their rounds and ``across_records``
gives each process's median ratio and the interval across processes. ``write_record`` writes a measurement as JSON
with the command, git revision, package versions, device and CPU names and timestamps.

A record (what ``interleaved`` returns, ``pool`` joins and ``write_record`` writes) is a dict:
``{"cases": [name, …], "order", "warmup", "rounds", "times": {name: [seconds per round]}, "started", "finished",
"load": [1-min load average at start, at end]}``; a script adds its own keys (kept by ``pool`` from the first
record).
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from .devices import accelerator_name, cpu_name
from .fileio import atomic_write_json
from .stats import paired_difference

ORDERS = ("abba", "alternate")
Case = Callable[[], "float | None"]


def round_order(names: Sequence[str], index: int, order: str = "abba") -> list[str]:
    """The cases of round ``index`` (0-based, warm-up rounds included) in the order they run: ``"abba"`` reverses
    ``names`` on odd rounds (with two cases each goes first in half the rounds), ``"alternate"`` keeps it
    (A B | A B …). Raises ``ValueError`` for another ``order``."""
    if order not in ORDERS:
        raise ValueError(f"order={order!r}: choose from {', '.join(ORDERS)}")
    return list(names)[::-1] if order == "abba" and index % 2 else list(names)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def interleaved(cases: Mapping[str, Case], rounds: int, order: str = "abba", warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter, before_round: Callable[[int], None] | None = None,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every case once per round, ``warmup`` untimed rounds first, in ``round_order``; returns a record.

    A case returns its own duration in seconds (when it must synchronise a device or use another clock first) or
    None, and then the harness times the call with ``clock`` (seconds). ``before_round(index)`` runs before each
    round, warm-up rounds included (index 0 is the first warm-up round), outside the timing: e.g. to draw the
    inputs all cases of a round share. ``log`` gets ``"round k/n done"`` after each timed round.

    Returns ``{"cases", "order", "warmup", "rounds", "times": {case: [seconds] * rounds}, "started", "finished"
    (UTC ISO 8601), "load": [start, end]}``. Raises ``ValueError`` for no case, ``rounds < 1``, ``warmup < 0`` or
    an unknown ``order``."""
    names = list(cases)
    if not names:
        raise ValueError("interleaved needs at least one case")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds} must be >= 1 and warmup={warmup} >= 0")
    round_order(names, 0, order)  # checks order before anything runs
    times: dict[str, list[float]] = {n: [] for n in names}
    started, load_start = _now(), _load()
    for index in range(warmup + rounds):
        if before_round is not None:
            before_round(index)
        for name in round_order(names, index, order):
            t0 = clock()
            seconds = cases[name]()
            if seconds is None:
                seconds = clock() - t0
            if index >= warmup:
                times[name].append(float(seconds))
        if index >= warmup and log is not None:
            log(f"round {index - warmup + 1}/{rounds} done")
    return {"cases": names, "order": order, "warmup": warmup, "rounds": rounds, "times": times,
            "started": started, "finished": _now(), "load": [load_start, _load()]}


def ratio_summary(ratios: Sequence[float]) -> dict[str, Any]:
    """``{"n", "median", "geomean", "ci95": [lo, hi] | None}`` of positive ratios: the 95 % interval is the
    t-interval of the mean log ratio (``stats.paired_difference``), exponentiated; None for one ratio. Raises
    ``ValueError`` for no ratio or one that is not positive."""
    if not ratios or min(ratios) <= 0:
        raise ValueError(f"ratio_summary needs positive ratios, got {list(ratios)!r}")
    logs = [math.log(r) for r in ratios]
    d = paired_difference(logs, [0.0] * len(logs))
    return {"n": len(ratios), "median": statistics.median(ratios), "geomean": math.exp(d["mean"]),
            "ci95": None if d["ci95"] is None else [math.exp(x) for x in d["ci95"]]}


def paired_ratios(record: Mapping[str, Any], num: str, den: str) -> dict[str, Any]:
    """Per-round time ratios ``num / den`` of a record (``interleaved``'s or ``pool``'s) and their
    ``ratio_summary``: ``{"num", "den", "ratios", "n", "median", "geomean", "ci95"}``. Raises ``KeyError`` naming a
    case the record lacks and ``ValueError`` for unequal round counts."""
    times = record["times"]
    for name in (num, den):
        if name not in times:
            raise KeyError(f"no case {name!r} in the record (cases: {', '.join(times)})")
    a, b = times[num], times[den]
    if len(a) != len(b):
        raise ValueError(f"{num!r} has {len(a)} rounds and {den!r} {len(b)}: ratios need paired rounds")
    ratios = [x / y for x, y in zip(a, b)]
    return {"num": num, "den": den, "ratios": ratios, **ratio_summary(ratios)}


def pool(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One record from several processes' records: each case's per-round times joined in process order (rounds
    stay paired within a process, so every per-round ratio still compares back-to-back timings), ``rounds`` their
    total, ``processes`` their count, ``started`` / ``finished`` the first and last; every other key from the first
    record. The inputs are not changed. Raises ``ValueError`` for no record or records with other cases (the order
the cases ran in may differ)."""
    if not records:
        raise ValueError("pool needs at least one record")
    first = records[0]
    for r in records[1:]:
        if set(r["times"]) != set(first["times"]):
            raise ValueError(f"pool: records with other cases: {list(first['times'])} and {list(r['times'])}")
    out = dict(first)
    out["times"] = {k: [x for r in records for x in r["times"][k]] for k in first["times"]}
    out["rounds"] = sum(r.get("rounds", len(next(iter(r["times"].values()), []))) for r in records)
    out["processes"] = sum(r.get("processes", 1) for r in records)
    if all("started" in r and "finished" in r for r in records):
        out["started"], out["finished"] = min(r["started"] for r in records), max(r["finished"] for r in records)
    return out


def across_records(records: Sequence[Mapping[str, Any]], num: str, den: str) -> dict[str, Any]:
    """Each record's (process's) median per-round ratio ``num / den`` and their ``ratio_summary`` across records:
    ``{"per_process", "n", "median", "geomean", "ci95"}`` (``ci95`` None for one record)."""
    per = [paired_ratios(r, num, den)["median"] for r in records]
    return {"per_process": per, **ratio_summary(per)}


def device_name(device: str | None) -> str | None:
    """The accelerator's name for a ``cuda`` device string (``devices.accelerator_name``), else ``device``."""
    return (accelerator_name(device) if device else None) or device


def environment(device: str | None = None, command: Sequence[str] | None = None) -> dict[str, Any]:
    """What a record says about where it was measured: ``{"command"`` (this process's, shell-quoted), ``"commit"``
    (``run.record.git_revision``), ``"versions"`` (``run.record.versions``), ``"python"``, ``"device"``
    (``device_name``), ``"cpu"`` (``cpu_name``), ``"cpu_count"``, ``"written"`` (UTC ISO 8601)``}``."""
    from .run.record import git_revision, versions

    argv = [os.path.basename(sys.executable), *sys.argv] if command is None else list(command)
    return {"command": shlex.join(argv), "commit": git_revision(), "versions": versions(),
            "python": platform.python_version(), "device": device_name(device), "cpu": cpu_name(),
            "cpu_count": os.cpu_count(), "written": _now()}


def write_record(path: str | os.PathLike, record: Mapping[str, Any], device: str | None = None,
                 command: Sequence[str] | None = None) -> dict[str, Any]:
    """Write ``record`` with ``environment(device, command)`` under ``"environment"`` to ``path`` as JSON
    (``fileio.atomic_write_json``: a reader sees the old file or the whole new one); returns what was written.
    Raises ``OSError`` from the write and ``TypeError`` for a value JSON cannot hold."""
    out = {"environment": environment(device, command), **record}
    atomic_write_json(path, out)
    return out
