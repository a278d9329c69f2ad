"""``depthattn compare``: train several cross-layer methods on the same data, seed and budget; evaluate; report.

Every (method, seed) pair trains in its own run folder ``OUT/runs/<method>[-loopsN]-seed<S>/`` with identical
``TrainConfig`` (same seed, so same data order and, for methods without extra parameters, the same initial
weights). Finished runs are reused and interrupted ones resumed, so re-running a comparison only does missing work.
Outputs: ``OUT/report.md``, ``OUT/results.json``, ``OUT/loss_curves.png``.

A run the divergence guard (or a non-finite loss) stopped is reported as *diverged* with its step (``results.json``:
``methods[m]["diverged"]``; the report's conclusion and table, the terminal table) and left out of the means and
the paired statistics; the other runs go on. A re-run reuses that verdict from the run's ``diverged.json`` instead
of training the run again; ``--set on_divergence=warn`` (``on_nonfinite=skip`` for a non-finite stop) continues it
past the divergence, deleting its folder trains it afresh.

The report opens with its conclusion: for every method, the paired difference from ``none`` over seeds (mean,
standard deviation, 95 % t-interval, seeds favouring; ``depthattn.stats``), what the run cannot show (scale, tokens),
tokens-to-target, zero-shot accuracies with binomial standard errors, and the history of the invocations that built
it (per-run training time from the runs' own logs, so re-running on finished runs does not rewrite it).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..accounting import kv_cache_bytes_per_token, num_flops, num_params
from ..config import ModelConfig
from ..fileio import atomic_write_text, read_json
from ..layout import COMPARE_RUNS_DIR, EVAL_CACHE_FILE, PLOT_FILE, REPORT_FILE, RESULTS_FILE, ZERO_SHOT_DIR
from ..outputs import COMPARE_FOLDER, check_new_output
from ..progress import write_line
from ..run.folder import RunFolder
from ..run.lock import RunLock
from ..run.record import recorded_precision
from ..training import DivergenceError, NonFiniteError, TrainConfig, train
from ..training.resume import plan_run
from .conclusions import conclusions
from .estimate import DurationEstimate
from .paired import aggregate, paired_stats, pairable_train_differences, run_differences
from .plot import method_colours, plot_curves
from .settings import (DEFAULT_EVAL_TOKENS, DEFAULT_OUT, DEFAULT_TRAIN, QUICK, CompareSettings, method_configs,
                       parse_methods, prepare_default_data, run_name)
from .report import render_report, render_table, shown_path
from .records import BASELINE, COLUMNS, SAMPLE_PROMPT, SAMPLE_TOKENS, by_seed, val_curve


def _train_tokens_per_s(rows: list[dict]) -> float:
    """Steady-state training throughput from the per-step log: the median of ``tokens_per_s`` over the logged steps
    after the first (the first step includes warm-up: allocation, kernel selection, compilation). NaN without timed
    rows; the first step's rate when it is the only one."""
    timed = [r for r in rows if r.get("tokens_per_s")]
    later = [float(r["tokens_per_s"]) for r in timed if r.get("step", 0) > 1]
    if later:
        return statistics.median(later)
    return float(timed[0]["tokens_per_s"]) if timed else float("nan")


def _train_seconds(rows: list[dict]) -> float:
    """Seconds spent in optimizer steps over the whole run (every session), from the per-step log."""
    prev, seconds = 0, 0.0
    for r in rows:
        if r.get("tokens_per_s"):
            seconds += (r["tokens"] - prev) / r["tokens_per_s"]
            prev = r["tokens"]
    return seconds


def _step_rates(rows: list[dict]) -> list[float]:
    """Per-step training throughputs after the first step (tokens/s)."""
    return [float(r["tokens_per_s"]) for r in rows if r.get("tokens_per_s") and r.get("step", 0) > 1]


def _ensure_trained(run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: Path,
                    progress: bool, log: Callable[[str], None], on_step: Callable[[int, int], None] | None = None
                    ) -> str:
    """Train, resume (from the newest checkpoint), or reuse the run in ``run_dir`` (ValueError if it holds a
    different config). Returns what it did: "reused", "resumed at step N", "trained", or "diverged at step N" (this
    session's training stopped by the divergence guard or a non-finite value, or with ``on_divergence="stop"`` an
    earlier session's verdict, from the run's ``diverged.json``, reused)."""
    folder = RunFolder(run_dir)
    plan = plan_run("reuse", run_dir, model_cfg=model_cfg, train_cfg=train_cfg, data_dir=data_dir)
    for line in plan.lines:
        log(line)
    if plan.resume:
        verdict = folder.read_divergence()
        setting = "on_nonfinite=skip" if verdict and verdict.get("reason") == "nonfinite" else "on_divergence=warn"
        if verdict is not None and getattr(train_cfg, setting.split("=")[0]) == "stop":  # the same rule would stop it
            log(f"reusing the verdict of {run_dir}: diverged at step {verdict['step']} (to try again: delete that "
                f"folder, or continue it past the divergence with --set {setting})")
            return f"diverged at step {verdict['step']}"
        if folder.summary_file.is_file() and folder.checkpoints():
            log(f"reusing finished run {run_dir}")
            return "reused"
    resume = plan.resume
    try:
        res = train(run_dir, model_cfg, train_cfg, data_dir, progress=progress, log=log, on_step=on_step,
                    **plan.train_kwargs())
    except (DivergenceError, NonFiniteError) as e:  # the run stopped itself (diverged.json says why): go on
        log(f"{run_dir}: {e}")
        return f"diverged at step {e.step}"
    return f"resumed at step {res.steps - res.steps_this_session}" if resume else "trained"


def diverged_run(run_dir: Path, model_cfg: ModelConfig, seed: int) -> dict[str, Any]:
    """What the report says of a run stopped by divergence: its method and seed, the step and why (the run's
    ``diverged.json``), the best checkpoint kept, and its curves up to the stop (from ``metrics.jsonl``)."""
    folder = RunFolder(run_dir)
    verdict = folder.read_divergence() or {}
    rows = folder.read_metrics()
    return {"run_dir": str(run_dir), "method": model_cfg.cross_layer, "num_loops": model_cfg.num_loops, "seed": seed,
            "step": verdict.get("step", max((int(r["step"]) for r in rows), default=0)),
            "reason": verdict.get("reason"), "val_loss": verdict.get("val_loss"), "ln_vocab": verdict.get("ln_vocab"),
            "best_checkpoint": verdict.get("best_checkpoint"), "best_val_loss": verdict.get("best_val_loss"),
            "train_seconds": _train_seconds(rows),
            "curve": [{"step": r["step"], "tokens": r["tokens"], "val_loss": r["val_loss"]} for r in rows
                      if r.get("val_loss") is not None],
            "train_curve": [{"tokens": r["tokens"], "loss": r["loss"]} for r in rows if r.get("loss") is not None]}


def evaluate_run(run_dir: Path, eval_tokens: int | None, eval_batch_size: int, tasks: list[str], limit: int | None,
                 harness: str, progress: bool, data_dir: Path | None = None) -> dict[str, Any]:
    """Numbers of one finished run: accounting, median per-step throughput, validation perplexity / bits per byte
    (in the precision the run trained and validated in, as its run.json records it, so a float32 run on CUDA is
    evaluated in float32 and a CPU run evaluated where CUDA is present is not put in bf16; cached in RUN/eval.json,
    ``_reusable_eval``), a sample from ``SAMPLE_PROMPT`` (seeded), and zero-shot results when ``tasks``. ``data_dir``:
    where the run's data is now (default: the folder its run.json records)."""
    from ..data import load_prepared
    from ..eval.inference import load_for_inference
    from ..eval.perplexity import evaluate_perplexity
    from ..eval.zero_shot import run_zero_shot
    from ..generate import generate_text
    from ..devices import autocast_dtype

    files = RunFolder(run_dir)
    run = files.read_run()
    summary = read_json(files.summary_file, "run summary")
    cfg = ModelConfig.from_dict(run["model"])
    seq_len = run["train"]["seq_len"]
    model, tokenizer, folder, dev = load_for_inference(run_dir, run["train"].get("device", "auto"),
                                                       "TrainConfig.device")
    cache = run_dir / EVAL_CACHE_FILE
    data = load_prepared(data_dir or run["data"])  # the run's data (``_ensure_trained`` checked it), where it is
    # the precision the run trained in (run.json's resolved one; else its setting), not "auto" on this device
    amp = autocast_dtype(recorded_precision(run) or run["train"].get("precision", "auto"), dev)
    key = {"checkpoint": str(folder), "eval_tokens": eval_tokens, "seq_len": seq_len,
           "data_fingerprint": data.fingerprint, "amp": str(amp)}
    cached = read_json(cache, "evaluation cache") if cache.is_file() else None
    if _reusable_eval(cached, key, as_auto=amp == autocast_dtype("auto", dev)):
        ev = cached["result"]
    else:
        res = evaluate_perplexity(model, data.val, tokenizer, seq_len=seq_len, batch_size=eval_batch_size,
                                  max_tokens=eval_tokens, device=dev, amp_dtype=amp,
                                  progress=progress, expected_bytes=data.num_bytes("val"))
        ev = res.to_dict()
        atomic_write_text(cache, json.dumps({"key": key, "result": ev}, indent=2) + "\n")
    rows = files.read_metrics()
    flops = num_flops(cfg, seq_len)
    out: dict[str, Any] = {
        "run_dir": str(run_dir), "method": cfg.cross_layer, "num_loops": cfg.num_loops,
        "seed": run["train"]["seed"], "params": num_params(cfg),
        "params_counted": sum(p.numel() for p in model.parameters()),
        "tokens": summary["tokens"], "steps": summary["steps"], "val_loss": ev["loss"],
        "perplexity": ev["perplexity"], "bits_per_byte": ev["bits_per_byte"], "eval_tokens": ev["tokens"],
        "eval_bytes": ev["bytes"], "periodic_val_loss": summary["final_val_loss"],
        "train_tokens_per_s": _train_tokens_per_s(rows), "train_seconds": _train_seconds(rows),
        "step_tokens_per_s": _step_rates(rows),
        "kv_bytes_per_token": kv_cache_bytes_per_token(cfg, torch.bfloat16),
        "flops_per_token": flops.total, "flops_extra_ratio": flops.ratio,
        "curve": [{"step": r["step"], "tokens": r["tokens"], "val_loss": r["val_loss"]} for r in rows
                  if "val_loss" in r],
        "train_curve": [{"tokens": r["tokens"], "loss": r["loss"]} for r in rows
                        if r.get("loss") is not None],  # a skipped non-finite step logs loss null
        "sample": generate_text(model, tokenizer, SAMPLE_PROMPT, max_new_tokens=SAMPLE_TOKENS, temperature=0.8,
                                top_k=50, seed=0, device=dev),
    }
    in_loop = task_curve(rows)
    if in_loop:  # TrainConfig.eval_tasks: the zero-shot numbers logged during training
        out["task_curve"] = in_loop
    if tasks:
        zs = run_zero_shot(model, tokenizer, tasks=tasks, limit=limit, batch_size=eval_batch_size, harness=harness,
                           out_dir=str(run_dir / ZERO_SHOT_DIR), progress=progress)
        out["zero_shot"] = {k: v for k, v in zs.items() if k != "items"}  # per-item predictions stay in the run
        out["task_accuracy"] = _task_accuracies(zs, tasks)
        out["task_n"] = {t: int(m["n"]) for t, m in zs.get("tasks", {}).items() if "n" in m}
        out["task_chance"] = {t: _chance(zs.get("items", {}).get(t, [])) for t in out["task_n"]}
    return out


def _reusable_eval(cached: Any, key: dict[str, Any], as_auto: bool) -> bool:
    """Whether an eval.json entry ``cached`` answers ``key``. The checkpoint is compared by its path inside the run
    folder (``checkpoints/step_N``: the cache lives there, so a moved folder, or one written with a relative
    ``--out``, finds its evaluation); an entry written before the key named the precision (``amp``) was evaluated
    under ``"auto"`` on this device, so it answers only when ``as_auto`` (the run's precision is what "auto" gives)."""
    if not isinstance(cached, dict) or not isinstance(cached.get("key"), dict):
        return False

    def inside_run(k: dict[str, Any]) -> dict[str, Any]:
        return {**k, "checkpoint": Path(str(k.get("checkpoint", ""))).parts[-2:]}

    got, want = inside_run(cached["key"]), inside_run(key)
    return got == want or (as_auto and got == {k: v for k, v in want.items() if k != "amp"})


def task_curve(rows: list[dict]) -> list[dict]:
    """The in-loop zero-shot rows of a run's metrics (``TrainConfig.eval_tasks``): step, tokens and every
    ``task/<name>/<metric>`` key, one entry per step that has them ([] for a run without)."""
    return [{"step": r["step"], "tokens": r["tokens"], **{k: v for k, v in r.items() if k.startswith("task/")}}
            for r in rows if any(k.startswith("task/") for k in r)]


def _chance(items: list[dict]) -> float:
    """Chance accuracy of a task from its per-item predictions: the mean of 1 / (number of choices); 0 for tasks
    scored by exact match (LAMBADA: no choices)."""
    from ..eval.zero_shot import chance_accuracy

    return chance_accuracy(items)


def _task_accuracies(zs: dict, tasks: list[str]) -> dict[str, float]:
    """Per-task accuracy from ``run_zero_shot``'s result (``{"tasks": {name: {"acc": x}}, "average_acc": y}``),
    plus ``average``."""
    table = zs.get("tasks", zs.get("results", zs))
    acc = {}
    for t in tasks:
        v = table.get(t) if isinstance(table, dict) else None
        if isinstance(v, dict):
            v = v.get("acc", v.get("accuracy", v.get("acc_norm")))
        if isinstance(v, (int, float)):
            acc[t] = float(v)
    if acc:
        avg = zs.get("average_acc", zs.get("average"))
        acc["average"] = float(avg) if isinstance(avg, (int, float)) else sum(acc.values()) / len(acc)
    return acc


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
            action = _ensure_trained(run_dir, cfgs[m], tcfg, data_dir, progress, log, estimate.on_step)
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
        "history": _previous_history(out / RESULTS_FILE) + [invocation],
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


def _previous_history(path: Path) -> list[dict]:
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
