"""The answer docs/results.md leads with, in plain words (``lead``), from the numbers its sections report.

Four sentences, each computed by the function its section uses, so the lead and the tables cannot disagree:

1. **the gap** of every method to ``none`` at each budget of the budget study on the CPU (``trend.gaps``; the
   95 % t-interval of ``stats.paired_difference``), with where the interval excludes 0;
2. **the compute multiplier** at the largest budget (``multiplier.table``);
3. **Depth-Attention against its uniform-weight control** (``trend.UNIFORM_PAIR``) at each budget and the change
   from the smallest budget to the largest, called only when its interval excludes 0 (``trend.change_sentence``'s
   rule);
4. **the learning-rate study**: what of it is published, each method's best rate once the sweep is complete, and
   once the tuned 4 × runs are, whether tuning changes a gap and the tuned gaps (``lrsweep.lead_sentence``).

The README quotes the same sentences (``tests/docs`` checks that they are these).
"""

from __future__ import annotations

from typing import Sequence

from ..compare.records import BASELINE
from ..stats import paired_difference
from . import multiplier as study_multiplier
from . import trend as study_trend

#: The budget set the lead speaks for: the CPU runs (complete; the GPU set trains the same runs).
WHERE = "on the 2-core CPU"
#: The methods, in the order the lead names them, and how it names them.
NAMES = {"depth_attention": "Depth-Attention", "depth_attention_uniform": "its uniform-weight control",
         "attnres": "Attention Residuals"}
START, END = "<!-- lead:start -->", "<!-- lead:end -->"


def _nats(x: float, fmt: str = "{:.3f}") -> str:
    return fmt.format(x)


def _k(k: float) -> str:
    return f"{k:.2f}"


def _d(g: dict[int, float]) -> dict | None:
    return paired_difference(list(g.values()), [0.0] * len(g)) if g else None


def _excludes(d: dict | None) -> bool:
    return d is not None and d["ci95"] is not None and not d["ci95"][0] <= 0 <= d["ci95"][1]


def _where(names: Sequence[str], flags: Sequence[bool]) -> str:
    """"at every budget", "at 4 × and 16 ×", "at no budget": the budgets whose flag is set."""
    hit = [n for n, f in zip(names, flags) if f]
    if len(hit) == len(names):
        return "at every budget"
    return "at no budget" if not hit else "at " + " and ".join(hit)


def gap_sentence(runs: dict, budgets: Sequence[tuple[str, str]]) -> str:
    """Sentence 1: each method's mean Δ from ``none`` per budget (``(group, name)``, smallest first)."""
    names = [n for _, n in budgets]
    said, below = [], True
    for method, word in NAMES.items():
        ds = [_d(study_trend.gaps(runs.get(g, {}), method, BASELINE)) for g, _ in budgets]
        if any(d is None for d in ds):
            continue
        below = below and all(d["mean"] < 0 for d in ds)
        said.append(f"{word} by {' / '.join(_nats(-d['mean']) for d in ds)} nats (the 95 % interval excludes 0 "
                    f"{_where(names, [_excludes(d) for d in ds])})")
    if not said:
        return ""
    head = ("every method ends below `none` at every budget: " if below
            else "the methods' gaps to `none` (positive: below it): ")
    return head[0].upper() + head[1:] + "; ".join(said) + f", at {' / '.join(names)}."


def multiplier_sentence(runs: dict, budgets: Sequence[tuple[str, str]], params: int) -> str:
    """Sentence 2: each method's compute multiplier at the largest budget."""
    last = budgets[-1][1]
    table = study_multiplier.table(runs, budgets)
    said = []
    for method, word in NAMES.items():
        m = table.get(method, {}).get(last)
        if m is None or m["ci95"] is None:
            continue
        said.append(f"{word} {_k(m['geomean'])}× ({_k(m['ci95'][0])} to {_k(m['ci95'][1])})")
    if not said:
        return ""
    said[0] = said[0].replace(" (", " (95 % interval ", 1)
    listed = ", ".join(said[:-1]) + (" and " if len(said) > 1 else "") + said[-1]
    return (f"Counted as compute at {last} (the factor of training tokens `none` would need to reach a method's "
            f"loss): {listed} ({params / 1e6:.1f} M parameters; beyond `none`'s largest budget, so extrapolated "
            "along its last log-linear segment).")


def control_sentence(runs: dict, budgets: Sequence[tuple[str, str]]) -> str:
    """Sentence 3: Depth-Attention against its uniform-weight control, per budget and from first to last."""
    method, control = study_trend.UNIFORM_PAIR
    gs = [study_trend.gaps(runs.get(g, {}), method, control) for g, _ in budgets]
    if not all(gs):
        return ""
    ds = [_d(g) for g in gs]
    names = [n for _, n in budgets]
    lower = all(d["mean"] > 0 for d in ds)
    head = (f"{NAMES[method]}'s learned weights do not beat {NAMES[control]} (fixed, equal weights over the same "
            f"layers): the control is lower {_where(names, [d['mean'] > 0 for d in ds])}, by "
            f"{' / '.join(_nats(d['mean']) for d in ds)} nats" if lower else
            f"{NAMES[method]} − {NAMES[control]}: {' / '.join(_nats(d['mean'], '{:+.3f}') for d in ds)} nats")
    seeds = [s for s in gs[0] if s in gs[-1]]
    change = paired_difference([gs[-1][s] for s in seeds], [gs[0][s] for s in seeds]) if seeds else None
    if change is None or change["ci95"] is None:
        return head + "."
    lo, hi = change["ci95"]
    if lo <= 0 <= hi:
        return head + f"; no change from {names[0]} to {names[-1]} is detectable (interval {lo:+.3f} to {hi:+.3f})."
    word = study_trend.direction(ds[0]["mean"], change["mean"], {s: gs[-1][s] for s in seeds})
    closed = "" if word != "narrows" or _excludes(ds[-1]) else (
        f", and at {names[-1]} the interval includes 0")
    return head + (f"; the gap {word} with training (change {change['mean']:+.3f}, 95 % interval {lo:+.3f} to "
                   f"{hi:+.3f}){closed}.")


def lead(runs: dict, budgets: Sequence[tuple[str, str]], params: int, learning_rate: str) -> list[str]:
    """The lead's markdown lines, a heading and a block between ``START`` and ``END`` (the README quotes the block): sentences 1–3 from ``runs`` (``published.collect``)
    over ``budgets`` (the CPU set's ``(group, name)``, smallest first; no lead until they are all published), then the
    learning-rate study's sentence ``learning_rate`` (``lrsweep.lead_sentence``)."""
    if not budgets:
        return []
    said = [s for s in (gap_sentence(runs, budgets), multiplier_sentence(runs, budgets, params),
                        control_sentence(runs, budgets), learning_rate) if s]
    if not said:
        return []
    tokens = [next(iter(runs[g][BASELINE].values()))["tokens"] for g, _ in budgets if runs.get(g, {}).get(BASELINE)]
    scope = (f"On the public-domain mix, with models of {params / 1e6:.1f} M parameters trained on the 2-core CPU "
             f"for {' / '.join(f'{t / 1e6:.2f} M' for t in tokens)} tokens (1 × / 4 × / 16 ×; 3 seeds, one "
             "learning rate shared by every method unless said):")
    return ["## The answer so far", "", START, scope, ""] + [f"- {s}" for s in said] + [END, ""]


def block(text: str, path: str = "the report") -> str:
    """The lead of ``text`` (a docs/results.md or a README): the lines from ``START`` to ``END``, inclusive.
    Raises ``ValueError`` naming ``path`` when it has no such block."""
    i, j = text.find(START), text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"{path} has no lead block ({START} … {END})")
    return text[i:j + len(END)]


def replace_block(text: str, lead_text: str, path: str = "the file") -> str:
    """``text`` with its lead block replaced by ``lead_text``'s (``block``); ``ValueError`` naming ``path`` when
    either has none."""
    old = block(text, path)
    return text.replace(old, block(lead_text, "the report"), 1)
