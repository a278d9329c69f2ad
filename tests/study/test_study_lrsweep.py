"""The learning-rate section of docs/results.md (``study.lrsweep``): each method's best rate of the sweep (lowest
mean, ties to the smaller, diverged rates out, the grid's edge flagged), the sweep's table from published parts,
some missing, and the tuned 4 × Δ table beside the shared-rate one, with numbers computed here by hand; a published
part of a learning-rate grid is matched to its cell by its train settings; and, once the sweep is published, the
rates lr4cpu.toml and lr4cpunb.toml train at are the sweep's best and neighbouring ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from depthattn.study import lrsweep, published

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies" / "small-scale"
#: t(0.975, 2): the 95 % t-interval's factor for three seeds.
T2 = 4.302652729911275
LR = (0.001, 0.002, 0.004, 0.008)


def test_the_best_rate_is_the_lowest_mean_ties_to_the_smaller_and_a_diverged_rate_is_no_candidate():
    losses = {"a": {0.001: [3.0, 3.2], 0.002: [3.0, 3.1], 0.004: [2.9, None], 0.008: [3.3, 3.3]},
              "b": {0.001: [3.1, 3.0], 0.002: [3.0, 3.1], 0.004: [3.4, 3.4]},
              "c": {0.004: [3.0], 0.008: [2.0, 2.2]},
              "d": {0.002: [None]}}
    best = lrsweep.best_lrs(losses, LR)
    assert set(best) == {"a", "b", "c"}  # d: no rate without a diverged seed
    assert best["a"] == lrsweep.Best(0.002, pytest.approx(3.05), False, 0.001)  # 0.004 diverged once: out
    assert best["b"] == lrsweep.Best(0.001, pytest.approx(3.05), True, 0.002)  # a tie: the smaller; its edge
    assert best["c"] == lrsweep.Best(0.008, pytest.approx(2.1), True, 0.004)
    with pytest.raises(ValueError, match=r"`a`: learning rate 0.003 is not in the grid"):
        lrsweep.best_lrs({"a": {0.003: [3.0]}}, LR)


def part_file(pub: Path, template: str, part: str, group: str, method: str, seed: int, loss: float | None,
              **train) -> None:
    """A published part of one run, made from a committed one: its group, name, train settings and final val loss
    (None: the run diverged); a part of a set rate labelled with it (the section reads the rate, not the label)."""
    rec = json.loads((ROOT / "results" / "small-scale" / template).read_text(encoding="utf-8"))
    rec["study"] = dict(rec["study"], part=part, group=group, label=f"lr={train['lr']:g}" if "lr" in train else "")
    rec["settings"] = dict(rec["settings"], methods=[method], seeds=[seed],
                           train=dict(rec["settings"]["train"], seed=seed, **train))
    run = dict(next(iter(rec["methods"].values()))["runs"][0], seed=seed, method=method)
    if loss is None:
        rec["methods"] = {method: {"runs": [], "diverged": [{"seed": seed, "step": 120, "reason": "loss spike"}]}}
    else:
        rec["methods"] = {method: {"runs": [dict(run, val_loss=loss)], "diverged": []}}
    (pub / f"{part}.json").write_text(json.dumps(rec), encoding="utf-8")


#: The sweep's fixture: {method: {lr: {seed: final val loss, None: diverged}}}; what is absent is not published.
SWEEP = {"none": {0.001: {0: 4.30, 1: 4.34}, 0.002: {0: 4.10, 1: 4.16}, 0.004: {0: 4.05, 1: 4.09},
                  0.008: {0: 4.00, 1: None}},
         "depth_attention": {0.001: {0: 4.20, 1: 4.22}, 0.002: {0: 4.00, 1: 4.04}, 0.004: {0: 4.04, 1: 4.00},
                             0.008: {0: 4.30, 1: 4.40}},
         "depth_attention_uniform": {0.001: {0: 4.50}, 0.002: {0: 4.30, 1: 4.32}, 0.004: {0: 4.20, 1: 4.24},
                                     0.008: {0: 4.10, 1: 4.12}},
         "attnres": {0.001: {0: 4.00, 1: 4.02}, 0.002: {0: 4.10, 1: 4.10}, 0.004: {0: 4.20, 1: 4.20}}}


def report(pub: Path, tmp_path: Path) -> str:
    studies = published.load_studies(STUDIES)
    every = published.load_published(pub, studies)
    parts = published.plan(studies)
    done = published.done_parts(parts, every, studies)
    lines = lrsweep.section(every, studies, parts, done, tmp_path / "docs" / "results.md")
    return "\n".join(lines)


def mean_std(xs: list[float]) -> tuple[float, float | None]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None)


def test_the_sweep_table_from_published_parts_some_missing_one_diverged(tmp_path):
    pub = tmp_path / "pub"
    pub.mkdir()
    for method, by_lr in SWEEP.items():
        for lr, by_seed in by_lr.items():
            for seed, loss in by_seed.items():
                part_file(pub, "mix1cpu-s0-none.json", f"lr1cpu-lr{lr:g}-s{seed}-{method}", "lr1cpu", method, seed,
                          loss, lr=lr)
    text = report(pub, tmp_path)
    assert ("**Incomplete:** 3 of the sweep's 32 parts are not yet published (lr1cpu-lr0.008-s0-attnres, "
            "lr1cpu-lr0.001-s1-depth_attention_uniform, lr1cpu-lr0.008-s1-attnres)") in text  # seed by seed

    def cell(xs: list[float], bold: bool = False) -> str:
        m, s = mean_std(xs)
        body = f"{m:.4f}" + (f" ± {s:.4f}" if s is not None else "") + f" ({len(xs)})"
        return f"**{body}**" if bold else body

    # none: 0.008 has a diverged seed, so its lower single loss is no candidate; best 0.004 (mean 4.07)
    assert (f"| `none` | {cell([4.30, 4.34])} | {cell([4.10, 4.16])} | {cell([4.05, 4.09], True)} | "
            f"{cell([4.00])}; 1 diverged (seed 1) | 0.004 |") in text
    # depth_attention: 0.002 and 0.004 tie (the same two losses): the smaller rate
    assert (f"| `depth_attention` | {cell([4.20, 4.22])} | {cell([4.00, 4.04], True)} | {cell([4.04, 4.00])} | "
            f"{cell([4.30, 4.40])} | 0.002 |") in text
    assert (f"| `depth_attention_uniform` | {cell([4.50])} | {cell([4.30, 4.32])} | {cell([4.20, 4.24])} | "
            f"{cell([4.10, 4.12], True)} | 0.008 |") in text
    assert f"| `attnres` | {cell([4.00, 4.02], True)} | {cell([4.10, 4.10])} | {cell([4.20, 4.20])} | — | 0.001 |" \
        in text
    assert "- `depth_attention_uniform`'s best rate, 0.008, is the grid's largest value: at the grid's edge" in text
    assert "- `attnres`'s best rate, 0.001, is the grid's smallest value: at the grid's edge" in text
    assert "`none`'s best rate" not in text and "extend the grid" in text
    assert (tmp_path / "docs" / lrsweep.FIGURE).read_bytes()[:4] == b"\x89PNG"
    assert "are optimistic" not in text and "so a tuned Δ is optimistic, for every method alike" in text
    assert "The tuned 4 × runs (`lr4cpu`, `lr4cpunb`) are not yet run." in text


def test_a_complete_sweep_says_whether_the_tuned_files_train_at_its_rates(tmp_path, monkeypatch):
    """A whole sweep whose best and neighbouring rates are those of lr4cpu.toml and lr4cpunb.toml: no incomplete
    note and one line saying so; the same sweep with attnres best elsewhere: a bold line naming what to correct."""
    studies = published.load_studies(STUDIES)
    best, near = (lrsweep.committed_lrs(studies[g]) for g in ("lr4cpu", "lr4cpunb"))

    def loss(method: str, lr: float, seed: int) -> float:  # lowest at the best rate, next at the neighbour
        return 4.0 + 0.1 * abs(math.log2(lr / best[method])) - 0.01 * (lr == near.get(method)) + 0.001 * seed

    pub = tmp_path / "pub"
    pub.mkdir()
    for method in best:
        for lr in LR:
            for seed in (0, 1):
                part_file(pub, "mix1cpu-s0-none.json", f"lr1cpu-lr{lr:g}-s{seed}-{method}", "lr1cpu", method, seed,
                          loss(method, lr, seed), lr=lr)
    text = report(pub, tmp_path)
    assert "**Incomplete:**" not in text
    assert "`lr4cpu` trains each method at this best rate and `lr4cpunb` `none` and `depth_attention` at the " \
           "neighbouring one." in text
    other = next(lr for lr in LR if lr != best["attnres"])
    for seed in (0, 1):  # attnres lowest at another rate
        part_file(pub, "mix1cpu-s0-none.json", f"lr1cpu-lr{other:g}-s{seed}-attnres", "lr1cpu", "attnres", seed,
                  3.0, lr=other)
    text = report(pub, tmp_path)
    assert f"**The tuned study files do not train at these rates** (lr4cpu.toml: `none` {best['none']:g}," in text
    assert f"the sweep's best are `none` {best['none']:g}, " in text and f"`attnres` {other:g}, the neighbours" in text


#: The tuned fixture: final val loss over seeds 0, 1, 2 per group and method.
SHARED = {"none": [3.60, 3.62, 3.58], "depth_attention": [3.52, 3.55, 3.49],
          "depth_attention_uniform": [3.50, 3.50, 3.47], "attnres": [3.57, 3.60, 3.56]}
TUNED = {"none": [3.55, 3.57, 3.54], "depth_attention": [3.50, 3.52, 3.47],
         "depth_attention_uniform": [3.46, 3.47, 3.45], "attnres": [3.50, 3.51, 3.49]}
NEIGHBOUR = {"none": [3.53, 3.56, 3.52], "depth_attention": [3.51, 3.54, 3.50]}


def interval(xs: list[float]) -> str:
    """The trend's cell of per-seed gaps ``xs``: mean ± std [95 % interval] (k of n lower), computed here."""
    m, s = mean_std(xs)
    half = T2 * s / math.sqrt(len(xs))
    return f"{m:+.4f} ± {s:.4f} [{m - half:+.4f}, {m + half:+.4f}] ({sum(x < 0 for x in xs)} of {len(xs)} lower)"


def test_the_tuned_table_beside_the_shared_rate_one(tmp_path):
    """none at the neighbouring rate (its lower mean at 4 ×), depth_attention at its best; Δ tuned and shared per
    pair with the verdicts, and the change tuned − shared called only where its interval excludes 0."""
    pub = tmp_path / "pub"
    pub.mkdir()
    studies = published.load_studies(STUDIES)
    best, near = (lrsweep.committed_lrs(studies[g]) for g in ("lr4cpu", "lr4cpunb"))
    for group, table, lrs in (("mix4cpu", SHARED, None), ("lr4cpu", TUNED, best), ("lr4cpunb", NEIGHBOUR, near)):
        for method, losses in table.items():
            for seed, loss in enumerate(losses):
                train = {"lr": lrs[method]} if lrs else {}
                part_file(pub, "mix4cpu-s0-none.json", f"{group}-s{seed}-{method}", group, method, seed, loss,
                          **train)
    text = report(pub, tmp_path)
    assert "The learning-rate sweep (`lr1cpu`: 4 methods × lr 0.001, 0.002, 0.004, 0.008 × seeds 0, 1) is not " \
           "yet published." in text
    assert "**Incomplete:**" not in text  # every tuned part is published
    none, da = [x for x in NEIGHBOUR["none"]], TUNED["depth_attention"]  # each at its better 4 x rate
    assert f"`none` at {near['none']:g}, mean {sum(none) / 3:.4f}, against {sum(TUNED['none']) / 3:.4f} at " \
           f"{best['none']:g} over seeds 0, 1, 2" in text
    assert f"`depth_attention` at {best['depth_attention']:g}, mean {sum(da) / 3:.4f}" in text
    tuned = [a - b for a, b in zip(da, none)]
    shared = [a - b for a, b in zip(SHARED["depth_attention"], SHARED["none"])]
    change = [t - s for t, s in zip(tuned, shared)]
    m, s = mean_std(change)
    half = T2 * s / math.sqrt(3)
    assert (f"| `depth_attention` − `none` | {interval(tuned)} | lower at this budget (the 95 % interval excludes 0) "
            f"| {interval(shared)} | lower at this budget (the 95 % interval excludes 0) | "
            f"{m:+.4f} [{m - half:+.4f}, {m + half:+.4f}] |") in text
    assert m - half > 0  # the fixture's gap narrows with tuned rates, and that is called
    assert (f"- `depth_attention` − `none`: {sum(shared) / 3:+.3f} nats at the shared rate and {sum(tuned) / 3:+.3f} "
            f"at each method's own (seeds 0, 1, 2); change {m:+.3f} (95 % interval {m - half:+.3f} to "
            f"{m + half:+.3f}): the gap **narrows** with tuned rates (the interval excludes 0).") in text
    tuned_a = [a - b for a, b in zip(TUNED["attnres"], none)]
    shared_a = [a - b for a, b in zip(SHARED["attnres"], SHARED["none"])]
    ma, sa = mean_std([t - s for t, s in zip(tuned_a, shared_a)])
    assert ma - T2 * sa / math.sqrt(3) < 0 < ma + T2 * sa / math.sqrt(3)
    assert f"- `attnres` − `none`: {sum(shared_a) / 3:+.3f} nats at the shared rate" in text
    assert "(inconclusive: the interval includes 0)" in text.split("- `attnres` − `none`: ")[-1].splitlines()[0]
    dau = [a - b for a, b in zip(da, TUNED["depth_attention_uniform"])]
    assert f"| `depth_attention` − `depth_attention_uniform` | {interval(dau)} |" in text
    m_t, s_t = mean_std(tuned)
    assert f"- `depth_attention` − `none`, each at its own rate: Δ {m_t:+.3f} ± {s_t:.3f} nats over 3 seeds" in text


def test_a_published_part_of_an_lr_grid_is_matched_on_its_train_settings(tmp_path):
    """lr1cpu's cells differ in lr only (a train setting): a part at lr 0.004 is the third cell, one at 0.003 is
    no cell; an lr4cpu part at another rate than its method's [method_set] is refused too; runs whose rates
    differ pair only where the rate is allowed."""
    studies = published.load_studies(STUDIES)
    pub = tmp_path / "pub"
    pub.mkdir()
    part_file(pub, "mix1cpu-s0-none.json", "x", "lr1cpu", "attnres", 1, 4.0, lr=0.004)
    res = published.load_published(pub, studies)[0]
    assert published.cell_of(studies["lr1cpu"], res) == 2
    res["settings"]["train"]["lr"] = 0.003
    with pytest.raises(ValueError, match=r"published part x: its settings \{'lr': 0.003\} are no cell of"):
        published.cell_of(studies["lr1cpu"], res)
    own = lrsweep.committed_lrs(studies["lr4cpu"])["attnres"]
    res["settings"]["train"]["lr"] = own
    assert published.cell_of(studies["lr4cpu"], res) == 0
    res["settings"]["train"]["lr"] = own * 2
    with pytest.raises(ValueError, match=r"are no cell of .*lr4cpu.toml"):
        published.cell_of(studies["lr4cpu"], res)
    run = published.run_record(res, res["methods"]["attnres"]["runs"][0])
    other = dict(run, val_loss=3.9, train_settings=dict(run["train_settings"], lr=own))
    with pytest.raises(ValueError, match="cannot pair"):
        published.paired_runs("attnres", {1: run}, {1: other})
    assert published.paired_runs("attnres", {1: run}, {1: other}, allowed=frozenset({"lr"}))[2]["mean"] == \
        pytest.approx(4.0 - 3.9)
    worse = dict(other, train_settings=dict(other["train_settings"], weight_decay=0.0))
    with pytest.raises(ValueError, match="cannot pair"):
        published.paired_runs("attnres", {1: run}, {1: worse}, allowed=frozenset({"lr"}))


def test_the_committed_tuned_rates_are_the_sweeps_best_once_it_is_published():
    """lr4cpu.toml trains each method at its best rate of the published sweep, lr4cpunb.toml none and
    depth_attention at the neighbouring one (``--check``: skipped while the sweep is incomplete)."""
    studies = published.load_studies(STUDIES)
    every = published.load_published(ROOT / "results" / "small-scale", studies)
    parts = published.plan(studies)
    done = published.done_parts(parts, every, studies)
    missing = [p.name for p in parts if p.group == "lr1cpu" and p.name not in done]
    if missing:
        pytest.skip(f"{len(missing)} of the sweep's parts are not published yet: lr4cpu.toml's rates are "
                    "provisional")
    best = lrsweep.best_lrs(lrsweep.sweep_of(every, studies["lr1cpu"]).losses(), studies["lr1cpu"].grid["lr"])
    assert lrsweep.committed_lrs(studies["lr4cpu"]) == {m: b.lr for m, b in best.items()}
    assert lrsweep.committed_lrs(studies["lr4cpunb"]) == {m: best[m].neighbour for m in studies["lr4cpunb"].methods}


def test_the_committed_report_says_the_sweep_is_not_yet_published_while_it_is_not():
    if any((ROOT / "results" / "small-scale").glob("lr1cpu-*.json")):
        pytest.skip("a part of the sweep is published")
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert lrsweep.TITLE in text and "(`lr1cpu`: 4 methods × lr 0.001, 0.002, 0.004, 0.008 × seeds 0, 1) is not " \
        "yet published." in text
