"""``train --dry-run``: parameter count equals the real model's; the memory estimate for ``small`` is within 30 % of
a measured CPU step (parameters, gradients and AdamW states as allocated, activations as autograd saved them)."""

from __future__ import annotations

import pytest
import torch

from depthattn.cross_layer import names as method_names
from depthattn import DecoderLM, ModelConfig
from depthattn.accounting import num_params
from depthattn.cli import main
from depthattn.eval.perplexity import next_token_loss
from depthattn.training import TrainConfig
from depthattn.training.dry_run import dry_run


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("method", method_names())
def test_dry_run_params_equal_the_real_model(preset, method):
    cfg = ModelConfig.from_preset(preset, cross_layer=method)
    d = dry_run(cfg, TrainConfig(steps=10, device="cpu"))
    assert d.params == DecoderLM(cfg).num_params() == num_params(cfg)


def _measured_step_bytes(cfg: ModelConfig, batch: int, seq: int) -> tuple[int, int]:
    """(parameters + gradients + AdamW states, saved activations of one micro-batch) in bytes, float32 CPU."""
    torch.manual_seed(0)
    model = DecoderLM(cfg).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    windows = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = next_token_loss(model, windows, torch.device("cpu"), None)
    loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    opt.step()
    static = sum(p.nbytes + p.grad.nbytes for p in model.parameters())
    static += sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return static, sum(saved.values())


@pytest.mark.parametrize("method", ["none", "depth_attention", "depth_attention_uniform"])
def test_memory_estimate_for_small_within_30_percent_of_measured(method):
    cfg = ModelConfig.from_preset("small", cross_layer=method)
    d = dry_run(cfg, TrainConfig(steps=10, batch_size=8, seq_len=128, device="cpu"))
    static, activations = _measured_step_bytes(cfg, 8, 128)
    assert d.param_bytes + d.grad_bytes + d.optimizer_bytes == static
    assert abs(d.activation_bytes - activations) / activations < 0.30, (d.activation_bytes, activations)
    assert abs(d.total_bytes - (static + activations)) / (static + activations) < 0.30
    fsdp = dry_run(cfg, TrainConfig(steps=10, batch_size=8, seq_len=128, device="cpu", data_parallel="fsdp"), 4)
    assert fsdp.param_bytes == d.param_bytes / 4 and fsdp.activation_bytes == d.activation_bytes
    assert d.activation_bytes_checkpointed < d.activation_bytes / 3


def test_dry_run_cli_allocates_nothing_and_prints_the_plan(capsys):
    assert main(["train", "--preset", "3b", "--dry-run", "--nproc", "32", "--set", "data_parallel=fsdp",
                 "--set", "seq_len=2048", "--set", "precision=bfloat16", "--steps", "1000"]) == 0
    out = capsys.readouterr().out
    cfg = ModelConfig.from_preset("3b")
    assert f"{num_params(cfg):,d} parameters (FSDP over 32 ranks)" in out
    assert "tokens/s in all" in out and "activations" in out


def test_paper_configs_exist_for_every_method_and_plan_on_meta():
    from pathlib import Path

    from depthattn.cross_layer import names
    from depthattn.training import load_toml

    root = Path(__file__).resolve().parent.parent / "configs"
    for size, preset in (("360m", "360m"), ("1p5b", "1.5b"), ("3b", "3b")):
        for method in names():
            doc = load_toml(root / f"{size}_{method}.toml")
            assert doc["preset"] == preset and doc["model"]["cross_layer"] == method
            train = TrainConfig.from_dict(doc["train"])
            assert (train.seq_len, train.precision, train.activation_checkpointing, train.data_parallel) == (
                2048, "bfloat16", True, "fsdp")
            assert train.min_lr_ratio == 0.1 and train.warmup == 0.02
            d = dry_run(ModelConfig.from_preset(preset, **doc["model"]), train, 32)
            assert d.params == num_params(ModelConfig.from_preset(preset, **doc["model"]))
