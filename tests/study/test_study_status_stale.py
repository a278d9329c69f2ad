"""A part done under other settings than its study file now gives is **stale** (``study.status``): not done, left
alone by ``study run``, named with the settings that differ."""

from __future__ import annotations

import json

from depthattn.study import load_study
from depthattn.study.runner import todo
from depthattn.study.status import part_status, render_status, study_status

TOML = """
name = "s"
out = "{out}"
data = "D"
preset = "tiny"
methods = ["none", "depth_attention"]
seeds = [0]
steps = 4
per_method = true
[set]
weight_decay = 0.05
[grid]
depth_attention_window = [0, 2]
[method_set.depth_attention]
lr = 0.004
"""


def finish(part, lr: float, window: int, weight_decay: float = 0.05) -> None:
    """The results.json compare writes last, as far as the status reads it."""
    part.folder.mkdir(parents=True)
    res = {"settings": {"train": {"steps": part.steps, "lr": lr, "weight_decay": weight_decay},
                        "model_overrides": {"depth_attention_window": window}},
           "methods": {m: {"runs": [{"seed": part.seed}]} for m in part.methods}}
    (part.folder / "results.json").write_text(json.dumps(res), encoding="utf-8")


def test_a_part_ran_with_other_settings_is_stale_named_and_left_alone(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(TOML.format(out=tmp_path / "out"), encoding="utf-8")
    study = load_study(path)
    parts = {p.name: p for p in study.parts()}
    finish(parts["s-depth_attention_window0-s0-depth_attention"], 0.004, 0)  # as the file says
    finish(parts["s-depth_attention_window2-s0-depth_attention"], 0.002, 2)  # its [method_set] lr was edited since
    finish(parts["s-depth_attention_window2-s0-none"], 2e-3, 2, weight_decay=0.1)  # [set] edited since
    states = {s.part.name: (s.state, s.why) for s in study_status(study)}
    assert states["s-depth_attention_window0-s0-depth_attention"] == ("done", "")
    assert states["s-depth_attention_window2-s0-depth_attention"] == (
        "stale", "lr: ran with 0.002, the study file says 0.004")
    assert states["s-depth_attention_window2-s0-none"] == (
        "stale", "weight_decay: ran with 0.1, the study file says 0.05")
    assert states["s-depth_attention_window0-s0-none"] == ("missing", "")
    said = []
    assert [p.name for p in todo(study, list(parts.values()), said.append)] == ["s-depth_attention_window0-s0-none"]
    assert any(line.startswith("s-depth_attention_window2-s0-depth_attention: done with other settings than the "
                               "study file's (lr: ran with 0.002, the study file says 0.004)") for line in said)
    assert "1 done, 2 stale, 0 running, 0 incomplete, 1 missing" in render_status(study_status(study))
    assert part_status(study, parts["s-depth_attention_window2-s0-none"]).runs == {"none": "not started"}


def test_a_parts_device_is_its_settings_including_its_methods_own(tmp_path):
    from depthattn.study.invocations import part_device

    path = tmp_path / "s.toml"
    path.write_text(TOML.format(out=tmp_path / "out") + 'device = "cpu"\n', encoding="utf-8")  # [method_set.da]
    study = load_study(path)
    devices = {p.name: part_device(study, p) for p in study.parts() if p.cell == "s-depth_attention_window0"}
    assert devices == {"s-depth_attention_window0-s0-none": "auto", "s-depth_attention_window0-s0-depth_attention": "cpu"}
