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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..accounting import kv_cache_bytes_per_token, num_flops, num_params
from ..config import ModelConfig
from ..cross_layer import names as method_names
from ..fileio import atomic_write_text, read_json
from ..layout import (COMPARE_DATA_DIR, COMPARE_RUNS_DIR, EVAL_CACHE_FILE, PLOT_FILE, PREPARED_META_FILE, REPORT_FILE,
                     RESULTS_FILE, TOKENIZER_FILE, ZERO_SHOT_DIR)
from ..outputs import COMPARE_FOLDER, check_new_output
from ..progress import write_line
from ..run.folder import RunFolder
from ..run.lock import RunLock
from ..run.record import recorded_precision
from ..stats import binomial_se
from ..training import DivergenceError, NonFiniteError, TrainConfig, resolve_model_config, train
from ..training.resume import plan_run
from .conclusions import conclusions
from .paired import aggregate, paired_stats, pairable_train_differences, run_differences
from .plot import method_colours, plot_curves
from .records import BASELINE, COLUMNS, SAMPLE_PROMPT, SAMPLE_TOKENS, by_seed, val_curve


#: The default budget: ``small`` preset at seq_len 128, batch 8 → 1,024 tokens per step, 400 steps (410k tokens) per
#: method. Measured on an idle 2-core CPU at ~0.6 s per step with validation: both methods, the final evaluation over
#: the whole held-out split and the samples take about 9 minutes (README), within the 15-minute budget.
DEFAULT_TRAIN = dict(steps=400, batch_size=8, seq_len=128, lr=2e-3, warmup=0.05, eval_every=25, eval_windows=64,
                     eval_batch_size=16, save_every=100, keep_last=1, log_every=1)
DEFAULT_EVAL_TOKENS = 0  # the whole validation split
DEFAULT_OUT = os.path.join("runs", "compare")

#: ``--quick``: the whole job (prepare the corpus, train both methods, evaluate, sample, report, plot) on the ``tiny``
#: preset in about a minute on an idle 2-core CPU; a smoke test of the setup, not a result. Flags given beside it win.
QUICK = dict(preset="tiny", out=os.path.join("runs", "compare-quick"), eval_tokens=16384,
             train=dict(steps=60, batch_size=4, seq_len=64, lr=3e-3, warmup=0.05, eval_every=10, eval_windows=16,
                        eval_batch_size=16, save_every=30, keep_last=1, log_every=1))


def prepare_default_data(out: Path, progress: bool) -> Path:
    """``OUT/data``: the embedded corpus, prepared (default settings) if it has no meta.json yet (``compare``
    without --data; every part of a study without ``data``)."""
    from ..data import load_prepared, prepare_corpus

    folder = out / COMPARE_DATA_DIR
    if not (folder / PREPARED_META_FILE).is_file():
        print(f"preparing the embedded corpus into {folder}")
        prepare_corpus(folder, None, progress=progress, overwrite=True, if_missing=True)
    load_prepared(folder)
    return folder


def parse_methods(text: str) -> list[str]:
    """Comma-separated ``cross_layer`` values; ValueError naming an unknown one."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in method_names()]
    if bad or not methods:
        raise ValueError(f"--methods: unknown method(s) {bad}; choose from {list(method_names())}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods lists a method twice: {methods}")
    return methods


def run_name(method: str, loops: int, seed: int) -> str:
    return f"{method}{f'-loops{loops}' if loops > 1 else ''}-seed{seed}"


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


@dataclass
class CompareSettings:
    methods: list[str]
    seeds: list[int]
    loops: int
    preset: str
    model_overrides: dict[str, Any]
    train: TrainConfig
    eval_tokens: int | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    harness: str = "native"


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


def method_configs(settings: CompareSettings, data_dir: str | os.PathLike) -> dict[str, ModelConfig]:
    """The model config each of ``settings.methods`` trains with on the prepared folder ``data_dir`` (its vocabulary
    and tokenizer); ``ValueError`` naming the field for a setting the preset refuses."""
    from ..data import load_prepared

    data_dir = Path(data_dir)
    vocab_size = load_prepared(data_dir).vocab_size
    cfgs = {}
    for m in settings.methods:
        overrides = {**settings.model_overrides, "cross_layer": m}
        if settings.loops != 1:
            overrides["num_loops"] = settings.loops
        cfgs[m] = resolve_model_config(settings.preset, overrides, vocab_size, str(data_dir / TOKENIZER_FILE))
    return cfgs


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






def _throughput_spread(m: dict) -> float | None:
    """(p90 − p10) / median of the per-step throughputs over all seeds of a method (None without steps)."""
    rates = sorted(x for r in m["runs"] for x in r.get("step_tokens_per_s", []))
    if len(rates) < 2:
        return None
    q = statistics.quantiles(rates, n=10)
    return (q[-1] - q[0]) / statistics.median(rates)


#: Relative p10–p90 spread of the per-step throughput above which the tok/s column is flagged unreliable.
UNRELIABLE_SPREAD = 0.2


# ----------------------------------------------------------------------------- the report
def _cell(mean: float, std: float, fmt: str, n: int) -> str:
    """``mean ± std`` over seeds; the mean alone for one seed or a constant (std 0)."""
    if n > 1 and std > 0:
        return f"{fmt.format(mean)} ± {fmt.format(std)}"
    return fmt.format(mean)


def render_table(results: dict) -> str:
    """The markdown table of the report (one row per method; mean ± std over seeds when there are several)."""
    methods = results["methods"]
    tasks = sorted({k for m in methods.values() for k in m["mean"] if k.startswith("acc:")},
                   key=lambda k: (k == "acc:average", k))
    seq_len = results.get("settings", {}).get("train", {}).get("seq_len", "?")
    head = ["method"] + [title.format(seq_len=seq_len) for _, title, _ in COLUMNS] + [k[4:] for k in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in methods.items():
        n = len(m["runs"])
        gone = m.get("diverged", [])
        if not n:  # every seed diverged
            stops = ", ".join(f"seed {d['seed']} at step {d['step']}" for d in gone)
            lines.append("| " + " | ".join([name, f"diverged ({stops})"] + [""] * (len(head) - 2)) + " |")
            continue
        label = f"{name} ({len(gone)} of {n + len(gone)} seeds diverged)" if gone else name
        cells = [label] + [_cell(m["mean"][k], m["std"][k], fmt, n) for k, _, fmt in COLUMNS]
        cells += [_cell(m["mean"][k], m["std"][k], "{:.4f}", n) if k in m["mean"] else "" for k in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_throughput(results: dict) -> str:
    """The secondary table of the report: each method's training tokens/s, timed one run after another (so under
    the machine's changing load), with its p10–p90 spread; † marks a spread above ``UNRELIABLE_SPREAD``."""
    lines = ["| method | train tok/s (sequential) | p10–p90 spread |", "|---|---:|---:|"]
    for name, m in results["methods"].items():
        if not m["runs"]:
            continue
        spread = _throughput_spread(m)
        flag = " †" if spread is not None and spread > UNRELIABLE_SPREAD else ""
        tps = _cell(m["mean"]["train_tokens_per_s"], m["std"]["train_tokens_per_s"], "{:.0f}", len(m["runs"]))
        lines.append(f"| {name} | {tps}{flag} | {'n/a' if spread is None else f'{spread:.0%}'} |")
    return "\n".join(lines) + "\n"


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a report shows it, without the machine's absolute layout: relative to the working folder when
    inside it, ``~/...`` when under the home folder, else its last component."""
    p = Path(path).expanduser().absolute()
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return prefix + rel.as_posix() if rel.parts or prefix else "."
    return p.name


def _pm(d: dict, key: str = "mean", fmt: str = "{:+.4f}") -> str:
    return fmt.format(d["mean"]) + ("" if d["std"] is None else " ± " + fmt.format(d["std"]).lstrip("+"))


def _interval(d: dict) -> str:
    return "n/a (one seed)" if d["ci95"] is None else f"{d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}"


def render_paired(results: dict) -> str:
    """The paired table: each method minus ``none``, per seed pair."""
    paired = results.get("paired") or {}
    if not paired:
        return ""
    lines = ["| method | Δ val loss (nats) | 95 % interval | seeds lower | Δ bits/byte | 95 % interval | "
             "tokens to none's final val loss | train time ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, p in paired.items():
        v, b = p["val_loss"], p["bits_per_byte"]
        reached = [t for t in p["tokens_to_target"] if t is not None]
        if len(reached) == len(p["tokens_to_target"]):
            ttt = f"{statistics.fmean(reached):,.0f} of {statistics.fmean(p['base_tokens']):,.0f}"
        elif reached:
            ttt = (f"{statistics.fmean(reached):,.0f} ({len(reached)} of {len(p['tokens_to_target'])} seeds; "
                   "else not reached)")
        else:
            ttt = "not reached"
        ratio = "n/a" if p["train_time_ratio"] is None else f"{p['train_time_ratio']:.2f}"
        lines.append(f"| {name} | {_pm(v)} | {_interval(v)} | {v['favouring']} of {v['n']} | {_pm(b)} | "
                     f"{_interval(b)} | {ttt} | {ratio} |")
    return "\n".join(lines) + "\n"


def render_zero_shot(results: dict) -> str:
    """Zero-shot accuracies: mean over seeds with the binomial standard error of one run, n and chance level."""
    rows = []
    for name, m in results["methods"].items():
        if not m["runs"]:
            continue
        run0 = m["runs"][0]
        for task, n in run0.get("task_n", {}).items():
            accs = [r["task_accuracy"][task] for r in m["runs"] if task in r.get("task_accuracy", {})]
            acc = statistics.fmean(accs)
            se = binomial_se(acc, n * len(accs))
            rows.append(f"| {name} | {task} | {acc:.4f} | {se:.4f} | {n} × {len(accs)} | "
                        f"{run0['task_chance'][task]:.3f} |")
    if not rows:
        return ""
    return "\n".join(["| method | task | accuracy | binomial s.e. | n (items × seeds) | chance |",
                      "|---|---|---:|---:|---:|---:|"] + rows) + "\n"


def render_task_curves(results: dict) -> str:
    """The in-loop zero-shot accuracies (``TrainConfig.eval_tasks``): per method and task, the accuracy at the
    first and the last step both logged by every seed, mean over seeds ("" when no run logged any)."""
    rows = []
    for name, m in results["methods"].items():
        curves = [r["task_curve"] for r in m["runs"] if r.get("task_curve")]
        if not curves:
            continue
        steps = sorted(set.intersection(*({c["step"] for c in curve} for curve in curves)))
        if not steps:
            continue
        at = {s: [next(c for c in curve if c["step"] == s) for curve in curves] for s in (steps[0], steps[-1])}
        for key in sorted(k for k in at[steps[-1]][0] if k.startswith("task/") and k.endswith("/acc")):
            first, last = (statistics.fmean(c[key] for c in at[s]) for s in (steps[0], steps[-1]))
            rows.append(f"| {name} | {key.split('/')[1]} | {first:.4f} (step {steps[0]}) | "
                        f"{last:.4f} (step {steps[-1]}) | {len(curves)} |")
    if not rows:
        return ""
    return "\n".join(["| method | task | first in-loop acc | last in-loop acc | seeds |", "|---|---|---:|---:|---:|"]
                     + rows) + "\n"


def render_history(results: dict) -> list[str]:
    lines = ["## Wall time", "", "Training time per run (optimizer steps over every session, from the run's "
             "metrics.jsonl):", "", "| run | train s |", "|---|---:|"]
    total = 0.0
    for m in results["methods"].values():
        for r in m["runs"] + m.get("diverged", []):
            total += float(r.get("train_seconds", 0.0))
            lines.append(f"| {Path(r['run_dir']).name}{' (diverged)' if 'reason' in r else ''} | "
                         f"{float(r.get('train_seconds', 0.0)):.0f} |")
    lines += ["", f"Total training time of the runs: {total:.0f} s.", "",
              "Invocations of `compare` that built this folder (each trains what is missing, evaluates everything):",
              ""]
    for i, h in enumerate(results.get("history", []), 1):
        actions: dict[str, int] = {}
        for r in h.get("runs", {}).values():
            key = r["action"].split(" at step")[0]
            actions[key] = actions.get(key, 0) + 1
        what = ", ".join(f"{v} {k}" for k, v in actions.items()) or "details not recorded"
        lines.append(f"{i}. {h.get('started_utc') or 'earlier'}: {h['wall_seconds']:.0f} s ({what})")
    lines += ["", f"Sum over invocations: {sum(h['wall_seconds'] for h in results.get('history', [])):.0f} s.", ""]
    return lines


def periodic_note(t: dict) -> str:
    """What the curves measure, beside the table's final evaluation: the periodic validation of training, on at
    most ``eval_windows`` windows spread evenly over the split (``eval.perplexity.validation_windows``) — another
    set of windows, so the numbers differ."""
    windows = t.get("eval_windows")
    subset = (f"at most {windows} windows ({windows * t['seq_len']:,d} tokens) spread evenly over the validation "
              f"split" if windows else "windows spread evenly over the validation split")
    return (f"The loss curves and the plot show the periodic validation during training, on {subset}; the table's "
            f"val loss is the final evaluation above, over another set of windows, so the two need not agree (nor "
            f"does the curve's last point equal the table).")


def render_report(results: dict) -> str:
    s = results["settings"]
    t = s["train"]
    spreads = {name: _throughput_spread(m) for name, m in results["methods"].items()}
    flagged = [n for n, v in spreads.items() if v is not None and v > UNRELIABLE_SPREAD]
    spread_text = ", ".join(f"{n} {v:.0%}" for n, v in spreads.items() if v is not None)
    lines = ["# depthattn compare", ""] + results.get("conclusion", conclusions(results)) + ["",
        f"Methods {', '.join(s['methods'])}; preset `{s['preset']}` with overrides `{s['model_overrides']}`; "
        f"loops {s['loops']}; seeds {s['seeds']}; {t['steps']} steps × {t['batch_size'] * t['grad_accum']} × "
        f"{t['seq_len']} tokens; peak lr {t['lr']}, warm-up {t['warmup']:.0%}, cosine to {t['min_lr_ratio']} × peak; "
        f"data `{shown_path(s['data'])}`.", "",
        "**a ± b** is the mean ± the sample standard deviation over seeds (omitted for one seed and for numbers that "
        "are the same for every seed). Validation loss, perplexity (= exp(loss)) and bits per byte are measured over "
        "the validation split in non-overlapping windows of the training length"
        + (f" (first {s['eval_tokens']:,d} tokens)" if s["eval_tokens"] else "") + ". "
        + periodic_note(t) + " Forward FLOPs/token is the analytical count (depthattn.accounting.num_flops(...)"
        f".total): matmuls, the method's extra FLOPs and sequence attention at the training length T = "
        f"{t['seq_len']}.", "",
        render_table(results),
        "## Training throughput (indicative only)", "",
        "Train tok/s is the median of the per-step training throughput on this machine over the steps after the "
        "first (the first step's warm-up excluded; from metrics.jsonl). **The runs were timed one after another "
        "(sequentially, not interleaved)**, so throughput differences include the machine's changing load: p10–p90 "
        f"spread of the per-step throughput {spread_text or 'n/a'}; † marks a spread above "
        f"{UNRELIABLE_SPREAD:.0%} (unreliable" + (f": {', '.join(flagged)}" if flagged else "") + "). Speed "
        "comparisons come from `scripts/bench.py`, which interleaves the methods' steps on one machine.", "",
        render_throughput(results)]
    paired = render_paired(results)
    if paired:
        lines += ["## Paired differences from `none`", "",
                  "Per seed, the method's number minus `none`'s with the same seed (same data order); negative = "
                  "better. Δ is the mean ± sample standard deviation of the per-seed differences; the 95 % interval "
                  "is mean ± t(0.975, n − 1) · std / √n (not available with one seed). Tokens to none's final val "
                  "loss: the tokens at which the method's periodic validation curve first reaches `none`'s last "
                  "periodic validation loss (same seed), linearly interpolated, mean over seeds, of the run's "
                  "tokens. Train time ratio: Σ optimizer-step seconds over seeds, method / `none` (sequential "
                  "timing, see above).", "", paired]
    zs = render_zero_shot(results)
    if zs:
        lines += ["## Zero-shot", "", "Accuracy is the mean over seeds; the binomial standard error is "
                  "√(acc (1 − acc) / N) with N = items × seeds; chance is the mean of 1 / (number of choices).", "",
                  zs]
    in_loop = render_task_curves(results)
    if in_loop:
        limit = t.get("eval_tasks_limit")
        lines += ["## Zero-shot during training", "",
                  f"Scored by the trainer (`eval_tasks`) on the first {limit or 'all'} documents of each task every "
                  f"{t.get('eval_tasks_every') or t['steps']} steps and at the last step (the native scorer's "
                  "definitions, mean over seeds); the plot's fourth panel shows the average accuracy over the tasks.",
                  "", in_loop]
    lines += ["![validation loss](loss_curves.png)", "",
              f"## Samples (seed 0, temperature 0.8, top-k 50, {SAMPLE_TOKENS} tokens)", "",
              f"Prompt: `{s['sample_prompt']}`", ""]
    for name, m in results["methods"].items():
        if not m["runs"]:
            lines += [f"- **{name}**: no sample (every seed diverged)"]
            continue
        sample = m["runs"][0]["sample"].replace("\n", " ")
        lines += [f"- **{name}**: {s['sample_prompt']}{sample}"]
    lines += [""] + render_history(results)
    return "\n".join(lines)
