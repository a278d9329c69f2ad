"""A study file's parts beyond one compare per seed: one part per method (``per_method``), methods on fewer seeds
(``[method_seeds]``), cells listed one by one (``cells``), and a one-cell study naming its parts after itself; the
published small-scale studies (studies/small-scale/) expand to the parts of results/small-scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from depthattn.study import load_study

from helpers import small_study as study

ROOT = Path(__file__).resolve().parents[2]


def test_per_method_parts_train_one_method_each_and_method_seeds_drop_a_methods_other_seeds(tmp_path):
    s = study(tmp_path, "per_method = true\n[method_seeds]\nattnres = [0, 2]\n")
    parts = s.parts()
    assert [p.name for p in parts] == ["s-s0-none", "s-s0-depth_attention", "s-s0-attnres", "s-s1-none",
                                       "s-s1-depth_attention", "s-s2-none", "s-s2-depth_attention", "s-s2-attnres"]
    argv = s.compare_argv(parts[2])
    assert argv[argv.index("--methods") + 1] == "attnres" and argv[argv.index("--seeds") + 1] == "0"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "out" / "s-s0-attnres")
    whole = study(tmp_path, "[method_seeds]\nattnres = [1]\n").parts()  # one part per seed: attnres only in s1
    assert [(p.name, p.methods) for p in whole] == [("s-s0", ("none", "depth_attention")),
                                                    ("s-s1", ("none", "depth_attention", "attnres")),
                                                    ("s-s2", ("none", "depth_attention"))]


def test_listed_cells_are_the_cells_in_their_order_and_a_many_cell_study_keeps_budget_names(tmp_path):
    s = study(tmp_path, "cells = [{depth_attention_window = 2, depth_attention_stride = 1}, "
                        "{depth_attention_window = 0}]\nbudgets = [1, 2]\n")
    assert [p.name for p in s.parts() if p.seed == 0] == [
        "s-b1-depth_attention_window2-depth_attention_stride1-s0", "s-b1-depth_attention_window0-s0",
        "s-b2-depth_attention_window2-depth_attention_stride1-s0", "s-b2-depth_attention_window0-s0"]
    argv = s.compare_argv(s.parts()[0])
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == ["depth_attention_window=2",
                                                                        "depth_attention_stride=1"]
    assert {p.steps for p in s.parts()} == {4, 8}


@pytest.mark.parametrize("extra, message", [
    ("per_method = 1\n", r"`per_method = 1` must be true or false"),
    ("[method_seeds]\nmhc = [0]\n", r"\[method_seeds\] `mhc` is not one of methods"),
    ("[method_seeds]\nattnres = [0, 5]\n", r"`attnres = \[0, 5\]` names a seed not in seeds \[0, 1, 2\]"),
    ("cells = []\n", r"`cells = \[\]` must be a non-empty list of tables"),
    ("cells = [{lr = 1e-3}, {lr = 0.001}]\n", r"`cells` lists a cell twice"),
    ("cells = [{lr = 1e-3}]\n[grid]\nlr = [1e-3]\n", r"`cells` and \[grid\] both given"),
    ("cells = [{seed = 3}]\n", r"`seed` in \[set\]/\[grid\]: the study sets it with `seeds`"),
    ("cells = [{lr = -1.0}]\n", r"part s: .*lr"),
])
def test_a_bad_part_layout_is_one_line_naming_the_file(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message) as e:
        study(tmp_path, extra)
    assert str(e.value).startswith(str(tmp_path / "s.toml")) and "\n" not in str(e.value)


def test_the_small_scale_study_files_expand_to_the_published_parts_names():
    """Each group of docs/results.md is one study file whose parts, where a part trains one method (the budget
    study), are named as results/small-scale names them; the budget study has 35 parts on each device."""
    studies = {p.stem: load_study(p) for p in sorted((ROOT / "studies" / "small-scale").glob("*.toml"))}
    assert set(studies) == {"main", "loops", "ablation", "long", "mix16", "mix4", "mix1", "mix16cpu", "mix4cpu",
                            "mix1cpu", "lr1cpu", "lr4cpu", "lr4cpunb"}
    assert {s.publish for s in studies.values()} == {Path("results/small-scale").absolute()}  # from the checkout
    published = {p.stem for p in (ROOT / "results" / "small-scale").glob("*.json")}
    for name in ("mix16", "mix4", "mix1", "mix16cpu", "mix4cpu", "mix1cpu"):
        parts = studies[name].parts()
        assert all(len(p.methods) == 1 for p in parts)
        if name.endswith("cpu"):  # the CPU twins are complete: every part is a published file
            assert {p.name for p in parts} <= published
    assert sum(len(studies[g].parts()) for g in ("mix16", "mix4", "mix1")) == 35
    assert sum(len(studies[g].parts()) for g in ("mix16cpu", "mix4cpu", "mix1cpu")) == 35
    assert [p.name for p in studies["main"].parts()] == ["main-s0", "main-s1", "main-s2"]
