"""The statistics of a comparison over seeds, public for the study report too: each method's mean ± std
(``aggregate``), its paired differences from ``none`` (``paired_stats``), and which two runs may be paired at all
(``run_differences``, ``pairable_train_differences``)."""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from ..compat import Side, data_differs, tokenizer_differs
from ..run.record import recorded_precision
from ..stats import paired_difference, tokens_to_target
from ..training.config import RESUMABLE_KEYS
from .records import BASELINE, COLUMNS, by_seed, val_curve


def aggregate(runs: list[dict]) -> dict[str, dict[str, float]]:
    """``{"mean": {key: x}, "std": {key: s}}`` over seeds for every tabulated number (std 0 for one seed; empty
    without runs: every seed diverged)."""
    if not runs:
        return {"mean": {}, "std": {}}
    keys = [k for k, _, _ in COLUMNS] + ["train_tokens_per_s", "flops_extra_ratio"]
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


def paired_stats(results: dict, baseline: str = BASELINE) -> dict[str, dict]:
    """For every method other than ``baseline`` (default ``none``), paired over the seeds both ran: the differences
    in final validation loss and bits per byte (``stats.paired_difference``), tokens-to-target per seed (the tokens
    at which the method's periodic validation curve first reaches the baseline's last periodic validation loss of
    the same seed, interpolated; None = not reached) and the training-time ratio (Σ optimizer-step seconds over
    seeds, method / baseline). ``{}`` without a baseline run. ``results``: ``{"methods": {name: {"runs": [run
    record, ...]}}}`` as ``results.json`` holds it (a run record needs ``seed``, ``val_loss``, ``bits_per_byte``,
    ``tokens``, ``curve``; ``train_seconds`` optional)."""
    methods = results["methods"]
    if baseline not in methods:
        return {}
    base = by_seed(methods[baseline])
    out = {}
    for name, m in methods.items():
        if name == baseline:
            continue
        mine = by_seed(m)
        seeds = [s for s in mine if s in base]
        if not seeds:
            continue
        a, b = [mine[s] for s in seeds], [base[s] for s in seeds]
        ttt = []
        for r, v in zip(a, b):
            target = val_curve(v)[-1][1] if v["curve"] else float(v["val_loss"])
            ttt.append(tokens_to_target(val_curve(r), target))
        base_time = sum(float(r.get("train_seconds", 0.0)) for r in b)
        out[name] = {
            "seeds": seeds,
            "val_loss": paired_difference([r["val_loss"] for r in a], [r["val_loss"] for r in b]),
            "bits_per_byte": paired_difference([r["bits_per_byte"] for r in a], [r["bits_per_byte"] for r in b]),
            "tokens_to_target": ttt,
            "base_tokens": [float(r["tokens"]) for r in b],
            "train_time_ratio": (sum(float(r.get("train_seconds", 0.0)) for r in a) / base_time
                                 if base_time > 0 else None),
        }
    return out


def pairable_train_differences() -> frozenset[str]:
    """Train settings two runs may differ in and still be paired in a comparison (``compare``, ``study``): those a
    resumed run may change (``training.config.RESUMABLE_KEYS``: compile, saving, logging) but ``device``, which
    decides a fresh run's initial weights (drawn on the device by its own generator: a CPU and a CUDA run of one
    seed start from other weights) and, under precision ``auto``, the arithmetic (float32 on CPU, bf16 autocast on
    CUDA); and ``seed``, the pairing key itself."""
    return frozenset(RESUMABLE_KEYS - {"device"}) | {"seed"}


def run_differences(a: Mapping[str, Any], b: Mapping[str, Any], allowed: frozenset[str] | set[str] = frozenset()
                    ) -> list[str]:
    """``"key: A vs B"`` for everything in which two runs' ``run.json`` records ``a`` and ``b`` differ that forbids
    pairing them: a train setting other than ``pairable_train_differences()`` and ``allowed``; the tokenizer or the
    data (``compat.tokenizer_differs``, ``compat.data_differs``); the device type the run trained on (``run.json``'s
    resolved ``device``, ``cpu`` or ``cuda``: other initial weights) and the resolved precision. Model settings are not
    compared (the methods of a comparison differ there by design; a grid axis is named in ``allowed`` for the train
    settings it changes). Empty when the two may be paired."""
    skip = pairable_train_differences() | set(allowed)
    ta, tb = a.get("train", {}), b.get("train", {})
    out = [f"{k}: {ta.get(k)!r} vs {tb.get(k)!r}" for k in sorted(set(ta) | set(tb))
           if k not in skip and ta.get(k) != tb.get(k)]
    sa, sb = Side.of_run("a", a), Side.of_run("b", b)
    if tokenizer_differs(sa, sb):
        out.append(f"tokenizer: {(sa.tokenizer_sha256 or '')[:12]} vs {(sb.tokenizer_sha256 or '')[:12]}")
    if data_differs(sa, sb):
        out.append(f"data: {(sa.data_fingerprint or '')[:12]} vs {(sb.data_fingerprint or '')[:12]}")
    da, db = (str(r.get("device") or "unknown").split(":")[0] for r in (a, b))
    if "unknown" not in (da, db) and da != db:
        out.append(f"device: {da} vs {db}")
    pa, pb = recorded_precision(dict(a)), recorded_precision(dict(b))
    if None not in (pa, pb) and pa != pb:
        out.append(f"precision: {pa} vs {pb}")
    return out
