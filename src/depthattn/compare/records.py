"""What a comparison's records hold, shared by the code that writes them and the code that renders them: the sample
every report shows, the numbers a run record tabulates, the baseline method, and readers of run records.

A *run record* is one entry of ``results.json``'s ``methods[m]["runs"]`` (``evaluate.evaluate_run``'s dict)."""

from __future__ import annotations

#: The fixed prompt of every report's sample (the opening of Pride and Prejudice, in the embedded corpus) and the
#: number of tokens sampled after it.
SAMPLE_PROMPT = "It is a truth universally acknowledged, that"
SAMPLE_TOKENS = 48

#: Numbers of a run that the report tabulates: (key, column title, format). ``{seq_len}`` in a title is the training
#: length, at which the FLOPs column counts sequence attention.
COLUMNS = (
    ("params", "parameters", "{:,.0f}"),
    ("tokens", "tokens seen", "{:,.0f}"),
    ("val_loss", "val loss", "{:.4f}"),
    ("perplexity", "perplexity", "{:.3f}"),
    ("bits_per_byte", "bits/byte", "{:.4f}"),
    ("kv_bytes_per_token", "KV bytes/token (bf16)", "{:,.0f}"),
    ("flops_per_token", "fwd FLOPs/token incl. attn (T={seq_len})", "{:.4g}"),
)

#: The method every other is paired with (``paired.paired_stats``), the reference of the report and the plot.
BASELINE = "none"


def by_seed(m: dict) -> dict[int, dict]:
    """A method's run records (``{"runs": [...]}``) by seed."""
    return {int(r["seed"]): r for r in m["runs"]}


def val_curve(run: dict) -> list[tuple[float, float]]:
    """A run record's periodic validation curve as ``[(tokens, val_loss), ...]`` (floats, in its order)."""
    return [(float(c["tokens"]), float(c["val_loss"])) for c in run["curve"]]

