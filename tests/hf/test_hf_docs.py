"""What docs/hf.md tells a user to run: lm-eval's own CLI on a checkpoint with the task files of ``depthattn data
lm-eval-tasks`` (offline, equal to the native scorer), and the tokenizer routes of transformers (no prompt, no
warning where the page says so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.cli import main

from helpers import machine_timeout


@pytest.mark.docs
def test_the_documented_lm_eval_command_runs_offline_and_matches_the_native_scorer(tmp_path):
    """`depthattn data lm-eval-tasks --out DIR`, then lm-eval's own CLI (`--model hf`, `--include_path DIR`) on a
    checkpoint, offline: the accuracies equal depthattn's native scorer on the same documents."""
    pytest.importorskip("lm_eval", reason="lm-eval==0.4.13 not installed (optional extra depthattn[lm-eval])")
    import json
    import os
    import shutil

    from depthattn.eval.inference import load_for_inference
    from depthattn.eval.zero_shot import evaluate_task

    from release_fixtures import FIXTURES

    # a checkpoint as this release writes it: the fixture's copied configuration.py predates later model fields
    # (docs/hf.md, "Checkpoints of older releases"), which lm-eval's trust_remote_code process would read
    ckpt = tmp_path / "ckpt"
    assert main(["convert", "--upgrade", str(FIXTURES / "run" / "checkpoints" / "step_00000004"), "--out",
                 str(ckpt)]) == 0
    tasks = tmp_path / "tasks"
    assert main(["data", "lm-eval-tasks", "--out", str(tasks), "--tasks", "arc_easy,winogrande"]) == 0
    lm_eval = Path(sys.executable).with_name("lm_eval")
    cmd = [str(lm_eval) if lm_eval.exists() else shutil.which("lm_eval"), "--model", "hf", "--model_args",
           f"pretrained={ckpt},trust_remote_code=True", "--device", "cpu", "--include_path", str(tasks),
           "--tasks", "depthattn_arc_easy,depthattn_winogrande", "--limit", "4", "--output_path",
           str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=machine_timeout(600), env=env,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    model, tok, _, _ = load_for_inference(ckpt, device="cpu")
    for name in ("arc_easy", "winogrande"):
        native = evaluate_task(model, tok, name, limit=4, progress=False)["metrics"]
        assert results[f"depthattn_{name}"]["acc,none"] == pytest.approx(native["acc"], abs=1e-12)
        if "acc_norm" in native:
            assert results[f"depthattn_{name}"]["acc_norm,none"] == pytest.approx(native["acc_norm"], abs=1e-12)


_TOKENIZER_PROBE = """
import sys
from transformers import AutoTokenizer, PreTrainedTokenizerFast
path, how = sys.argv[1], sys.argv[2]
if how == "plain-class":
    tok = PreTrainedTokenizerFast.from_pretrained(path)
elif how == "auto-trusted":
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
else:
    tok = AutoTokenizer.from_pretrained(path)
print("EOS", tok.eos_token, tok("To be, or not to be").input_ids)
"""


def _load_tokenizer(ckpt: Path, how: str) -> subprocess.CompletedProcess:
    """The probe in a fresh interpreter with an open stdin holding "n" (as a terminal user would answer)."""
    import os
    return subprocess.run([sys.executable, "-c", _TOKENIZER_PROBE, str(ckpt), how], input="n\n", text=True,
                          capture_output=True, timeout=machine_timeout(300), env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.docs
def test_the_documented_tokenizer_routes_load_with_no_prompt_and_no_warning(tmp_path):
    """docs/hf.md: `PreTrainedTokenizerFast.from_pretrained(CKPT)` (no argument) and `AutoTokenizer` with
    `trust_remote_code=True` load the checkpoint's tokenizer silently and encode as `tokenizers` does; plain
    `AutoTokenizer` asks the question the page explains (if transformers stops asking, the page must change)."""
    from tokenizers import Tokenizer

    from release_fixtures import copy_release_fixture

    old = copy_release_fixture("run", tmp_path) / "checkpoints" / "step_00000004"
    ckpt = tmp_path / "ckpt"  # a checkpoint as this release writes it (its configuration.py is today's)
    assert main(["convert", "--upgrade", str(old), "--out", str(ckpt)]) == 0
    ids = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode("To be, or not to be").ids
    for how in ("plain-class", "auto-trusted"):
        res = _load_tokenizer(ckpt, how)
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.strip() == f"EOS <|endoftext|> {ids}", how
        said = res.stdout + res.stderr
        assert "custom code" not in said and "model of type" not in said, (how, said[-2000:])
    asked = _load_tokenizer(ckpt, "auto-plain")
    assert "Do you wish to run the custom code?" in asked.stdout + asked.stderr
