"""The compute multiplier of docs/results.md (issue 45): how many training tokens ``none`` needs to reach a method's
final validation loss, divided by the tokens the method trained on, over the budget study's three budgets.

Units: tokens are training tokens (a run's ``tokens``); a loss is the final validation loss in nats per token. The
model size is fixed, so "compute" is training tokens: a method's own extra cost per token is not charged.

**Fit.** ``none``'s final losses at 1 ×, 4 × and 16 × are joined by straight lines in log(tokens) (piecewise
log-linear interpolation, ``loglinear_tokens``); beyond the largest budget the last segment is extended, below the
smallest the first, and every such value is flagged as an extrapolation. A method at 16 × is usually below
``none``'s 16 × loss, so its multiplier is an extrapolation. A saturating power law L(D) = E + A·D^(−α) has three
parameters: through three points it is exactly determined (no residual degree of freedom, nothing to test it
with), so it is a sensitivity check only (``power_law``), never the estimate; where a method's loss is at or below
its E the loss is not reachable under the power law.

**Per seed, then over seeds.** Seed s's ``none`` curve is its own three final losses (a seed has the same data order
at every budget); k_s = D_none,s(L_method,s) / D_method. The summary is the geometric mean of k_s with the 95 %
t-interval of log k over seeds (``stats.paired_difference`` against 0, exponentiated). A t-interval, not a bootstrap:
three seeds have 10 distinct resamples, so a bootstrap interval is coarse and covers less than its nominal 95 %. The
multiplier of the seed-mean losses (``none``'s mean curve over its seeds with all three budgets, the method's mean
loss over its seeds) is given beside it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ..fileio import atomic_path
from ..compare.records import BASELINE
from ..stats import paired_difference
from .groups import budget_sets

#: Where the section draws its figure, beside docs/results.md.
FIGURE = Path("img") / "compute_multiplier.png"
#: The section's title for each of ``groups.budget_sets``.
RUNS_NAME = {"on the GPU": "GPU runs", "on the 2-core CPU": "CPU runs"}


def _checked(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``points`` ``[(tokens, loss)]`` sorted by tokens; raises ``ValueError`` unless there are at least two, the
    tokens positive and distinct and the loss strictly falling with tokens (else no curve gives one token count per
    loss)."""
    pts = sorted((float(d), float(v)) for d, v in points)
    if len(pts) < 2 or pts[0][0] <= 0:
        raise ValueError(f"need at least two points of positive tokens, got {points}")
    if any(b[0] <= a[0] or b[1] >= a[1] for a, b in zip(pts, pts[1:])):
        raise ValueError(f"the loss must fall strictly as tokens grow, got {points}")
    return pts


def loglinear_tokens(points: Sequence[tuple[float, float]], loss: float) -> tuple[float, bool]:
    """``(tokens, extrapolated)``: where the piecewise log-linear curve through ``points`` (``[(tokens, loss)]``,
    loss strictly falling with tokens) reaches ``loss``. Within the points' losses, the segment around ``loss``
    (loss linear in log tokens); beyond the last point, the last segment extended, before the first, the first
    segment extended, and then ``extrapolated`` is True. Raises ``ValueError`` for points no such curve passes
    through (``_checked``)."""
    pts = _checked(points)
    i = next((j for j in range(len(pts) - 1) if loss >= pts[j + 1][1]), len(pts) - 2)
    (d0, l0), (d1, l1) = pts[i], pts[i + 1]
    log_d = math.log(d0) + (l0 - loss) / (l0 - l1) * (math.log(d1) - math.log(d0))
    return math.exp(log_d), not pts[-1][1] <= loss <= pts[0][1]


def power_law(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """``(E, A, alpha)`` of the saturating power law L(D) = E + A·D^(−alpha) through three ``points`` ``[(tokens,
    loss)]`` exactly (alpha > 0, A > 0; E in nats, may come out negative where the points barely bend). alpha solves
    (L1 − L2)/(L2 − L3) = (D1^−α − D2^−α)/(D2^−α − D3^−α), by bisection: the right side rises with α from
    ln(D2/D1)/ln(D3/D2) (at α → 0: the points on one log-linear line) to ∞. Raises ``ValueError`` for other than
    three points, or points that do not bend upwards in log tokens (no saturating power law passes through them)."""
    pts = _checked(points)
    if len(pts) != 3:
        raise ValueError(f"an exactly determined power law needs three points, got {len(pts)}")
    (d1, l1), (d2, l2), (d3, l3) = pts
    a, b = math.log(d2 / d1), math.log(d3 / d2)
    ratio = (l1 - l2) / (l2 - l3)
    if ratio <= a / b:
        raise ValueError(f"the points {pts} do not bend upwards in log tokens: no saturating power law passes "
                         "through them")

    def rises(alpha: float) -> float:  # (D1^-α − D2^-α)/(D2^-α − D3^-α), multiplied through by D2^α
        return math.expm1(alpha * a) / -math.expm1(-alpha * b)

    lo, hi = 0.0, 1.0 / max(a, b)
    while rises(hi) < ratio:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rises(mid) < ratio else (lo, mid)
    alpha = (lo + hi) / 2
    amp = (l1 - l2) / (d1 ** -alpha - d2 ** -alpha)
    return l1 - amp * d1 ** -alpha, amp, alpha


def power_law_tokens(law: tuple[float, float, float], loss: float) -> float | None:
    """The tokens at which ``law`` ``(E, A, alpha)`` reaches ``loss``: (A / (loss − E))^(1/alpha); None when
    ``loss`` <= E (not reachable under the power law)."""
    e, amp, alpha = law
    return (amp / (loss - e)) ** (1 / alpha) if loss > e else None


def summary(ks: Sequence[float]) -> dict:
    """``{"n", "geomean", "ci95": [lo, hi] | None}`` of multipliers ``ks`` (> 0): the geometric mean and the 95 %
    t-interval of log k over seeds (``stats.paired_difference`` of log k against 0), exponentiated; None with one
    seed. Raises ``ValueError`` for no multipliers."""
    d = paired_difference([math.log(k) for k in ks], [0.0] * len(ks))
    ci = None if d["ci95"] is None else [math.exp(x) for x in d["ci95"]]
    return {"n": d["n"], "geomean": math.exp(d["mean"]), "ci95": ci}


def curves(runs: dict, groups: Sequence[str], label: str = BASELINE) -> dict[int, list[tuple[float, float]]]:
    """``{seed: [(tokens, final val loss)] over groups}`` of ``label``'s runs (``runs``: ``published.collect``'s
    ``{group: {label: {seed: run}}}``), for the seeds that have a run in every one of ``groups``."""
    by = [runs.get(g, {}).get(label, {}) for g in groups]
    seeds = sorted(set.intersection(*(set(b) for b in by))) if by else []
    return {s: [(float(b[s]["tokens"]), float(b[s]["val_loss"])) for b in by] for s in seeds}


def mean_curve(by_seed: dict[int, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The seed-mean ``[(tokens, loss)]`` of ``curves``' output (same tokens on every seed, else ``ValueError``)."""
    rows = list(by_seed.values())
    if any([d for d, _ in r] != [d for d, _ in rows[0]] for r in rows):
        raise ValueError(f"the seeds' budgets differ: {by_seed}")
    return [(d, sum(r[i][1] for r in rows) / len(rows)) for i, (d, _) in enumerate(rows[0])]


def multiplier(none: dict[int, list[tuple[float, float]]], method: dict[int, dict]) -> dict | None:
    """The multiplier of one method at one budget: ``none`` is ``curves``' output for ``none``, ``method``
    ``{seed: run}`` at that budget. Returns None when no seed has both, else ``summary`` over the seeds both have
    plus ``"per_seed": {seed: (k, extrapolated)}``, ``"extrapolated"`` (how many seeds' k are), ``"mean"``:
    ``(k, extrapolated)`` of the seed-mean losses (``"loss"``: the method's mean loss, ``"tokens"``: its mean
    tokens, ``"reach"``: where none's mean curve reaches that loss) and ``"power_law"``: k of the seed-mean losses
    under ``power_law`` of none's mean curve (None where not reachable; the key is absent where no power law
    passes). Raises ``ValueError`` where a seed's none loss does not fall with tokens."""
    seeds = [s for s in sorted(method) if s in none]
    if not seeds:
        return None
    per_seed = {}
    for s in seeds:
        reach, extra = loglinear_tokens(none[s], method[s]["val_loss"])
        per_seed[s] = (reach / method[s]["tokens"], extra)
    out = summary([k for k, _ in per_seed.values()])
    mean_none = mean_curve(none)
    loss = sum(r["val_loss"] for r in method.values()) / len(method)
    tokens = sum(r["tokens"] for r in method.values()) / len(method)
    reach, extra = loglinear_tokens(mean_none, loss)
    out.update(per_seed=per_seed, extrapolated=sum(e for _, e in per_seed.values()), mean=(reach / tokens, extra),
               loss=loss, tokens=tokens, reach=reach)
    if len(mean_none) == 3:
        try:
            at = power_law_tokens(power_law(mean_none), loss)
            out["power_law"] = None if at is None else at / tokens
        except ValueError:
            pass
    return out


def table(runs: dict, budgets: Sequence[tuple[str, str]]) -> dict[str, dict[str, dict | None]]:
    """``{label: {budget name: multiplier(...)}}`` for every label but none in ``budgets``' groups (``(group,
    name)``, smallest budget first)."""
    groups = [g for g, _ in budgets]
    none = curves(runs, groups)
    labels = [lab for lab in dict.fromkeys(lab for g in groups for lab in runs.get(g, {})) if lab != BASELINE]
    return {lab: {name: multiplier(none, runs[g].get(lab, {})) for g, name in budgets} for lab in labels}


def _k(k: float) -> str:
    return f"{k:.2f}" if k < 10 else f"{k:.1f}"


def cell(m: dict | None) -> str:
    """``k [lo, hi] (n seeds)`` and an extrapolation mark, or ``—``."""
    if m is None:
        return "—"
    ci = "no interval" if m["ci95"] is None else f"[{_k(m['ci95'][0])}, {_k(m['ci95'][1])}]"
    extra = "" if not m["extrapolated"] else f"; {m['extrapolated']} of {m['n']} extrapolated"
    return f"{_k(m['geomean'])}× {ci} ({m['n']} seed{'s' if m['n'] > 1 else ''}{extra})"


def sentence(label: str, name: str, m: dict, params: int) -> str:
    """The plain sentence for one method at one budget."""
    ci = ("one seed: no interval" if m["ci95"] is None
          else f"95 % interval {_k(m['ci95'][0])} to {_k(m['ci95'][1])}")
    extra = ("; extrapolated beyond none's largest budget" if m["extrapolated"] == m["n"]
             else f"; extrapolated on {m['extrapolated']} of {m['n']} seeds" if m["extrapolated"] else "")
    return (f"- `{label}` at {name} is worth {_k(m['geomean'])}× `{BASELINE}`'s compute at {params / 1e6:.1f} M "
            f"parameters ({ci}, {m['n']} seed{'s' if m['n'] > 1 else ''}{extra}).")


def missing(parts: Sequence, done: set[str], groups: Sequence[str]) -> int:
    """How many of the planned ``parts`` (``published.Planned``) of ``groups`` are not in ``done`` (not published)."""
    return sum(p.group in groups and p.name not in done for p in parts)


def section(runs: dict, budgets: Sequence[tuple[str, str]], where: str, parts: Sequence, done: set[str],
            out: Path) -> list[str]:
    """The markdown lines of the compute-multiplier section for the budget set ``where`` (a key of
    ``groups.budget_sets``; ``budgets`` its ``(group, name)``, smallest first), its figure drawn beside ``out``
    (``FIGURE``); empty unless every planned part of the set is published (``parts``, ``done``: ``published``'s
    ``plan`` and ``done_parts``). Names the sets skipped as incomplete. Raises ``ValueError`` where ``none``'s loss
    does not fall with budget on a seed."""
    groups = [g for g, _ in budgets]
    if missing(parts, done, groups) or any(g not in runs for g in groups):
        return []
    mults = table(runs, budgets)
    none = curves(runs, groups)
    mean_none = mean_curve(none)
    params = next(iter(runs[groups[-1]][BASELINE].values()))["params"]
    lr = next(iter(runs[groups[-1]][BASELINE].values()))["train_settings"]["lr"]
    pts = ", ".join(f"{d:,.0f} tokens → {v:.4f}" for d, v in mean_none)
    lines = [f"## How much compute is each method worth? ({RUNS_NAME.get(where, where)}, shared learning rate)", "",
             f"The tokens `{BASELINE}` needs to reach a method's final validation loss, divided by the tokens the "
             "method trained on (k > 1: the method is worth more than its tokens). Fit: **piecewise log-linear "
             f"interpolation** of `{BASELINE}`'s final validation loss in log(tokens) through its "
             f"{len(mean_none)} budgets (mean over seeds {', '.join(map(str, sorted(none)))}: {pts} nats), "
             "extended with the last segment's slope beyond the largest budget (and the first's below the "
             "smallest): such values are **extrapolations** and marked. A method at 16 × is below `none`'s 16 × "
             "loss, so its multiplier is an extrapolation. Per seed, `none`'s curve is that seed's own three runs "
             "(the same data order at every budget) and k_s = tokens(none reaches the method's loss) / the method's "
             "tokens; each cell is the geometric mean of k_s, [95 % t-interval of log k over seeds, exponentiated], "
             "the seed count and how many seeds' k are extrapolated. A saturating power law L = E + A·D^(−α) has "
             "three parameters, so through three budgets it is exactly determined (no residual degree of freedom: "
             "not a fit that could be tested); it is shown below as a sensitivity check only.", "",
             f"![none's loss against tokens and the tokens it needs to reach each method]({FIGURE.as_posix()})", "",
             "| k | " + " | ".join(name for _, name in budgets) + " |", "|---|" + "---:|" * len(budgets)]
    lines += [f"| `{lab}` | " + " | ".join(cell(by[name]) for _, name in budgets) + " |" for lab, by in mults.items()]
    lines += ["", "In words (geometric mean over seeds):", ""]
    lines += [sentence(lab, budgets[-1][1], by[budgets[-1][1]], params) for lab, by in mults.items()
              if by[budgets[-1][1]] is not None]
    lines += ["", "From the seed-mean losses (the figure's points), log-linear and under the power law:", "",
              "| k of the mean losses | " + " | ".join(f"{n}, log-linear | {n}, power law" for _, n in budgets)
              + " |", "|---|" + "---:|" * (2 * len(budgets))]
    for lab, by in mults.items():
        cells = []
        for _, name in budgets:
            m = by[name]
            cells += ["—", "—"] if m is None else [
                _k(m["mean"][0]) + ("× (extrapolated)" if m["mean"][1] else "×"),
                "no power law" if "power_law" not in m else
                "not reachable under the power law" if m["power_law"] is None else f"{_k(m['power_law'])}×"]
        lines.append(f"| `{lab}` | " + " | ".join(cells) + " |")
    lines.append("")
    try:
        e, amp, alpha = power_law(mean_none)
        lines += [f"The power law through `{BASELINE}`'s three mean points: E = {e:.3f} nats, A = {amp:.3f}, "
                  f"α = {alpha:.4f}" + (" (E below 0 nats, no physical floor: the three points bend too little "
                                        "to pin the floor down)" if e < 0 else "") + ".", ""]
    except ValueError as err:
        lines += [f"No saturating power law passes through `{BASELINE}`'s mean points ({err}).", ""]
    skipped = [(w, gs) for w, gs in budget_sets().items() if w != where and missing(parts, done, gs)]
    lines += ["Caveats: three budgets and three seeds (two for a method that trained fewer); log-linear "
              "interpolation between budgets a factor of 4 apart, and a straight-line extrapolation beyond the "
              f"largest; one learning rate (lr = {lr:g}) shared by all methods, not tuned per method, so a multiplier "
              "also carries how well that rate suits each method; compute is training tokens at a fixed model size "
              "(a method's own extra time per token is not charged)."
              + "".join(f" The runs {w} (groups {', '.join(gs)}) are skipped: {missing(parts, done, gs)} of their "
                        "parts are not yet published." for w, gs in skipped), ""]
    figure(none, runs, budgets, mults, out.parent / FIGURE)
    return lines


def figure(none: dict[int, list[tuple[float, float]]], runs: dict, budgets: Sequence[tuple[str, str]],
           mults: dict[str, dict[str, dict | None]], png: Path) -> None:
    """Draw ``none``'s per-seed points and the log-linear curve through their means (log tokens), each method's mean
    (tokens, loss) per budget and a horizontal line to where ``none``'s curve reaches it (dashed where
    extrapolated), to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for s, pts in sorted(none.items()):
        ax.scatter([d for d, _ in pts], [v for _, v in pts], color="grey", s=14, alpha=0.6,
                   label=f"{BASELINE}, per seed" if s == min(none) else None)
    mean = mean_curve(none)
    reach = [m["reach"] for by in mults.values() for m in by.values() if m is not None]
    lo, hi = min([mean[0][0]] + reach), max([mean[-1][0]] + reach)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    inner = [x for x in xs if mean[0][0] <= x <= mean[-1][0]]
    ax.plot(inner, [_loss_at(mean, x) for x in inner], color="black", label=f"{BASELINE}, mean: log-linear")
    for part in ([x for x in xs if x > mean[-1][0]], [x for x in xs if x < mean[0][0]]):
        if part:
            ax.plot(part, [_loss_at(mean, x) for x in part], color="black", ls="--", lw=1)
    colours = plt.get_cmap("tab10")
    for i, (lab, by) in enumerate(mults.items()):
        c = colours(i + 1)
        for j, (_, name) in enumerate(budgets):
            m = by[name]
            if m is None:
                continue
            ax.scatter([m["tokens"]], [m["loss"]], color=c, marker="o", zorder=3, label=lab if j == 0 else None)
            ax.plot([m["tokens"], m["reach"]], [m["loss"]] * 2, color=c, lw=1, ls="--" if m["mean"][1] else "-")
            ax.scatter([m["reach"]], [m["loss"]], color=c, marker="|", s=80)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("final validation loss (nats)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Tokens none needs to reach each method's loss (dashed: extrapolated)")
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _loss_at(points: list[tuple[float, float]], tokens: float) -> float:
    """The piecewise log-linear curve through ``points`` at ``tokens`` (end segments extended)."""
    i = next((j for j in range(len(points) - 1) if tokens <= points[j + 1][0]), len(points) - 2)
    (d0, l0), (d1, l1) = points[i], points[i + 1]
    return l0 + (math.log(tokens) - math.log(d0)) / (math.log(d1) - math.log(d0)) * (l1 - l0)
