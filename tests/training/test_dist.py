"""Data-parallel training on CPU: two gloo processes under torchrun.

* ``depthattn train --set data_parallel=ddp`` end to end: the run finishes, rank 0 alone writes the run folder and
  its checkpoints, and the weights equal a single-process run whose every micro-batch is rank 0's windows followed by
  rank 1's (``TokenBatches(world_size=2)``: the ranks split one global draw, which is also what one process with the
  global batch draws; this is the run DDP's gradient averaging must reproduce) and are far from a run on rank 0's
  windows alone.
* ``parallelize(data_parallel="ddp")`` with SGD: both ranks end bitwise equal and equal to a single-process reference
  that averages the two ranks' gradients; every parameter (Depth-Attention's included) gets a gradient without
  ``find_unused_parameters``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthattn import DecoderLM, ModelConfig
from depthattn import checkpoint as ckpt
from depthattn import data as data_module
from depthattn.checkpoint import checkpoint_dirs
from depthattn.data import load_prepared
from depthattn.training import TrainConfig, read_metrics, read_summary, resolve_model_config, train

from helpers import torchrun


TokenBatches = data_module.TokenBatches  # the real one (the trainer's is patched below)

pytestmark = pytest.mark.dist

STEPS, BATCH, SEQ, ACCUM = 4, 2, 32, 2
# data_order=random: the rank-split draw of TokenBatches, patched below (tests/training/test_epochs.py: the epochs
# order)
TRAIN_SETS = dict(data_order="random", batch_size=BATCH, seq_len=SEQ, grad_accum=ACCUM, lr=3e-3, eval_windows=4,
                  save_every=2, keep_last=3, device="cpu")


# ---------------------------------------------------------------------------------------------------- the trainer
class _BothRanks:
    """Stands in for ``TokenBatches`` in a single process: each micro-batch is rank 0's windows, then rank 1's (half
    of ``batch_size`` each), exactly what the two DDP ranks draw."""

    def __init__(self, tokens, batch_size, seq_len, seed=0, rank=0, world_size=None):
        assert rank == 0 and world_size in (None, 1) and batch_size % 2 == 0
        self.ranks = [TokenBatches(tokens, batch_size // 2, seq_len, seed=seed, rank=r, world_size=2) for r in (0, 1)]
        self.whole = TokenBatches(tokens, batch_size, seq_len, seed=seed)  # one process drawing the global batch

    def batch(self, step, micro_step=0):
        both = torch.cat([b.batch(step, micro_step) for b in self.ranks])
        assert torch.equal(both, self.whole.batch(step, micro_step))  # the ranks split one global draw
        return both



def _weights(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_state(checkpoint_dir)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("cross_layer", ["none", "depth_attention"])
def test_ddp_train_cli_matches_single_process_on_both_ranks_windows(cross_layer, data_dir, tmp_path, monkeypatch):
    run = tmp_path / "ddp"
    res = torchrun(["-m", "depthattn.cli", "train", "--preset", "tiny", "--no-progress", "--data", str(data_dir),
                    "--steps", str(STEPS), "--cross-layer", cross_layer, "--out", str(run),
                    *[a for k, v in TRAIN_SETS.items() for a in ("--set", f"{k}={v}")],
                    "--set", "data_parallel=ddp"], tmp_path)
    assert f"trained {STEPS} steps" in res.stdout

    # rank 0 alone wrote the run folder: one metrics row per step, checkpoints at steps 2 and 4, nothing half-written
    record = json.loads((run / "run.json").read_text())
    assert record["world_size"] == 2 and record["train"]["data_parallel"] == "ddp"
    assert record["tokens_per_step"] == 2 * BATCH * ACCUM * SEQ
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["tokens"] for r in rows] == [s * 2 * BATCH * ACCUM * SEQ for s in range(1, STEPS + 1)]
    losses = [r["loss"] for r in rows]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert [p.name for p in checkpoint_dirs(run)] == ["step_00000002", "step_00000004"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]
    summary = read_summary(run)
    assert summary["steps"] == STEPS and summary["checkpoint"] == str(run / "checkpoints" / "step_00000004")
    assert np.isfinite(summary["final_val_loss"])

    # the same run in one process, its batches the two ranks' windows (gradients averaged over both), and on
    # rank 0's windows only (what an unsynchronised rank 0 would do)
    model_cfg = resolve_model_config("tiny", {"cross_layer": cross_layer}, load_prepared(data_dir).vocab_size,
                                     "tokenizer.json")
    base = TrainConfig(steps=STEPS, **TRAIN_SETS)
    alone = train(tmp_path / "rank0_only", model_cfg, base, data_dir, progress=False)
    with monkeypatch.context() as m:
        m.setattr(data_module, "TokenBatches", _BothRanks)
        both = train(tmp_path / "both", model_cfg, base.replace(batch_size=2 * BATCH), data_dir, progress=False)

    torch.manual_seed(base.seed)  # as the trainer seeds its model
    init = DecoderLM(model_cfg).state_dict()
    ddp = _weights(run / "checkpoints" / "step_00000004")
    assert set(ddp) <= set(init)
    moved = _max_diff(ddp, {k: init[k] for k in ddp})
    near = _max_diff(ddp, _weights(both.checkpoint))
    far = _max_diff(ddp, _weights(alone.checkpoint))
    assert moved > 1e-3, moved
    assert near < 1e-4 and far > 100 * near, (near, far)  # AdamW amplifies reduction-order noise: not bitwise
    assert abs(summary["final_val_loss"] - both.final_val_loss) < 1e-4


# ---------------------------------------------------------------------------------------------------- parallelize
SGD_STEPS, SGD_B, SGD_T, SGD_LR = 3, 2, 16, 0.1
MODELS = {"none": dict(cross_layer="none", num_hidden_layers=5),
          "depth_attention": dict(cross_layer="depth_attention", num_hidden_layers=5, depth_attention_stride=2)}

SGD_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    from depthattn import DecoderLM, ModelConfig
    from depthattn.training.parallelize import parallelize

    out, steps, B, T, lr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    models = json.loads(sys.argv[6])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name, overrides in models.items():
        torch.manual_seed(100 + rank)  # another init on rank 1: DDP must broadcast rank 0's
        model = DecoderLM(ModelConfig.from_preset("tiny", **overrides)).train()
        net = parallelize(model, data_parallel="ddp")
        init = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        grads = None
        for step in range(steps):
            g = torch.Generator().manual_seed(1000 * step + rank)  # rank-dependent data
            ids = torch.randint(0, model.config.vocab_size, (B, T + 1), generator=g)
            logits = net(ids[:, :-1]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grads is None:
                grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
            opt.step()
        torch.save({"init": init, "grads": grads, "final": model.state_dict()}, f"{out}/{name}_rank{rank}.pt")
    dist.destroy_process_group()
""")


def _reference(overrides: dict) -> tuple[dict, dict, dict]:
    """(init, first step's gradients, final weights) of one process averaging the two ranks' losses (hence
    gradients), with rank 0's init."""
    torch.manual_seed(100)
    model = DecoderLM(ModelConfig.from_preset("tiny", **overrides)).train()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    grads = None
    for step in range(SGD_STEPS):
        losses = []
        for rank in (0, 1):
            g = torch.Generator().manual_seed(1000 * step + rank)
            ids = torch.randint(0, model.config.vocab_size, (SGD_B, SGD_T + 1), generator=g)
            logits = model(ids[:, :-1]).logits
            losses.append(F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()))
        opt.zero_grad(set_to_none=True)
        (sum(losses) / 2).backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return init, grads, model.state_dict()


def test_ddp_parallelize_averages_gradients_and_keeps_ranks_identical(tmp_path):
    script = tmp_path / "ddp_sgd.py"
    script.write_text(SGD_SCRIPT, encoding="utf-8")
    torchrun([str(script), str(tmp_path), str(SGD_STEPS), str(SGD_B), str(SGD_T), str(SGD_LR), json.dumps(MODELS)],
             tmp_path)
    for name, overrides in MODELS.items():
        r0, r1 = (torch.load(tmp_path / f"{name}_rank{r}.pt") for r in (0, 1))
        init, grads, final = _reference(overrides)
        # every parameter, the Depth-Attention ones included, got a gradient (no find_unused_parameters needed)
        missing = [n for n, g in r0["grads"].items() if g is None or not g.abs().sum() > 0]
        assert not missing, (name, missing)
        for k in init:  # DDP broadcast rank 0's init, which is the reference's
            assert torch.equal(r0["init"][k], r1["init"][k]) and torch.equal(r0["init"][k], init[k]), (name, k)
        for k in grads:  # the all-reduced gradient is the same on both ranks and is the mean of the two
            assert torch.equal(r0["grads"][k], r1["grads"][k]), (name, k)
            torch.testing.assert_close(r0["grads"][k], grads[k], rtol=0, atol=1e-6)
        for k in final:
            assert torch.equal(r0["final"][k], r1["final"][k]), (name, k)  # bitwise: the ranks never diverge
            torch.testing.assert_close(r0["final"][k], final[k], rtol=0, atol=1e-6)
        assert max(float((r0["final"][k] - init[k]).abs().max()) for k in init) > 1e-3  # the steps did move
    # same init and data: layer 0's values reach later layers only through Depth-Attention's sources, so its value
    # projection's gradient differs between the two models (and DDP averaged it without find_unused_parameters)
    none, da = (torch.load(tmp_path / f"{name}_rank0.pt")["grads"] for name in MODELS)
    v0 = "model.layers.0.self_attn.v_proj.weight"
    assert not torch.allclose(none[v0], da[v0], rtol=0, atol=1e-6)
