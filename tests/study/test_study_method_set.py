"""A study's ``[method_set.METHOD]`` settings: ``--set`` values for one method's parts only (``per_method``), checked
as [set] is when the file is read, and allowed to differ between a method and the reference when the report pairs
their runs (``report.cell_stats``); any other difference still keeps a pair out, named."""

from __future__ import annotations

import pytest

from depthattn.cli import build_parser
from depthattn.study import load_study
from depthattn.study.report import Cell, cell_stats, trend_change
from depthattn.training.config import parse_value

from helpers import small_study as study


def sets(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)  # compare's command line, as the CLI reads it
    return {k: parse_value(v, k) for k, v in (item.split("=", 1) for item in args.set)}


def test_a_methods_settings_go_to_its_parts_only(tmp_path):
    s = study(tmp_path, "per_method = true\n[set]\nbatch_size = 2\n[method_set.depth_attention]\nlr = 0.004\n"
                        "depth_attention_window = 2\n")
    parts = {p.name: p for p in s.parts()}
    assert list(parts)[:3] == ["s-s0-none", "s-s0-depth_attention", "s-s0-attnres"]  # names as without it
    assert sets(s.compare_argv(parts["s-s1-depth_attention"])) == {"batch_size": 2, "lr": 0.004,
                                                                  "depth_attention_window": 2}
    assert sets(s.compare_argv(parts["s-s1-none"])) == sets(s.compare_argv(parts["s-s1-attnres"])) == {
        "batch_size": 2}
    assert s.method_set_keys() == s.method_set_keys("depth_attention", "none") == {"lr", "depth_attention_window"}
    assert s.method_set_keys("none", "attnres") == frozenset()


@pytest.mark.parametrize("extra, message", [
    ("[method_set.depth_attention]\nlr = 0.004\n", r"\[method_set\] needs `per_method = true`"),
    ("per_method = true\n[method_set.mhc]\nlr = 0.004\n", r"\[method_set.mhc\]: `mhc` is not one of methods"),
    ("per_method = true\n[method_set]\nnone = 0.004\n", r"\[method_set\] `none = 0.004` must be a table"),
    ("per_method = true\n[method_set.none]\nseed = 3\n",
     r"`seed` in \[method_set.none\]: the study sets it with `seeds`"),
    ("per_method = true\n[method_set.none]\nlr = 0.004\n[set]\nlr = 0.002\n",
     r"\['lr'\] in both \[method_set.none\] and \[set\]/\[grid\]/cells"),
    ("per_method = true\n[method_set.none]\nlr = 0.004\n[grid]\nlr = [0.001, 0.002]\n",
     r"\['lr'\] in both \[method_set.none\] and \[set\]/\[grid\]/cells"),
    ("per_method = true\n[method_set.attnres]\nlrr = 0.004\n", r"\[method_set.attnres\]: unknown key 'lrr'"),
    ("per_method = true\n[method_set.attnres]\nlr = -1.0\n", r"part s \[method_set.attnres\]: .*lr"),
])
def test_a_bad_method_set_is_one_line_naming_the_file(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message) as e:
        study(tmp_path, extra)
    assert str(e.value).startswith(str(tmp_path / "s.toml")) and "\n" not in str(e.value)


def run(seed: int, val_loss: float) -> dict:
    """A compare run record, as results.json holds it (the fields paired_stats reads)."""
    return {"seed": seed, "val_loss": val_loss, "bits_per_byte": val_loss / 2, "tokens": 400,
            "curve": [{"tokens": 400, "val_loss": val_loss}]}


def record(**train) -> dict:
    """A run.json record: its train settings (no data or device recorded: those are not compared then)."""
    return {"train": {"steps": 4, "lr": 0.002, "weight_decay": 0.1, **train}}


def cell(runs: dict[str, dict[int, float]], records: dict[str, dict[int, dict]]) -> Cell:
    return Cell("s", 1.0, (), runs={m: {s: run(s, v) for s, v in by.items()} for m, by in runs.items()},
                records=records)


LOSSES = {"none": {0: 4.0, 1: 4.2, 2: 4.1}, "depth_attention": {0: 3.9, 1: 4.15, 2: 4.12}}


def test_the_report_pairs_a_method_with_the_reference_across_its_method_set_keys_only(tmp_path):
    tuned = study(tmp_path, "per_method = true\n[method_set.depth_attention]\nlr = 0.004\n")
    records = {"none": {s: record() for s in range(3)},
               "depth_attention": {0: record(lr=0.004), 1: record(lr=0.004), 2: record(lr=0.004, weight_decay=0.0)}}
    c = cell(LOSSES, records)
    stats = cell_stats(tuned, c)
    d = stats["depth_attention"]["val_loss"]
    assert stats["depth_attention"]["seeds"] == [0, 1]  # seed 2 differs in weight_decay too: left out, named
    assert d["diffs"] == pytest.approx([3.9 - 4.0, 4.15 - 4.2]) and d["mean"] == pytest.approx(-0.075)
    assert c.excluded == ["s: `depth_attention` seed 2 not paired with `none`: weight_decay: 0.0 vs 0.1"]
    shared = study(tmp_path, "per_method = true\n")  # the same runs without [method_set]: lr is a difference
    c = cell(LOSSES, records)
    assert cell_stats(shared, c) == {} and len(c.excluded) == 3
    assert c.excluded[0] == "s: `depth_attention` seed 0 not paired with `none`: lr: 0.004 vs 0.002"


def test_a_trend_across_budgets_of_a_method_set_study_pairs_the_references_runs(tmp_path):
    """Across budgets only the reference's own runs are compared (``steps`` may differ); a method's own rate
    does not enter: Δ at 2 × minus Δ at 1 ×, per seed."""
    s = study(tmp_path, "per_method = true\nbudgets = [1, 2]\n[method_set.depth_attention]\nlr = 0.004\n")
    first = cell(LOSSES, {"none": {x: record() for x in range(3)}})
    last = cell(LOSSES, {"none": {0: record(steps=8), 1: record(steps=8), 2: record(steps=8, lr=0.001)}})
    g1, g2 = {0: -0.1, 1: -0.05, 2: 0.02}, {0: -0.2, 1: -0.1, 2: 0.0}
    d, seeds, notes = trend_change(s, first, last, "budget", g1, g2)
    assert seeds == [0, 1] and d["diffs"] == pytest.approx([-0.1, -0.05])
    assert notes == ["s vs s: seed 2 not paired across budget: lr: 0.002 vs 0.001"]


TOY = """
name = "toy"
out = "{out}"
data = "{data}"
preset = "tiny"
methods = ["none", "depth_attention"]
seeds = [0]
steps = 3
eval_tokens = 600
per_method = true

[set]
batch_size = 2
seq_len = 32
eval_every = 3
eval_windows = 2
save_every = 3
keep_last = 1
{extra}"""


@pytest.mark.slow
def test_a_study_trains_a_method_at_its_own_rate_and_reports_the_pair(data_dir, tmp_path):
    """depth_attention trains at its [method_set] rate, none at compare's default; the report pairs the two runs
    (their run.json records differ in lr only), and the same runs read by a study without [method_set] are not
    paired, the difference named."""
    from depthattn.cli import main
    from depthattn.run.folder import RunFolder
    from depthattn.study.report import collect

    path = tmp_path / "toy.toml"
    path.write_text(TOY.format(out=tmp_path / "out", data=data_dir,
                               extra="[method_set.depth_attention]\nlr = 0.004\n"), encoding="utf-8")
    assert main(["study", "run", str(path), "--jobs", "2"]) == 0
    lrs = {m: RunFolder(tmp_path / f"out/toy-s0-{m}/runs/{m}-seed0").read_run()["train"]["lr"]
           for m in ("none", "depth_attention")}
    assert lrs == {"none": 0.002, "depth_attention": 0.004}
    tuned = load_study(path)
    c = collect(tuned)["toy"]
    assert cell_stats(tuned, c)["depth_attention"]["seeds"] == [0] and c.excluded == []
    assert main(["study", "report", str(path)]) == 0
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "; per method: `depth_attention` lr=0.004; 2 finished runs." in report
    assert "| toy | `depth_attention` |" in report and "Runs not paired" not in report
    plain = tmp_path / "plain.toml"
    plain.write_text(TOY.format(out=tmp_path / "out", data=data_dir, extra=""), encoding="utf-8")
    shared = load_study(plain)
    c = collect(shared)["toy"]
    assert cell_stats(shared, c) == {}
    assert c.excluded == ["toy: `depth_attention` seed 0 not paired with `none`: lr: 0.004 vs 0.002"]
