"""FSDP2 training and DCP sharded checkpoints on CPU: gloo processes under torchrun (two launches in all).

* FSDP2 equals DDP on the same global batch (losses and final weights) for ``none``, ``depth_attention`` and
  ``attnres`` (a residual-seam method): both build the model on the meta device and materialise the same weights.
* A DCP checkpoint written on 2 ranks, resumed on 2 ranks, repeats the uninterrupted curve bit for bit; resumed on
  1 rank it keeps the tokens per step (``grad_accum`` doubled, said in one line).
* ``depthattn export`` of an FSDP checkpoint gives the ordinary folder whose ``depthattn eval`` validation loss is
  the one the run logged; a tied model stays tied through sharding, DCP and export.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from depthattn import checkpoint as ckpt
from depthattn.checkpoint import checkpoint_dirs
from depthattn.training import TrainConfig, read_metrics, read_summary
from depthattn.run.dcp import export_checkpoint, load_sharded
from depthattn.training.resume import keep_tokens_per_step

from helpers import machine_timeout, torchrun as dist_torchrun

pytestmark = pytest.mark.dist

TIMEOUT_S = 240
BASE = dict(steps=4, batch_size=2, seq_len=32, grad_accum=2, lr=3e-3, eval_every=4, eval_windows=512, eval_batch_size=128, save_every=2,
            keep_last=3, device="cpu")
METHODS = ("none", "depth_attention", "attnres", "value_residual")  # value_residual: learnable λ, a [1] parameter

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from depthattn.training import TrainConfig, resolve_model_config, train

    data, out, base, methods = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4].split(",")
    EXTRA = {"value_residual": {"value_residual_learnable": True}}  # per-layer scalars through fully_shard
    def cfg(method, **extra):
        return resolve_model_config("tiny", {"cross_layer": method, **EXTRA.get(method, {}), **extra}, 512,
                                    "tokenizer.json")
    for method in methods:
        for dp in ("ddp", "fsdp"):
            train(out / f"{method}_{dp}", cfg(method), TrainConfig(**base, data_parallel=dp), data, progress=False)
    fsdp = TrainConfig(**base, data_parallel="fsdp")
    for name in ("part", "part1"):
        train(out / name, cfg("depth_attention"), fsdp, data, progress=False, stop_after=2)
    train(out / "part", cfg("depth_attention"), fsdp, data, progress=False, resume=True)
    train(out / "tied", cfg("none", tie_word_embeddings=True), fsdp, data, progress=False)
    train(out / "hsdp", cfg("none"), fsdp.replace(fsdp_replicate=2), data, progress=False)
""")


def torchrun(nproc: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``test_dist.torchrun`` with this file's process count and time limit."""
    return dist_torchrun(args, cwd, nproc=nproc, timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    data = data_dir
    script = root / "runs.py"
    script.write_text(SCRIPT, encoding="utf-8")
    torchrun(2, [str(script), str(data), str(root), json.dumps(BASE), ",".join(METHODS)], root)
    return root


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run)]


def _gathered(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    from depthattn import DecoderLM

    model = DecoderLM(ckpt.load_config(checkpoint_dir))
    load_sharded(checkpoint_dir, model, None)
    return model.state_dict()


@pytest.mark.parametrize("method", METHODS)
def test_fsdp_equals_ddp_on_the_same_global_batch(runs, method):
    ddp, fsdp = runs / f"{method}_ddp", runs / f"{method}_fsdp"
    assert json.loads((fsdp / "run.json").read_text())["tokens_per_step"] == 2 * 2 * 2 * 32
    l_ddp, l_fsdp = _losses(ddp), _losses(fsdp)
    assert len(l_fsdp) == 4 and max(abs(a - b) for a, b in zip(l_ddp, l_fsdp)) < 1e-5, (l_ddp, l_fsdp)
    assert l_fsdp[-1] < l_fsdp[0]
    last = checkpoint_dirs(fsdp)[-1]
    assert (last / "dcp" / ".metadata").is_file() and not (last / ckpt.WEIGHTS_NAME).exists()
    assert not [p for p in (fsdp / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp folder left
    from depthattn.fileio import read_manifest, verify_manifest

    listed = read_manifest(last)  # rank 0's files are hashed, the dcp/ shards are not
    assert "trainer_state.pt" in listed and "config.json" in listed and not any(k.startswith("dcp/") for k in listed)
    assert verify_manifest(last) == sorted(listed)
    full, sharded = ckpt.load_state(checkpoint_dirs(ddp)[-1]), _gathered(last)
    assert set(full) == set(sharded)
    diff = max(float((full[k] - sharded[k]).abs().max()) for k in full)
    assert diff < 1e-4, diff  # AdamW amplifies reduce-order noise: close, not bitwise
    assert abs(read_summary(ddp)["final_val_loss"] - read_summary(fsdp)["final_val_loss"]) < 1e-5


def test_hsdp_two_replicas_equals_fsdp(runs):
    """fsdp_replicate=2 on 2 ranks: a (2 × 1) mesh, replicas all-reducing instead of one shard group."""
    l_hsdp, l_fsdp = _losses(runs / "hsdp"), _losses(runs / "none_fsdp")
    assert len(l_hsdp) == 4 and max(abs(a - b) for a, b in zip(l_hsdp, l_fsdp)) < 1e-5, (l_hsdp, l_fsdp)


def test_dcp_resume_on_two_ranks_repeats_the_curve_exactly(runs):
    assert _losses(runs / "part") == _losses(runs / "depth_attention_fsdp")
    assert read_metrics(runs / "part")[-1]["val_loss"] == read_metrics(runs / "depth_attention_fsdp")[-1]["val_loss"]


def test_dcp_resume_on_one_rank_keeps_tokens_per_step(runs, tmp_path):
    res = torchrun(1, ["-m", "depthattn.cli", "train", "--resume", str(runs / "part1"), "--no-progress"], tmp_path)
    assert "resuming on 1 rank(s) instead of 2: grad_accum 2 -> 4 keeps 256 tokens per step" in res.stdout
    rows = read_metrics(runs / "part1")
    assert [r["tokens"] for r in rows] == [256 * s for s in range(1, 5)]
    record = json.loads((runs / "part1" / "run.json").read_text())
    assert record["world_size"] == 1 and record["train"]["grad_accum"] == 4 and record["tokens_per_step"] == 256
    assert _losses(runs / "part1")[:2] == _losses(runs / "depth_attention_fsdp")[:2]


def test_world_size_that_cannot_keep_the_batch_is_refused(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"world_size": 2, "tokens_per_step": 3 * 64, "train": {}}))
    with pytest.raises(ValueError, match=r"^cannot resume .* on 1 rank\(s\): it trained 192 tokens per step on 2"):
        keep_tokens_per_step(tmp_path, TrainConfig(steps=1, batch_size=2, seq_len=64), print)


def test_export_of_fsdp_checkpoint_evaluates_to_the_logged_val_loss(runs, data_dir, tmp_path):
    out = tmp_path / "exported"
    res = subprocess.run([sys.executable, "-m", "depthattn.cli", "export", str(runs / "depth_attention_fsdp"),
                          "--out", str(out)], capture_output=True, text=True, timeout=machine_timeout(TIMEOUT_S))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["checksums.json", "config.json", "configuration.py",
                                                      "generation_config.json",
                                                      "model.safetensors", "modeling.py", "tokenizer.json",
                                                      "tokenizer_config.json"]  # a Hugging Face model folder
    assert json.loads((out / "config.json").read_text())["model_type"] == "depthattn"
    n_windows = (len(__import__("depthattn").data.load_prepared(data_dir).val) - 1) // 32
    assert n_windows <= BASE["eval_windows"]  # the run validated on every window of the split
    res = subprocess.run([sys.executable, "-m", "depthattn.cli", "eval", str(out), "--data", str(data_dir),
                          "--seq-len", "32", "--max-tokens", str(n_windows * 32), "--no-progress", "--device", "cpu",
                          "--out", str(tmp_path / "eval.json")], capture_output=True, text=True,
                         timeout=machine_timeout(TIMEOUT_S))
    assert res.returncode == 0, res.stderr
    loss = json.loads((tmp_path / "eval.json").read_text())["loss"]
    logged = read_metrics(runs / "depth_attention_fsdp")[-1]["val_loss"]
    assert abs(loss - logged) < 1e-5, (loss, logged)


def test_tied_model_stays_tied_through_fsdp_dcp_and_export(runs, tmp_path):
    exported = tmp_path / "tied"
    export_checkpoint(runs / "tied", exported)
    model = ckpt.load_model(exported)
    assert model.is_tied() and model.num_params() == sum(p.numel() for p in model.parameters())
    assert "lm_head.weight" not in ckpt.load_state(exported)  # stored once
    gathered = _gathered(checkpoint_dirs(runs / "tied")[-1])
    assert torch.equal(gathered["lm_head.weight"], gathered["model.embed_tokens.weight"])
    torch.testing.assert_close(model.lm_head.weight, gathered["lm_head.weight"], rtol=0, atol=0)


def test_sharded_checkpoint_with_a_missing_shard_or_other_config_is_refused(runs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint_dirs(runs / "none_fsdp")[-1], broken)
    (broken / "dcp" / "__1_0.distcp").unlink()
    with pytest.raises(ValueError, match=r"^cannot read sharded checkpoint .*broken/dcp"):
        export_checkpoint(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    other = tmp_path / "other"
    shutil.copytree(checkpoint_dirs(runs / "none_fsdp")[-1], other)
    export_checkpoint(runs / "attnres_fsdp", tmp_path / "attnres")
    model = ckpt.load_model(tmp_path / "attnres")
    with pytest.raises(ValueError, match=r"^checkpoint .*other was written for another model config \(cross_layer"):
        load_sharded(other, model, None)


def test_sharded_checkpoint_is_described_as_hf_and_eval_says_to_export_it(runs, data_dir):
    """A sharded checkpoint carries the Hugging Face config files (model_type, generation and tokenizer configs);
    opening it for inference is one line naming the folder and the `depthattn export` command."""
    last = checkpoint_dirs(runs / "depth_attention_fsdp")[-1]
    assert json.loads((last / "config.json").read_text())["model_type"] == "depthattn"
    assert (last / "generation_config.json").is_file() and (last / "tokenizer_config.json").is_file()
    res = subprocess.run([sys.executable, "-m", "depthattn.cli", "eval", str(runs / "depth_attention_fsdp"),
                          "--data", str(data_dir), "--no-progress", "--device", "cpu"],
                         capture_output=True, text=True, timeout=machine_timeout(TIMEOUT_S))
    assert res.returncode == 2 and res.stdout == ""
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "sharded FSDP checkpoint" in err[0] and f"depthattn export {last}" in err[0], err
