"""The comparison itself (``run_compare``): under ``OUT``'s lock, every (method, seed) run trained, resumed or reused
(``reuse``) and evaluated (``evaluate``), then ``results.json`` with the statistics (``paired``, ``conclusions``) and
the history of the invocations, ``loss_curves.png`` (``plot``) and ``report.md`` (``report``) written."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from ..fileio import atomic_write_text, read_json
from ..layout import COMPARE_RUNS_DIR, PLOT_FILE, REPORT_FILE, RESULTS_FILE
from ..outputs import COMPARE_FOLDER, check_new_output
from ..progress import write_line
from ..run.lock import RunLock
from .conclusions import conclusions
from .estimate import DurationEstimate
from .evaluate import diverged_run, evaluate_run
from .paired import aggregate, paired_stats
from .plot import plot_curves
from .records import SAMPLE_PROMPT
from .report import render_report
from .reuse import ensure_trained
from .settings import CompareSettings, method_configs, run_name


def run_compare(out: str | os.PathLike, settings: CompareSettings, data_dir: str | os.PathLike,
                progress: bool = True, log: Callable[[str], None] = write_line) -> dict[str, Any]:
    """Train and evaluate every (method, seed); write ``results.json``, ``report.md``, ``loss_curves.png`` under
    ``out`` and return the results. Holds ``out``'s lock throughout (``run.lock.RunLock``; each run's trainer locks
    its own folder too). Raises ``ValueError`` for bad settings before any training, for an ``out`` holding files
    no compare wrote (``outputs.COMPARE_FOLDER``, checked under the lock), and ``RunFolderLocked`` (a
    ``ValueError``) when another compare holds ``out``: nothing is written then."""
    with RunLock(out, "compare"):
        check_new_output(out, COMPARE_FOLDER)
        return _run_compare(out, settings, data_dir, progress, log)


def _run_compare(out: str | os.PathLike, settings: CompareSettings, data_dir: str | os.PathLike, progress: bool,
                 log: Callable[[str], None]) -> dict[str, Any]:
    out, data_dir = Path(out), Path(data_dir)
    t_start = time.perf_counter()
    settings.train.total_steps()
    cfgs = method_configs(settings, data_dir)  # every config validated before training anything
    runs: dict[str, list[dict]] = {m: [] for m in settings.methods}
    diverged: dict[str, list[dict]] = {m: [] for m in settings.methods}
    invocation: dict[str, Any] = {"started_utc": _utc_now(), "runs": {}}
    estimate = DurationEstimate(len(settings.seeds) * len(settings.methods), log)
    for seed in settings.seeds:
        tcfg = settings.train.replace(seed=seed)
        for m in settings.methods:
            run_dir = out / COMPARE_RUNS_DIR / run_name(m, settings.loops, seed)
            log(f"== {m} (seed {seed}) -> {run_dir}")
            t_run = time.perf_counter()
            estimate.next_run()
            action = ensure_trained(run_dir, cfgs[m], tcfg, data_dir, progress, log, estimate.on_step)
            if action.startswith("diverged"):
                diverged[m].append(diverged_run(run_dir, cfgs[m], seed))
            else:
                runs[m].append(evaluate_run(run_dir, settings.eval_tokens, tcfg.eval_batch_size,
                                            settings.tasks or [], settings.limit, settings.harness, progress,
                                            data_dir))
            invocation["runs"][run_dir.name] = {"action": action, "seconds": time.perf_counter() - t_run}
    invocation["wall_seconds"] = time.perf_counter() - t_start
    results = {
        "settings": {"methods": settings.methods, "seeds": settings.seeds, "loops": settings.loops,
                     "preset": settings.preset, "model_overrides": settings.model_overrides,
                     "train": settings.train.replace(steps=settings.train.total_steps()).to_dict(),
                     "data": str(data_dir.resolve()), "eval_tokens": settings.eval_tokens,
                     "tasks": settings.tasks or [], "sample_prompt": SAMPLE_PROMPT},
        "methods": {m: {"runs": runs[m], "diverged": diverged[m], **aggregate(runs[m])} for m in settings.methods},
        "wall_seconds": invocation["wall_seconds"],
        "history": previous_history(out / RESULTS_FILE) + [invocation],
    }
    results["paired"] = paired_stats(results)
    results["conclusion"] = conclusions(results)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    plot_curves(results, out / PLOT_FILE)
    atomic_write_text(out / REPORT_FILE, render_report(results))
    return results


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def previous_history(path: Path) -> list[dict]:
    """The invocation history of an earlier ``results.json`` in the same folder ([] if none or unreadable)."""
    try:
        old = read_json(path, "results file")
    except (OSError, ValueError):
        return []
    history = old.get("history") if isinstance(old, dict) else None
    if isinstance(history, list):
        return [h for h in history if isinstance(h, dict)]
    if isinstance(old, dict) and isinstance(old.get("wall_seconds"), (int, float)):  # a report from before histories
        return [{"started_utc": None, "wall_seconds": float(old["wall_seconds"]), "runs": {}}]
    return []
