"""A run record (``results.json``'s ``methods[m]["runs"]`` entry) from a run folder: a finished run evaluated
(``evaluate_run``: accounting, throughput and curves from its metrics, the final validation, cached in
``RUN/eval.json``, a sample, zero-shot tasks), or a diverged one described (``diverged_run``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from ..accounting import kv_cache_bytes_per_token, num_flops, num_params
from ..config import ModelConfig
from ..fileio import atomic_write_text, read_json
from ..layout import EVAL_CACHE_FILE, ZERO_SHOT_DIR
from ..run.folder import RunFolder
from ..run.record import recorded_precision
from .records import SAMPLE_PROMPT, SAMPLE_TOKENS


def train_tokens_per_s(rows: list[dict]) -> float:
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
    data = load_prepared(data_dir or run["data"])  # the run's data (``reuse.ensure_trained`` checked it), where it is
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
        "train_tokens_per_s": train_tokens_per_s(rows), "train_seconds": _train_seconds(rows),
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
