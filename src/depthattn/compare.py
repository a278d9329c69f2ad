"""``depthattn compare``: train several cross-layer methods on the same data, seed and budget; evaluate; report.

Every (method, seed) pair trains in its own run folder ``OUT/runs/<method>[-loopsN]-seed<S>/`` with identical
``TrainConfig`` (same seed, so same data order and, for methods without extra parameters, the same initial
weights). Finished runs are reused and interrupted ones resumed, so re-running a comparison only does missing work.
Outputs: ``OUT/report.md``, ``OUT/results.json``, ``OUT/loss_curves.png``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .accounting import kv_cache_bytes_per_token, num_flops, num_params
from .checkpoint import checkpoint_dirs
from .config import ModelConfig
from .cross_layer import names as method_names
from .fileio import atomic_path, atomic_write_text
from .training import TrainConfig, read_metrics, read_run, resolve_model_config, train
from .training.runs import RUN_FILE, SUMMARY_FILE, config_differences

#: The fixed prompt of every report's sample (the opening of Pride and Prejudice, in the embedded corpus).
SAMPLE_PROMPT = "It is a truth universally acknowledged, that"
SAMPLE_TOKENS = 48

#: Numbers of a run that the report tabulates: (key, column title, format). ``{seq_len}`` in a title is the training
#: length, at which the FLOPs column counts sequence attention.
COLUMNS = (
    ("params", "parameters", "{:,.0f}"),
    ("tokens", "tokens seen", "{:,.0f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("perplexity", "perplexity", "{:.3f}"),
    ("bits_per_byte", "bits/byte", "{:.4f}"),
    ("train_tokens_per_s", "train tok/s", "{:.0f}"),
    ("kv_bytes_per_token", "KV bytes/token (bf16)", "{:,.0f}"),
    ("flops_per_token", "fwd FLOPs/token incl. attn (T={seq_len})", "{:.4g}"),
)


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


def _ensure_trained(run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: Path,
                    progress: bool, log: Callable[[str], None]) -> None:
    """Train, resume, or reuse the run in ``run_dir`` (ValueError if it holds a different config)."""
    if (run_dir / RUN_FILE).is_file():
        from .data import load_prepared

        old = read_run(run_dir)
        want_train = train_cfg.replace(steps=train_cfg.total_steps()).to_dict()
        problems = config_differences(old, model_cfg.to_dict(), want_train)
        if old.get("data_fingerprint") not in (None, load_prepared(data_dir).fingerprint):
            problems.append(f"data {data_dir}: fingerprint differs from the run's (the folder was re-prepared)")
        if problems or Path(old["data"]).resolve() != data_dir.resolve():
            raise ValueError(f"{run_dir} holds a run with other settings ({'; '.join(problems) or 'other data'}); "
                             f"use another --out or delete that folder")
        if (run_dir / SUMMARY_FILE).is_file() and checkpoint_dirs(run_dir):
            log(f"reusing finished run {run_dir}")
            return
        train(run_dir, model_cfg, train_cfg, data_dir, resume=True, progress=progress, log=log)
        return
    train(run_dir, model_cfg, train_cfg, data_dir, progress=progress, log=log)


def evaluate_run(run_dir: Path, eval_tokens: int | None, eval_batch_size: int, tasks: list[str], limit: int | None,
                 harness: str, progress: bool) -> dict[str, Any]:
    """Numbers of one finished run: accounting, median per-step throughput, validation perplexity / bits per byte,
    a sample from ``SAMPLE_PROMPT`` (seeded), and zero-shot results when ``tasks``."""
    from .data import load_prepared
    from .eval.inference import load_for_inference
    from .eval.perplexity import evaluate_perplexity
    from .eval.zero_shot import run_zero_shot
    from .generate import generate_text
    from .training.runtime import autocast_dtype

    run = read_run(run_dir)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    cfg = ModelConfig.from_dict(run["model"])
    seq_len = run["train"]["seq_len"]
    model, tokenizer, folder, dev = load_for_inference(run_dir, run["train"].get("device", "auto"),
                                                       "TrainConfig.device")
    cache = run_dir / "eval.json"
    data = load_prepared(run["data"])
    key = {"checkpoint": str(folder), "eval_tokens": eval_tokens, "seq_len": seq_len,
           "data_fingerprint": data.fingerprint}
    if cache.is_file() and json.loads(cache.read_text(encoding="utf-8")).get("key") == key:
        ev = json.loads(cache.read_text(encoding="utf-8"))["result"]
    else:
        res = evaluate_perplexity(model, data.val, tokenizer, seq_len=seq_len, batch_size=eval_batch_size,
                                  max_tokens=eval_tokens, device=dev, amp_dtype=autocast_dtype("auto", dev),
                                  progress=progress, expected_bytes=data.num_bytes("val"))
        ev = res.to_dict()
        atomic_write_text(cache, json.dumps({"key": key, "result": ev}, indent=2) + "\n")
    rows = read_metrics(run_dir)
    flops = num_flops(cfg, seq_len)
    out: dict[str, Any] = {
        "run_dir": str(run_dir), "method": cfg.cross_layer, "num_loops": cfg.num_loops,
        "seed": run["train"]["seed"], "params": num_params(cfg),
        "params_counted": sum(p.numel() for p in model.parameters()),
        "tokens": summary["tokens"], "steps": summary["steps"], "val_loss": ev["loss"],
        "perplexity": ev["perplexity"], "bits_per_byte": ev["bits_per_byte"], "eval_tokens": ev["tokens"],
        "eval_bytes": ev["bytes"], "periodic_val_loss": summary["final_val_loss"],
        "train_tokens_per_s": _train_tokens_per_s(rows),
        "kv_bytes_per_token": kv_cache_bytes_per_token(cfg, torch.bfloat16),
        "flops_per_token": flops.total, "flops_extra_ratio": flops.ratio,
        "curve": [{"step": r["step"], "tokens": r["tokens"], "val_loss": r["val_loss"]} for r in rows
                  if "val_loss" in r],
        "train_curve": [{"tokens": r["tokens"], "loss": r["loss"]} for r in rows],
        "sample": generate_text(model, tokenizer, SAMPLE_PROMPT, max_new_tokens=SAMPLE_TOKENS, temperature=0.8,
                                top_k=50, seed=0, device=dev),
    }
    if tasks:
        zs = run_zero_shot(model, tokenizer, tasks=tasks, limit=limit, batch_size=eval_batch_size, harness=harness,
                           out_dir=str(run_dir / "zero_shot"), progress=progress)
        out["zero_shot"] = {k: v for k, v in zs.items() if k != "items"}  # per-item predictions stay in the run
        out["task_accuracy"] = _task_accuracies(zs, tasks)
    return out


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
                progress: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train and evaluate every (method, seed); write ``results.json``, ``report.md``, ``loss_curves.png`` under
    ``out`` and return the results. Raises ``ValueError`` for bad settings before any training."""
    from .data import load_prepared

    out, data_dir = Path(out), Path(data_dir)
    t_start = time.perf_counter()
    data = load_prepared(data_dir)
    settings.train.total_steps()
    cfgs = {}
    for m in settings.methods:  # validate every config before training anything
        overrides = {**settings.model_overrides, "cross_layer": m}
        if settings.loops != 1:
            overrides["num_loops"] = settings.loops
        cfgs[m] = resolve_model_config(settings.preset, overrides, data.vocab_size, str(data_dir / "tokenizer.json"))
    runs: dict[str, list[dict]] = {m: [] for m in settings.methods}
    for seed in settings.seeds:
        tcfg = settings.train.replace(seed=seed)
        for m in settings.methods:
            run_dir = out / "runs" / run_name(m, settings.loops, seed)
            log(f"== {m} (seed {seed}) -> {run_dir}")
            _ensure_trained(run_dir, cfgs[m], tcfg, data_dir, progress, log)
            runs[m].append(evaluate_run(run_dir, settings.eval_tokens, tcfg.eval_batch_size, settings.tasks or [],
                                        settings.limit, settings.harness, progress))
    results = {
        "settings": {"methods": settings.methods, "seeds": settings.seeds, "loops": settings.loops,
                     "preset": settings.preset, "model_overrides": settings.model_overrides,
                     "train": settings.train.replace(steps=settings.train.total_steps()).to_dict(),
                     "data": str(data_dir.resolve()), "eval_tokens": settings.eval_tokens,
                     "tasks": settings.tasks or [], "sample_prompt": SAMPLE_PROMPT},
        "methods": {m: {"runs": runs[m], **aggregate(runs[m])} for m in settings.methods},
        "wall_seconds": time.perf_counter() - t_start,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    plot_curves(results, out / "loss_curves.png")
    atomic_write_text(out / "report.md", render_report(results))
    return results


def aggregate(runs: list[dict]) -> dict[str, dict[str, float]]:
    """``{"mean": {key: x}, "std": {key: s}}`` over seeds for every tabulated number (std 0 for one seed)."""
    keys = [k for k, _, _ in COLUMNS] + ["flops_extra_ratio"]
    accs = sorted({t for r in runs for t in r.get("task_accuracy", {})})
    mean, std = {}, {}
    for k in keys:
        xs = [float(r[k]) for r in runs]
        mean[k] = statistics.fmean(xs)
        std[k] = statistics.stdev(xs) if len(xs) > 1 else 0.0
    for t in accs:
        xs = [r["task_accuracy"][t] for r in runs if t in r.get("task_accuracy", {})]
        mean[f"acc:{t}"] = statistics.fmean(xs)
        std[f"acc:{t}"] = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"mean": mean, "std": std}


def _cell(mean: float, std: float, fmt: str, n: int) -> str:
    if n > 1:
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
        cells = [name] + [_cell(m["mean"][k], m["std"][k], fmt, n) for k, _, fmt in COLUMNS]
        cells += [_cell(m["mean"][k], m["std"][k], "{:.4f}", n) if k in m["mean"] else "" for k in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_report(results: dict) -> str:
    s = results["settings"]
    t = s["train"]
    lines = [
        "# depthattn compare", "",
        f"Methods {', '.join(s['methods'])}; preset `{s['preset']}` with overrides `{s['model_overrides']}`; "
        f"loops {s['loops']}; seeds {s['seeds']}; {t['steps']} steps × {t['batch_size'] * t['grad_accum']} × "
        f"{t['seq_len']} tokens; peak lr {t['lr']}, warm-up {t['warmup']:.0%}, cosine to {t['min_lr_ratio']} × peak; "
        f"data `{s['data']}`.", "",
        "Validation loss, perplexity (= exp(loss)) and bits per byte are measured over the validation split in "
        "non-overlapping windows of the training length"
        + (f" (first {s['eval_tokens']:,d} tokens)" if s["eval_tokens"] else "") + ". Train tok/s is the median of "
        "the per-step training throughput on this machine over the steps after the first (the first step's warm-up "
        "excluded; from metrics.jsonl). Forward FLOPs/token is the analytical count (depthattn.accounting.num_flops(...).total): "
        f"matmuls, the method's extra FLOPs and sequence attention at the training length T = {t['seq_len']}.", "",
        render_table(results),
        "![validation loss](loss_curves.png)", "",
        f"## Samples (seed 0, temperature 0.8, top-k 50, {SAMPLE_TOKENS} tokens)", "",
        f"Prompt: `{s['sample_prompt']}`", "",
    ]
    for name, m in results["methods"].items():
        sample = m["runs"][0]["sample"].replace("\n", " ")
        lines += [f"- **{name}**: {s['sample_prompt']}{sample}"]
    lines += ["", f"Total wall time: {results['wall_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def _tokens_label(x: float, _pos) -> str:
    """Axis label for a token count: 250k, 1.5M."""
    return f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k" if x >= 1e3 else f"{x:g}"


def plot_curves(results: dict, path: Path) -> None:
    """Validation loss (left) and training loss (right, 20-step moving mean) vs tokens, one line per method
    (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, m in results["methods"].items():
        curves = [r["curve"] for r in m["runs"]]
        n = min(len(c) for c in curves)
        if n:
            xs = [curves[0][i]["tokens"] for i in range(n)]
            ys = [statistics.fmean(c[i]["val_loss"] for c in curves) for i in range(n)]
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
        tc = m["runs"][0]["train_curve"]
        k = max(1, min(20, len(tc) // 10))
        xs = [r["tokens"] for r in tc][k - 1:]
        ys = [statistics.fmean(r["loss"] for r in tc[i - k + 1:i + 1]) for i in range(k - 1, len(tc))]
        ax2.plot(xs, ys, label=name)
    for a, title in ((ax, "validation loss"), (ax2, "training loss (moving mean, seed 0)")):
        a.set_xlabel("training tokens")
        a.xaxis.set_major_formatter(FuncFormatter(_tokens_label))
        a.set_ylabel("loss (nats/token)")
        a.set_title(title)
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)

