"""The lead of docs/results.md (``study.lead``): its sentences carry the numbers of the sections they summarise, and
the README quotes the same block."""

import math
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.study import lead

ROOT = Path(__file__).resolve().parents[2]
BUDGETS = (("b1", "1 ×"), ("b4", "4 ×"), ("b16", "16 ×"))
T95_2 = 4.302652729911275  # Student's t, 0.975 quantile, 2 degrees of freedom (3 seeds)


def runs_of(losses: dict[str, dict[str, list[float]]]) -> dict:
    """``published.collect``'s shape from ``{group: {method: [val loss per seed]}}``; tokens 1, 4, 16 × 100."""
    tokens = {"b1": 100, "b4": 400, "b16": 1600}
    return {g: {m: {s: {"val_loss": x, "tokens": tokens[g], "params": 10_000_000, "seed": s}
                    for s, x in enumerate(xs)} for m, xs in by.items()} for g, by in losses.items()}


def test_the_gap_sentence_gives_each_methods_mean_gap_and_where_its_interval_excludes_zero():
    runs = runs_of({
        "b1": {"none": [5.0, 5.1, 5.2], "depth_attention": [4.9, 5.1, 5.1], "attnres": [4.8, 4.9, 5.0]},
        "b4": {"none": [4.0, 4.1, 4.2], "depth_attention": [3.9, 4.0, 4.1], "attnres": [3.8, 3.9, 4.0]},
        "b16": {"none": [3.0, 3.1, 3.2], "depth_attention": [2.95, 3.0, 3.1], "attnres": [2.8, 2.9, 3.0]}})
    text = lead.gap_sentence(runs, BUDGETS)
    # depth_attention at 1 x: gaps -0.1, 0, -0.1 -> mean -0.0667, sd 0.0577, half-width t*sd/sqrt(3) = 0.143 > 0.067
    # at 4 x every gap is -0.1 (sd 0: the interval is the point); at 16 x gaps -0.05, -0.1, -0.1: sd 0.0289,
    # half-width 0.0717 < mean 0.0833 -> excludes 0
    assert math.isclose(T95_2 * 0.0577350 / math.sqrt(3), 0.1434, abs_tol=1e-4)
    assert text.startswith("Every method ends below `none` at every budget: ")
    assert "Depth-Attention by 0.067 / 0.100 / 0.083 nats (the 95 % interval excludes 0 at 4 × and 16 ×)" in text
    assert "Attention Residuals by 0.200 / 0.200 / 0.200 nats (the 95 % interval excludes 0 at every budget)" in text
    worse = runs_of({g: {"none": [5.0, 5.0, 5.0], "depth_attention": [5.1, 5.2, 5.0]} for g, _ in BUDGETS})
    assert lead.gap_sentence(worse, BUDGETS).startswith("The methods' gaps to `none` (positive: below it): ")


def test_the_control_sentence_calls_a_change_only_when_its_interval_excludes_zero():
    runs = runs_of({
        "b1": {"depth_attention": [5.10, 5.12, 5.11], "depth_attention_uniform": [5.0, 5.0, 5.0]},
        "b4": {"depth_attention": [4.05, 4.06, 4.05], "depth_attention_uniform": [4.0, 4.0, 4.0]},
        "b16": {"depth_attention": [3.00, 3.05, 3.01], "depth_attention_uniform": [3.0, 3.0, 3.0]}})
    text = lead.control_sentence(runs, BUDGETS)
    # gaps 1 x: .10 .12 .11 (mean .110); 16 x: .00 .05 .01 (mean .020, its interval includes 0); change per seed
    # -.10 -.07 -.10: mean -.090, sd .01732, half-width t*sd/sqrt(3) = .0430 -> -.133 to -.047
    assert "the control is lower at every budget, by 0.110 / 0.053 / 0.020 nats" in text
    assert "the gap narrows with training (change -0.090, 95 % interval -0.133 to -0.047)" in text
    assert text.endswith("and at 16 × the interval includes 0.")
    flat = runs_of({g: {"depth_attention": [5.1, 5.3, 5.0], "depth_attention_uniform": [5.0, 5.0, 5.0]}
                    for g, _ in BUDGETS})
    flat["b16"]["depth_attention"] = {s: dict(r, val_loss=r["val_loss"] + d) for (s, r), d
                                      in zip(flat["b16"]["depth_attention"].items(), (0.1, -0.2, 0.05))}
    assert "no change from 1 × to 16 × is detectable" in lead.control_sentence(flat, BUDGETS)


def test_the_readme_quotes_the_lead_of_results_md():
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert lead.block(readme, "README.md") == lead.block(results, "docs/results.md"), \
        "run `depthattn study report --published results/small-scale --readme README.md`"
    assert "On the public-domain mix" in lead.block(results)


def test_replace_block_needs_the_markers_and_readme_goes_with_published(tmp_path, capsys):
    new = f"x\n{lead.START}\nnew\n{lead.END}\n"
    assert lead.replace_block(f"a\n{lead.START}\nold\n{lead.END}\nb", new) == f"a\n{lead.START}\nnew\n{lead.END}\nb"
    with pytest.raises(ValueError, match=r"README.md has no lead block"):
        lead.replace_block("no markers", new, "README.md")
    assert main(["study", "report", "x.toml", "--readme", str(tmp_path / "R.md")]) == 2
    assert "--readme goes with --published" in capsys.readouterr().err
