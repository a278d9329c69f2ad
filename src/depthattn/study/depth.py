"""The depth statistics of the study's runs (``TrainConfig.log_depth_every``; keys in
``depthattn.training.depth_stats``): extracted from a run's metrics.jsonl into a small published file, and drawn as
one figure per method: per layer, the entropy of the depth weights and the weight on layer 0 over training.

    extract(run_folder)                      -> [{"step": 100, "depth/L1/entropy": 1.02, ...}, ...]
    figure({seed: rows}, png, title)         -> the figure (mean over seeds, a line per layer)
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..fileio import atomic_path

#: The per-layer keys the figure draws: (key suffix, axis label).
PANELS = (("entropy", "entropy of the depth weights (nats)"), ("from0", "weight on layer 0"))
_LAYER_KEY = re.compile(r"^depth/L(\d+)/(entropy|from0)$")
#: A layer's weight on one source layer: the layer mixes one value per such key and its own.
_SOURCE_KEY = re.compile(r"^depth/L(\d+)/(from\d+)$")


def extract(run_dir: Path) -> list[dict]:
    """The depth-statistics rows of a run's metrics.jsonl: ``[{"step": int, "depth/...": float, ...}]`` in step
    order, only the ``depth/`` keys (gradient norms and the rest are left in the run folder). Empty if the method
    logs none. Read as the trainer reads it (``RunFolder.read_metrics``: a torn last line is dropped with a
    warning); raises ``ValueError`` naming the file and line on a bad row elsewhere."""
    from ..run.folder import RunFolder

    rows = RunFolder(run_dir).read_metrics()
    depth = [{"step": int(r["step"]), **{k: v for k, v in r.items() if k.startswith("depth/")}} for r in rows]
    return sorted((r for r in depth if len(r) > 1), key=lambda r: r["step"])


def layer_series(by_seed: dict[int, list[dict]], suffix: str) -> dict[int, tuple[list[int], list[float]]]:
    """``{layer: (steps, mean over seeds)}`` of ``depth/L{layer}/{suffix}``, over the steps every seed logged."""
    per_seed = []
    for rows in by_seed.values():
        table: dict[int, dict[int, float]] = {}
        for row in rows:
            for key, value in row.items():
                m = _LAYER_KEY.match(key)
                if m and m.group(2) == suffix:
                    table.setdefault(int(m.group(1)), {})[row["step"]] = float(value)
        per_seed.append(table)
    out = {}
    for layer in sorted(set().union(*per_seed)) if per_seed else []:
        steps = sorted(set.intersection(*(set(t.get(layer, {})) for t in per_seed)))
        if steps:
            out[layer] = (steps, [sum(t[layer][s] for t in per_seed) / len(per_seed) for s in steps])
    return out


def figure(by_seed: dict[int, list[dict]], png: Path, title: str, tokens_per_step: int) -> bool:
    """Draw the per-layer entropy and layer-0 weight over training tokens (mean over the seeds given) to ``png``.
    Returns False (and writes nothing) when the rows hold no per-layer depth-attention keys."""
    series = {suffix: layer_series(by_seed, suffix) for suffix, _ in PANELS}
    if not any(series.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4), constrained_layout=True)
    cmap = plt.get_cmap("viridis")
    layers = sorted(set().union(*(s.keys() for s in series.values())))
    for ax, (suffix, label) in zip(axes, PANELS):
        for i, layer in enumerate(layers):
            if layer in series[suffix]:
                steps, values = series[suffix][layer]
                ax.plot([s * tokens_per_step / 1e6 for s in steps], values, color=cmap(i / max(1, len(layers) - 1)),
                        label=f"layer {layer}")
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, ncol=2)
    seeds = ", ".join(str(s) for s in sorted(by_seed))
    fig.suptitle(f"{title} (mean over seeds {seeds})" if len(by_seed) > 1 else f"{title} (seed {seeds})")
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return True


def candidates(by_seed: dict[int, list[dict]]) -> dict[int, int]:
    """``{layer: N}``: how many values each layer's depth attention mixes (its own and one per ``depth/L{l}/from{j}``
    key any seed logged)."""
    sources: dict[int, set[str]] = {}
    for rows in by_seed.values():
        for row in rows:
            for key in row:
                m = _SOURCE_KEY.match(key)
                if m:
                    sources.setdefault(int(m.group(1)), set()).add(m.group(2))
    return {layer: len(s) + 1 for layer, s in sorted(sources.items())}


def table(by_seed: dict[int, list[dict]], tokens_per_step: int) -> list[str]:
    """The figure's numbers at the first and last step every seed logged, as markdown lines: per layer, N, the
    entropy beside ln N (uniform weights) and the weight on layer 0 beside 1/N; empty without per-layer keys."""
    series = {suffix: layer_series(by_seed, suffix) for suffix, _ in PANELS}
    n = candidates(by_seed)
    layers = [layer for layer in n if all(layer in s for s in series.values())]
    if not layers:
        return []
    steps = series["entropy"][layers[0]][0]
    lines = [f"At the first and last logged step ({steps[0] * tokens_per_step:,d} and {steps[-1] * tokens_per_step:,d}"
             " training tokens), mean over the seeds; uniform weights over the layer's N values would give "
             "entropy ln N and weight 1/N on layer 0 (the uniform control's fixed weights):", "",
             "| layer | N | entropy, first → last (nats) | ln N | weight on layer 0, first → last | 1/N |",
             "|---:|---:|---:|---:|---:|---:|"]
    for layer in layers:
        (_, ent), (_, w0) = series["entropy"][layer], series["from0"][layer]
        lines.append(f"| {layer} | {n[layer]} | {ent[0]:.3f} → {ent[-1]:.3f} | {math.log(n[layer]):.3f} "
                     f"| {w0[0]:.3f} → {w0[-1]:.3f} | {1 / n[layer]:.3f} |")
    return lines + [""]
