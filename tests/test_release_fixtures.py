"""Old artefacts keep working: a run and a ``compare`` folder written by the previous release (97f8652) resume and
compare unchanged, and the resumed run repeats the old release's uninterrupted run bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from depthattn.cli import main
from depthattn.training import read_metrics, read_run

from helpers import machine_timeout
from release_fixtures import copy_release_fixture, reference_losses, resumed_to_step_8


def test_an_old_release_run_resumes_bit_exactly(tmp_path, capsys):
    run = copy_release_fixture("run", tmp_path)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert resumed_to_step_8(capsys.readouterr().out)
    assert [r["loss"] for r in read_metrics(run)] == reference_losses()
    assert read_run(run)["train"]["on_divergence"] == "warn"  # recorded without the guard: resumed warn-only


def test_an_old_release_compare_folder_is_reused_unchanged(tmp_path, capsys):
    out = copy_release_fixture("compare", tmp_path)
    before = json.loads((out / "results.json").read_text())
    logs = {f: f.read_bytes() for f in sorted(out.glob("runs/*/metrics.jsonl"))}
    args = ["compare", "--preset", "tiny", "--set", "hidden_size=32", "--set", "intermediate_size=64",
            "--set", "num_attention_heads=2", "--set", "num_key_value_heads=1", "--set", "num_hidden_layers=3",
            "--set", "depth_attention_stride=1", "--steps", "6", "--set", "batch_size=2", "--set", "seq_len=32",
            "--set", "eval_every=3", "--set", "eval_windows=2", "--set", "eval_batch_size=2", "--set", "save_every=3",
            "--set", "tensorboard=false", "--data", str(tmp_path / "data"), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert capsys.readouterr().out.count("reusing finished run") == 2  # reused, not retrained
    assert len(logs) == 2 and {f: f.read_bytes() for f in logs} == logs
    after = json.loads((out / "results.json").read_text())
    for m in ("none", "depth_attention"):
        old, new = before["methods"][m], after["methods"][m]
        assert new["runs"][0]["val_loss"] == old["runs"][0]["val_loss"]
        assert new["runs"][0]["curve"] == old["runs"][0]["curve"]
    assert len(after["history"]) == len(before["history"]) + 1


_LOAD = ("import sys, torch; {pre}from transformers import AutoModelForCausalLM; "
         "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval(); "
         "print(m(torch.arange(1, 9)[None]).logits.double().sum().item())")


def _load_in_fresh_process(folder, pre: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _LOAD.format(pre=pre), str(folder)], capture_output=True, text=True,
                          timeout=machine_timeout(300), stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_an_old_release_checkpoint_loads_natively_and_after_upgrade_with_trust_remote_code(tmp_path):
    """docs/hf.md, "Checkpoints of older releases": depthattn's loader reads a 97f8652 checkpoint as it is, and so
    does `AutoModelForCausalLM` once `depthattn.hf` is imported; its own copied `configuration.py` predates the
    model fields added since, so a transformers-only process needs `convert --upgrade` once — then the same logits."""
    import torch

    from depthattn.checkpoint import load_model

    ckpt = copy_release_fixture("run", tmp_path) / "checkpoints" / "step_00000004"
    ref = load_model(ckpt)(torch.arange(1, 9)[None]).logits.double().sum().item()
    res = _load_in_fresh_process(ckpt, pre="import depthattn.hf; ")
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.split()[-1]) == pytest.approx(ref, abs=1e-6)
    assert main(["convert", "--upgrade", str(ckpt), "--out", str(tmp_path / "upgraded")]) == 0
    res = _load_in_fresh_process(tmp_path / "upgraded")
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.split()[-1]) == pytest.approx(ref, abs=1e-6)
