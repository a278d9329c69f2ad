"""The budget-trend section of docs/results.md (issue 28): does a method's gap to ``none`` (and Depth-Attention's gap
to its uniform-weight control) move from 1 × to 4 × to 16 × the default budget on the public-domain mix?

Input: ``{group: {label: {seed: run}}}`` (``published.collect``), groups ``mix1``, ``mix4``, ``mix16`` (or their
CPU twins ``mix1cpu`` …, a trend of their own: ``section``'s ``budgets``); a run is a
compare results.json run record (``val_loss``, ``tokens``, ``train_seconds``). Δ is a per-seed paired difference
of final validation loss (nats; negative: the first method is lower). Across budgets the same seeds are paired
again: the change of a gap from 1 × to 16 × is ``Δ16(s) − Δ1(s)`` over the seeds both budgets have, with its 95 %
t-interval. Only when that interval excludes 0 is the gap said to **widen** (the change has the 1 × gap's sign) or
**narrow** (the opposite sign), and to **reverse** when moreover the 16 × gap's own interval excludes 0 on the other
side; otherwise "no change detectable" (inconclusive). "Holds" is never said: that would need an equivalence margin
this study does not set. Runs paired across budgets must have the same settings but for ``steps`` (else
``ValueError``).
"""

from __future__ import annotations

import json

from ..compare.paired import pairable_train_differences
from ..stats import difference_text, interval_brackets, paired_difference

#: The train settings two runs may differ in and still be paired: those that change neither a fresh run's initial
#: weights nor its arithmetic beyond rounding — what a resumed run may change (``RESUMABLE_KEYS``: compile, saving,
#: logging) but ``device``, which decides the initial weights of a fresh run (drawn on the device, by its own
#: generator: a CPU and a CUDA run of one seed start from other weights) and, under precision ``auto``, the
#: arithmetic (float32 on CPU, bf16 autocast on CUDA).
PAIRABLE_DIFFERENCES = pairable_train_differences() - {"seed"}  # compat's rule, which ``depthattn study`` applies

BUDGETS = (("mix1", "1 ×"), ("mix4", "4 ×"), ("mix16", "16 ×"))
#: (method, reference) pairs the trend follows: every method against none, and Depth-Attention against its control.
UNIFORM_PAIR = ("depth_attention", "depth_attention_uniform")


def gaps(group: dict[str, dict[int, dict]], method: str, ref: str) -> dict[int, float]:
    """``{seed: val_loss(method) − val_loss(ref)}`` over the seeds both have in ``group``."""
    a, b = group.get(method, {}), group.get(ref, {})
    return {s: a[s]["val_loss"] - b[s]["val_loss"] for s in sorted(a) if s in b}


def cell(g: dict[int, float]) -> str:
    """``mean ± std [lo, hi] (k of n lower)`` of per-seed gaps, or ``—``."""
    if not g:
        return "—"
    d = paired_difference(list(g.values()), [0.0] * len(g))
    lower = "" if d["ci95"] is None else f" ({d['favouring']} of {d['n']} lower)"
    return f"{difference_text(d)} {interval_brackets(d)}{lower}"


def direction(m1: float, change: float, last: dict[int, float]) -> str:
    """"widens", "narrows" or "reverses": how a gap of mean ``m1`` at 1 × moved by a significant ``change``;
    "reverses" needs the 16 × gaps ``last`` to have an interval excluding 0 on the side opposite to ``m1``."""
    if m1 == 0:
        return "moves away from 0"
    if (change < 0) == (m1 < 0):
        return "widens"
    d = paired_difference(list(last.values()), [0.0] * len(last))
    if d["ci95"] is not None and (d["ci95"][0] > 0 if m1 < 0 else d["ci95"][1] < 0):
        return "reverses"
    return "narrows"


def change_sentence(method: str, ref: str, first: dict[int, float], last: dict[int, float],
                    names: tuple[str, str] = ("1 ×", "16 ×"), between: tuple[tuple[str, dict[int, float]], ...] = ()
                    ) -> str:
    """One plain sentence on how the gap ``method − ref`` moved from the first budget to the last (``names``),
    paired over common seeds; the mean gap at each budget of ``between`` (``(name, {seed: gap})``, smallest first)
    that has all those seeds is named on the way (descriptive: the test is first against last)."""
    seeds = [s for s in first if s in last]
    name = f"`{method}` − `{ref}`"
    if not seeds:
        return f"- {name}: no seed has both budgets yet."
    d = paired_difference([last[s] for s in seeds], [first[s] for s in seeds])
    m1, m16 = (sum(x[s] for s in seeds) / len(seeds) for x in (first, last))
    via = "".join(f", {sum(g[s] for s in seeds) / len(seeds):+.3f} at {mid}" for mid, g in between
                  if all(s in g for s in seeds))
    head = (f"- {name}: {m1:+.3f} nats at {names[0]}{via} and {m16:+.3f} at {names[1]} "
            f"(seeds {', '.join(map(str, seeds))}); ")
    if d["ci95"] is None:
        return head + "one seed gives no interval: the trend is undetermined."
    return head + change_words(d, m1, {s: last[s] for s in seeds}, "with training")


def change_words(d: dict, m1: float, last: dict[int, float], cause: str) -> str:
    """``change … (95 % interval …)`` and its verdict for the paired change ``d`` (``paired_difference``, with an
    interval) of a gap of mean ``m1`` whose gaps after the change are ``last``: inconclusive when the interval
    includes 0, else the gap **widens** / **narrows** / **reverses** (``direction``) ``cause``."""
    lo, hi = d["ci95"]
    change = f"change {d['mean']:+.3f} (95 % interval {lo:+.3f} to {hi:+.3f})"
    if lo <= 0 <= hi:
        return change + ": no change detectable with these seeds (inconclusive: the interval includes 0)."
    return change + f": the gap **{direction(m1, d['mean'], last)}** {cause} (the interval excludes 0)."


def trajectory_settings(train: dict) -> dict:
    """The train settings that decide a run's numbers: all but ``steps``, ``seed`` and ``PAIRABLE_DIFFERENCES``
    (compile, saving, logging)."""
    return {k: v for k, v in train.items() if k not in PAIRABLE_DIFFERENCES and k not in ("steps", "seed")}


def check_pairable(runs: dict[str, dict[str, dict[int, dict]]], groups: list[str]) -> None:
    """Raise ``ValueError`` if runs of ``groups`` differ in anything but steps, seed and ``PAIRABLE_DIFFERENCES``
    (compile, saving) — train settings, device included, data, preset: their gaps would not be comparable across
    budgets."""
    seen = {}
    for g in groups:
        for label, by_seed in runs[g].items():
            for seed, r in by_seed.items():
                train = trajectory_settings(r.get("train_settings") or {})
                key = json.dumps([train, r.get("data"), r.get("preset")], sort_keys=True, default=str)
                seen.setdefault(key, f"{g} {label} seed {seed}")
    if len(seen) > 1:
        raise ValueError(f"the budget groups were trained with other settings ({'; '.join(seen.values())}); "
                         "cannot compare their gaps")


def section(runs: dict[str, dict[str, dict[int, dict]]], baseline: str = "none",
            budgets: tuple[tuple[str, str], ...] = BUDGETS, where: str = "") -> list[str]:
    """The markdown lines of the trend section over ``budgets`` (``(group, name)`` from the smallest budget to the
    largest; ``where`` qualifies the title, e.g. the CPU twins'); empty if none of them is published."""
    present = [(g, name) for g, name in budgets if g in runs]
    if not present:
        return []
    labels = [lab for lab in dict.fromkeys(lab for g, _ in present for lab in runs[g]) if lab != baseline]
    check_pairable(runs, [g for g, _ in present])
    (first, first_name), (last, last_name) = budgets[0], budgets[-1]
    lines = [f"## Public-domain mix{where}: does the gap move with training budget?", "",
             "Each cell: the per-seed paired Δ in final validation loss (nats), mean ± standard deviation over "
             "seeds, [95 % t-interval], and how many seeds the first method is lower on. 1 × is the default budget "
             "(409,600 tokens), 16 × is 6,553,600 tokens, under one epoch of the mix's training split.", "",
             "| Δ | " + " | ".join(name for _, name in present) + " |", "|---|" + "---:|" * len(present)]
    if not labels:
        return lines[:4] + ["No method beside `none` is published yet.", ""]
    pairs = [(lab, baseline) for lab in labels] + ([UNIFORM_PAIR] if all(
        any(m in runs[g] for g, _ in present) for m in UNIFORM_PAIR) else [])
    for method, ref in pairs:
        lines.append(f"| `{method}` − `{ref}` | " + " | ".join(cell(gaps(runs[g], method, ref)) for g, _ in present)
                     + " |")
    lines.append("")
    if first in runs and last in runs:
        lines += [f"From {first_name} to {last_name} (the same seeds paired across budgets; no correction for "
                  "multiple comparisons):", ""]
        lines += [change_sentence(m, r, gaps(runs[first], m, r), gaps(runs[last], m, r), (first_name, last_name),
                                  tuple((name, gaps(runs[g], m, r)) for g, name in present[1:-1]))
                  for m, r in pairs]
        lines.append("")
    else:
        gone = " and ".join(name for g, name in budgets if g in (first, last) and g not in runs)
        lines += [f"The {gone} parts are not published yet, so no change across budgets is stated.", ""]
    return lines


def train_minutes(group: dict[str, dict[int, dict]]) -> str:
    """``"a–b min (mean m)"`` of the runs' training seconds in a group (sequential, on a shared machine)."""
    mins = [r.get("train_seconds", 0.0) / 60 for by_seed in group.values() for r in by_seed.values()]
    mins = [m for m in mins if m > 0]
    if not mins:
        return "n/a"
    if len(mins) == 1:
        return f"{mins[0]:.0f} min (one run)"
    return f"{min(mins):.0f}–{max(mins):.0f} min (mean {sum(mins) / len(mins):.0f}, {len(mins)} runs)"
