"""Small statistics for comparisons over seeds: paired differences, t-intervals, tokens-to-target, binomial errors.

Pure Python (no SciPy): the two-sided 95 % Student-t quantiles for 1–30 degrees of freedom are tabulated (to 4
decimals, from any statistics table; e.g. t_{0.975, 2} = 4.3027); beyond 30 the Cornish–Fisher expansion of t
around the normal quantile (Abramowitz & Stegun 26.7.5, three terms: within 2e-4 of the exact quantile for df > 30).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

#: t_{0.975, df} for df = 1 … 30.
T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
Z_975 = 1.959964


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom (tabulated to 30, then the
    Cornish–Fisher expansion, A&S 26.7.5). Raises ``ValueError`` for df < 1."""
    if df < 1:
        raise ValueError(f"df={df} must be >= 1")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def paired_difference(method: Sequence[float], base: Sequence[float], lower_is_better: bool = True) -> dict[str, Any]:
    """Per-seed differences ``method[i] − base[i]`` and their summary.

    Returns ``{"n", "diffs", "mean", "std", "ci95": [lo, hi] | None, "favouring"}``: ``std`` is the sample standard
    deviation (n − 1) and ``ci95`` the 95 % t-interval ``mean ± t_{0.975, n−1} · std / √n``; both are None with one
    seed (not available, never 0). ``favouring`` counts the seeds where the method is better (lower when
    ``lower_is_better``). Raises ``ValueError`` for empty or unequal lengths.
    """
    if len(method) != len(base) or not method:
        raise ValueError(f"paired_difference needs two equal non-empty lists, got {len(method)} and {len(base)}")
    diffs = [float(a) - float(b) for a, b in zip(method, base)]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    std = statistics.stdev(diffs) if n > 1 else None
    ci = None
    if std is not None:
        half = t_quantile_975(n - 1) * std / math.sqrt(n)
        ci = [mean - half, mean + half]
    favouring = sum(1 for d in diffs if (d < 0 if lower_is_better else d > 0))
    return {"n": n, "diffs": diffs, "mean": mean, "std": std, "ci95": ci, "favouring": favouring}


def verdict(d: dict[str, Any]) -> str:
    """Plain words for a ``paired_difference`` result of a loss (lower is better): "inconclusive" unless the 95 %
    interval excludes 0, and then "lower" or "higher" (no correction for multiple comparisons: with m methods
    against one baseline, one interval in twenty excludes 0 by chance)."""
    if d["ci95"] is None:
        return "inconclusive (one seed: no interval)"
    lo, hi = d["ci95"]
    if lo <= 0 <= hi:
        return "inconclusive at this budget (the 95 % interval includes 0)"
    return ("lower" if hi < 0 else "higher") + " at this budget (the 95 % interval excludes 0)"


def mean_pm(mean: float, std: float | None, fmt: str = "{:+.4f}") -> str:
    """``mean ± std`` in ``fmt`` (the sign dropped from the std), or the mean alone when ``std`` is None (one seed).
    E.g. ``mean_pm(-0.0621, 0.0103)`` is ``"-0.0621 ± 0.0103"``."""
    return fmt.format(mean) + ("" if std is None else " ± " + fmt.format(std).lstrip("+"))


def difference_text(d: dict[str, Any]) -> str:
    """A ``paired_difference`` result's mean difference ± its sample std over seeds, as ``mean_pm`` writes it
    (the mean signed, 4 decimals, in the difference's unit); the mean alone with one seed."""
    return mean_pm(d["mean"], d["std"])


def interval_text(d: dict[str, Any]) -> str:
    """A ``paired_difference`` result's 95 % interval as ``"lo to hi"`` (signed, 4 decimals, in the difference's
    unit), or ``"n/a (one seed)"`` when it has none."""
    return "n/a (one seed)" if d["ci95"] is None else f"{d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}"


def interval_brackets(d: dict[str, Any]) -> str:
    """A ``paired_difference`` result's 95 % interval as ``"[lo, hi]"`` (signed, 4 decimals), or ``"(1 seed)"``
    when it has none."""
    return "(1 seed)" if d["ci95"] is None else f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"


def tokens_to_target(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first token count at which a validation curve ``[(tokens, loss), …]`` (ascending tokens) reaches
    ``target`` (loss <= target), linearly interpolated between the two logged points around the crossing; the first
    point's tokens if it is already there; None if the curve never reaches it."""
    prev = None
    for tokens, loss in curve:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return float(tokens)
            t0, l0 = prev
            return float(t0 + (l0 - target) / (l0 - loss) * (tokens - t0))
        prev = (tokens, loss)
    return None


def binomial_se(acc: float, n: int) -> float:
    """Standard error ``sqrt(acc · (1 − acc) / n)`` of an accuracy measured on ``n`` >= 1 items."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    return math.sqrt(max(acc * (1.0 - acc), 0.0) / n)
