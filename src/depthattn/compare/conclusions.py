"""The opening sentences of a comparison's report (``results.json``'s ``conclusion``): each method against ``none``
in words, each diverged run and why, and what the comparison cannot show."""

from __future__ import annotations

from ..stats import verdict
from .records import BASELINE


def why_diverged(d: dict) -> str:
    """Why a diverged run stopped, in words."""
    if d.get("reason") == "val_loss" and d.get("val_loss") is not None:
        return f"validation loss {d['val_loss']:.4f}, more than 1 nat above ln V = {d['ln_vocab']:.4f}"
    return "a non-finite loss, gradient norm or weight"


def conclusions(results: dict) -> list[str]:
    """The report's opening sentences: one per method vs ``none`` and one on what the run cannot show."""
    paired = results.get("paired") or {}
    lines = []
    for name, p in paired.items():
        d = p["val_loss"]
        n = d["n"]
        size = ("within 0.001 nats of `none`" if abs(d["mean"]) < 0.0005 else
                f"{abs(d['mean']):.3f} nats {'lower' if d['mean'] < 0 else 'higher'} than `none`")
        if d["std"] is None:
            lines.append(f"`{name}` is {size} in validation loss on one seed: inconclusive (one seed gives no "
                         f"interval; run several, e.g. --seeds 0,1,2).")
            continue
        lo, hi = d["ci95"]
        lines.append(f"`{name}` is {size} in validation loss (± {d['std']:.3f} std over {n} seeds; 95 % interval "
                     f"{lo:+.3f} to {hi:+.3f}; {d['favouring']} of {n} seeds lower): {verdict(d)}.")
    for name, m in results["methods"].items():
        for d in m.get("diverged", []):
            lines.append(f"`{name}` diverged (seed {d['seed']}) at step {d['step']}: {why_diverged(d)}; the run "
                         f"stopped there and is left out of the means and the paired comparison.")
    if not paired:
        lines.append("No paired comparison: the run has no `none` (vanilla) method to compare against."
                     if BASELINE not in results["methods"] else
                     "No paired comparison: no seed has both `none` and another method finished.")
    runs = [r for m in results["methods"].values() for r in m["runs"]]
    if runs:
        params = max(int(r["params"]) for r in runs)
        tokens = max(int(r["tokens"]) for r in runs)
        lines.append(f"What this cannot show: behaviour at scale or after long training — these models have at most "
                     f"{params:,d} parameters and saw {tokens:,d} tokens each (the paper trains 1.5B–3B-parameter "
                     f"models on billions of tokens).")
    return lines
