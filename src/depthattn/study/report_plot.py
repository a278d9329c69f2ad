"""The figure of ``depthattn study report``: each method's paired difference from the reference, cell by cell.

A leaf: it takes plain numbers and draws them (matplotlib, imported when called), so the report's statistics stay
in ``report`` and this module imports nothing of the package but ``fileio``.

One horizontal panel per method other than the reference; a row per cell (in the study's order); the mean of the
per-seed Δ in final validation loss (nats) as a point, its 95 % t-interval as a bar (none with one seed), each seed's
Δ as a small dot; a vertical line at 0. A row whose bar misses 0 is a difference the interval supports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..fileio import atomic_path


def delta_figure(rows: dict[str, list[tuple[str, dict]]], reference: str, png: Path, title: str) -> bool:
    """Draw ``rows`` (``{method: [(cell name, paired_difference of val loss), ...]}``, each dict with ``mean``,
    ``ci95`` ((lo, hi) or None) and ``diffs`` (per seed, nats)) into ``png`` (written atomically, its folder made).
    Returns False, drawing nothing, when no method has a row."""
    methods = [m for m, r in rows.items() if r]
    if not methods:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys(c for m in methods for c, _ in rows[m]))
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 1.2 + 0.42 * len(cells)), sharey=True,
                             squeeze=False)
    for ax, method in zip(axes[0], methods):
        for cell, d in rows[method]:
            y = cells.index(cell)
            if d["ci95"] is not None:
                ax.plot(d["ci95"], [y, y], color="tab:blue", linewidth=2)
            ax.scatter(d["diffs"], [y] * len(d["diffs"]), s=10, color="grey", zorder=3)
            ax.scatter([d["mean"]], [y], s=36, color="tab:blue", zorder=4)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_title(f"{method} − {reference}", fontsize=9)
        ax.set_xlabel("Δ final validation loss (nats)")
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(cells)), _short(cells))
    axes[0][0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return True


def _short(cells: Sequence[str]) -> list[str]:
    """Cell names without the prefix every one shares (the study's name), for the axis."""
    parts = [c.split("-") for c in cells]
    k = 0
    while len(cells) > 1 and all(len(p) > k + 1 and p[k] == parts[0][k] for p in parts):
        k += 1
    return ["-".join(p[k:]) for p in parts]
