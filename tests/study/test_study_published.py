"""``depthattn study report --published``: docs/results.md is the report of the study files of studies/small-scale
and the committed parts of results/small-scale, byte for byte; a study file's part is published when its runs are,
in whichever files; a published part outside the study files is refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.study import published
from depthattn.study import results_page

ROOT = Path(__file__).resolve().parents[2]


def checkout(tmp_path: Path, monkeypatch) -> None:
    """The study files and published parts placed as in the checkout (the report's links are relative to them),
    the current folder tmp_path (the figure goes to tmp_path/docs/img)."""
    (tmp_path / "results").symlink_to(ROOT / "results", target_is_directory=True)
    (tmp_path / "studies").symlink_to(ROOT / "studies", target_is_directory=True)
    monkeypatch.chdir(tmp_path)


def test_the_committed_parts_rebuild_the_committed_results_md(tmp_path, monkeypatch, capsys):
    checkout(tmp_path, monkeypatch)
    assert main(["study", "report", "--published", "results/small-scale"]) == 0  # default --out docs/results.md
    assert capsys.readouterr().out.strip() == "wrote docs/results.md"
    text = (tmp_path / "docs" / "results.md").read_text(encoding="utf-8")
    assert text == (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert (tmp_path / "docs" / published.DEPTH_FIGURE).read_bytes()[:4] == b"\x89PNG"


def test_a_part_is_published_by_its_runs_whatever_file_holds_them(tmp_path):
    """loops-a.json holds seeds 0 and 1 of loops.toml (its parts loops-s0, loops-s1); without loops-b.json (seed 2)
    the report names loops-s2 as not run, and the parts still published are listed in the study's order."""
    studies = published.load_studies(ROOT / "studies" / "small-scale")
    parts = published.plan(studies)
    tuned = {g: 3 * len(studies[g].methods) for g in ("lr4cpu", "lr4cpunb")}  # seeds 0, 1, 2 per method
    assert len(parts) == 88 + 32 + sum(tuned.values()) and parts[0].name == "main-s0" and \
        parts[87].name == "mix4cpu-s2-attnres"
    assert [p.name for p in parts[88:90]] == ["lr1cpu-lr0.001-s0-none", "lr1cpu-lr0.001-s0-depth_attention"]
    assert parts[-1].name == "lr4cpunb-s2-depth_attention"  # the learning-rate study last: sweep, then tuned
    pub = tmp_path / "pub"
    shutil.copytree(ROOT / "results" / "small-scale", pub)
    every = published.load_published(pub, studies)
    assert published.done_parts(parts, every, studies) == {p.name for p in parts} - {
        f"mix16-s{s}-{m}" for s, m in [(0, "depth_attention"), (1, "depth_attention"), (2, "depth_attention"),
                                       (2, "depth_attention_uniform"), (0, "attnres"), (1, "attnres")]} - {
        f"mix4-s{s}-{m}" for s in (1, 2) for m in ("none", "depth_attention", "depth_attention_uniform", "attnres")
        if (s, m) != (1, "none")} - {p.name for p in parts if p.group.startswith("lr")  # the sweep, as far as run
                                     and not (pub / f"{p.name}.json").is_file()}
    (pub / "loops-b.json").unlink()
    rest = published.load_published(pub, studies)
    done = published.done_parts(parts, rest, studies)
    assert {"loops-s0", "loops-s1"} <= done and "loops-s2" not in done
    names = [r["study"]["part"] for r in rest]
    assert names[:6] == ["main-s0", "main-s1", "main-s2", "loops-a", "ablation-1w0-s0", "ablation-2w0-s0"]
    text = results_page.aggregate(ROOT / "studies" / "small-scale", pub, tmp_path / "docs" / "results.md")
    if all((pub / f"{p.name}.json").is_file() for p in parts if p.group.startswith("lr")):
        # the committed learning-rate study is complete: its parts are counted with the rest
        assert f"**Incomplete:** 14 of {len(parts)} parts are not yet run (loops-s2, mix16-s0-depth_attention," in text
        assert "learning-rate study is not complete" not in text
        (pub / "lr4cpunb-s2-depth_attention.json").unlink()
        text = results_page.aggregate(ROOT / "studies" / "small-scale", pub, tmp_path / "docs" / "results.md")
    assert "**Incomplete:** 14 of the 88 parts outside the learning-rate study are not yet run (loops-s2, " \
           "mix16-s0-depth_attention," in text
    n = {g: len(list(pub.glob(f"{g}-*.json"))) for g in ("lr1cpu", "lr4cpu", "lr4cpunb")}
    assert f"**The learning-rate study is not complete:** published parts per group: lr1cpu {n['lr1cpu']} of 32, " \
           f"lr4cpu {n['lr4cpu']} of {tuned['lr4cpu']}, lr4cpunb {n['lr4cpunb']} of {tuned['lr4cpunb']};" in text


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["study"].update(group="nope"), r"group 'nope' has no study file"),
    (lambda r: r["settings"]["model_overrides"].update(depth_attention_window=7),
     r"ablation-1w0-s0: its settings .* are no cell of .*ablation.toml"),
])
def test_a_published_part_outside_the_study_files_is_one_line(tmp_path, capsys, edit, message):
    pub = tmp_path / "pub"
    pub.mkdir()
    record = json.loads((ROOT / "results/small-scale/ablation-1w0-s0.json").read_text(encoding="utf-8"))
    edit(record)
    (pub / "ablation-1w0-s0.json").write_text(json.dumps(record), encoding="utf-8")
    assert main(["study", "report", "--published", str(pub), "--studies", str(ROOT / "studies/small-scale"),
                 "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert main(["study", "report"]) == 2 and "give a study FILE, or --published" in capsys.readouterr().err
