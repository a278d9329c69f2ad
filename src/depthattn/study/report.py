"""A study's tables in markdown (``depthattn study report``), from the parts' ``results.json``.

Per **cell** (a budget and a combination of grid values) the parts' runs are put together by seed, and every method
is compared with the study's reference by ``compare.paired_stats`` — the statistics ``compare`` itself reports
(``stats.paired_difference``: per-seed differences, their mean ± sample standard deviation, the 95 % t-interval,
the seeds on which the method is lower). A method's run and the reference's run of one seed are paired only when
their ``run.json`` records allow it (``compare.run_differences``: same train settings, data, tokenizer, device type
and precision; but for the keys the study sets per method, ``[method_set]``); a pair that does not is left out and
named.

**Trends**: for every axis with two values or more (the budget, each grid key) and every combination of the other
axes, each method's Δ at each value of the axis, and the change of Δ from the first value to the last, paired by
seed (``Δ_last(s) − Δ_first(s)``, ``stats.paired_difference``), over the seeds whose runs at both values may be
paired (``compare.run_differences`` allowing the axis's own setting). Only parts that are done enter the report.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare.paired import paired_stats, run_differences
from ..fileio import read_json
from ..layout import RESULTS_FILE
from ..run.folder import RunFolder
from ..stats import difference_text, interval_text, paired_difference, verdict
from .report_plot import delta_figure
from .spec import Part, Study
from .status import part_status, run_dir


@dataclass
class Cell:
    """The finished runs of one cell: ``runs[method][seed]`` (a compare run record), ``records[method][seed]``
    (its ``run.json``), and the pairs left out (``excluded``: one line each)."""

    name: str
    budget: float
    axes: tuple[tuple[str, Any], ...]
    runs: dict[str, dict[int, dict]] = field(default_factory=dict)
    records: dict[str, dict[int, dict]] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)

    def coordinates(self) -> dict[str, Any]:
        return {"budget": self.budget, **dict(self.axes)}


def collect(study: Study, parts: list[Part] | None = None) -> dict[str, Cell]:
    """``{cell name: Cell}`` from the parts that are done (``status.part_status``), in the study's order."""
    cells: dict[str, Cell] = {}
    for part in study.parts() if parts is None else parts:
        cell = cells.setdefault(part.cell, Cell(part.cell, part.budget, part.axes))
        if part_status(study, part).state != "done":
            continue
        res = read_json(part.folder / RESULTS_FILE, "compare results")
        for method in part.methods:
            for r in res["methods"][method]["runs"]:
                if int(r["seed"]) == part.seed:
                    cell.runs.setdefault(method, {})[part.seed] = r
                    cell.records.setdefault(method, {})[part.seed] = RunFolder(
                        run_dir(study, part, method)).read_run()
    return cells


def cell_stats(study: Study, cell: Cell) -> dict[str, dict]:
    """``compare.paired_stats`` of every method against the reference over the cell's seeds, each method with the
    seeds whose pair may be paired (``compare.run_differences``, allowing the keys of the two methods'
    ``[method_set]``, which differ by design; the others are added to ``cell.excluded``)."""
    ref = study.reference
    base = cell.runs.get(ref, {})
    out = {}
    for method in study.methods:
        if method == ref or method not in cell.runs:
            continue
        allowed = study.method_set_keys(method, ref)
        seeds = []
        for seed in sorted(cell.runs[method]):
            if seed not in base:
                continue
            diffs = run_differences(cell.records[method][seed], cell.records[ref][seed], allowed)
            if diffs:
                cell.excluded.append(f"{cell.name}: `{method}` seed {seed} not paired with `{ref}`: "
                                     f"{'; '.join(diffs)}")
            else:
                seeds.append(seed)
        if not seeds:
            continue
        results = {"methods": {ref: {"runs": [base[s] for s in seeds]},
                               method: {"runs": [cell.runs[method][s] for s in seeds]}}}
        out.update(paired_stats(results, baseline=ref))
    return out


def losses_table(study: Study, cells: dict[str, Cell]) -> list[str]:
    """Final validation loss per cell and method: mean ± sample std over the seeds done, and their number."""
    lines = ["| cell | " + " | ".join(f"`{m}`" for m in study.methods) + " |",
             "|---|" + "---:|" * len(study.methods)]
    for cell in cells.values():
        row = []
        for m in study.methods:
            xs = [float(r["val_loss"]) for r in cell.runs.get(m, {}).values()]
            if not xs:
                row.append("—")
            else:
                std = f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else ""
                row.append(f"{statistics.fmean(xs):.4f}{std} ({len(xs)})")
        lines.append(f"| {cell.name} | " + " | ".join(row) + " |")
    return lines


def paired_table(study: Study, stats: dict[str, dict[str, dict]]) -> list[str]:
    """Δ from the reference per cell and method (``compare.paired_stats``' numbers)."""
    lines = ["| cell | method | Δ val loss (nats) | 95 % interval | seeds lower | Δ bits/byte | 95 % interval | "
             "verdict |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for cell, by_method in stats.items():
        for method, p in by_method.items():
            v, b = p["val_loss"], p["bits_per_byte"]
            lines.append(f"| {cell} | `{method}` | {difference_text(v)} | {interval_text(v)} | "
                         f"{v['favouring']} of {v['n']} | {difference_text(b)} | {interval_text(b)} | {verdict(v)} |")
    return lines


def seeds_table(study: Study, stats: dict[str, dict[str, dict]]) -> list[str]:
    """The per-seed Δ val loss behind each paired row."""
    lines = ["| cell | method | seed: Δ val loss |", "|---|---|---|"]
    for cell, by_method in stats.items():
        for method, p in by_method.items():
            per = ", ".join(f"{s}: {d:+.4f}" for s, d in zip(p["seeds"], p["val_loss"]["diffs"]))
            lines.append(f"| {cell} | `{method}` | {per} |")
    return lines


def gaps(study: Study, cell: Cell, stats: dict[str, dict], method: str) -> dict[int, float]:
    """``{seed: Δ val loss}`` of ``method`` in ``cell`` over its paired seeds."""
    p = stats.get(method)
    return dict(zip(p["seeds"], p["val_loss"]["diffs"])) if p else {}


def trend_axes(study: Study) -> list[str]:
    """The axes a trend follows: ``budget`` (with two budgets or more) and every grid key with two values or more."""
    return (["budget"] if len(study.budgets) > 1 else []) + [k for k, v in study.grid.items() if len(v) > 1]


def trend_change(study: Study, first: Cell, last: Cell, axis: str, g1: dict[int, float], g2: dict[int, float]
                 ) -> tuple[dict | None, list[int], list[str]]:
    """``paired_difference(Δ_last, Δ_first)`` over the seeds both have whose reference runs at the two cells may be
    paired (the axis's setting allowed to differ: ``steps`` for the budget); the seeds used; the lines naming the
    seeds left out."""
    allowed = {"steps"} if axis == "budget" else {axis}
    ref = study.reference
    seeds, notes = [], []
    for s in sorted(set(g1) & set(g2)):
        diffs = run_differences(first.records[ref][s], last.records[ref][s], allowed)
        if diffs:
            notes.append(f"{first.name} vs {last.name}: seed {s} not paired across {axis}: {'; '.join(diffs)}")
        else:
            seeds.append(s)
    if not seeds:
        return None, seeds, notes
    return paired_difference([g2[s] for s in seeds], [g1[s] for s in seeds]), seeds, notes


def trend_lines(study: Study, cells: dict[str, Cell], stats: dict[str, dict[str, dict]], axis: str) -> list[str]:
    """The trend table of one axis (module docstring)."""
    values = list(study.budgets) if axis == "budget" else list(study.grid[axis])
    groups: dict[str, list[Cell]] = {}
    for cell in cells.values():
        rest = {k: v for k, v in cell.coordinates().items() if k != axis}
        groups.setdefault(", ".join(f"{k}={v}" for k, v in rest.items()) or "—", []).append(cell)
    head = [f"{axis}={v}" for v in values]
    lines = [f"### Across {axis}", "",
             "Δ val loss from the reference (mean over paired seeds) at each value; the change from the first value "
             "to the last, paired by seed, with its 95 % interval.", "",
             "| other axes | method | " + " | ".join(head) + " | change first → last |",
             "|---|---|" + "---:|" * len(head) + "---|"]
    notes: list[str] = []
    for label, group in groups.items():
        by_value = {c.coordinates()[axis]: c for c in group}
        ordered = [by_value.get(v) for v in values]
        for method in study.methods:
            if method == study.reference:
                continue
            g = [gaps(study, c, stats.get(c.name, {}), method) if c else {} for c in ordered]
            cols = [f"{statistics.fmean(x.values()):+.4f} ({len(x)})" if x else "—" for x in g]
            change = "—"
            if ordered[0] is not None and ordered[-1] is not None and g[0] and g[-1]:
                d, seeds, left = trend_change(study, ordered[0], ordered[-1], axis, g[0], g[-1])
                notes += left
                if d is not None:
                    where = ("the interval includes 0: no change detectable" if d["ci95"] is None
                             or d["ci95"][0] <= 0 <= d["ci95"][1] else "the interval excludes 0")
                    seed_names = ", ".join(map(str, seeds))
                    change = f"{difference_text(d)} ({interval_text(d)}; seeds {seed_names}): {where}"
            lines.append(f"| {label} | `{method}` | " + " | ".join(cols) + f" | {change} |")
    return lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else [])


def _per_method(study: Study) -> str:
    """``; per method: `m` k=v, …`` for a study's ``[method_set]`` settings, or nothing."""
    said = [f"`{m}` " + ", ".join(f"{k}={v}" for k, v in s.items()) for m, s in study.method_sets.items() if s]
    return f"; per method: {'; '.join(said)}" if said else ""


def render(study: Study, parts: list[Part] | None = None, figure: Path | None = None) -> str:
    """The study's report (markdown); with ``figure`` (a .png path beside the report: ``study report`` names it
    after the report, ``report_delta.png``), it also draws each method's
    paired Δ from the reference cell by cell there (``report_plot.delta_figure``) and links it."""
    cells = collect(study, parts)
    stats = {name: cell_stats(study, cell) for name, cell in cells.items()}
    done = sum(len(by_seed) for c in cells.values() for by_seed in c.runs.values())
    lines = [f"# Study `{study.name}`", "",
             f"Methods {', '.join(f'`{m}`' for m in study.methods)} against `{study.reference}`; seeds "
             f"{', '.join(map(str, study.seeds))}; budgets {', '.join(f'{b:g} ×' for b in study.budgets)} of "
             f"{study.steps} steps" + (f"; grid {', '.join(f'{k} ∈ {list(v)}' for k, v in study.grid.items())}"
                                       if study.grid else "") + _per_method(study)
             + f"; {done} finished runs. Study file `{study.path.name}`.", "",
             "## Final validation loss", "", "Mean ± sample standard deviation over seeds (number of seeds).", ""]
    lines += losses_table(study, cells) + ["", f"## Paired differences from `{study.reference}`", "",
              "Per seed, the method's number minus the reference's with the same seed (same data order); negative "
              "= lower. Δ is the mean ± sample standard deviation of the per-seed differences; the 95 % interval is "
              "mean ± t(0.975, n − 1) · std / √n (none with one seed); no correction for multiple comparisons.",
              ""]
    lines += paired_table(study, stats) + [""]
    if figure is not None:
        rows = {m: [(c, p["val_loss"]) for c, by in stats.items() for mm, p in by.items() if mm == m]
                for m in study.methods if m != study.reference}
        if delta_figure(rows, study.reference, figure, f"study {study.name}: Δ from {study.reference}, per cell "
                        "(point: mean; bar: 95 % interval; dots: seeds)"):
            lines += [f"![paired Δ from `{study.reference}` per cell]({figure.name})", ""]
    lines += ["### Per seed", ""] + seeds_table(study, stats) + [""]
    axes = trend_axes(study)
    if axes:
        lines += ["## Trends", ""]
        for axis in axes:
            lines += trend_lines(study, cells, stats, axis) + [""]
    excluded = [line for c in cells.values() for line in c.excluded]
    if excluded:
        lines += ["## Runs not paired", ""] + [f"- {line}" for line in excluded] + [""]
    return "\n".join(lines)
