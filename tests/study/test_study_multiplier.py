"""The compute multiplier (``study.multiplier``): log-linear interpolation of none's loss in log tokens, the exactly
determined power law as a sensitivity check, per-seed multipliers with a t-interval on log k, and the section of
docs/results.md, checked against numbers computed here from first principles."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from depthattn.study import multiplier as mult
from depthattn.study import published
from depthattn.study import results_page

ROOT = Path(__file__).resolve().parents[2]
#: t_{0.975, 2}, from any statistics table.
T2 = 4.3027


def loglinear(d: float) -> float:
    return 10.0 - 0.5 * math.log(d)


@pytest.mark.parametrize("tokens, extrapolated", [(2e5, False), (8e5, False), (1e5, False), (1.6e6, False),
                                                  (5e6, True), (3e4, True)])
def test_loglinear_recovers_the_tokens_of_exactly_log_linear_points(tokens, extrapolated):
    points = [(d, loglinear(d)) for d in (1e5, 4e5, 1.6e6)]
    got, extra = mult.loglinear_tokens(points, loglinear(tokens))
    assert got == pytest.approx(tokens, rel=1e-12) and extra is extrapolated


def test_loglinear_uses_the_segment_around_the_loss_and_extends_the_end_segments():
    points = [(4000, 2.0), (1000, 3.0), (16000, 1.5)]  # any order; two segments of other slopes
    assert mult.loglinear_tokens(points, 2.5) == (pytest.approx(2000), False)  # half way along the first in log
    assert mult.loglinear_tokens(points, 1.75) == (pytest.approx(8000), False)
    assert mult.loglinear_tokens(points, 1.0) == (pytest.approx(64000), True)  # last slope: 0.5 nats per ×4
    assert mult.loglinear_tokens(points, 4.0) == (pytest.approx(250), True)  # first slope: 1 nat per ×4


@pytest.mark.parametrize("points", [[(1, 3.0), (4, 3.0), (16, 2.0)], [(1, 3.0), (4, 3.5), (16, 2.0)],
                                    [(1, 3.0)], [(0, 3.0), (4, 2.0)], [(4, 3.0), (4, 2.0)]])
def test_points_no_falling_curve_passes_through_are_refused(points):
    with pytest.raises(ValueError):
        mult.loglinear_tokens(points, 2.5)


@pytest.mark.parametrize("tokens", [(1e5, 4e5, 1.6e6), (1e5, 3e5, 2e6)])
@pytest.mark.parametrize("e, amp, alpha", [(2.0, 50.0, 0.3), (-1.4, 23.7, 0.089), (3.5, 400.0, 0.6)])
def test_the_power_law_through_three_points_of_a_known_law_recovers_it(tokens, e, amp, alpha):
    points = [(d, e + amp * d ** -alpha) for d in tokens]
    got = mult.power_law(points)
    assert got == pytest.approx((e, amp, alpha), rel=1e-8, abs=1e-9)
    target = 7.5e6
    assert mult.power_law_tokens(got, e + amp * target ** -alpha) == pytest.approx(target, rel=1e-6)
    assert mult.power_law_tokens(got, got[0]) is None and mult.power_law_tokens(got, e - 0.1) is None


@pytest.mark.parametrize("points", [[(1, 3.0), (4, 2.0), (16, 1.0)],  # on one log-linear line: alpha -> 0
                                    [(1, 3.0), (4, 2.5), (16, 1.0)],  # bends down
                                    [(1, 3.0), (4, 2.0)]])
def test_no_saturating_power_law_through_straight_or_concave_points(points):
    with pytest.raises(ValueError):
        mult.power_law(points)


def run(seed: int, tokens: int, loss: float) -> dict:
    return {"seed": seed, "tokens": tokens, "val_loss": loss, "params": 10_491_136, "train_settings": {"lr": 2e-3}}


#: none's losses at 1000, 4000, 16000 tokens per seed, and depth_attention's at 16000 (see the test below).
NONE = {0: (3.0, 2.0, 1.5), 1: (3.2, 2.2, 1.9), 2: (3.0, 2.0, 1.5)}
METHOD16 = {0: 1.25, 1: 1.3, 2: 1.5}
BUDGETS = (("mix1cpu", "1 ×"), ("mix4cpu", "4 ×"), ("mix16cpu", "16 ×"))


def hand_runs() -> dict:
    runs = {g: {"none": {s: run(s, d, NONE[s][i]) for s in NONE}}
            for i, ((g, _), d) in enumerate(zip(BUDGETS, (1000, 4000, 16000)))}
    runs["mix16cpu"]["depth_attention"] = {s: run(s, 16000, v) for s, v in METHOD16.items()}
    runs["mix4cpu"]["depth_attention"] = {0: run(0, 4000, 1.75)}  # one seed, k = 2 (no interval)
    return runs


def test_per_seed_multipliers_and_their_interval_by_hand():
    """Seed 0: none falls 0.5 nats per ×4 after 4000 tokens, so 1.25 is reached at 32000 tokens: k = 2,
    extrapolated. Seed 1: 0.3 nats per ×4, 1.3 is 0.6 below 1.9: 16000·16 tokens, k = 16, extrapolated. Seed 2:
    exactly none's 16 × loss, k = 1, not extrapolated. log k = ln 2 · (1, 4, 0)."""
    runs = hand_runs()
    m = mult.table(runs, BUDGETS)["depth_attention"]
    got = m["16 ×"]
    assert got["per_seed"] == {0: (pytest.approx(2.0), True), 1: (pytest.approx(16.0), True),
                               2: (pytest.approx(1.0), False)}
    assert got["n"] == 3 and got["extrapolated"] == 2
    assert got["geomean"] == pytest.approx(2 ** (5 / 3))
    half = T2 * math.log(2) * statistics.stdev([1, 4, 0]) / math.sqrt(3)
    assert got["ci95"] == pytest.approx([2 ** (5 / 3) * math.exp(-half), 2 ** (5 / 3) * math.exp(half)])
    # the seed-mean losses: none's mean curve ends 3.0667, 2.0667, 1.6333; the method's mean is 1.35
    l4, l16, lm = 6.2 / 3, 4.9 / 3, 4.05 / 3
    assert got["mean"] == (pytest.approx(4 ** ((l16 - lm) / (l4 - l16))), True)
    assert m["4 ×"]["per_seed"] == {0: (pytest.approx(2.0), False)} and m["4 ×"]["ci95"] is None
    assert m["1 ×"] is None


def parts(missing_gpu: int) -> list:
    cpu = [SimpleNamespace(group=g, name=f"{g}-s0") for g, _ in BUDGETS]
    gpu = [SimpleNamespace(group=g, name=f"{g}-s{i}") for i, g in enumerate(("mix1", "mix4", "mix16"))]
    return cpu + gpu[:missing_gpu]


def test_the_section_renders_from_hand_made_runs(tmp_path):
    runs = hand_runs()
    ps = parts(missing_gpu=2)
    done = {p.name for p in ps if p.group.endswith("cpu")}
    lines = mult.section(runs, BUDGETS, "on the 2-core CPU", ps, done, tmp_path / "docs" / "results.md")
    text = "\n".join(lines)
    assert lines[0] == "## How much compute is each method worth? (CPU runs, shared learning rate)"
    k, half = 2 ** (5 / 3), T2 * math.log(2) * statistics.stdev([1, 4, 0]) / math.sqrt(3)
    assert (f"- `depth_attention` at 16 × is worth {k:.2f}× `none`'s compute at 10.5 M parameters (95 % interval "
            f"{k * math.exp(-half):.2f} to {k * math.exp(half):.1f}, 3 seeds; extrapolated on 2 of 3 seeds).") in text
    assert "| `depth_attention` | — | 2.00× no interval (1 seed) | 3.17× [" in text
    assert "1,000 tokens → 3.0667, 4,000 tokens → 2.0667, 16,000 tokens → 1.6333 nats" in text
    assert "lr = 0.002" in text
    assert "The runs on the GPU (groups mix16, mix4, mix1) are skipped: 2 of their parts are not yet published." in text
    assert (tmp_path / "docs" / mult.FIGURE).read_bytes()[:4] == b"\x89PNG"
    # a set with a part not yet published gets no section
    assert mult.section(runs, BUDGETS, "on the 2-core CPU", ps, done - {"mix4cpu-s0"}, tmp_path / "r.md") == []


def test_the_real_section_equals_numpy_for_depth_attention_at_16x(tmp_path):
    """docs/results.md's multiplier of depth_attention at 16 × on the CPU, recomputed from the published files with
    numpy: none's last two budgets per seed fit a line in log tokens exactly; solve it for the method's loss."""
    text = results_page.aggregate(ROOT / "studies" / "small-scale", ROOT / "results" / "small-scale",
                               tmp_path / "docs" / "results.md")
    runs = published.collect(published.load_published(ROOT / "results" / "small-scale",
                                                      published.load_studies(ROOT / "studies" / "small-scale")))
    logk, logk4 = [], []
    for s in (0, 1, 2):
        d = np.array([runs[g]["none"][s]["tokens"] for g, _ in BUDGETS], dtype=float)
        loss = np.array([runs[g]["none"][s]["val_loss"] for g, _ in BUDGETS])
        slope, icpt = np.polyfit(np.log(d[1:]), loss[1:], 1)
        m16 = runs["mix16cpu"]["depth_attention"][s]
        assert m16["val_loss"] < loss[-1]  # below none's 16 × loss: an extrapolation
        logk.append((m16["val_loss"] - icpt) / slope - np.log(m16["tokens"]))
        m4 = runs["mix4cpu"]["depth_attention"][s]
        logk4.append(np.interp(-m4["val_loss"], -loss, np.log(d)) - np.log(m4["tokens"]))
    for lk, name in ((logk, "16 ×"), (logk4, "4 ×")):
        half = T2 * np.std(lk, ddof=1) / np.sqrt(3)
        k, lo, hi = np.exp(np.mean(lk)), np.exp(np.mean(lk) - half), np.exp(np.mean(lk) + half)
        row = next(line for line in text.splitlines() if line.startswith("| `depth_attention` | ") and "[" in line)
        assert f"{k:.2f}× [{lo:.2f}, {hi:.2f}] (3 seeds" in row, (name, row)
    assert re.search(rf"- `depth_attention` at 16 × is worth {np.exp(np.mean(logk)):.2f}× `none`'s compute at "
                     r"10\.5 M parameters \(95 % interval [0-9.]+ to [0-9.]+, 3 seeds; extrapolated beyond none's "
                     r"largest budget\)\.", text)
    title = "## How much compute is each method worth? (CPU runs, shared learning rate)"
    section = text[text.index(title):].split("\n## ")[0]
    assert section in (ROOT / "docs" / "results.md").read_text(encoding="utf-8")  # the committed report has it
