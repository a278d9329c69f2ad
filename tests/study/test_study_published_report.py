"""The report of the small-scale study's published files (``depthattn.study.published``, with the study files of
studies/small-scale) that builds docs/results.md from them: pairing, verdicts, budget trends, the CPU twins'
cross-check, depth statistics; and a part's file (``partfile``), which keeps what the report reads."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from depthattn.study import groups as study_groups
from depthattn.study import depth as study_depth
from depthattn.study import partfile as study_results
from depthattn.study import published as study_report
from depthattn.study import results_page
from depthattn.study import trend as study_trend
from helpers import hand_made_results as results

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies" / "small-scale"


def aggregate(publish: Path, out: Path) -> str:
    """docs/results.md (``out``) from the parts published under ``publish`` and the study files of
    studies/small-scale (``depthattn study report --published``)."""
    return results_page.aggregate(STUDIES, publish, out)


def test_pairing_ignores_settings_that_do_not_change_a_trajectory():
    """Runs that differ in compile or saving pair; in lr or in device they do not (a fresh run draws its initial
    weights on its device, so a CPU and a CUDA run of one seed start from other weights)."""
    base = results(seeds=(0,))
    none = dict(base["methods"]["none"]["runs"][0], train_settings=dict(base["settings"]["train"], device="cuda"),
                data="d", tokens=100)
    fast = dict(none, val_loss=none["val_loss"] - 0.1,
                train_settings=dict(none["train_settings"], compile=True, save_every=0, save_every_minutes=5))
    pair = study_report.paired_runs("depth_attention", {0: fast}, {0: none})
    assert pair[2]["mean"] == pytest.approx(-0.1)
    trend = study_trend
    trend.check_pairable({"mix1": {"none": {0: none}}, "mix16": {"x": {0: fast}}}, ["mix1", "mix16"])
    for change in ({"lr": 1.0}, {"device": "cpu"}):
        other = dict(fast, train_settings=dict(fast["train_settings"], **change))
        with pytest.raises(ValueError, match="other settings; cannot pair"):
            study_report.paired_runs("depth_attention", {0: other}, {0: none})
        with pytest.raises(ValueError, match="other settings"):
            trend.check_pairable({"mix1": {"none": {0: none}}, "mix16": {"x": {0: other}}}, ["mix1", "mix16"])


def test_aggregate_without_parts_says_not_run(tmp_path):
    text = aggregate(tmp_path / "pub", tmp_path / "results.md")
    assert "**The study has not been run yet.**" in text and "|" not in text
    assert (tmp_path / "results.md").read_text() == text


def publish(folder: Path, part: str, group: str, res: dict, label: str = "", depth: dict | None = None,
            **record) -> None:
    """Publish compare's ``res`` as part ``part`` of ``group`` under ``folder``, with the runs' ``depth`` rows
    (``{method: {str(seed): rows}}``) and any other study ``record`` fields (hardware, jobs …)."""
    from depthattn.study.partfile import compact, dumps, path

    if group == "ablation":  # the cell's settings, as compare records them
        stride, window = (x.split("=")[1] for x in label.split(", "))
        overrides = {"depth_attention_window": int(window)}
        if stride != "L/2":
            overrides["depth_attention_stride"] = int(stride)
        res = dict(res, settings=dict(res["settings"], model_overrides=overrides))
    res = dict(res, study={"part": part, "group": group, "label": label, "command": f"depthattn compare # {part}",
                           **record})
    folder.mkdir(parents=True, exist_ok=True)
    path(folder, part).write_text(dumps(compact(res, depth or {})))


def test_aggregate_pairs_across_parts(tmp_path):
    pub = tmp_path / "pub"
    main = results(seeds=(0, 1, 2))
    publish(pub, "main-s0", "main", main)
    ablation = results(seeds=(0, 1))
    del ablation["methods"]["none"]
    for r, v in zip(ablation["methods"]["depth_attention"]["runs"], (4.9, 5.2)):
        r["val_loss"] = v
    publish(pub, "ablation-1w0-s0", "ablation", ablation, label="stride=1, window=0")
    text = aggregate(pub, tmp_path / "results.md")
    assert "**Incomplete:**" in text and "main-s1" in text
    assert f"run with the code of {study_report.PUBLISHED_WITH}" in text  # the tables say which code made them
    lines = text.splitlines()
    da = next(line for line in lines if line.startswith("| depth_attention | 3 |"))
    assert "-0.0180 ± 0.0269 | -0.0848 to +0.0488 | 2 of 3 |" in da
    # the ablation run is paired with main's none of the same seed: Δ = 4.9 − 5.0, 5.2 − 5.1
    abl = next(line for line in lines if line.startswith("| depth_attention (stride=1, window=0) |"))
    half = 12.7062 * math.sqrt(0.02) / math.sqrt(2)
    assert f"| +0.0000 ± {math.sqrt(0.02):.4f} | {-half:+.4f} to {half:+.4f} | 1 of 2 |" in abl
    assert "depth_attention (stride=L/2, window=0; from main)" in text
    assert "`depthattn compare # main-s0`" in text and "[main-s0](pub/main-s0.json)" in text


def test_aggregate_states_each_result_in_words(tmp_path):
    pub = tmp_path / "pub"
    main = results(seeds=(0, 1, 2))  # depth_attention: Δ = −0.026, +0.012, −0.040 (interval includes 0)
    publish(pub, "main-s0", "main", main)
    clear = results(seeds=(0, 1))
    del clear["methods"]["none"]
    for r, v in zip(clear["methods"]["depth_attention"]["runs"], (4.80, 4.91)):  # Δ = −0.20, −0.19
        r["val_loss"] = v
    publish(pub, "ablation-1w0-s0", "ablation", clear, label="stride=1, window=0")
    text = aggregate(pub, tmp_path / "results.md")
    assert ("- `depth_attention`: Δ -0.018 ± 0.027 nats over 3 seeds (95 % interval -0.085 to +0.049; 2 of 3 seeds "
            "lower): inconclusive at this budget (the 95 % interval includes 0).") in text
    half = 12.7062 * 0.01 / math.sqrt(2) / math.sqrt(2)  # t(1) · std / √2, std of (−0.20, −0.19) = 0.01/√2
    assert (f"- `depth_attention (stride=1, window=0)`: Δ -0.195 ± 0.007 nats over 2 seeds (95 % interval "
            f"{-0.195 - half:+.3f} to {-0.195 + half:+.3f}; 2 of 2 seeds lower): lower at this budget (the 95 % "
            "interval excludes 0).") in text


def test_aggregate_refuses_to_pair_other_budgets(tmp_path):
    pub = tmp_path / "pub"
    publish(pub, "main-s0", "main", results(seeds=(0,)))
    other = results(seeds=(0,))
    del other["methods"]["none"]
    other["methods"]["depth_attention"]["runs"][0]["tokens"] = 999
    publish(pub, "ablation-1w0-s0", "ablation", other, label="stride=1, window=0")
    with pytest.raises(ValueError, match="other settings; cannot pair"):
        aggregate(pub, tmp_path / "results.md")


def test_cross_check_compares_the_cpu_and_gpu_runs_of_a_seed(tmp_path):
    pub = tmp_path / "pub"
    gpu = results(seeds=(0,))  # none 5.0, depth_attention 4.974 on seed 0
    cpu = copy.deepcopy(gpu)
    cpu["methods"]["none"]["runs"][0]["val_loss"] = 5.002
    uniform = copy.deepcopy(cpu)  # the CPU group's uniform control, a part of its own
    del uniform["methods"]["none"]
    uniform["methods"] = {"depth_attention_uniform": uniform["methods"]["depth_attention"]}
    uniform["methods"]["depth_attention_uniform"]["runs"][0]["val_loss"] = 4.96
    rows = [{"step": 2, "depth/L1/entropy": 1.0, "depth/L1/from0": 0.5}]  # only the CPU run logged depth statistics
    publish(pub, "mix16-s0-none", "mix16", gpu, hardware="NVIDIA H200 (CUDA), torch 2.11.0", jobs=16)
    publish(pub, "mix16cpu-s0-none", "mix16cpu", cpu, depth={"depth_attention": {"0": rows}})
    publish(pub, "mix16cpu-s0-depth_attention_uniform", "mix16cpu", uniform)
    text = aggregate(pub, tmp_path / "docs" / "results.md")
    assert "mean over seeds 0. Seed 0: the run trained on the CPU (`mix16cpu`)." in text
    assert (tmp_path / "docs" / study_report.DEPTH_FIGURE).read_bytes()[:4] == b"\x89PNG"
    assert "| none | 0 | 5.0020 | 5.0000 | -0.0020 |" in text and "not rounding" in text
    assert "`depth_attention` − `none` on seed 0: -0.0280 nats on the CPU, -0.0260 on the GPU." in text
    assert "; on NVIDIA H200 (CUDA), torch 2.11.0, up to 16 at a time sharing it" in text
    assert f"; on {study_report.CPU_MACHINE}, one after another" in text
    # the CPU group says how Depth-Attention stands against its control (the GPU groups: in the trend table)
    said = "- `depth_attention` − `depth_attention_uniform`: Δ +0.014 nats on one seed: inconclusive (one seed"
    assert text.count(said) == 1 and text.index(said) > text.index("trained on the 2-core CPU")


def test_published_study_files_hold_no_machine_paths():
    """docs/results.md and results/ are read on other machines: no absolute path of the one that ran the study."""
    files = [ROOT / "docs" / "results.md", *(ROOT / "results").rglob("*.json"), *(ROOT / "results").rglob("*.md")]
    offenders = [str(f.relative_to(ROOT)) for f in files
                 if any(p in f.read_text(encoding="utf-8") for p in ("/work/", "/home/", "/root/", "/tmp/"))]
    assert offenders == []


def test_a_published_part_keeps_what_the_report_reads_and_drops_the_rest(tmp_path):
    """A part's file round-trips compare's run records but their per-step lists and sample, which it drops, as it
    drops the summaries compare recomputes from the runs; a file of another format is refused in one line."""
    from depthattn.compare import aggregate, conclusions, paired_stats

    sr = study_results
    res = results(seeds=(0, 1))
    res["study"] = {"part": "main-s0", "group": "main", "label": "", "command": "depthattn compare"}
    rows = [{"step": 2, "depth/L1/entropy": 1.0}, {"step": 4, "depth/L1/entropy": 0.5}]
    text = sr.dumps(sr.compact(res, {"depth_attention": {"1": rows}}))
    assert json.loads(text)["methods"]["none"]["runs"][0]["curve"] == {
        "step": [1, 2, 3], "tokens": [100, 200, 400], "val_loss": [6.0, 5.5, 5.0]}  # columns, one line each
    assert '"val_loss": [6.0, 5.5, 5.0]' in text
    (tmp_path / "main-s0.json").write_text(text)
    back = sr.load(tmp_path / "main-s0.json")
    dropped = ("train_curve", "step_tokens_per_s", "sample")
    for method, m in res["methods"].items():
        for r, b in zip(m["runs"], back["methods"][method]["runs"], strict=True):
            assert {k: v for k, v in b.items() if k != "depth"} == {k: v for k, v in r.items() if k not in dropped}
        assert aggregate(back["methods"][method]["runs"]) == {k: m[k] for k in ("mean", "std")}
    assert [r.get("depth") for r in back["methods"]["depth_attention"]["runs"]] == [None, rows]
    assert paired_stats(back) == res["paired"] and "paired" not in back and "conclusion" not in back
    assert conclusions(dict(back, paired=paired_stats(back))) == res["conclusion"]
    assert back["study"] == res["study"] and back["settings"] == res["settings"] and back["history"] == res["history"]
    (tmp_path / "old.json").write_text(json.dumps(res))  # compare's own results.json is not a published part
    with pytest.raises(ValueError, match=r"old.json is not a published study part \(format None"):
        sr.load(tmp_path / "old.json")


def with_method(res: dict, method: str, offsets: dict[int, float]) -> dict:
    """``res`` with ``method``'s runs: none's runs of each seed with val_loss = none's + offsets[seed]."""
    import copy

    res = copy.deepcopy(res)
    runs = []
    for r in res["methods"]["none"]["runs"]:
        runs.append(dict(r, method=method, val_loss=r["val_loss"] + offsets[r["seed"]]))
    res["methods"][method] = {"runs": runs}
    return res


def test_budget_trend_pairs_seeds_across_budgets_and_says_what_moved(tmp_path):
    """The mix's trend table and sentences: Δ per budget, and the change 1 × → 16 × paired over seeds, called a
    widening only when its interval excludes 0 (issue 28)."""
    pub = tmp_path / "pub"
    one = with_method(results(), "depth_attention_uniform", {0: -0.05, 1: -0.05, 2: -0.05})
    # 1 ×: depth_attention − none = −0.026, +0.012, −0.040 (results()); depth_attention − uniform = +0.024, ...
    publish(pub, "mix1-s0-none", "mix1", one)
    sixteen = with_method(results(), "depth_attention_uniform", {0: -0.2, 1: -0.2, 2: -0.2})
    for r, off in zip(sixteen["methods"]["depth_attention"]["runs"], (-0.10, -0.12, -0.11)):
        r["val_loss"] = {0: 5.0, 1: 5.1, 2: 4.9}[r["seed"]] + off
    rows = [{"step": 2, "depth/L1/entropy": 1.0, "depth/L1/from0": 0.5, "depth/L2/entropy": 1.1},
            {"step": 4, "depth/L1/entropy": 0.8, "depth/L1/from0": 0.6, "depth/L2/entropy": 0.9}]
    publish(pub, "mix16-s0-none", "mix16", sixteen, depth={"depth_attention": {"0": rows, "1": rows}})
    out = tmp_path / "docs" / "results.md"
    text = aggregate(pub, out)
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| `depth_attention` − `none` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].startswith("-0.0180 ± 0.0269 [-0.0848, +0.0488] (2 of 3 lower)")
    assert cells[2].startswith("-0.1100 ± 0.0100") and cells[2].endswith("(3 of 3 lower)")
    change = [-0.10 + 0.026, -0.12 - 0.012, -0.11 + 0.040]
    d = study_report.paired_difference(change, [0.0] * 3)
    assert d["ci95"][1] < 0
    said = next(line for line in lines if line.startswith("- `depth_attention` − `none`:"))
    assert f"change {d['mean']:+.3f} (95 % interval {d['ci95'][0]:+.3f} to {d['ci95'][1]:+.3f})" in said
    assert "-0.018 nats at 1 × and -0.110 at 16 ×" in said and "the gap **widens**" in said
    uni = next(line for line in lines if line.startswith("- `depth_attention` − `depth_attention_uniform`:"))
    assert "no change detectable" in uni and "**" not in uni  # change +0.058, interval includes 0
    assert "| `depth_attention` − `depth_attention_uniform` | +0.0320" in text
    assert (out.parent / study_report.DEPTH_FIGURE).read_bytes()[:4] == b"\x89PNG"
    assert f"]({study_report.DEPTH_FIGURE.as_posix()})" in text
    assert "not published yet" not in text and "Training time per run:" in text


def test_cpu_twins_have_a_trend_of_their_own_never_paired_with_the_gpus(tmp_path):
    """The budget trend of the CPU twins (mix1cpu … mix16cpu) is a section of its own: paired among themselves,
    while the GPU's trend, whose runs have another device setting, says what it lacks."""
    pub = tmp_path / "pub"
    one = with_method(results(), "depth_attention_uniform", {0: -0.05, 1: -0.05, 2: -0.05})
    sixteen = with_method(results(), "depth_attention_uniform", {0: -0.2, 1: -0.2, 2: -0.2})
    for r, off in zip(sixteen["methods"]["depth_attention"]["runs"], (-0.10, -0.12, -0.11)):
        r["val_loss"] = {0: 5.0, 1: 5.1, 2: 4.9}[r["seed"]] + off
    gpu = copy.deepcopy(one)
    gpu["settings"]["train"] = dict(gpu["settings"]["train"], device="cuda")
    publish(pub, "mix1-s0-none", "mix1", gpu)
    publish(pub, "mix1cpu-s0-none", "mix1cpu", one)
    publish(pub, "mix16cpu-s0-none", "mix16cpu", sixteen)
    text = aggregate(pub, tmp_path / "docs" / "results.md")
    # the CPU's set has more of its parts published (2 of 35 against 1 of 35), so its trend comes first
    cpu_trend, gpu_trend = text.split("## Public-domain mix on the GPU")[:2]
    cpu_trend = cpu_trend.split("## Public-domain mix on the CPU")[1]
    assert "The 16 × parts are not published yet, so no change across budgets is stated." in gpu_trend
    assert gpu_trend.startswith(" (paired among themselves): does the gap move")
    assert cpu_trend.startswith(" (the CPU twins' runs, paired among themselves): does the gap move")
    assert "**Incomplete:**" in text and "**Complete" not in text
    said = next(line for line in cpu_trend.splitlines() if line.startswith("- `depth_attention` − `none`:"))
    assert "-0.018 nats at 1 × and -0.110 at 16 ×" in said and "the gap **widens**" in said
    assert "## Public-domain mix, the default budget, trained on the 2-core CPU" in text
    assert "## Cross-check: the same 1 × runs on the CPU and on the GPU" in text


def test_depth_stats_are_extracted_from_metrics_rows(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 9.0}\n{"step": 100, "depth/L1/entropy": 0.5, "grad_norm/L1": 2.0}\n\n')
    assert study_depth.extract(tmp_path) == [{"step": 100, "depth/L1/entropy": 0.5}]
    metrics.write_text('{"step": 1}\n{"step": 2, "depth/L1/self": 0.25}\n{"step": 3,')  # a torn last line
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        assert study_depth.extract(tmp_path) == [{"step": 2, "depth/L1/self": 0.25}]
    metrics.write_text('{"step": 1,\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl"):
        study_depth.extract(tmp_path)


@pytest.mark.parametrize("first, last, word", [
    ((-0.20, -0.21, -0.19), (0.002, 0.001, 0.0), "narrows"),     # the gap closed: its 16 × interval includes 0
    ((-0.20, -0.21, -0.19), (0.10, 0.12, 0.11), "reverses"),     # now significantly the other way
    ((-0.20, -0.21, -0.19), (-0.30, -0.32, -0.31), "widens"),
    ((0.05, 0.06, 0.04), (0.20, 0.22, 0.19), "widens"),          # a method behind falls further behind
    ((-0.20, -0.21, -0.19), (-0.20, -0.15, -0.25), None)])       # change 0 ± 0.05: inconclusive
def test_change_sentence_words_follow_the_intervals(first, last, word):
    trend = study_trend
    said = trend.change_sentence("m", "none", dict(enumerate(first)), dict(enumerate(last)))
    if word is None:
        assert "no change detectable" in said and "**" not in said
    else:
        assert f"the gap **{word}** with training" in said


def test_trend_of_partial_publication_says_what_is_missing(tmp_path):
    pub = tmp_path / "pub"
    only_none = results()
    del only_none["methods"]["depth_attention"]
    publish(pub, "mix16-s0-none", "mix16", only_none)
    text = aggregate(pub, tmp_path / "results.md")
    assert "No method beside `none` is published yet." in text and "| `depth_attention` − `none` |" not in text
    publish(pub, "mix16-s0-depth_attention", "mix16", results())
    text = aggregate(pub, tmp_path / "results.md")
    assert "The 1 × parts are not published yet" in text
    other = results()
    other["settings"]["train"] = dict(other["settings"]["train"], lr=5e-3)
    publish(pub, "mix1-s0-none", "mix1", other)
    with pytest.raises(ValueError, match="budget groups were trained with other settings"):
        aggregate(pub, tmp_path / "results.md")


def test_depth_figure_series_average_seeds_over_the_steps_every_seed_logged():
    rows0 = [{"step": 100, "depth/L1/entropy": 1.0, "depth/L1/from0": 0.2}, {"step": 200, "depth/L1/entropy": 0.5}]
    rows1 = [{"step": 100, "depth/L1/entropy": 0.6}, {"step": 200, "depth/L1/entropy": 0.3},
             {"step": 300, "depth/L1/entropy": 0.1}]  # step 300: seed 0 has none, so it is left out
    series = study_depth.layer_series({0: rows0, 1: rows1}, "entropy")
    assert series == {1: ([100, 200], [pytest.approx(0.8), pytest.approx(0.4)])}
    assert study_depth.layer_series({0: rows0, 1: rows1}, "from0") == {}  # seed 1 logged no layer-0 weight


def test_the_report_leads_with_the_budget_set_that_is_complete(tmp_path):
    """When every part is published but some of the GPU's budget-study runs, the report says the study is complete
    on the CPU and partial on the GPU, naming the missing parts, and its CPU sections come before the GPU's; one
    missing part outside the GPU's set makes it plainly incomplete again."""
    parts = study_report.plan(study_report.load_studies(STUDIES))
    gpu = [p.name for p in parts if p.group in ("mix16", "mix4", "mix1")]
    done = {p.name for p in parts} - set(gpu[:2])
    said = study_report.completeness(parts, done)[0]
    assert said.startswith("**Complete on the 2-core CPU:** the budget study's 35 parts (groups mix16cpu, mix4cpu, "
                           "mix1cpu) are all published")
    assert f"**Partial on the GPU:** 2 of the 35 parts that train the same runs on the GPU are not yet run " \
           f"({gpu[0]}, {gpu[1]})" in said
    assert study_groups.set_order(parts, done) == ["on the 2-core CPU", "on the GPU"]
    assert study_groups.set_order(parts, set()) == ["on the GPU", "on the 2-core CPU"]  # a tie: the GPU's
    assert study_report.completeness(parts, done - {"main-s0"})[0].startswith(
        f"**Incomplete:** 3 of {len(parts)} parts")
    tuned = [p.name for p in parts if p.group == "lr4cpu"]
    assert study_report.completeness(parts, done - {tuned[0]})[0].startswith(  # said apart
        "**Complete on the 2-core CPU:** the budget study's 35 parts (groups mix16cpu, mix4cpu, mix1cpu) are all "
        "published, and so is every part outside the budget study and the learning-rate study.")
    assert study_report.completeness(parts, done - {tuned[0]})[2].startswith(
        "**The learning-rate study is not complete:** published parts per group: lr1cpu 32 of 32, lr4cpu "
        f"{len(tuned) - 1} of {len(tuned)},")
    assert study_report.completeness(parts, {p.name for p in parts}) == []
    # the report follows that order: the CPU's 16 x table before the GPU's
    pub = tmp_path / "pub"
    gpu_run = results(seeds=(0,))
    gpu_run["settings"]["train"] = dict(gpu_run["settings"]["train"], device="cuda")
    publish(pub, "mix16-s0-none", "mix16", gpu_run)
    publish(pub, "mix16cpu-s0-none", "mix16cpu", results(seeds=(0,)))
    publish(pub, "mix16cpu-s1-none", "mix16cpu", results(seeds=(1,)))
    text = aggregate(pub, tmp_path / "docs" / "results.md")
    assert text.index("## Public-domain mix, 16 ×, trained on the 2-core CPU") < text.index(
        "## Public-domain mix, 16 × the default budget (6.55 M tokens), trained on the GPU")


def test_the_trend_names_the_middle_budget_on_the_way():
    first, middle, last = {0: -0.1, 1: -0.1}, {0: -0.2, 1: -0.3}, {0: -0.3, 1: -0.31}
    change_sentence = study_trend.change_sentence
    said = change_sentence("depth_attention", "none", first, last, ("1 ×", "16 ×"), (("4 ×", middle),))
    assert said.startswith("- `depth_attention` − `none`: -0.100 nats at 1 ×, -0.250 at 4 × and -0.305 at 16 × "
                           "(seeds 0, 1); change -0.205")
    partial = change_sentence("depth_attention", "none", first, last, ("1 ×", "16 ×"), (("4 ×", {0: -0.2}),))
    assert "-0.100 nats at 1 × and -0.305 at 16 ×" in partial  # a middle budget lacking a seed is not named


def test_depth_table_sets_the_learned_weights_beside_uniform_ones():
    """Per layer: N counts the layer's own value and every source it logged a weight for; the entropy and layer-0
    weight at the first and last step both seeds logged are their means, beside ln N and 1/N."""
    def row(step, ent, w0):
        return {"step": step, "depth/L1/entropy": ent, "depth/L1/from0": w0, "depth/L1/self": 1 - w0,
                "depth/L5/entropy": ent, "depth/L5/from0": w0, "depth/L5/from4": 0.1, "depth/L5/self": 0.5}
    by_seed = {0: [row(10, 0.2, 0.9), row(20, 0.4, 0.5), row(30, 9.0, 9.0)],  # step 30: seed 0 only
               1: [row(10, 0.4, 0.7), row(20, 0.6, 0.3)]}
    lines = study_depth.table(by_seed, tokens_per_step=1000)
    assert lines[0].startswith("At the first and last logged step (10,000 and 20,000 training tokens)")
    assert "| 1 | 2 | 0.300 → 0.500 | 0.693 | 0.800 → 0.400 | 0.500 |" in lines
    assert "| 5 | 3 | 0.300 → 0.500 | 1.099 | 0.800 → 0.400 | 0.333 |" in lines
    assert study_depth.table({0: [{"step": 1, "depth/layer0": 0.5}]}, 1000) == []
