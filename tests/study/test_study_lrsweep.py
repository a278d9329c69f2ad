"""The learning-rate section of docs/results.md (``study.lrsweep``): each method's best rate of the sweep (lowest
mean, ties to the smaller, diverged rates out, the grid's edge flagged), the sweep's table from published parts,
some missing, and, after a complete hand-made sweep, the tuned 4 × Δ table beside the shared-rate one, a method's
runs at the shared rate taken from mix4cpu, with numbers computed here by hand; a published part of a learning-rate
grid is matched to its cell by its train settings; a method counts at 4 × at the best of its rates with runs, the
shared rate's among them; and, once the sweep is published, lr4cpu.toml and lr4cpunb.toml list exactly the sweep's
best and neighbouring rates that are not the shared one."""

from __future__ import annotations

import json
import math
import shutil
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


def report(pub: Path, tmp_path: Path, folder: Path = STUDIES) -> str:
    studies = published.load_studies(folder)
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
    assert "are optimistic" not in text
    assert "at 1 × and at 4 × alike, so a tuned Δ is optimistic; the more rates a method is chosen among, the " \
        "more" in text
    assert "The tuned 4 × comparison waits for the complete sweep: its rates are the sweep's best." in text


#: A complete hand-made sweep: mean final val loss per method and rate (seed 0 0.01 below, seed 1 0.01 above). Best
#: and neighbour: none 0.002 (the shared rate) and 0.004; depth_attention 0.004 and 0.002 (shared); the uniform
#: control 0.008 (the grid's edge); attnres 0.002 (shared).
FULL_SWEEP = {"none": (4.30, 4.10, 4.12, 4.30), "depth_attention": (4.30, 4.05, 4.00, 4.20),
              "depth_attention_uniform": (4.50, 4.30, 4.20, 4.10), "attnres": (4.05, 4.00, 4.20, 4.40)}
#: The study files that sweep asks for: only the rates mix4cpu (at 0.002) lacks.
OWN = {"depth_attention": 0.004, "depth_attention_uniform": 0.008}
NEAR = {"none": 0.004}


def tuned_file(name: str, rates: dict[str, float]) -> str:
    """A tuned study file as lr4cpu.toml's, training ``rates`` ({method: lr})."""
    sets = "".join(f"\n[method_set.{m}]\nlr = {lr}\n" for m, lr in rates.items())
    return (f'name = "{name}"\nout = "runs/study/{name}"\ndata = "runs/study/data-mix"\npublish = '
            f'"results/small-scale"\npreset = "small"\nmethods = {json.dumps(list(rates))}\nseeds = [0, 1, 2]\n'
            f"steps = 400\nbudgets = [4]\nper_method = true\n{sets}")


def studies_with(tmp_path: Path, own: dict[str, float], near: dict[str, float]) -> Path:
    """The committed study files, but lr4cpu.toml and lr4cpunb.toml training ``own`` and ``near``."""
    folder = tmp_path / "studies"
    shutil.copytree(STUDIES, folder, dirs_exist_ok=True)
    (folder / "lr4cpu.toml").write_text(tuned_file("lr4cpu", own), encoding="utf-8")
    (folder / "lr4cpunb.toml").write_text(tuned_file("lr4cpunb", near), encoding="utf-8")
    return folder


def publish_sweep_and_shared(pub: Path, shared: dict[str, list[float]]) -> None:
    """FULL_SWEEP's 32 parts and mix4cpu's parts of final val losses ``shared`` ({method: per seed})."""
    pub.mkdir(exist_ok=True)
    for method, means in FULL_SWEEP.items():
        for lr, mean in zip(LR, means):
            for seed in (0, 1):
                part_file(pub, "mix1cpu-s0-none.json", f"lr1cpu-lr{lr:g}-s{seed}-{method}", "lr1cpu", method, seed,
                          mean + (0.01 if seed else -0.01), lr=lr)
    for method, losses in shared.items():
        for seed, loss in enumerate(losses):
            part_file(pub, "mix4cpu-s0-none.json", f"mix4cpu-s{seed}-{method}", "mix4cpu", method, seed, loss)


def test_a_complete_sweep_says_whether_the_tuned_files_train_at_its_rates(tmp_path):
    """Files listing exactly the sweep's rates that are not the shared one: one line saying so; a file that also
    retrains a shared-rate run, or one that should list nothing: a bold line naming what to correct."""
    pub = tmp_path / "pub"
    publish_sweep_and_shared(pub, SHARED)
    assert json.loads((pub / "mix4cpu-s0-none.json").read_text())["settings"]["train"]["lr"] == 0.002
    text = report(pub, tmp_path, studies_with(tmp_path, OWN, NEAR))
    assert "of the sweep's 32 parts" not in text
    # At 1 x from the sweep's own runs: depth_attention at 0.004 (4.00), none at 0.002 (4.10), the uniform control
    # at 0.008 (4.10), beside every method at 0.002 (depth_attention 4.05, the uniform control 4.30).
    one_x = text[text.index("At 1 ×, the same Δ"):text.index("`lr4cpu` trains")]
    assert ("| `depth_attention` − `none` | -0.1000 ± 0.0000 [-0.1000, -0.1000] (2 of 2 lower) | lower at this "
            "budget (the 95 % interval excludes 0) | -0.0500 ± 0.0000 [-0.0500, -0.0500] (2 of 2 lower) |") in one_x
    assert "| `depth_attention` − `depth_attention_uniform` | -0.1000 ± 0.0000" in one_x
    assert "-0.2500 ± 0.0000 [-0.2500, -0.2500] (2 of 2 lower) | lower at this budget (the 95 % interval " \
        "excludes 0) | +0.1500 [+0.1500, +0.1500] |" in one_x
    # depth_attention's third 4 x rate follows from its lr4cpu runs, not published here; none's best is the shared
    # rate, so its third is its 1 x neighbour, and lr4cpunb.toml is not checked until both are known
    assert ("`lr4cpu` trains `depth_attention` 0.004, `depth_attention_uniform` 0.008 (the best rates); every other "
            "4 × rate is the shared rate 0.002, whose runs `mix4cpu` already has. `lr4cpunb`'s rates for "
            "`depth_attention` follow from `lr4cpu`'s runs (`lrsweep.near_rates`), not all published yet.") in text
    text = report(pub, tmp_path, studies_with(tmp_path, dict(OWN, attnres=0.002), NEAR))
    assert ("**The tuned study files do not train at the sweep's rates**: lr4cpu.toml trains `depth_attention` "
            "0.004, `depth_attention_uniform` 0.008, `attnres` 0.002; it should train `depth_attention` 0.004, "
            "`depth_attention_uniform` 0.008; every other 4 × rate") in text
    studies = published.load_studies(studies_with(tmp_path, OWN, NEAR))
    shared_best = {m: lrsweep.Best(0.002, 4.0, False, 0.001) for m in FULL_SWEEP}
    near = lrsweep.near_rates(shared_best, {}, 0.002, (0, 1, 2))
    assert near == {"none": 0.001, "depth_attention": 0.001}  # best = shared: the 1 x neighbour
    line = lrsweep.rates_check(shared_best, studies["lr4cpu"], studies["lr4cpunb"], 0.002, near)[0]
    assert line.startswith("**The tuned study files do not train at the sweep's rates**: lr4cpu.toml trains "
                           "`depth_attention` 0.004, `depth_attention_uniform` 0.008; it should train nothing, as "
                           "every such rate is the shared one 0.002 (delete it); lr4cpunb.toml trains `none` 0.004; "
                           "it should train `none` 0.001, `depth_attention` 0.001;")


def test_the_lead_gives_the_best_rates_and_the_gaps_at_them_while_the_tuned_runs_are_not_all_run(tmp_path):
    pub = tmp_path / "pub"
    publish_sweep_and_shared(pub, SHARED)
    studies = published.load_studies(studies_with(tmp_path, OWN, NEAR))
    every = published.load_published(pub, studies)
    parts = published.plan(studies)
    done = published.done_parts(parts, every, studies)
    assert lrsweep.lead_sentence(every, studies, parts, done) == (
        "Each method's best learning rate at 1 × (by mean final validation loss over 2 seeds): `none` 0.002, "
        "`depth_attention` 0.004, `depth_attention_uniform` 0.008 (at the grid’s edge), `attnres` 0.002. At those "
        "rates, on the sweep's own runs, the gaps at 1 × are `depth_attention` − `none` = -0.100 nats, lower at "
        "this budget (the 95 % interval excludes 0); `depth_attention_uniform` − `none` = +0.000 nats, inconclusive "
        "at this budget (the 95 % interval includes 0); `attnres` − `none` = -0.100 nats, lower at this budget (the "
        "95 % interval excludes 0); `depth_attention` − `depth_attention_uniform` = -0.100 nats, lower at this "
        "budget (the 95 % interval excludes 0); the tuned 4 × runs, new runs at the chosen rates, are not yet all "
        "run (0 of 9 published).")


def test_no_tuned_table_before_none_has_a_4x_run_at_its_own_rate():
    """Only the uniform control's runs at the shared rate (mix4cpu's) count yet: no pair, so no table."""
    run = {"val_loss": 3.5, "train_settings": {"lr": 0.002}, "seed": 0}
    best = {"none": lrsweep.Best(0.004, 4.0, False, 0.008),
            "depth_attention_uniform": lrsweep.Best(0.002, 4.0, False, 0.004)}
    lines = lrsweep.tuned_lines({"mix4cpu": {"depth_attention_uniform": {0: run}}}, {}, [], set(), best)
    assert lines[2:] == ["No tuned pair yet: a pair needs `none`'s 4 × runs at its own rate and another method's.",
                         ""]


def test_a_tuned_study_file_may_be_absent_and_the_check_says_whether_it_should_be(tmp_path):
    """A tuned group's file is optional (nothing to train there); any other group's file is not."""
    folder = studies_with(tmp_path, dict(none=0.004, **OWN), NEAR)
    (folder / "lr4cpunb.toml").unlink()
    studies = published.load_studies(folder)
    assert "lr4cpunb" not in studies and "lr4cpu" in studies
    assert not [p for p in published.plan(studies) if p.group == "lr4cpunb"]
    best = {"none": lrsweep.Best(0.004, 4.0, False, 0.002), "depth_attention": lrsweep.Best(0.004, 4.0, False, 0.002),
            "depth_attention_uniform": lrsweep.Best(0.008, 4.0, True, 0.004),
            "attnres": lrsweep.Best(0.002, 4.0, False, 0.001)}
    assert lrsweep.rates_check(best, studies["lr4cpu"], None, 0.002, {})[0] == (
        "`lr4cpu` trains `none` 0.004, `depth_attention` 0.004, `depth_attention_uniform` 0.008 (the best rates) "
        "and `lr4cpunb` nothing (no study file) (`near_rates`: a step beyond the better of the best and the shared "
        "rate at 4 ×, or the 1 × neighbour where the two are one); every other 4 × rate is the shared rate 0.002, "
        "whose runs `mix4cpu` already has.")
    assert lrsweep.rates_check(best, studies["lr4cpu"], None, 0.002, {"none": 0.008})[0].startswith(
        "**The tuned study files do not train at the sweep's rates**: lr4cpunb.toml is absent; it should train "
        "`none` 0.008; every other")
    (folder / "lr1cpu.toml").unlink()
    with pytest.raises(FileNotFoundError, match="lr1cpu.toml"):
        published.load_studies(folder)


def test_a_run_of_a_rate_and_seed_is_taken_from_lr4cpu_then_lr4cpunb_then_mix4cpu():
    def run(lr: float, loss: float) -> dict:
        return {"val_loss": loss, "train_settings": {"lr": lr}}

    runs = {"mix4cpu": {"none": {0: run(0.002, 3.0), 1: run(0.002, 3.1)}},
            "lr4cpunb": {"none": {0: run(0.002, 2.0), 2: run(0.004, 2.5)}},
            "lr4cpu": {"none": {0: run(0.002, 1.0)}, "attnres": {0: run(0.004, 9.0)}}}
    at = lrsweep.runs_at(runs, "none")
    assert {lr: {s: (g, r["val_loss"]) for s, (g, r) in by_seed.items()} for lr, by_seed in at.items()} == {
        0.002: {0: ("lr4cpu", 1.0), 1: ("mix4cpu", 3.1)}, 0.004: {2: ("lr4cpunb", 2.5)}}
    assert lrsweep.shared_rate(runs) == 0.002
    with pytest.raises(ValueError, match=r"`mix4cpu` trained at several learning rates \(0.002, 0.004\)"):
        lrsweep.shared_rate({"mix4cpu": {"none": {0: run(0.002, 3.0)}, "attnres": {0: run(0.004, 3.0)}}})


#: The tuned fixture: final val loss over seeds 0, 1, 2: mix4cpu's (every method at 0.002), lr4cpu's (OWN) and
#: lr4cpunb's (NEAR). depth_attention's shared-rate runs beat its own best rate's at 4 ×.
SHARED = {"none": [3.60, 3.62, 3.58], "depth_attention": [3.50, 3.52, 3.47],
          "depth_attention_uniform": [3.50, 3.50, 3.47], "attnres": [3.50, 3.62, 3.60]}
TUNED = {"depth_attention": [3.52, 3.55, 3.49], "depth_attention_uniform": [3.40, 3.55, 3.45]}
NEIGHBOUR = {"none": [3.53, 3.56, 3.52]}


def interval(xs: list[float]) -> str:
    """The trend's cell of per-seed gaps ``xs``: mean ± std [95 % interval] (k of n lower), computed here."""
    m, s = mean_std(xs)
    half = T2 * s / math.sqrt(len(xs))
    return f"{m:+.4f} ± {s:.4f} [{m - half:+.4f}, {m + half:+.4f}] ({sum(x < 0 for x in xs)} of {len(xs)} lower)"


def lead_verdict(xs: list[float]) -> str:
    """``stats.verdict``'s words for per-seed gaps ``xs`` (three seeds), the interval computed here."""
    m, s = mean_std(xs)
    half = T2 * s / math.sqrt(len(xs))
    if m - half <= 0 <= m + half:
        return "inconclusive at this budget (the 95 % interval includes 0)"
    return ("lower" if m + half < 0 else "higher") + " at this budget (the 95 % interval excludes 0)"


def test_the_tuned_table_beside_the_shared_rate_one(tmp_path):
    """After the complete sweep: none at its neighbour 0.004 (lr4cpunb; lower than mix4cpu's at its best 0.002),
    depth_attention at its neighbour 0.002, which is mix4cpu's runs (lower than lr4cpu's at its best 0.004), attnres
    at its best, the shared rate (mix4cpu's runs); Δ tuned and shared per pair with the verdicts, and the change
    tuned − shared called only where its interval excludes 0."""
    pub = tmp_path / "pub"
    publish_sweep_and_shared(pub, SHARED)
    for group, table, lrs in (("lr4cpu", TUNED, OWN), ("lr4cpunb", NEIGHBOUR, NEAR)):
        for method, losses in table.items():
            for seed, loss in enumerate(losses):
                part_file(pub, "mix4cpu-s0-none.json", f"{group}-s{seed}-{method}", group, method, seed, loss,
                          lr=lrs[method])
    text = report(pub, tmp_path, studies_with(tmp_path, OWN, NEAR))
    assert "**Incomplete:**" not in text  # the sweep and every tuned part are published
    mix = "(the shared-rate runs of `mix4cpu`)"
    mean = {k: sum(v) / 3 for k, v in [("none nb", NEIGHBOUR["none"]), ("none mix", SHARED["none"]),
                                       ("da mix", SHARED["depth_attention"]), ("da own", TUNED["depth_attention"]),
                                       ("u own", TUNED["depth_attention_uniform"]),
                                       ("u mix", SHARED["depth_attention_uniform"])]}
    assert mean["none nb"] < mean["none mix"] and mean["da mix"] < mean["da own"] and mean["u own"] < mean["u mix"]
    above = "the highest of its 4 × rates (one above it is untried)"
    below = "the lowest of its 4 × rates (one below it is untried)"
    assert (f"Rates at 4 ×: `none` at 0.004, mean {mean['none nb']:.4f}, against {mean['none mix']:.4f} at 0.002 "
            f"{mix} over seeds 0, 1, 2, {above}; `depth_attention` at 0.002 {mix}, mean {mean['da mix']:.4f}, "
            f"against {mean['da own']:.4f} at 0.004 over seeds 0, 1, 2, {below}; `depth_attention_uniform` at 0.008, "
            f"mean {mean['u own']:.4f}, against {mean['u mix']:.4f} at 0.002 {mix} over seeds 0, 1, 2, {above}; "
            f"`attnres` at 0.002 {mix}.") in text
    none, da = NEIGHBOUR["none"], SHARED["depth_attention"]  # each at its better 4 x rate
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
    tuned_a = [a - b for a, b in zip(SHARED["attnres"], none)]  # attnres: mix4cpu's runs, against none's own
    assert f"| `attnres` − `none` | {interval(tuned_a)} |" in text
    tuned_u = [a - b for a, b in zip(TUNED["depth_attention_uniform"], none)]
    shared_u = [a - b for a, b in zip(SHARED["depth_attention_uniform"], SHARED["none"])]
    mu, su = mean_std([t - s for t, s in zip(tuned_u, shared_u)])
    assert mu - T2 * su / math.sqrt(3) < 0 < mu + T2 * su / math.sqrt(3)
    assert f"- `depth_attention_uniform` − `none`: {sum(shared_u) / 3:+.3f} nats at the shared rate" in text
    assert "(inconclusive: the interval includes 0)" in \
        text.split("- `depth_attention_uniform` − `none`: ")[-1].splitlines()[0]
    dau = [a - b for a, b in zip(da, TUNED["depth_attention_uniform"])]
    assert f"| `depth_attention` − `depth_attention_uniform` | {interval(dau)} |" in text
    m_t, s_t = mean_std(tuned)
    assert f"- `depth_attention` − `none`, each at its own rate: Δ {m_t:+.3f} ± {s_t:.3f} nats over 3 seeds" in text
    studies = published.load_studies(studies_with(tmp_path, OWN, NEAR))
    every = published.load_published(pub, studies)
    parts = published.plan(studies)
    lead = lrsweep.lead_sentence(every, studies, parts, published.done_parts(parts, every, studies))
    m_u, m_a, m_d = mean_std(tuned_u)[0], mean_std(tuned_a)[0], mean_std(dau)[0]
    shared_a = [a - b for a, b in zip(SHARED["attnres"], SHARED["none"])]
    shared_d = [a - b for a, b in zip(da, SHARED["depth_attention_uniform"])]
    # a change is called by its paired interval (the section's rule), not by two verdicts: the uniform control's
    # verdict against none moves (lower -> inconclusive), yet its change is inconclusive; none's own rate moves
    # the gaps of depth_attention and attnres (the same runs) by the same called amount
    assert [lead_verdict(x).split()[0] for x in (shared_u, tuned_u)] == ["lower", "inconclusive"]
    called = change_called([t - s for t, s in zip(tuned_a, shared_a)])
    assert called == change_called(change) and called is not None
    assert change_called([t - s for t, s in zip(tuned_u, shared_u)]) is None
    assert change_called([t - s for t, s in zip(dau, shared_d)]) is None
    assert lead == (
        f"Giving each method its own learning rate changes gaps at 4 ×: `depth_attention` − `none` by {called}; "
        f"`attnres` − `none` by {called}; the other changes are inconclusive: with each method at the best of its "
        "4 × rates (`none` 0.004, `depth_attention` 0.002, `depth_attention_uniform` 0.008, `attnres` 0.002; "
        "`depth_attention` at the lowest rate tried at 4 ×, so a lower one may do better; `none`, "
        "`depth_attention_uniform` at the highest rate tried at 4 ×, so a higher one may do better; `attnres` tried "
        "at one rate only), the gaps are "
        f"`depth_attention` − `none` = {m_t:+.3f} nats, lower at this budget (the 95 % interval excludes 0); "
        f"`depth_attention_uniform` − `none` = {m_u:+.3f} nats, {lead_verdict(tuned_u)}; `attnres` − `none` = "
        f"{m_a:+.3f} nats, {lead_verdict(tuned_a)}; `depth_attention` − `depth_attention_uniform` = {m_d:+.3f} "
        f"nats, {lead_verdict(dau)}. Each method's best learning rate at 1 × was `none` 0.002, `depth_attention` "
        "0.004, `depth_attention_uniform` 0.008 (at the grid’s edge), `attnres` 0.002.")
    for f in pub.glob("lr4cpunb-*.json"):  # lr4cpu complete, the neighbouring rate not yet: a provisional lead
        f.unlink()
    every = published.load_published(pub, studies)
    lead = lrsweep.lead_sentence(every, studies, parts, published.done_parts(parts, every, studies))
    gap = [a - b for a, b in zip(da, SHARED["none"])]  # none at 0.002 now: its neighbour's runs are not published
    # only the uniform control has runs of its own; its changes are inconclusive, the others' are 0 (the same runs)
    assert lead.startswith("Provisional, with 0 of `lr4cpunb`'s 3 runs published: giving each method its own "
                           "learning rate changes no gap at 4 × detectably (each paired change tuned − shared has a "
                           "95 % interval including 0): with each method at the best of its 4 × rates (`none` "
                           "0.002, `depth_attention` 0.002, `depth_attention_uniform` 0.008, `attnres` 0.002; ")
    assert f"the gaps are `depth_attention` − `none` = {mean_std(gap)[0]:+.3f} nats, " in lead
    assert lead.endswith(". Each method's best learning rate at 1 × was `none` 0.002, `depth_attention` 0.004, "
                         "`depth_attention_uniform` 0.008 (at the grid’s edge), `attnres` 0.002.")


def change_called(xs: list[float]) -> str | None:
    """``"+m nats (95 % interval lo to hi)"`` (3 decimals) for per-seed changes ``xs`` whose t-interval excludes 0,
    None when it includes 0; computed here."""
    m, s = mean_std(xs)
    half = T2 * s / math.sqrt(len(xs))
    return None if m - half <= 0 <= m + half else f"{m:+.3f} nats (95 % interval {m - half:+.3f} to {m + half:+.3f})"


def test_the_lead_says_nothing_changes_when_every_best_4x_rate_is_the_shared_one(tmp_path):
    """Every method's own 4 x runs worse than its shared-rate ones: each counts at the shared rate, the pairs are the
    very same runs, and the lead says so in place of repeating the shared-rate gaps; provisional, first, while
    lr4cpunb is incomplete."""
    assert lrsweep.pairs_of(["none", "attnres", "depth_attention"]) == [("attnres", "none"),
                                                                         ("depth_attention", "none")]
    assert lrsweep.pairs_of(["depth_attention_uniform", "depth_attention"]) == [
        ("depth_attention_uniform", "none"), ("depth_attention", "none"),
        ("depth_attention", "depth_attention_uniform")]
    pub = tmp_path / "pub"
    publish_sweep_and_shared(pub, SHARED)
    worse = {"lr4cpu": ({m: [x + 0.2 for x in SHARED[m]] for m in OWN}, OWN),
             "lr4cpunb": ({m: [x + 0.2 for x in SHARED[m]] for m in NEAR}, NEAR)}
    for group, (table, lrs) in worse.items():
        for method, losses in table.items():
            for seed, loss in enumerate(losses):
                part_file(pub, "mix4cpu-s0-none.json", f"{group}-s{seed}-{method}", group, method, seed, loss,
                          lr=lrs[method])
    studies = published.load_studies(studies_with(tmp_path, OWN, NEAR))
    parts = published.plan(studies)
    every = published.load_published(pub, studies)
    lead = lrsweep.lead_sentence(every, studies, parts, published.done_parts(parts, every, studies))
    assert lead == (
        "At 4 × the best rate tried was the shared one, 0.002, for every method (`none`, `depth_attention`, "
        "`depth_attention_uniform` at the lowest rate tried at 4 ×, so a lower one may do better; `attnres` tried at "
        "one rate only), so giving each method its own rate changes no gap: the 4 × gaps are the shared-rate ones "
        "above. Each method's best learning rate at 1 × was `none` 0.002, `depth_attention` 0.004, "
        "`depth_attention_uniform` 0.008 (at the grid’s edge), `attnres` 0.002.")
    (pub / "lr4cpunb-s2-none.json").unlink()
    every = published.load_published(pub, studies)
    lead = lrsweep.lead_sentence(every, studies, parts, published.done_parts(parts, every, studies))
    assert lead.startswith("Provisional, with 2 of `lr4cpunb`'s 3 runs published: at 4 × the best rate tried was "
                           "the shared one, 0.002, for every method (")


def test_a_method_counts_at_the_shared_rate_where_its_runs_there_are_better_and_an_unrun_rate_is_no_candidate():
    """The best rate at 1 × can be too high at 4 ×: none's mix4cpu runs (0.002, the shared rate, not its neighbour)
    are a candidate at no cost; while its neighbour has no run it is no candidate, then its seeds decide."""
    def run(lr: float, loss: float, seed: int) -> dict:
        return {"val_loss": loss, "train_settings": {"lr": lr}, "seed": seed}

    best = lrsweep.Best(0.004, 6.05, False, 0.008)
    assert lrsweep.candidate_rates(best, 0.002, 0.008) == [0.004, 0.008, 0.002]
    assert lrsweep.candidate_rates(lrsweep.Best(0.004, 6.0, False, 0.002), 0.002, None) == [0.004, 0.002]
    assert lrsweep.candidate_rates(lrsweep.Best(0.002, 6.0, False, 0.004), 0.002, None) == [0.002]
    assert lrsweep.candidate_rates(best, None, 0.008) == [0.004, 0.008]
    runs = {"mix4cpu": {"none": {s: run(0.002, x, s) for s, x in enumerate([5.25, 5.23, 5.24])}},
            "lr4cpu": {"none": {0: run(0.004, 5.22, 0), 1: run(0.004, 5.20, 1)}}}
    rates = lrsweep.candidate_rates(best, 0.002, 0.008)
    c = lrsweep.tuned_choice(runs, "none", rates)  # 0.004 lacks seed 2: no candidate yet, lower as it is
    assert (c.lr, c.edge, c.tried) == (0.002, "", (0.002,))
    assert c.note == "`none` at 0.002 (the shared-rate runs of `mix4cpu`)"
    assert {s: r["val_loss"] for s, r in c.runs.items()} == {0: 5.25, 1: 5.23, 2: 5.24}
    runs["lr4cpu"]["none"][2] = run(0.004, 5.40, 2)
    c = lrsweep.tuned_choice(runs, "none", rates)
    assert (c.lr, c.edge, c.tried) == (0.002, "lowest", (0.004, 0.002))
    # means over seeds 0, 1, 2: (5.25 + 5.23 + 5.24) / 3 and (5.22 + 5.20 + 5.40) / 3
    assert c.note == ("`none` at 0.002 (the shared-rate runs of `mix4cpu`), mean 5.2400, against 5.2733 at 0.004 "
                      "over seeds 0, 1, 2, the lowest of its 4 × rates (one below it is untried)")
    runs["lr4cpunb"] = {"none": {0: run(0.008, 5.00, 0)}}  # one lucky seed does not decide
    assert lrsweep.tuned_choice(runs, "none", rates).lr == 0.002
    runs["lr4cpunb"]["none"].update({1: run(0.008, 5.10, 1), 2: run(0.008, 5.30, 2)})
    c = lrsweep.tuned_choice(runs, "none", rates)
    assert (c.lr, c.edge) == (0.008, "highest") and {s: r["val_loss"] for s, r in c.runs.items()} == {
        0: 5.00, 1: 5.10, 2: 5.30}
    assert c.note == ("`none` at 0.008, mean 5.1333, against 5.2733 at 0.004; 5.2400 at 0.002 (the shared-rate "
                      "runs of `mix4cpu`) over seeds 0, 1, 2, the highest of its 4 × rates (one above it is untried)")
    # no rate on every seed yet (disjoint seeds): the one with the most runs, not the first listed
    split = {"mix4cpu": {"none": {0: run(0.002, 5.0, 0), 1: run(0.002, 5.0, 1)}},
             "lr4cpu": {"none": {2: run(0.004, 9.0, 2)}}}
    assert lrsweep.tuned_choice(split, "none", [0.004, 0.002]).lr == 0.002
    assert lrsweep.tuned_choice(runs, "attnres", [0.004]) == lrsweep.Choice({}, None, "", "")


def test_the_third_4x_rate_is_a_step_beyond_the_better_of_the_best_and_the_shared_one():
    def run(lr: float, loss: float) -> dict:
        return {"val_loss": loss, "train_settings": {"lr": lr}}

    best = {"none": lrsweep.Best(0.004, 6.05, False, 0.008), "depth_attention": lrsweep.Best(0.004, 6.0, False, 0.002),
            "attnres": lrsweep.Best(0.004, 6.0, False, 0.002)}
    runs = {"mix4cpu": {m: {s: run(0.002, 5.20 + 0.01 * s) for s in range(3)} for m in best},
            "lr4cpu": {"none": {s: run(0.004, 5.25) for s in range(3)},  # worse than 0.002: step down
                       "depth_attention": {s: run(0.004, 5.10) for s in range(3)}}}  # better: step up
    near = lrsweep.near_rates(best, runs, 0.002, (0, 1, 2))
    assert near == {"none": 0.001, "depth_attention": 0.008}  # attnres is not one of NEAR_METHODS
    runs["lr4cpunb"] = {"none": {s: run(0.001, 1.0) for s in range(3)}}  # lr4cpunb's own runs do not move it
    assert lrsweep.near_rates(best, runs, 0.002, (0, 1, 2))["none"] == 0.001
    del runs["lr4cpu"]["depth_attention"][2]
    assert lrsweep.near_rates(best, runs, 0.002, (0, 1, 2))["depth_attention"] is None  # not yet known
    assert lrsweep.near_rates({"none": lrsweep.Best(0.002, 6.0, False, 0.004)}, runs, 0.002, (0, 1, 2)) == {
        "none": 0.004}  # the best is the shared rate: its 1 x neighbour
    low = {"none": lrsweep.Best(0.001, 6.0, False, 0.002)}  # a best rate below the shared one
    for loss, step in ((5.10, 0.0005), (5.30, 0.004)):
        runs["lr4cpu"]["none"] = {s: run(0.001, loss) for s in range(3)}
        assert lrsweep.near_rates(low, runs, 0.002, (0, 1, 2)) == {"none": step}
    runs["lr4cpu"]["none"] = {s: run(0.001, 5.20 + 0.01 * s) for s in range(3)}  # a tie: the smaller rate, 0.001
    assert lrsweep.near_rates(low, runs, 0.002, (0, 1, 2)) == {"none": 0.0005}
    assert lrsweep.to_train(best, 0.002, {"none": 0.001, "depth_attention": None}) == (
        {"none": 0.004, "depth_attention": 0.004, "attnres": 0.004}, {"none": 0.001})


def test_a_pair_whose_methods_both_count_at_the_shared_rate_is_the_same_runs_and_no_change():
    def run(method: str, seed: int, loss: float) -> dict:
        return {"method": method, "seed": seed, "val_loss": loss, "train_settings": {"lr": 0.002}, "data": "D",
                "tokens": 100}

    shared = {m: {s: run(m, s, x + 0.01 * s) for s in range(3)} for m, x in (("none", 5.24), ("attnres", 5.05))}
    lines = lrsweep.delta_lines(dict(shared), shared, frozenset({"lr"}))
    row = next(x for x in lines if x.startswith("| `attnres` − `none` |"))
    assert row.endswith("| 0 (the same runs) |")
    assert "- `attnres` − `none`: both count at the shared rate, so these are the same runs: no change." in lines
    own = {"none": shared["none"], "attnres": {s: dict(r) for s, r in shared["attnres"].items()}}  # equal, not same
    lines = lrsweep.delta_lines(own, shared, frozenset({"lr"}))
    assert next(x for x in lines if x.startswith("| `attnres` − `none` |")).endswith("| +0.0000 [+0.0000, +0.0000] |")


def test_a_published_part_of_an_lr_grid_is_matched_on_its_train_settings(tmp_path):
    """lr1cpu's cells differ in lr only (a train setting): a part at lr 0.004 is the third cell, one at 0.003 is
    no cell; an lr4cpu part at another rate than its method's [method_set] is refused too; runs whose rates
    differ pair only where the rate is allowed."""
    studies = published.load_studies(STUDIES)
    pub = tmp_path / "pub"
    pub.mkdir()
    method, own = next(iter(lrsweep.committed_lrs(studies["lr4cpu"]).items()))  # whatever the file trains
    part_file(pub, "mix1cpu-s0-none.json", "x", "lr1cpu", method, 1, 4.0, lr=0.004)
    res = published.load_published(pub, studies)[0]
    assert published.cell_of(studies["lr1cpu"], res) == 2
    res["settings"]["train"]["lr"] = 0.003
    with pytest.raises(ValueError, match=r"published part x: its settings \{'lr': 0.003\} are no cell of"):
        published.cell_of(studies["lr1cpu"], res)
    res["settings"]["train"]["lr"] = own
    assert published.cell_of(studies["lr4cpu"], res) == 0
    res["settings"]["train"]["lr"] = own * 2
    with pytest.raises(ValueError, match=r"are no cell of .*lr4cpu.toml"):
        published.cell_of(studies["lr4cpu"], res)
    run = published.run_record(res, res["methods"][method]["runs"][0])
    other = dict(run, val_loss=3.9, train_settings=dict(run["train_settings"], lr=own))
    with pytest.raises(ValueError, match="cannot pair"):
        published.paired_runs("tuned", {1: run}, {1: other})
    assert published.paired_runs("tuned", {1: run}, {1: other}, allowed=frozenset({"lr"}))[2]["mean"] == \
        pytest.approx(4.0 - 3.9)
    worse = dict(other, train_settings=dict(other["train_settings"], weight_decay=0.0))
    with pytest.raises(ValueError, match="cannot pair"):
        published.paired_runs("tuned", {1: run}, {1: worse}, allowed=frozenset({"lr"}))


def test_the_committed_tuned_rates_are_the_sweeps_best_once_it_is_published():
    """lr4cpu.toml trains each method whose best rate of the published sweep is not the shared one (mix4cpu's) at
    that rate, lr4cpunb.toml none and depth_attention at their neighbouring rate unless it is the shared one; no
    other method (skipped while the sweep is incomplete)."""
    studies = published.load_studies(STUDIES)
    every = published.load_published(ROOT / "results" / "small-scale", studies)
    parts = published.plan(studies)
    done = published.done_parts(parts, every, studies)
    missing = [p.name for p in parts if p.group == "lr1cpu" and p.name not in done]
    if missing:
        pytest.skip(f"{len(missing)} of the sweep's parts are not published yet: lr4cpu.toml's rates are "
                    "provisional")
    shared = {res["settings"]["train"]["lr"] for res in every if res["study"]["group"] == "mix4cpu"}
    assert len(shared) == 1
    best = lrsweep.best_lrs(lrsweep.sweep_of(every, studies["lr1cpu"]).losses(), studies["lr1cpu"].grid["lr"])
    own = {m: b.lr for m, b in best.items() if b.lr not in shared}
    near = {}  # a step beyond the better of the best and the shared rate at 4 x; the 1 x neighbour if they are one
    for m in ("none", "depth_attention"):
        if best[m].lr in shared:
            near[m] = best[m].neighbour
            continue
        losses = {g: {res["settings"]["seeds"][0]: res["methods"][m]["runs"][0]["val_loss"] for res in every
                      if res["study"]["group"] == g and m in res["methods"] and res["methods"][m]["runs"]}
                  for g in ("lr4cpu", "mix4cpu")}
        if set(losses["lr4cpu"]) != set(studies["lr4cpu"].seeds) or not set(losses["lr4cpu"]) <= set(losses["mix4cpu"]):
            pytest.skip(f"lr4cpu's runs of {m} are not all published yet: lr4cpunb.toml's rates are provisional")
        mean = {g: sum(losses[g][s] for s in losses["lr4cpu"]) / len(losses["lr4cpu"]) for g in losses}
        better = min((mean["lr4cpu"], best[m].lr), (mean["mix4cpu"], min(shared)))[1]  # ties: the smaller rate
        near[m] = better / 2 if better == min(best[m].lr, *shared) else better * 2
    for group, want in (("lr4cpu", own), ("lr4cpunb", near)):
        if not want:
            assert group not in studies, f"every rate of {group}.toml is the shared one: delete the file"
            continue
        assert group in studies, f"write {group}.toml: it should train {want}"
        lrs = lrsweep.committed_lrs(studies[group])
        assert {m: lrs.get(m) for m in studies[group].methods} == want, group


def test_the_committed_report_says_the_sweep_is_not_yet_published_while_it_is_not():
    if any((ROOT / "results" / "small-scale").glob("lr1cpu-*.json")):
        pytest.skip("a part of the sweep is published")
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert lrsweep.TITLE in text and "(`lr1cpu`: 4 methods × lr 0.001, 0.002, 0.004, 0.008 × seeds 0, 1) is not " \
        "yet published." in text
