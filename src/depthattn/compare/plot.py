"""``loss_curves.png``: a comparison's curves against training tokens, drawn from its ``results.json`` dict with
matplotlib (Agg). A leaf: it reads the results and imports nothing of the comparison's training or evaluation."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..fileio import atomic_path
from .records import BASELINE, by_seed


def _tokens_label(x: float, _pos) -> str:
    """Axis label for a token count: 250k, 1.5M."""
    return f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k" if x >= 1e3 else f"{x:g}"


def _seed_curves(m: dict) -> tuple[list[float], list[list[float]]]:
    """Tokens and the per-seed validation losses at the points every seed logged."""
    curves = [r["curve"] for r in m["runs"]]
    n = min((len(c) for c in curves), default=0)
    xs = [curves[0][i]["tokens"] for i in range(n)]
    return xs, [[c[i]["val_loss"] for c in curves] for i in range(n)]


def _plot_task_curves(ax, results: dict, colours: dict[str, str]) -> None:
    """The fourth panel: in-loop zero-shot accuracy averaged over the tasks (mean over seeds) vs tokens."""
    from matplotlib.ticker import FuncFormatter

    for name, m in results["methods"].items():
        curves = [r["task_curve"] for r in m["runs"] if r.get("task_curve")]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        ax.plot([curves[0][i]["tokens"] for i in range(n)],
                [statistics.fmean(c[i].get("task/average/acc", math.nan) for c in curves) for i in range(n)],
                marker="o", markersize=3, label=name, color=colours[name])
    ax.set_xlabel("training tokens")
    ax.xaxis.set_major_formatter(FuncFormatter(_tokens_label))
    ax.set_ylabel("accuracy")
    ax.set_title("zero-shot accuracy (task average)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def method_colours(results: dict) -> dict[str, str]:
    """One matplotlib colour per method (``C0``, ``C1``, ... in the order of ``results["methods"]``), the same in
    every panel of ``plot_curves``."""
    return {name: f"C{i % 10}" for i, name in enumerate(results["methods"])}


def plot_curves(results: dict, path: Path):
    """Three panels vs training tokens: validation loss (mean over seeds, min–max band), each method's difference
    from ``none`` (per-seed paired, mean and min–max band; below 0 is better than ``none``) and training loss
    (20-step moving mean, seed 0); a fourth with the in-loop zero-shot accuracy when a run logged it
    (``report.render_task_curves``). Each method has one colour in every panel (``method_colours``). Writes a PNG to
    ``path`` and returns the (closed) ``matplotlib.figure.Figure``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    in_loop = any(r.get("task_curve") for m in results["methods"].values() for r in m["runs"])
    fig, axes = plt.subplots(1, 4 if in_loop else 3, figsize=(21 if in_loop else 16, 4.2), layout="constrained")
    ax, axd, ax2 = axes[:3]
    colours = method_colours(results)
    if in_loop:
        _plot_task_curves(axes[3], results, colours)
    base = results["methods"].get(BASELINE)
    base_by_seed = by_seed(base) if base else {}
    finished: list[float] = []  # the finished runs' losses: the y-range a diverged curve may leave
    finished_train: list[float] = []
    for name, m in results["methods"].items():
        for d in m.get("diverged", []):  # the curve up to the stop, dashed, ending in a cross
            label = f"{name} (seed {d['seed']}: diverged at step {d['step']})"
            if d["curve"]:
                ax.plot([c["tokens"] for c in d["curve"]], [c["val_loss"] for c in d["curve"]], linestyle="--",
                        marker="x", markersize=4, label=label, color=colours[name])
            if d["train_curve"] and not m["runs"]:
                ax2.plot([r["tokens"] for r in d["train_curve"]], [r["loss"] for r in d["train_curve"]],
                         linestyle="--", label=label, color=colours[name])
        if not m["runs"]:
            continue
        finished += [c["val_loss"] for r in m["runs"] for c in r["curve"]]
        xs, per_point = _seed_curves(m)
        if xs:
            line, = ax.plot(xs, [statistics.fmean(v) for v in per_point], marker="o", markersize=3, label=name,
                            color=colours[name])
            if len(m["runs"]) > 1:
                ax.fill_between(xs, [min(v) for v in per_point], [max(v) for v in per_point],
                                color=line.get_color(), alpha=0.2)
        if base and name != BASELINE:
            pairs = [(r, base_by_seed[int(r["seed"])]) for r in m["runs"] if int(r["seed"]) in base_by_seed]
            k = min([min(len(a["curve"]), len(b["curve"])) for a, b in pairs] or [0])
            if k:
                dx = [pairs[0][0]["curve"][i]["tokens"] for i in range(k)]
                d = [[a["curve"][i]["val_loss"] - b["curve"][i]["val_loss"] for a, b in pairs] for i in range(k)]
                line, = axd.plot(dx, [statistics.fmean(v) for v in d], marker="o", markersize=3, label=name,
                                 color=colours[name])
                if len(pairs) > 1:
                    axd.fill_between(dx, [min(v) for v in d], [max(v) for v in d], color=line.get_color(),
                                     alpha=0.2)
        tc = m["runs"][0]["train_curve"]
        k = max(1, min(20, len(tc) // 10))
        xs = [r["tokens"] for r in tc][k - 1:]
        ys = [statistics.fmean(r["loss"] for r in tc[i - k + 1:i + 1]) for i in range(k - 1, len(tc))]
        ax2.plot(xs, ys, label=name, color=colours[name])
        finished_train += ys
    axd.axhline(0.0, color="black", linewidth=0.8)
    if any(d for m in results["methods"].values() for d in m.get("diverged", [])):
        for a, values in ((ax, finished), (ax2, finished_train)):
            if values:  # the finished runs' range: a diverged curve leaves the top of the panel
                lo, hi = min(values), max(values)
                a.set_ylim(lo - 0.05 * (hi - lo + 0.1), hi + 0.25 * (hi - lo + 0.1))
    windows = results["settings"]["train"].get("eval_windows")
    subset = f"≤ {windows} windows" if windows else "a subset"
    for a, title, ylabel in ((ax, f"validation loss ({subset})", "loss (nats/token); mean, min–max over seeds"),
                             (axd, f"Δ val loss (below 0: better than {BASELINE})",
                              f"loss − {BASELINE}'s, same seed (nats/token)"),
                             (ax2, "training loss (seed 0)", "loss (nats/token), moving mean")):
        a.set_xlabel("training tokens")
        a.xaxis.set_major_formatter(FuncFormatter(_tokens_label))
        a.set_ylabel(ylabel)
        a.set_title(title)
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return fig
