"""The learning-rate section of docs/results.md: is the comparison fair once each method has its own learning rate?

The budget study trains every method at one peak learning rate (compare's default, 2e-3). The learning-rate
study (``groups.lr_groups``) gives each method its own:

- the **sweep** (group ``lr1cpu``): every method at each peak learning rate of a grid (``[grid] lr``), at the default
  budget. A method's **best rate** is the grid value of lowest mean final validation loss over its seeds, ties to
  the smaller rate (``best_lrs``); a rate at which a seed diverged is no candidate (a diverged run has no final loss
  to average). A best rate that is the grid's smallest or largest value is **at the grid's edge**: a better one
  may lie outside it. Its **neighbour** is the grid value beside it of lower mean loss (ties: the smaller).
- the **tuned** runs at 4 ×: a method's **4 × runs at rate r** are its published 4 × CPU runs at r of ``lr4cpu``,
  ``lr4cpunb`` or ``mix4cpu`` (the shared-rate runs, every method at one rate, the **shared rate**), a seed in two
  of them taken from the first (``runs_at``). At 4 × a method has its best rate (``lr4cpu``) and the shared one
  (``mix4cpu``'s runs cost nothing more); each of ``NEAR_METHODS`` also one more (``lr4cpunb``), a line search
  since the optimum moves with the budget: a factor-2 step beyond the better of those two at 4 ×, on its side (its
  1 × neighbour when the two are one, ``near_rates``). A method counts at the one of these rates with runs of
  lowest mean final validation loss over the seeds they all have, ties to the smaller (``candidate_rates``,
  ``tuned_choice``), so tuning never leaves a method's mean above its shared-rate one. The study files list only
  what ``mix4cpu`` lacks (``to_train``); ``rates_check`` says whether they do. The tuned comparison waits for the
  complete sweep (its rates are the sweep's best). The complete sweep's own runs give the same table at 1 ×
  (``sweep_delta_lines``), each method at its best rate beside every method at the shared one.

Beside the shared-rate runs of the same budget and seeds (``mix4cpu``), per pair of the budget study's Δ table
(every method − none, and depth_attention − depth_attention_uniform): the tuned Δ and the shared Δ, each a
per-seed paired difference of final validation loss (``published.paired_runs``: runs paired only when trained
alike, but for the study's ``[method_set]`` keys) with its 95 % t-interval and ``stats.verdict``, and the change
**tuned − shared**, ``Δ_tuned(s) − Δ_shared(s)`` paired by seed. As in the budget trend (``trend``), a change is
called (the gap **widens**, **narrows** or **reverses** with tuned rates) only when its interval excludes 0.

The rates are chosen on the validation split the losses are reported on (there is no test split), so a tuned Δ is
optimistic, for every method alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..fileio import atomic_path
from ..compare.records import BASELINE
from ..stats import interval_brackets, paired_difference, verdict
from . import trend as study_trend
from .published import Planned, paired_runs, run_record, verdict_sentence
from .spec import Study

SWEEP, TUNED, NEIGHBOUR, SHARED = "lr1cpu", "lr4cpu", "lr4cpunb", "mix4cpu"
#: The groups of 4 × runs, in the order a method's run of a rate and seed is taken from (``runs_at``).
FOUR_X = (TUNED, NEIGHBOUR, SHARED)
#: The methods tuned at 4 × over one more rate (``near_rates``; issue 45: the baseline and the method under test).
NEAR_METHODS = ("none", "depth_attention")
#: Where the report draws the sweep (beside its --out).
FIGURE = Path("img") / "lr_sweep.png"
TITLE = "## Is the comparison fair once each method has its own learning rate?"
SAME_SPLIT = ("The learning rate is chosen on the same validation split and the same seeds the loss is reported on "
              "(there is no separate test split), at 1 × and at 4 × alike, so a tuned Δ is optimistic; the more "
              "rates a method is chosen among, the more, so a gap to `none` (chosen among the most) leans against "
              "the method chosen among fewer.")


@dataclass(frozen=True)
class Best:
    """A method's best rate of the sweep: ``lr``, its ``mean`` final validation loss (nats), whether it is the
    grid's smallest or largest value (``at_edge``) and its ``neighbour`` (None when no grid value beside it has a
    loss)."""

    lr: float
    mean: float
    at_edge: bool
    neighbour: float | None


def best_lrs(losses: dict[str, dict[float, list[float | None]]], grid: Sequence[float]) -> dict[str, Best]:
    """``{method: Best}`` from ``losses`` (``{method: {lr: [final val loss per seed, None for a diverged seed]}}``)
    over the rates of ``grid``: the lowest mean over seeds, ties to the smaller rate; a rate with a diverged seed
    or no seed is no candidate, and a method without a candidate is left out. Raises ``ValueError`` for a rate not
    in ``grid``."""
    grid = sorted(grid)
    out = {}
    for method, by_lr in losses.items():
        bad = [lr for lr in by_lr if lr not in grid]
        if bad:
            raise ValueError(f"`{method}`: learning rate {bad[0]} is not in the grid {grid}")
        means = {lr: statistics.fmean(xs) for lr, xs in by_lr.items() if xs and None not in xs}
        if not means:
            continue
        lr = min(means, key=lambda x: (means[x], x))
        i = grid.index(lr)
        beside = [grid[j] for j in (i - 1, i + 1) if 0 <= j < len(grid) and grid[j] in means]
        neighbour = min(beside, key=lambda x: (means[x], x)) if beside else None
        out[method] = Best(lr, means[lr], lr in (grid[0], grid[-1]), neighbour)
    return out


@dataclass(frozen=True)
class Sweep:
    """The sweep's published runs: ``runs[method][lr][seed]`` (``published.run_record``'s) and the seeds that
    diverged, ``diverged[method][lr]``; ``grid`` the study's rates, ascending."""

    grid: tuple[float, ...]
    runs: dict[str, dict[float, dict[int, dict]]]
    diverged: dict[str, dict[float, list[int]]]

    def at_best(self, best: dict[str, Best]) -> dict[str, dict[int, dict]]:
        """``{method: {seed: run}}``: each method of ``best`` (``best_lrs``') at its best rate."""
        return {m: self.runs.get(m, {}).get(b.lr, {}) for m, b in best.items()}

    def losses(self) -> dict[str, dict[float, list[float | None]]]:
        """``best_lrs``' input: per method and rate, the finished seeds' final val losses and None per diverged
        seed."""
        out: dict[str, dict[float, list[float | None]]] = {}
        for method in dict.fromkeys([*self.runs, *self.diverged]):
            for lr in self.grid:
                xs = [r["val_loss"] for _, r in sorted(self.runs.get(method, {}).get(lr, {}).items())]
                xs += [None] * len(self.diverged.get(method, {}).get(lr, []))
                if xs:
                    out.setdefault(method, {})[lr] = xs
        return out


def sweep_of(published: list[dict], study: Study) -> Sweep:
    """The runs of ``study``'s group (the sweep) among the ``published`` parts, keyed by the rate each trained at
    (``settings.train.lr``)."""
    runs: dict[str, dict[float, dict[int, dict]]] = {}
    diverged: dict[str, dict[float, list[int]]] = {}
    for res in published:
        if res["study"]["group"] != study.name:
            continue
        lr = float(res["settings"]["train"]["lr"])
        for method, m in res["methods"].items():
            for r in m["runs"]:
                runs.setdefault(method, {}).setdefault(lr, {})[int(r["seed"])] = run_record(res, r)
            for d in m.get("diverged", []):
                diverged.setdefault(method, {}).setdefault(lr, []).append(int(d["seed"]))
    order = {m: i for i, m in enumerate(study.methods)}
    return Sweep(tuple(sorted(study.grid["lr"])), dict(sorted(runs.items(), key=lambda x: order.get(x[0], 99))),
                 diverged)


def method_runs(published: list[dict], groups: Sequence[str]) -> dict[str, dict[str, dict[int, dict]]]:
    """``{group: {method: {seed: run}}}`` (``published.collect``'s shape, keyed by method whatever a part's
    label) of the finished runs of ``groups`` among the ``published`` parts."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for res in published:
        if res["study"]["group"] in groups:
            for method, m in res["methods"].items():
                for r in m["runs"]:
                    out.setdefault(res["study"]["group"], {}).setdefault(method, {})[int(r["seed"])] = \
                        run_record(res, r)
    return out


def committed_lrs(study: Study) -> dict[str, float]:
    """``{method: lr}`` a study file sets per method (``[method_set.METHOD] lr``)."""
    return {m: float(s["lr"]) for m, s in study.method_sets.items() if "lr" in s}


def shared_rate(runs: dict) -> float | None:
    """The rate every ``mix4cpu`` run trained at (``runs``: ``method_runs``'), None without one. Raises
    ``ValueError`` if its runs trained at several."""
    rates = sorted({float(r["train_settings"]["lr"]) for by_seed in runs.get(SHARED, {}).values()
                    for r in by_seed.values()})
    if len(rates) > 1:
        raise ValueError(f"the shared-rate runs of `{SHARED}` trained at several learning rates "
                         f"({', '.join(map(_lr, rates))}); expected one")
    return rates[0] if rates else None


def near_rates(best: dict[str, Best], runs: dict, shared: float | None, seeds: Sequence[int]
               ) -> dict[str, float | None]:
    """``{method: rate}`` ``lr4cpunb`` trains each of ``NEAR_METHODS`` at (``runs``: ``method_runs``' of ``FOUR_X``),
    a line search at 4 ×, since the optimum moves with the budget: one factor-2 step beyond the better of the
    method's 4 × rates of ``lr4cpu`` and ``mix4cpu`` (its best ``best`` rate and the ``shared`` one), on that
    rate's side; its 1 × neighbour when the best rate is the shared one (one 4 × rate gives no direction); None
    while a seed of ``seeds`` (``lr4cpu``'s) has no run at either of the two."""
    first = {g: runs.get(g, {}) for g in (TUNED, SHARED)}
    out: dict[str, float | None] = {}
    for m in NEAR_METHODS:
        if m not in best:
            continue
        b = best[m]
        if shared is None or b.lr == shared:
            out[m] = b.neighbour
            continue
        at = runs_at(first, m)
        if not seeds or not all(s in at.get(r, {}) for r in (b.lr, shared) for s in seeds):
            out[m] = None
            continue
        lr = tuned_choice(first, m, [b.lr, shared]).lr
        out[m] = lr / 2 if lr == min(b.lr, shared) else lr * 2
    return out


def four_x_rates(best: dict[str, Best], runs: dict, studies: dict[str, Study]
                 ) -> tuple[float | None, dict[str, float | None]]:
    """``(shared, near)``: the shared rate (``shared_rate``) and the rates ``lr4cpunb`` trains (``near_rates``, at
    ``lr4cpu``'s seeds) for the complete sweep's ``best`` rates (``runs``: ``method_runs``' of ``FOUR_X``;
    ``studies``: ``published.load_studies``'). Raises ``ValueError`` as ``shared_rate`` does."""
    shared = shared_rate(runs)
    return shared, near_rates(best, runs, shared, studies[TUNED].seeds if TUNED in studies else ())


def candidate_rates(best: Best, shared: float | None, near: float | None) -> list[float]:
    """The rates a method counts at at 4 × (``tuned_choice``): its ``best`` rate, its ``near`` one (``near_rates``',
    None for none) and the ``shared`` rate (every method has 4 × runs there, ``mix4cpu``'s), once each, in that
    order."""
    rates = [best.lr]
    for r in (near, shared):
        if r is not None and r not in rates:
            rates.append(r)
    return rates


def to_train(best: dict[str, Best], shared: float | None, near: dict[str, float | None]
             ) -> tuple[dict[str, float], dict[str, float]]:
    """``({method: lr} of lr4cpu, {method: lr} of lr4cpunb)``: each method's ``best`` rate and each ``near`` rate
    (``near_rates``'; None, not yet known, left out) but the ``shared`` one (``mix4cpu`` has those runs)."""
    own = {m: b.lr for m, b in best.items() if b.lr != shared}
    return own, {m: r for m, r in near.items() if r is not None and r != shared}


def runs_at(runs: dict, method: str) -> dict[float, dict[int, tuple[str, dict]]]:
    """``{lr: {seed: (group, run)}}``: ``method``'s 4 × runs (``runs``: ``method_runs``' of ``FOUR_X``) by the rate
    they trained at, a seed that two groups have at one rate taken from the first of ``FOUR_X``."""
    out: dict[float, dict[int, tuple[str, dict]]] = {}
    for group in reversed(FOUR_X):
        for seed, r in runs.get(group, {}).get(method, {}).items():
            out.setdefault(float(r["train_settings"]["lr"]), {})[seed] = (group, r)
    return out


def _lr(x: float) -> str:
    return f"{x:g}"


def _cell(by_seed: dict[int, dict], gone: list[int], bold: bool) -> str:
    xs = [r["val_loss"] for r in by_seed.values()]
    text = ""
    if xs:
        mean = statistics.fmean(xs)
        text = f"{mean:.4f}" + (f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else "") + f" ({len(xs)})"
        text = f"**{text}**" if bold else text
    if gone:
        text += ("; " if text else "") + (f"{len(gone)} diverged (seed{'s' if len(gone) > 1 else ''} "
                                          f"{', '.join(map(str, sorted(gone)))})")
    return text or "—"


def sweep_table(sweep: Sweep, best: dict[str, Best]) -> list[str]:
    """Method × rate: mean ± sample std of final validation loss (seeds), the best in bold; diverged seeds counted
    and named; then one line per best at the grid's edge."""
    lines = ["| method | " + " | ".join(f"lr {_lr(x)}" for x in sweep.grid) + " | best lr |",
             "|---|" + "---:|" * len(sweep.grid) + "---:|"]
    for method in dict.fromkeys([*sweep.runs, *sweep.diverged]):
        b = best.get(method)
        cells = [_cell(sweep.runs.get(method, {}).get(lr, {}), sweep.diverged.get(method, {}).get(lr, []),
                       b is not None and b.lr == lr) for lr in sweep.grid]
        lines.append(f"| `{method}` | " + " | ".join(cells) + f" | {_lr(b.lr) if b else '—'} |")
    lines.append("")
    for method, b in best.items():
        if b.at_edge:
            end = "smallest" if b.lr == sweep.grid[0] else "largest"
            lines.append(f"- `{method}`'s best rate, {_lr(b.lr)}, is the grid's {end} value: at the grid's edge, so a "
                         "better rate may lie beyond it (extend the grid).")
    return lines + ([""] if any(b.at_edge for b in best.values()) else [])


def figure(sweep: Sweep, png: Path) -> bool:
    """Draw final validation loss against the rate (log2 axis): per method the mean over seeds as a line and each
    seed as a point; a rate at which a seed diverged is left off the line (its finished seeds stay points) and
    marked by a cross at the top. Returns False (and writes nothing) without a finished run."""
    if not any(by_lr for by_lr in sweep.runs.values()):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), constrained_layout=True)
    top = ax.get_xaxis_transform()  # x in data, y in axes coordinates
    for i, method in enumerate(dict.fromkeys([*sweep.runs, *sweep.diverged])):
        by_lr, gone = sweep.runs.get(method, {}), sweep.diverged.get(method, {})
        colour = f"C{i % 10}"
        lrs = [lr for lr in sweep.grid if by_lr.get(lr) and not gone.get(lr)]
        ax.plot(lrs, [statistics.fmean(r["val_loss"] for r in by_lr[lr].values()) for lr in lrs], marker="o",
                color=colour, label=method)
        pts = [(lr, r["val_loss"]) for lr in sweep.grid for r in by_lr.get(lr, {}).values()]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=colour, alpha=0.4, s=14)
        crosses = [lr for lr in sweep.grid if gone.get(lr)]
        ax.scatter(crosses, [0.97] * len(crosses), transform=top, marker="x", color=colour, s=40,
                   label=f"{method}: a seed diverged" if crosses else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(sweep.grid), [_lr(x) for x in sweep.grid])
    ax.minorticks_off()
    ax.set_xlabel("peak learning rate (log2 axis)")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Learning-rate sweep, default budget (line: mean over seeds; points: seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return True


def _missing(parts: list[Planned], done: set[str], group: str) -> list[str]:
    return [p.name for p in parts if p.group == group and p.name not in done]


def sweep_lines(sweep: Sweep, studies: dict[str, Study], parts: list[Planned], done: set[str], out: Path,
                runs: dict) -> list[str]:
    """The sweep's subsection: what is missing, the table, the edge lines, the figure and, once the sweep is
    complete, whether the tuned study files train at its rates (``rates_check``; ``runs``: ``method_runs``' of
    ``FOUR_X``)."""
    study = studies[SWEEP]
    head = [f"### The sweep at the default budget (`{SWEEP}`)", ""]
    if not sweep.runs and not sweep.diverged:
        return head + [f"The learning-rate sweep (`{SWEEP}`: {len(study.methods)} methods × lr "
                       f"{', '.join(map(_lr, sweep.grid))} × seeds {', '.join(map(str, study.seeds))}) is not yet "
                       "published.", ""]
    missing = _missing(parts, done, SWEEP)
    lines = head
    if missing:
        lines += [f"**Incomplete:** {len(missing)} of the sweep's {sum(p.group == SWEEP for p in parts)} parts are "
                  f"not yet published ({', '.join(missing)}); the table and the best rates cover the published "
                  "parts only, so they are provisional.", ""]
    best = best_lrs(sweep.losses(), sweep.grid)
    lines += ["Final validation loss (nats, whole validation split), mean ± sample standard deviation over seeds "
              "(number of seeds); a method's best rate, the lowest mean (ties: the smaller rate), in bold. A "
              "diverged run is counted and named, not averaged, and its rate is no candidate.", ""]
    lines += sweep_table(sweep, best)
    if figure(sweep, out.parent / FIGURE):
        lines += [f"![final validation loss against the learning rate, per method]({FIGURE.as_posix()})", ""]
    if missing:
        return lines
    shared, near = four_x_rates(best, runs, studies)
    return (lines + sweep_delta_lines(sweep, best, shared)
            + rates_check(best, studies.get(TUNED), studies.get(NEIGHBOUR), shared, near))


def _said(lrs: dict[str, float | None]) -> str:
    return ", ".join(f"`{m}` {_lr(lr) if lr is not None else '(no rate set)'}" for m, lr in lrs.items())


def tuned_keys(studies: dict[str, Study]) -> frozenset[str]:
    """The keys the tuned study files (those of ``studies`` there are) set per method: the keys a tuned run may
    differ in from its reference's (``published.paired_runs``' ``allowed``)."""
    return frozenset().union(*(studies[g].method_set_keys() for g in (TUNED, NEIGHBOUR) if g in studies))


def rates_check(best: dict[str, Best], tuned: Study | None, near_study: Study | None, shared: float | None,
                near: dict[str, float | None]) -> list[str]:
    """Whether the tuned study files (``tuned``: lr4cpu's, ``near_study``: lr4cpunb's, None for an absent file)
    list exactly the methods and rates ``to_train`` gives for the complete sweep's ``best`` rates, the ``shared``
    rate (None: no shared-rate run is published) and the ``near`` ones (``near_rates``'), in one line; a file that
    should list nothing is told to be deleted, an absent one that should list methods to be written; lr4cpunb's
    rates, while some are not yet known, are not checked."""
    wants = to_train(best, shared, near)
    waiting = [m for m, r in near.items() if r is None]
    reused = ("" if shared is None else
              f"; every other 4 × rate is the shared rate {_lr(shared)}, whose runs `{SHARED}` already has")
    wrong = []
    for group, study, want in zip((TUNED, NEIGHBOUR), (tuned, near_study), wants):
        if group == NEIGHBOUR and waiting:
            continue
        if study is None:
            if want:
                wrong.append(f"{group}.toml is absent; it should train {_said(want)}")
            continue
        has = {m: committed_lrs(study).get(m) for m in study.methods}
        if has != want:
            wrong.append(f"{study.path.name} trains {_said(has)}; it should train " + (
                _said(want) if want else f"nothing, as every such rate is the shared one {_lr(shared)} (delete it)"))
    if wrong:
        return [f"**The tuned study files do not train at the sweep's rates**: {'; '.join(wrong)}{reused}. Correct "
                "them before their parts train.", ""]
    own = _said(wants[0]) if wants[0] else "nothing (no study file)"
    if waiting:
        return [f"`{TUNED}` trains {own} (the best rates){reused}. `{NEIGHBOUR}`'s rates for "
                f"{', '.join(f'`{m}`' for m in waiting)} follow from `{TUNED}`'s runs (`lrsweep.near_rates`), not "
                "all published yet.", ""]
    near_ = _said(wants[1]) if wants[1] else "nothing (no study file)"
    return [f"`{TUNED}` trains {own} (the best rates) and `{NEIGHBOUR}` {near_} (`near_rates`: a step beyond the "
            f"better of the best and the shared rate at 4 ×, or the 1 × neighbour where the two are one){reused}.",
            ""]


def choices(runs: dict, best: dict[str, Best], studies: dict[str, Study]) -> dict[str, Choice]:
    """``{method: Choice}`` at 4 × for each method of the complete sweep's ``best`` rates (``runs``:
    ``method_runs``' of ``FOUR_X``; ``studies``: ``published.load_studies``'): the best of its candidate rates."""
    shared, near = four_x_rates(best, runs, studies)
    return {m: tuned_choice(runs, m, candidate_rates(b, shared, near.get(m))) for m, b in best.items()}


@dataclass(frozen=True)
class Choice:
    """A method's 4 × rate (``tuned_choice``): its ``runs`` there (``{seed: run}``), the rate ``lr`` (None without
    runs), ``edge`` ("lowest" or "highest" when ``lr`` is that end of two or more rates with runs, else "") and the
    ``note`` saying how it was chosen ("" when there was nothing to choose and the runs are its own); ``tried``
    the rates it was chosen among."""

    runs: dict[int, dict]
    lr: float | None
    edge: str
    note: str
    tried: tuple[float, ...] = ()


def tuned_choice(runs: dict, method: str, rates: Sequence[float]) -> Choice:
    """``method``'s 4 × runs (``runs``: ``method_runs``' of ``FOUR_X``) at the one of ``rates``
    (``candidate_rates``') of lowest mean final validation loss over the seeds, among the rates that have a run on
    every seed any of them has (ties: the smaller rate); while none has, at the one with the most runs (ties: the
    first). A rate missing a seed (its parts not all published) is no candidate: the report names its parts as
    missing. The note names the means when there were several, where the chosen runs are ``mix4cpu``'s (the shared
    rate's), and an edge: a rate beyond it is untried."""
    at = runs_at(runs, method)
    every = set().union(*(set(at.get(r, {})) for r in rates))
    have = [r for r in rates if at.get(r) and set(at[r]) == every]
    seeds = sorted(every)
    means = {r: statistics.fmean(at[r][s][1]["val_loss"] for s in seeds) for r in have}
    lr = (min(means, key=lambda r: (means[r], r)) if means else
          max(rates, key=lambda r: (len(at.get(r, {})), -rates.index(r))))
    chosen = {s: run for s, (_, run) in sorted(at.get(lr, {}).items())}
    if not chosen:
        return Choice({}, None, "", "")
    edge = "" if len(means) < 2 else "lowest" if lr == min(means) else "highest" if lr == max(means) else ""

    def name(r: float) -> str:
        mine = at.get(r, {}).values()
        return _lr(r) + (f" (the shared-rate runs of `{SHARED}`)" if mine and all(g == SHARED for g, _ in mine)
                         else "")

    note = f"`{method}` at {name(lr)}"
    if len(means) > 1:
        others = "; ".join(f"{means[r]:.4f} at {name(r)}" for r in have if r != lr)
        note += (f", mean {means[lr]:.4f}, against {others} over seed{'s' if len(seeds) > 1 else ''} "
                 f"{', '.join(map(str, seeds))}")
    if edge:
        note += f", the {edge} of its 4 × rates (one {'below' if edge == 'lowest' else 'above'} it is untried)"
    return Choice(chosen, lr, edge, "" if note == f"`{method}` at {_lr(lr)}" else note, tuple(means))


def gaps(method: str, ref: str, mine: dict[int, dict], base: dict[int, dict], allowed: frozenset[str]
         ) -> dict[int, float]:
    """``{seed: val_loss(method) − val_loss(ref)}`` over the seeds both have (``published.paired_runs``, which
    raises ``ValueError`` for runs trained with other settings but for ``allowed``)."""
    pair = paired_runs(method, mine, base, ref, allowed)
    if pair is None:
        return {}
    a, _, d = pair
    return {int(x["seed"]): diff for x, diff in zip(a, d["diffs"])}


def _stats(g: dict[int, float]) -> dict | None:
    return paired_difference(list(g.values()), [0.0] * len(g)) if g else None


def change_sentence(method: str, ref: str, shared: dict[int, float], tuned: dict[int, float]) -> str:
    """How the gap ``method − ref`` moved from the shared rate to each method's own, paired by seed, in the budget
    trend's words (only an interval excluding 0 calls a change)."""
    seeds = [s for s in sorted(tuned) if s in shared]
    name = f"`{method}` − `{ref}`"
    if not seeds:
        return f"- {name}: no seed has both a tuned and a shared-rate pair yet."
    d = paired_difference([tuned[s] for s in seeds], [shared[s] for s in seeds])
    ms, mt = (statistics.fmean(x[s] for s in seeds) for x in (shared, tuned))
    head = (f"- {name}: {ms:+.3f} nats at the shared rate and {mt:+.3f} at each method's own (seed"
            f"{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}); ")
    if d["ci95"] is None:
        return head + "one seed gives no interval: the change is undetermined."
    return head + study_trend.change_words(d, ms, {s: tuned[s] for s in seeds}, "with tuned rates")


def tuned_lines(runs: dict, studies: dict[str, Study], parts: list[Planned], done: set[str],
                best: dict[str, Best] | None) -> list[str]:
    """The tuned 4 × subsection from ``runs`` (``method_runs``' of ``FOUR_X``) at the complete sweep's ``best``
    rates (None while the sweep is incomplete): the rates, the table of tuned and shared Δ and their change, in
    words."""
    head = [f"### 4 × at each method's own rate (`{TUNED}`, `{NEIGHBOUR}`) beside the shared rate (`{SHARED}`)", ""]
    if best is None:
        return head + ["The tuned 4 × comparison waits for the complete sweep: its rates are the sweep's best.", ""]
    choice = choices(runs, best, studies)
    methods = [m for m in best if choice[m].runs]
    if not methods:
        return head + [f"The tuned 4 × runs (`{TUNED}`, `{NEIGHBOUR}`) are not yet run.", ""]
    lines = list(head)
    missing = _missing(parts, done, TUNED) + _missing(parts, done, NEIGHBOUR)
    if missing:
        lines += [f"**Incomplete:** {len(missing)} tuned parts are not yet published ({', '.join(missing)}); the "
                  "table covers the published ones only.", ""]
    if BASELINE not in methods or len(methods) < 2:
        return lines + [f"No tuned pair yet: a pair needs `{BASELINE}`'s 4 × runs at its own rate and another "
                        "method's.", ""]
    rates = "; ".join(choice[m].note or f"`{m}` at {_lr(choice[m].lr)}" for m in methods)
    lines += [f"Rates at 4 ×: {rates}.", ""]
    return lines + delta_lines({m: choice[m].runs for m in methods}, runs.get(SHARED, {}), tuned_keys(studies))


def pairs_of(methods: Iterable[str]) -> list[tuple[str, str]]:
    """The budget study's ``(method, reference)`` pairs among ``methods``: each but none against none, then
    depth_attention against depth_attention_uniform (``trend.UNIFORM_PAIR``) when both are there."""
    methods = list(methods)
    pairs = [(m, BASELINE) for m in methods if m != BASELINE]
    return pairs + ([study_trend.UNIFORM_PAIR] if all(m in methods for m in study_trend.UNIFORM_PAIR) else [])


@dataclass(frozen=True)
class PairChange:
    """A pair's gaps (``{seed: Δ}``, ``gaps``) with each method at its own rate (``tuned``) and at the shared rate
    (``shared``), and the paired change tuned − shared over the seeds both have (``change``, ``paired_difference``'s,
    None without such a seed); ``same`` when on those seeds both are the very same runs."""

    tuned: dict[int, float]
    shared: dict[int, float]
    change: dict | None
    same: bool


def pair_change(method: str, ref: str, own: dict[str, dict[int, dict]], shared: dict[str, dict[int, dict]],
                allowed: frozenset[str]) -> PairChange:
    """The gap ``method − ref`` with each at its own rate (``own``: ``{method: {seed: run}}``, runs that may
    differ in the ``allowed`` keys) and at the shared rate (``shared``, the same shape, runs trained alike), and its
    change (``PairChange``). Raises ``ValueError`` as ``gaps`` does."""
    tuned = gaps(method, ref, own.get(method, {}), own.get(ref, {}), allowed)
    at_shared = gaps(method, ref, shared.get(method, {}), shared.get(ref, {}), frozenset())
    seeds = [s for s in sorted(tuned) if s in at_shared]
    same = bool(seeds) and all(own[x][s] is shared[x][s] for x in (method, ref) for s in seeds)
    dc = paired_difference([tuned[s] for s in seeds], [at_shared[s] for s in seeds]) if seeds else None
    return PairChange(tuned, at_shared, dc, same)


def delta_lines(own: dict[str, dict[int, dict]], shared: dict[str, dict[int, dict]], allowed: frozenset[str]
                ) -> list[str]:
    """The Δ table of the budget study's pairs (every method of ``own`` − none, and depth_attention −
    depth_attention_uniform) with each method at its own rate (``own``: ``{method: {seed: run}}``, runs that may
    differ in the ``allowed`` keys) beside the same pairs at the shared rate (``shared``, the same shape, runs
    trained alike), the change tuned − shared paired by seed, and both in words (``change_sentence``)."""
    lines = ["Each Δ cell: the per-seed paired Δ in final validation loss (nats), mean ± standard deviation over "
             "seeds, [95 % t-interval], and how many seeds the first method is lower on. Tuned − shared: "
             "Δ_tuned(s) − Δ_shared(s), paired by seed, [95 % t-interval].", "",
             "| Δ | each at its own rate | verdict | shared rate | verdict | tuned − shared |",
             "|---|---:|---|---:|---|---:|"]
    words, changes = [], []
    for m, ref in pairs_of(own):
        pc = pair_change(m, ref, own, shared, allowed)
        dt, ds, dc = _stats(pc.tuned), _stats(pc.shared), pc.change
        change = ("—" if dc is None else "0 (the same runs)" if pc.same
                  else f"{dc['mean']:+.4f} {interval_brackets(dc)}")
        lines.append(f"| `{m}` − `{ref}` | {study_trend.cell(pc.tuned)} | {verdict(dt) if dt else '—'} | "
                     f"{study_trend.cell(pc.shared)} | {verdict(ds) if ds else '—'} | {change} |")
        if dt:
            words.append(verdict_sentence(f"`{m}` − `{ref}`, each at its own rate", dt))
        changes.append(f"- `{m}` − `{ref}`: both count at the shared rate, so these are the same runs: no change."
                       if pc.same else change_sentence(m, ref, pc.shared, pc.tuned))
    if words:
        lines += ["", "In words (no correction for multiple comparisons):", ""] + words
    return lines + [""] + ["From the shared rate to each method's own (the same seeds paired):", ""] + changes + [""]


def sweep_delta_lines(sweep: Sweep, best: dict[str, Best], shared: float | None) -> list[str]:
    """The complete sweep's own runs as a tuned comparison at 1 ×: each method at its ``best`` rate beside every
    method at the ``shared`` one (``delta_lines``); nothing when the grid lacks the shared rate."""
    if shared is None or shared not in sweep.grid:
        return []
    own = sweep.at_best(best)
    at_shared = {m: sweep.runs.get(m, {}).get(shared, {}) for m in best}
    seeds = len({s for by_seed in own.values() for s in by_seed})
    return [f"At 1 ×, the same Δ from the sweep's own runs: each method at its best rate, and every method at the "
            f"shared rate {_lr(shared)}. The rates were chosen on these very runs, so the tuned Δ here carries the "
            f"choice's optimism in full, and {seeds} seed{'s give' if seeds > 1 else ' gives'} wide intervals; the "
            "4 × runs below are new runs at the chosen rates (their rate, too, chosen on the seeds they report).",
            ""] + delta_lines(own, at_shared, frozenset({"lr"}))


def section(published: list[dict], studies: dict[str, Study], parts: list[Planned], done: set[str], out: Path
            ) -> list[str]:
    """The section's markdown lines (module docstring), drawing the sweep's figure beside ``out`` (``FIGURE``):
    ``published`` parts, ``studies`` (``published.load_studies``), ``parts`` and ``done`` (``published.plan``,
    ``done_parts``). Raises ``ValueError`` if runs to be paired were trained with other settings, or if the
    shared-rate runs trained at several rates (``shared_rate``)."""
    sweep_study = studies[SWEEP]
    sweep = sweep_of(published, sweep_study)
    runs = method_runs(published, FOUR_X)
    shared = shared_rate(runs)
    near = " and ".join(f"`{m}`" for m in NEAR_METHODS)
    lines = [TITLE, "",
             "The budget study above trains every method at one peak learning rate"
             + (f" ({_lr(shared)})" if shared is not None else "") + ". Here each method has its own: "
             f"a sweep at the default budget over lr {', '.join(map(_lr, sweep.grid))} (`{SWEEP}`, seeds "
             f"{', '.join(map(str, sweep_study.seeds))}), then 4 × at each method's best rate (`{TUNED}`), and "
             f"{near} also one factor-2 step beyond the better of their best and the shared rate at 4 × "
             f"(`{NEIGHBOUR}`: a line search, since the best rate moves with the budget), on the 2-core CPU. A "
             f"4 × run at the shared rate is not trained again: `{SHARED}`'s run of the same method and seed is that "
             "run (same data, initial weights and settings). At 4 × each method counts at the one of its rates of "
             "lowest mean final validation loss, so tuning never leaves a method above its shared-rate mean. "
             + SAME_SPLIT, ""]
    lines += sweep_lines(sweep, studies, parts, done, out, runs)
    best = None if _missing(parts, done, SWEEP) else best_lrs(sweep.losses(), sweep.grid)
    return lines + tuned_lines(runs, studies, parts, done, best)


def lead_sentence(published: list[dict], studies: dict[str, Study], parts: list[Planned], done: set[str]) -> str:
    """The learning-rate study in one sentence for the lead of docs/results.md (``lead``): how much is published
    while the sweep is incomplete; each method's best rate once it is complete; once ``lr4cpu``'s runs are
    published, whether giving each method its own rate changes a gap at 4 × (``_answer``, by the section's rule) and
    the tuned 4 × gaps of every pair (``pairs_of``), or, when every method's best 4 × rate is the shared one, that
    nothing changes; provisional, and saying so first, while ``lr4cpunb``'s runs are not all published. "" when the
    study has no study file."""
    if SWEEP not in studies:
        return ""
    count = {g: (sum(p.group == g and p.name in done for p in parts), sum(p.group == g for p in parts))
             for g in (SWEEP, TUNED, NEIGHBOUR, SHARED)}
    sweep_done, sweep_all = count[SWEEP]
    tuned_done = count[TUNED][0] + count[NEIGHBOUR][0]
    tuned_all = count[TUNED][1] + count[NEIGHBOUR][1]
    if sweep_done < sweep_all:
        return (f"Whether this ranking holds once each method has its own learning rate is not yet answered: "
                f"{sweep_done} of the sweep's {sweep_all} runs and {tuned_done} of the {tuned_all} tuned 4 × runs "
                "are published (the learning-rate section shows them).")
    sweep = sweep_of(published, studies[SWEEP])
    best = best_lrs(sweep.losses(), sweep.grid)
    rates = ", ".join(f"`{m}` {_lr(b.lr)}{' (at the grid’s edge)' if b.at_edge else ''}" for m, b in best.items())
    if count[TUNED][0] < count[TUNED][1] or count[SHARED][0] < count[SHARED][1]:
        seeds = len(studies[SWEEP].seeds)
        own = sweep.at_best(best)
        return (f"Each method's best learning rate at 1 × (by mean final validation loss over {seeds} seeds): "
                f"{rates}. At those rates, on the sweep's own runs, the gaps at 1 × are "
                f"{_gaps_said(own, frozenset({'lr'}))}; the tuned 4 × runs, new runs at the chosen rates, are not "
                f"yet all run ({tuned_done} of {tuned_all} published).")
    runs = method_runs(published, FOUR_X)
    choice = choices(runs, best, studies)
    at_four = ", ".join(f"`{m}` {_lr(c.lr)}" for m, c in choice.items() if c.lr is not None)
    notes = []
    for edge, beyond in (("lowest", "lower"), ("highest", "higher")):
        names = [f"`{m}`" for m, c in choice.items() if c.edge == edge]
        if names:
            notes.append(f"{', '.join(names)} at the {edge} rate tried at 4 ×, so a {beyond} one may do better")
    one = [f"`{m}`" for m, c in choice.items() if len(c.tried) == 1]
    if one:
        notes.append(f"{', '.join(one)} tried at one rate only")
    done_nb, all_nb = count[NEIGHBOUR]
    head = (f"Provisional, with {done_nb} of `{NEIGHBOUR}`'s {all_nb} runs published: " if done_nb < all_nb
            else "")
    own = {m: c.runs for m, c in choice.items()}
    changes = {p: pair_change(*p, own, runs.get(SHARED, {}), tuned_keys(studies)) for p in pairs_of(own)}
    closing = f" Each method's best learning rate at 1 × was {rates}."
    if changes and all(c.same for c in changes.values()):
        extra = f" ({'; '.join(notes)})" if notes else ""
        body = (f"at 4 × the best rate tried was the shared one, {_lr(shared_rate(runs))}, for every method{extra}, "
                "so giving each method its own rate changes no gap: the 4 × gaps are the shared-rate ones above.")
    else:
        said = f"{at_four}{''.join('; ' + e for e in notes)}"
        body = (_answer(changes) + f": with each method at the best of its 4 × rates ({said}), the gaps are "
                f"{_gaps_said(own, tuned_keys(studies))}.")
    return (head + body if head else body[0].upper() + body[1:]) + closing


def _answer(changes: dict[tuple[str, str], PairChange]) -> str:
    """Whether giving each method its own rate changes a gap at 4 ×, in words, by the section's rule
    (``change_sentence``): a pair's change is called only when the 95 % interval of its paired change tuned −
    shared excludes 0; pairs without a change on two or more seeds are named as not yet comparable."""
    called, open_ = [], []
    for (m, ref), c in changes.items():
        if c.change is None or c.change["ci95"] is None:
            open_.append(f"`{m}` − `{ref}`")
        elif not c.change["ci95"][0] <= 0 <= c.change["ci95"][1]:
            lo, hi = c.change["ci95"]
            called.append(f"`{m}` − `{ref}` by {c.change['mean']:+.3f} nats (95 % interval {lo:+.3f} to {hi:+.3f})")
    unsure = f" ({', '.join(open_)}: not yet comparable on two seeds)" if open_ else ""
    if not called:
        return ("giving each method its own learning rate changes no gap at 4 × detectably (each paired change "
                f"tuned − shared has a 95 % interval including 0){unsure}")
    rest = "; the other changes are inconclusive" if len(called) + len(open_) < len(changes) else ""
    return f"giving each method its own learning rate changes gaps at 4 ×: {'; '.join(called)}{rest}{unsure}"


def _gaps_said(own: dict[str, dict[int, dict]], allowed: frozenset[str]) -> str:
    """Each pair of ``own``'s methods (``{method: {seed: run}}``; ``pairs_of``): its mean paired Δ, in nats, and
    verdict."""
    said = []
    for m, ref in pairs_of(own):
        d = _stats(gaps(m, ref, own[m], own.get(ref, {}), allowed))
        if d is not None:
            said.append(f"`{m}` − `{ref}` = {d['mean']:+.3f} nats, {verdict(d)}")
    return "; ".join(said)
