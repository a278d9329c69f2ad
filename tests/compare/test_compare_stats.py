"""Paired statistics, tokens-to-target and the report's conclusion on hand-made results (issue 14)."""

from __future__ import annotations

import json
import math

import pytest

from depthattn.compare.conclusions import conclusions
from depthattn.compare.paired import paired_stats
from depthattn.compare.report import render_paired, render_report, render_table, render_throughput, render_zero_shot
from depthattn.compare.runner import previous_history
from depthattn.stats import (binomial_se, difference_text, interval_brackets, interval_text, mean_pm, paired_difference,
                             t_quantile_975, tokens_to_target)

from helpers import hand_made_results as results


def test_t_quantiles():
    assert t_quantile_975(1) == 12.7062 and t_quantile_975(2) == 4.3027 and t_quantile_975(30) == 2.0423
    # beyond the table (exact quantiles from a statistics table: 2.0395 at 31, 2.0003 at 60, 1.9623 at 1000)
    for df, exact in ((31, 2.039513), (40, 2.021075), (60, 2.000298), (120, 1.979930), (1000, 1.962339)):
        assert abs(t_quantile_975(df) - exact) < 2e-4, df
    with pytest.raises(ValueError, match="df=0"):
        t_quantile_975(0)


def test_paired_difference_by_hand():
    """The issue's three seeds: Δ = −0.026, +0.012, −0.040."""
    base = [5.000, 5.100, 4.900]
    method = [4.974, 5.112, 4.860]
    d = paired_difference(method, base)
    assert d["diffs"] == pytest.approx([-0.026, 0.012, -0.040], abs=1e-12)
    assert d["mean"] == pytest.approx(-0.018, abs=1e-12)
    # deviations −0.008, +0.030, −0.022: Σ² = 1.448e-3, / 2 → 7.24e-4
    assert d["std"] == pytest.approx(math.sqrt(7.24e-4), abs=1e-12)
    half = 4.3027 * math.sqrt(7.24e-4) / math.sqrt(3)
    assert d["ci95"] == pytest.approx([-0.018 - half, -0.018 + half], abs=1e-12)
    assert d["ci95"][0] == pytest.approx(-0.0848, abs=1e-4) and d["ci95"][1] == pytest.approx(0.0488, abs=1e-4)
    assert d["favouring"] == 2 and d["n"] == 3
    # the words every report writes them in (stats owns them)
    assert mean_pm(d["mean"], d["std"]) == difference_text(d) == "-0.0180 ± 0.0269"
    assert interval_text(d) == "-0.0848 to +0.0488" and interval_brackets(d) == "[-0.0848, +0.0488]"


def test_one_seed_has_no_interval_not_zero():
    d = paired_difference([4.9], [5.0])
    assert d["mean"] == pytest.approx(-0.1) and d["std"] is None and d["ci95"] is None and d["favouring"] == 1
    assert difference_text(d) == "-0.1000" and interval_text(d) == "n/a (one seed)"
    assert interval_brackets(d) == "(1 seed)"
    assert mean_pm(5.2264, None, "{:.4f}") == "5.2264"
    with pytest.raises(ValueError, match="equal non-empty"):
        paired_difference([1.0], [1.0, 2.0])


def test_tokens_to_target_on_a_synthetic_curve():
    curve = [(100, 6.0), (200, 5.0), (300, 4.0), (400, 3.5)]
    assert tokens_to_target(curve, 4.5) == pytest.approx(250.0)   # halfway between 5.0 and 4.0
    assert tokens_to_target(curve, 4.0) == pytest.approx(300.0)   # reached exactly at a logged point
    assert tokens_to_target(curve, 3.75) == pytest.approx(350.0)
    assert tokens_to_target(curve, 7.0) == 100.0                  # already there at the first point
    assert tokens_to_target(curve, 3.0) is None                   # never reached
    assert tokens_to_target([(0, 5.0), (10, 5.2), (20, 4.8)], 4.9) == pytest.approx(17.5)  # first crossing


def test_binomial_standard_error():
    assert binomial_se(0.5, 100) == pytest.approx(0.05)
    assert binomial_se(0.0, 10) == 0.0
    with pytest.raises(ValueError, match="n=0"):
        binomial_se(0.5, 0)


def test_paired_stats_of_a_hand_made_results_json(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    res = json.loads(path.read_text())
    p = res["paired"]["depth_attention"]
    assert p["seeds"] == [0, 1, 2]
    assert p["val_loss"]["diffs"] == pytest.approx([-0.026, 0.012, -0.040], abs=1e-12)
    assert p["val_loss"]["std"] == pytest.approx(math.sqrt(7.24e-4), abs=1e-12)
    assert p["bits_per_byte"]["diffs"] == pytest.approx([-0.010, 0.006, -0.020], abs=1e-12)
    assert p["bits_per_byte"]["mean"] == pytest.approx(-0.008, abs=1e-12) and p["bits_per_byte"]["favouring"] == 2
    # none's last periodic val loss per seed: 5.0, 5.1, 4.9; depth_attention's curve 5.8 → 5.0 → 4.9
    assert p["tokens_to_target"] == pytest.approx([200.0, 100 + 0.7 / 0.8 * 100, 400.0])
    assert p["train_time_ratio"] == pytest.approx(1.2)
    first = res["conclusion"][0]
    assert first.startswith("`depth_attention` is 0.018 nats lower than `none` in validation loss (± 0.027 std "
                            "over 3 seeds; 95 % interval -0.085 to +0.049; 2 of 3 seeds lower): inconclusive")
    assert "cannot show" in res["conclusion"][-1] and "1,000,000 parameters and saw 400 tokens" in res["conclusion"][-1]


def test_report_opens_with_its_conclusion_and_keeps_the_history():
    res = results()
    report = render_report(res).splitlines()
    assert report[0] == "# depthattn compare" and report[2] == res["conclusion"][0]
    text = "\n".join(report)
    assert "**a ± b** is the mean ± the sample standard deviation over seeds" in text
    assert "sequentially, not interleaved" in text
    # constants carry no ± (params, tokens are the same for every seed); the val loss does
    row = next(line for line in report if line.startswith("| none |"))
    assert "| 1,000,000 | 400 |" in row and "1,000,000 ±" not in row and "5.0000 ± 0.1000" in row
    # history: both invocations and the per-run training time from the runs' logs, not only the last call's 9 s
    assert "1. 2026-12-01T10:00:00Z: 500 s (1 trained)" in text and "2. 2026-12-01T11:00:00Z: 9 s (1 reused)" in text
    assert "Sum over invocations: 509 s." in text and "Total training time of the runs: 66 s." in text
    paired = render_paired(res)
    assert "| depth_attention | -0.0180 ± 0.0269 | -0.0848 to +0.0488 | 2 of 3 |" in paired
    zs = render_zero_shot(res)
    se = math.sqrt(0.52 * 0.48 / 300)
    assert f"| depth_attention | piqa | 0.5200 | {se:.4f} | 100 × 3 | 0.500 |" in zs


def test_one_seed_report_says_not_available():
    res = results(seeds=(0,))
    p = res["paired"]["depth_attention"]["val_loss"]
    assert p["ci95"] is None and p["std"] is None
    assert res["conclusion"][0] == ("`depth_attention` is 0.026 nats lower than `none` in validation loss on one "
                                    "seed: inconclusive (one seed gives no interval; run several, e.g. "
                                    "--seeds 0,1,2).")
    assert "n/a (one seed)" in render_paired(res) and "± 0" not in render_report(res)


def test_throughput_with_a_large_spread_is_flagged():
    res = results()
    for r in res["methods"]["depth_attention"]["runs"]:
        r["step_tokens_per_s"] = [50.0, 100.0, 300.0, 1900.0, 302.0]
    text = render_report(res)
    assert "(unreliable: depth_attention)" in text
    row = next(line for line in render_throughput(res).splitlines() if line.startswith("| depth_attention |"))
    assert "| 100 † |" in row
    assert "tok/s" not in render_table(res) and "| 100 † |" in text  # in the secondary table only


def test_the_report_shows_no_absolute_machine_path(monkeypatch, tmp_path):
    """The data folder is shown relative to the working folder, under ~, or by its name alone."""
    from depthattn.compare.report import shown_path

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert shown_path(work / "data/embedded") == "data/embedded"
    assert shown_path(home / ".cache/d") == "~/.cache/d"
    assert shown_path("/srv/scratch/prepared") == "prepared"
    res = results()
    res["settings"]["data"] = "/srv/scratch/prepared"
    text = render_report(res)
    assert "data `prepared`." in text and "/srv/" not in text


def test_no_none_means_no_paired_comparison():
    res = results()
    del res["methods"]["none"]
    res["paired"] = paired_stats(res)
    assert res["paired"] == {} and conclusions(res)[0].startswith("No paired comparison")


def test_previous_history(tmp_path):
    assert previous_history(tmp_path / "missing.json") == []
    (tmp_path / "old.json").write_text(json.dumps({"wall_seconds": 540.0}))
    assert previous_history(tmp_path / "old.json") == [{"started_utc": None, "wall_seconds": 540.0, "runs": {}}]
    (tmp_path / "bad.json").write_text("{")
    assert previous_history(tmp_path / "bad.json") == []
