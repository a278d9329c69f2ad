"""docs/results.md from the small-scale study's published parts (``depthattn study report --published``).

The study is one study file per group (``studies/small-scale/GROUP.toml``; ``groups.GROUPS``), its results one small
file per part under the published folder (``partfile``; results/README.md). The report: per group a table of final
validation losses and paired differences from ``none`` (``stats.paired_difference``: per-seed Δ, t-interval over
seeds) with the verdicts in words, two budget trends (``trend``: the GPU's groups, and their CPU twins among
themselves; the set with more of its parts published first, ``groups.set_order``), Depth-Attention's depth
statistics over training (``depth``), the learning-rate study's section (``lrsweep``: its groups have no table of
their own), a CPU-vs-GPU cross-check per CPU twin and the parts' commands. It reads the
study files (which parts there are) and the published parts (what they found), never run folders.

A study file's part is **published** when every run it trains (method, seed and cell settings) is in a published
file of its group, whatever that file's own name (``loops-a.json`` holds seeds 0 and 1 of ``loops.toml``). Parts,
planned and published, are listed group by group (``groups.RUN_ORDER``), then seed by seed, cell by cell and method
by method, a method that trains fewer seeds (``[method_seeds]``) after the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..compare.records import BASELINE, val_curve
from ..stats import difference_text, interval_text, mean_pm, paired_difference, tokens_to_target, verdict
from . import depth as study_depth
from . import partfile as study_results
from . import trend as study_trend
from .groups import GROUPS, RUN_ORDER, budget_sets, cpu_twin_group, lr_groups
from .spec import Study, load_study

#: Where the report draws Depth-Attention's depth statistics over the 16 × runs (beside its --out).
DEPTH_FIGURE = Path("img") / "study_mix16_depth_attention.png"


@dataclass(frozen=True)
class Planned:
    """A part of a group's study file: its ``name``, ``group`` and the runs it trains (``(method, seed, cell)``,
    cell an index into ``Study.cells``); ``key`` orders it (module docstring)."""

    name: str
    group: str
    runs: tuple[tuple[str, int, int], ...]
    key: tuple


def load_studies(folder: Path) -> dict[str, Study]:
    """``{group: Study}`` of ``folder/GROUP.toml`` for every group of ``groups.RUN_ORDER``, in that order, but an
    ``optional`` group's absent file. Raises ``FileNotFoundError`` naming any other missing file and ``ValueError``
    for an invalid one."""
    paths = {group: Path(folder) / f"{group}.toml" for group in RUN_ORDER}
    return {group: load_study(path) for group, path in paths.items()
            if path.exists() or not GROUPS[group].optional}


def run_key(study: Study, group: str, method: str, seed: int, cell: int) -> tuple:
    """Where a run is listed: group, then a method of fewer seeds after the others, seed, cell, method."""
    return (RUN_ORDER.index(group), method in study.method_seeds, seed, cell, study.methods.index(method))


def plan(studies: dict[str, Study]) -> list[Planned]:
    """Every part of the study files, in listing order."""
    out = []
    for group, study in studies.items():
        cells = study.cells()
        for part in study.parts():
            runs = tuple((m, part.seed, cells.index(part.axes)) for m in part.methods)
            out.append(Planned(part.name, group, runs, min(run_key(study, group, *r) for r in runs)))
    return sorted(out, key=lambda p: p.key)


def cell_of(study: Study, res: dict) -> int:
    """The cell of ``study`` whose settings the published part ``res`` ran with: its ``model_overrides`` and
    ``train`` settings on the keys the cells set, and on the keys ``[method_set]`` sets for its methods, those
    methods' values. Raises ``ValueError`` when none matches."""
    settings = res["settings"]
    ran_with = {**settings["train"], **settings["model_overrides"]}
    keys = {k for cell in study.cells() for k, _ in cell} | study.method_set_keys(*res["methods"])
    ran = {k: ran_with[k] for k in keys if k in ran_with}
    own = {k: v for m in res["methods"] for k, v in study.method_sets.get(m, {}).items()}
    for i, cell in enumerate(study.cells()):
        if {**dict(cell), **own} == ran:
            return i
    raise ValueError(f"published part {res['study']['part']}: its settings {ran} are no cell of {study.path}")


def published_runs(studies: dict[str, Study], res: dict) -> list[tuple[str, int, int]]:
    """The ``(method, seed, cell)`` of every run in the published part ``res`` (finished or diverged)."""
    cell = cell_of(studies[res["study"]["group"]], res)
    return [(m, int(r["seed"]), cell) for m, mm in res["methods"].items()
            for r in mm["runs"] + mm.get("diverged", [])]


def load_published(publish: Path, studies: dict[str, Study]) -> list[dict]:
    """Every part published under ``publish`` (``partfile.load``), in listing order. Raises ``ValueError`` for a
    file that is not a published part or whose group has no study in ``studies``."""
    found = []
    for file in sorted(Path(publish).glob("*.json")):
        res = study_results.load(file)
        group = res["study"]["group"]
        if group not in studies:
            raise ValueError(f"{file}: group {group!r} has no study file (groups {list(studies)})")
        key = min(run_key(studies[group], group, *r) for r in published_runs(studies, res))
        found.append((key, res))
    return [res for _, res in sorted(found, key=lambda x: x[0])]


def done_parts(parts: list[Planned], published: list[dict], studies: dict[str, Study]) -> set[str]:
    """The names of the planned ``parts`` every run of which is published."""
    have = {(res["study"]["group"], *r) for res in published for r in published_runs(studies, res)}
    return {p.name for p in parts if all((p.group, *r) in have for r in p.runs)}


def run_record(res: dict, run: dict) -> dict:
    """A published part's run with what pairing needs: its part's ``train_settings``, ``data``, ``preset``,
    ``hardware`` and ``jobs``."""
    st = res["study"]
    return dict(run, train_settings=res["settings"]["train"], data=res["settings"]["data"],
                preset=res["settings"]["preset"], hardware=st.get("hardware"), jobs=st.get("jobs", 1))


def collect(published: list[dict]) -> dict[str, dict[str, dict[int, dict]]]:
    """``{group: {label: {seed: run}}}`` (``run_record``'s); a label is the method, or ``depth_attention (stride=…,
    window=…)``."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for res in published:
        st = res["study"]
        for method, m in res["methods"].items():
            label = f"{method} ({st['label']})" if st["label"] else method
            for r in m["runs"]:
                out.setdefault(st["group"], {}).setdefault(label, {})[int(r["seed"])] = run_record(res, r)
    return out


def paired_runs(label: str, by_seed: dict[int, dict], base: dict[int, dict] | None, ref: str = BASELINE,
                allowed: frozenset[str] = frozenset()):
    """``(runs, the reference's runs, paired_difference of final val loss)`` over the seeds both have, or None for
    the reference itself (``ref``, default none, whose runs are ``base``) or no common seed. Raises ``ValueError``
    if a pair was trained with other settings (``study_trend.trajectory_settings``, data or tokens) but for the train
    settings ``allowed`` (a group's ``[method_set]`` keys, ``Study.method_set_keys``: set per method by design)."""
    common = [s for s in sorted(by_seed) if base and s in base]
    if label == ref or not common:
        return None
    a, b = [by_seed[s] for s in common], [base[s] for s in common]

    def same(train: dict) -> dict:
        return {k: v for k, v in study_trend.trajectory_settings(train).items() if k not in allowed}

    for x, y in zip(a, b):
        if same(x["train_settings"]) != same(y["train_settings"]) or x["data"] != y["data"] \
                or x["tokens"] != y["tokens"]:
            raise ValueError(f"{label} and {ref} were trained with other settings; cannot pair")
    return a, b, paired_difference([x["val_loss"] for x in a], [y["val_loss"] for y in b])


def group_verdicts(runs: dict[str, dict[int, dict]], base: dict[int, dict] | None) -> list[str]:
    """One plain sentence per method of a group: the paired Δ, its interval, the seeds favouring it, a verdict."""
    pairs = ((label, paired_runs(label, by_seed, base)) for label, by_seed in runs.items())
    return [verdict_sentence(f"`{label}`", pair[2]) for label, pair in pairs if pair is not None]


def verdict_sentence(what: str, d: dict) -> str:
    """``- what: Δ …`` in words for a ``paired_difference`` result: mean, spread, interval, seeds lower, verdict."""
    if d["ci95"] is None:
        return f"- {what}: Δ {d['mean']:+.3f} nats on one seed: {verdict(d)}."
    lo, hi = d["ci95"]
    return (f"- {what}: Δ {d['mean']:+.3f} ± {d['std']:.3f} nats over {d['n']} seeds (95 % interval {lo:+.3f} to "
            f"{hi:+.3f}; {d['favouring']} of {d['n']} seeds lower): {verdict(d)}.")


def control_verdict(runs: dict[str, dict[int, dict]]) -> list[str]:
    """Depth-Attention against its uniform-weight control within one group, in words with its verdict (the trend
    tables give it as numbers; this sentence is for the CPU twins' sections), or nothing where the two share no
    seed."""
    method, control = study_trend.UNIFORM_PAIR
    pair = paired_runs(method, runs.get(method, {}), runs.get(control), control)
    return [verdict_sentence(f"`{method}` − `{control}`", pair[2])] if pair else []


def group_table(runs: dict[str, dict[int, dict]], base: dict[int, dict] | None) -> list[str]:
    lines = ["| method | seeds | val loss | Δ vs none (nats) | 95 % interval | seeds lower | "
             "tokens to none's final val loss | train time ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, by_seed in runs.items():
        seeds = sorted(by_seed)
        vals = [by_seed[s]["val_loss"] for s in seeds]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None
        cells = [label, str(len(seeds)), mean_pm(mean, std, "{:.4f}")]
        pair = paired_runs(label, by_seed, base)
        if pair is None:
            cells += ["—", "—", "—", "—", "—"]
        else:
            a, b, d = pair
            ci = interval_text(d)
            ttt = [tokens_to_target(val_curve(x), val_curve(y)[-1][1]) for x, y in zip(a, b)]
            reached = [t for t in ttt if t is not None]
            ttt_cell = (f"{sum(reached) / len(reached):,.0f} ({len(reached)}/{len(ttt)} reached)" if reached
                        else "not reached")
            bt = sum(y.get("train_seconds", 0.0) for y in b)
            ratio = f"{sum(x.get('train_seconds', 0.0) for x in a) / bt:.2f}" if bt else "n/a"
            cells += [difference_text(d), ci, f"{d['favouring']} of {d['n']}", ttt_cell, ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


#: The code the published parts that record no commit were run with: commit 73cecd4d, whose defaults drew training
#: windows uniformly with replacement (``data_order="random"``) and ran PyTorch's default AdamW (``adamw_impl=
#: "torch_default"``). Runs of this release's defaults (epochs, fused AdamW) train on other batches; the parts are
#: regenerated with them by the science issue.
PUBLISHED_WITH = ("commit 73cecd4d (defaults then: `data_order = \"random\"`, `adamw_impl = \"torch_default\"`; "
                  "this release's defaults, seeded epochs and fused AdamW, train on other batches)")


def code_line(published: list[dict]) -> str:
    """Which code the published parts ran with: the commits they recorded, and ``PUBLISHED_WITH`` for the older
    parts that recorded none."""
    by_commit: dict[str, list[str]] = {}
    for res in published:
        by_commit.setdefault(res["study"].get("commit") or "", []).append(res["study"]["part"])
    said = []
    if "" in by_commit:
        said.append(f"The embedded-corpus parts were run with the code of {PUBLISHED_WITH}.")
    for commit, names in by_commit.items():
        if commit:
            what = "commits" if "," in commit else "commit"
            said.append(f"Part{'s' if len(names) > 1 else ''} {', '.join(names)}: the code of {what} {commit}.")
    return " ".join(said)


def group_sections(runs: dict, order: list[str]) -> list[str]:
    """Per group: title, table, and the verdicts in words; a CPU twin also gets Depth-Attention against its uniform
    control and the cross-check against the group it repeats. The budget study's groups come first, set by set in
    ``order`` (keys of ``budget_sets``), then the others in ``study_groups.GROUPS``' order, but for the learning-rate
    study's (``Group.lr_study``), which ``lrsweep.section`` reports."""
    lines = []
    first = [name for where in order for name in budget_sets()[where]]
    for group in first + [name for name in GROUPS if name not in first]:
        g = GROUPS[group]
        if group not in runs or g.lr_study:  # the learning-rate study's groups: lrsweep.section
            continue
        base = runs.get(g.baseline_group, {}).get(BASELINE)
        lines += [f"## {g.title}", ""] + group_table(runs[group], base) + [""]
        if group.startswith("mix"):
            lines += [f"Training time per run: {study_trend.train_minutes(runs[group])}; {machine_words(runs[group])}.",
                      ""]
        said = group_verdicts(runs[group], base) + (control_verdict(runs[group]) if g.twin_of else [])
        if said:
            lines += ["In words (Δ is the method's validation loss minus `none`'s; negative is better; no "
                      "correction for multiple comparisons):", ""] + said + [""]
        if g.twin_of:
            lines += cross_check(runs[group], runs.get(g.twin_of, {}), dict(study_trend.BUDGETS)[g.twin_of])
    return lines


#: What the CPU parts ran on, for parts published before the study recorded its hardware.
CPU_MACHINE = "the 2-core CPU VM (torch 2.13.0)"


def machine_words(group: dict[str, dict[int, dict]]) -> str:
    """Where a group's runs trained and how many shared the machine, in words (``study.hardware``, ``jobs``);
    where they differ, how many runs each."""
    count: dict[tuple[str, int], int] = {}
    for by_seed in group.values():
        for r in by_seed.values():
            key = (r.get("hardware") or CPU_MACHINE, r.get("jobs", 1))
            count[key] = count.get(key, 0) + 1
    said = []
    for (hw, jobs), n in count.items():
        runs = f"{n} run{'s' if n > 1 else ''} on {hw}" if len(count) > 1 else f"on {hw}"
        if jobs > 1:
            said.append(f"{runs}, up to {jobs} at a time sharing it (so a run's time is not its speed alone)")
        else:
            said.append(f"{runs}, one after another (a run's time includes any other load on the machine, "
                        "kept to short tests and reviews)")
    return "; ".join(said)


def cross_check(cpu: dict, gpu: dict, budget: str) -> list[str]:
    """A CPU twin's runs (``cpu``, ``{label: {seed: run}}``) beside the GPU runs of the same method and seed
    (``gpu``), at ``budget`` (e.g. "16 ×"). Not a rounding check: the same data order, but other initial weights
    (drawn on each device by its own generator) and other torch releases; so the differences are of the size of
    seed-to-seed noise, and the two are never paired."""
    rows = {(m, s): (r, gpu[m][s]) for m, by_seed in cpu.items() for s, r in sorted(by_seed.items())
            if s in gpu.get(m, {})}
    if not rows:
        return []
    lines = [f"## Cross-check: the same {budget} runs on the CPU and on the GPU", "",
             "Same seed, data order and float32 arithmetic, but not the same run: the initial weights are drawn on "
             "the device by its own random generator (a CPU and a CUDA run of one seed start from other weights: "
             "their first training losses differ), and the CPU ran torch 2.13, the GPU torch 2.11. So the "
             "difference below is of the kind seeds make, not rounding, and CPU and GPU runs are never paired.", "",
             "| method | seed | val loss, CPU | val loss, GPU | GPU − CPU |", "|---|---:|---:|---:|---:|"]
    for (m, s), (c, g) in rows.items():
        diff = g["val_loss"] - c["val_loss"]
        lines.append(f"| {m} | {s} | {c['val_loss']:.4f} | {g['val_loss']:.4f} | {diff:+.4f} |")
    pairs = [(m, s) for (m, s) in rows if m != BASELINE and (BASELINE, s) in rows]
    for m, s in pairs:
        dc = rows[(m, s)][0]["val_loss"] - rows[(BASELINE, s)][0]["val_loss"]
        dg = rows[(m, s)][1]["val_loss"] - rows[(BASELINE, s)][1]["val_loss"]
        lines += ["", f"`{m}` − `{BASELINE}` on seed {s}: {dc:+.4f} nats on the CPU, {dg:+.4f} on the GPU."]
    return lines + [""]


def long_trend(runs: dict) -> list[str]:
    """The embedded corpus's default-vs-4 × table."""
    if "long" not in runs or "main" not in runs:
        return []
    lines = ["## Embedded corpus: does the gap move with training length?", "",
             "| method | Δ vs none, default budget | Δ vs none, 4 × budget |", "|---|---:|---:|"]
    for label in runs["long"]:
        if label == BASELINE or label not in runs["main"]:
            continue
        cells = []
        for group in ("main", "long"):
            base, mine = runs[group].get(BASELINE, {}), runs[group][label]
            seeds = [x for x in mine if x in base]
            if seeds:
                d = paired_difference([mine[x]["val_loss"] for x in seeds], [base[x]["val_loss"] for x in seeds])
                cells.append(f"{difference_text(d)} ({d['n']} seed{'s' if d['n'] > 1 else ''})")
            else:
                cells.append("—")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def depth_section(published: list[dict], out: Path, runs: dict, groups: list[str]) -> list[str]:
    """Draw Depth-Attention's depth statistics over the 16 × runs (the ``depth`` rows of the ``published`` parts'
    runs) beside ``out``: the runs of ``groups[0]`` (``mix16`` or its CPU twin ``mix16cpu``), and for a seed they
    lack, the run of that seed in ``groups[1]`` (a descriptive figure, so a run of the other device's initial
    weights may stand in; the seeds trained on the CPU are named below the figure)."""
    by_seed: dict[int, list] = {}
    origin: dict[int, str] = {}
    twin = cpu_twin_group("mix16")
    for group in groups:
        for res in published:
            if res["study"]["group"] != group:
                continue
            for r in res["methods"].get("depth_attention", {}).get("runs", []):
                if r.get("depth") and int(r["seed"]) not in by_seed:
                    by_seed[int(r["seed"])], origin[int(r["seed"])] = r["depth"], group
    runs16 = next((runs[g]["depth_attention"] for g in groups if runs.get(g, {}).get("depth_attention")), {})
    if not by_seed or not runs16:
        return []
    tokens_per_step = next(iter(runs16.values()))["tokens"] // next(iter(runs16.values()))["steps"]
    png = out.parent / DEPTH_FIGURE
    if not study_depth.figure(by_seed, png, "depth_attention, 16 × budget, public-domain mix", tokens_per_step):
        return []
    cpu = sorted(s for s, g in origin.items() if g == twin)
    note = (f" Seed{'s' if len(cpu) > 1 else ''} {', '.join(map(str, cpu))}: the run{'s' if len(cpu) > 1 else ''} "
            "trained on the CPU "
            f"(`{twin}`)."
            if cpu else "")
    return ["## What Depth-Attention learns over the 16 × runs", "",
            "Logged every `log_depth_every` steps on a fixed probe batch of validation windows "
            "([training.md](training.md)): per layer, the entropy of the depth-attention weights (0: one "
            f"candidate; ln N: uniform over N candidates) and the mean weight on layer 0; mean over seeds "
            f"{', '.join(map(str, sorted(by_seed)))}.{note}", "",
            f"![depth statistics of depth_attention over training]({DEPTH_FIGURE.as_posix()})", ""
            ] + study_depth.table(by_seed, tokens_per_step)


def parts_table(published: list[dict], publish: Path, out: Path) -> list[str]:
    lines = ["## Parts", "",
             "Wall time sums the part's finished `compare` invocations; one killed mid-run (a session's end) "
             "left no record and is missing from it, while its training steps are still counted in the runs' "
             "own train time (the per-step log survives).", "",
             "| part | wall time (s, finished invocations) | command |", "|---|---:|---|"]
    for res in published:
        wall = sum(h.get("wall_seconds", 0.0) for h in res.get("history", [])) or res.get("wall_seconds", 0.0)
        link = study_results.path(Path(os.path.relpath(publish, out.parent)), res["study"]["part"])
        lines.append(f"| [{res['study']['part']}]({link}) | {wall:.0f} | `{res['study']['command']}` |")
    return lines + [""]


#: How the trend section of each of ``budget_sets`` qualifies its title.
TREND_WHERE = {"on the GPU": " on the GPU (paired among themselves)",
               "on the 2-core CPU": " on the CPU (the CPU twins' runs, paired among themselves)"}


def completeness(parts: list[Planned], done: set[str]) -> list[str]:
    """What of the study (``parts``, ``plan``'s) is not yet run, as the report's opening lines: nothing when all is
    done. While the learning-rate study (``groups.lr_groups``) is incomplete, its parts are counted per group (its
    section names the missing ones) and the rest is said of the other parts: when every missing part belongs to one
    of ``budget_sets`` and the other set is complete, that the budget study is complete on the one device and
    partial on the other; else the missing parts."""
    lr = [p for p in parts if p.group in lr_groups()]
    if all(p.name in done for p in lr):
        return _study_completeness(parts, done, False)
    rest = [p for p in parts if p.group not in lr_groups()]
    return _study_completeness(rest, done, True) + _lr_completeness(lr, done)


def _study_completeness(parts: list[Planned], done: set[str], lr_apart: bool) -> list[str]:
    """``completeness`` of ``parts`` (``lr_apart``: those outside the learning-rate study, said apart)."""
    missing = [p for p in parts if p.name not in done]
    if not missing:
        return []
    sets = budget_sets()
    for where, groups in sets.items():
        other = next(w for w in sets if w != where)
        mine = [p for p in parts if p.group in groups]
        if mine and all(p.name in done for p in mine) and all(p.group in sets[other] for p in missing):
            total = sum(p.group in sets[other] for p in parts)
            outside = "the budget study" + (" and the learning-rate study" if lr_apart else "")
            return [f"**Complete {where}:** the budget study's {len(mine)} parts (groups {', '.join(groups)}) "
                    f"are all published, and so is every part outside {outside}. "
                    f"**Partial {other}:** {len(missing)} of the {total} parts that train the same runs {other} "
                    f"are not yet run ({', '.join(p.name for p in missing)}); the tables of "
                    f"{', '.join(sets[other])} cover their finished parts only.", ""]
    of = f"the {len(parts)} parts outside the learning-rate study" if lr_apart else f"{len(parts)} parts"
    return [f"**Incomplete:** {len(missing)} of {of} are not yet run "
            f"({', '.join(p.name for p in missing)}); the tables below cover the finished parts only.", ""]


def _lr_completeness(parts: list[Planned], done: set[str]) -> list[str]:
    """How many of the learning-rate study's ``parts`` are published, group by group; nothing when all are."""
    if all(p.name in done for p in parts):
        return []
    counts = {}
    for p in parts:
        n, k = counts.get(p.group, (0, 0))
        counts[p.group] = (n + 1, k + (p.name in done))
    said = ", ".join(f"{g} {k} of {n}" for g, (n, k) in counts.items())
    return [f"**The learning-rate study is not complete:** published parts per group: {said}; its section below "
            "reports what is published and names what is not.", ""]
