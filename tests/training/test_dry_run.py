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


def test_dry_run_names_the_vocabulary_and_sequence_length_it_assumed(data_dir, capsys):
    """The parameter count depends on vocab_size, which a run takes from its data's tokenizer: the plan says which
    it used and where it came from."""
    assert main(["train", "--preset", "1.5b", "--dry-run"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("assuming vocab_size 50,304 (the 1.5b preset's; a run takes its data tokenizer's")
    assert "seq_len 256 tokens" in line
    assert main(["train", "--preset", "1.5b", "--dry-run", "--data", str(data_dir), "--set", "seq_len=2048"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith(f"assuming vocab_size 512 ({data_dir}'s tokenizer), seq_len 2,048 tokens")


def test_paper_configs_exist_for_every_method_and_plan_on_meta():
    from pathlib import Path

    from depthattn.cross_layer import names
    from depthattn.training import load_toml

    root = Path(__file__).resolve().parents[2] / "configs"
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


# ------------------------------------------------------------------------------------------------ global batch, plan
def _paper(size: str = "3b", method: str = "depth_attention"):
    from pathlib import Path

    from depthattn.training import load_toml

    doc = load_toml(Path(__file__).resolve().parents[2] / "configs" / f"{size}_{method}.toml")
    preset = {"3b": "3b", "1p5b": "1.5b", "360m": "360m"}[size]
    return ModelConfig.from_preset(preset, **doc["model"]), TrainConfig.from_dict(doc["train"])


@pytest.mark.parametrize("size", ["1p5b", "3b"])
def test_paper_configs_keep_their_batch_and_budget_on_8_or_32_gpus(size):
    model, train = _paper(size)
    assert train.global_batch_tokens == 1024 * 2048  # the paper's 1024 x 2048 tokens per step
    for nproc, accum in ((8, 32), (32, 8)):
        d = dry_run(model, train, nproc)
        assert (d.grad_accum, d.tokens_per_step, d.total_tokens) == (accum, 2_097_152, 20_000 * 2_097_152)
        assert d.batch_size * d.grad_accum * d.seq_len * nproc == d.tokens_per_step


def test_global_batch_tokens_that_the_world_cannot_split_is_one_line(capsys):
    _, train = _paper()
    with pytest.raises(ValueError, match=r"^TrainConfig.global_batch_tokens=2097152 is not a multiple of batch_size 4 "
                                         r"× seq_len 2048 × 3 rank\(s\) = 24576; choose"):
        train.for_world(3)
    assert main(["train", "--config", "configs/3b_none.toml", "--dry-run", "--nproc", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a multiple" in err and err.count("\n") == 0
    with pytest.raises(ValueError, match=r"global_batch_tokens=.* must be a multiple of batch_size × seq_len = 512"):
        TrainConfig(steps=1, batch_size=2, seq_len=256, global_batch_tokens=1000)
    assert main(["train", "--config", "configs/3b_none.toml", "--dry-run", "--set", "grad_accum=32"]) == 2
    assert "are both set: grad_accum follows from global_batch_tokens" in capsys.readouterr().err
    unset = TrainConfig(steps=5, grad_accum=3)
    assert unset.for_world(7) is unset  # without global_batch_tokens, grad_accum is per rank as before


def test_training_derives_grad_accum_from_global_batch_tokens(tmp_path, data_dir, model_cfg):
    from depthattn.training import read_run, train

    cfg = TrainConfig(steps=2, batch_size=2, seq_len=32, global_batch_tokens=2 * 32 * 3, eval_every=0,
                      eval_windows=2, device="cpu", tensorboard=False, tokens=None)
    train(tmp_path / "r", model_cfg, cfg, data_dir, progress=False)
    run = read_run(tmp_path / "r")
    assert (run["train"]["grad_accum"], run["tokens_per_step"]) == (3, 192)
    assert TrainConfig(tokens=192 * 5, batch_size=2, seq_len=32, global_batch_tokens=192).total_steps() == 5


def _plan(capsys, *argv) -> str:
    assert main(["train", *argv, "--dry-run"]) == 0
    return capsys.readouterr().out


def test_dry_run_prints_torchrun_commands_that_parse(capsys):
    import shlex

    from depthattn.cli import build_parser

    one = _plan(capsys, "--config", "configs/3b_depth_attention.toml", "--nproc", "8", "--out", "runs/3b-da")
    many = _plan(capsys, "--config", "configs/3b_depth_attention.toml", "--nproc", "32", "--out", "runs/3b-da")
    lines = [line.strip() for line in (one + many).splitlines() if line.strip().startswith("torchrun ")]
    assert lines[0].startswith("torchrun --standalone --nproc_per_node=8 -m depthattn.cli train ")
    assert lines[1].startswith("torchrun --nnodes=4 --nproc_per_node=8 --rdzv_backend=c10d "
                               "--rdzv_endpoint=$MASTER_ADDR:29500 --rdzv_id=3b-da -m depthattn.cli train ")
    for line in lines:
        args = build_parser().parse_args(shlex.split(line.split(" -m depthattn.cli ", 1)[1]))
        assert (args.config, args.out, args.dry_run) == ("configs/3b_depth_attention.toml", "runs/3b-da", False)
    ddp = _plan(capsys, "--preset", "tiny", "--nproc", "2", "--gpus-per-node", "2", "--set", "seq_len=64")
    assert "--nproc_per_node=2 -m depthattn.cli train --preset tiny --set seq_len=64 --set data_parallel=ddp" in ddp
    assert "grad_accum is per rank, so the global batch and a steps budget scale with --nproc" in ddp
    odd = _plan(capsys, "--preset", "tiny", "--nproc", "12")
    assert "(none: 12 ranks do not fill whole nodes of 8 GPUs; set --gpus-per-node)" in odd


def test_dry_run_flags_unreachable_mfu_and_gives_throughput_at_40_percent(capsys):
    from depthattn.training.metrics import PEAK_BF16_FLOPS

    peaks = dict(PEAK_BF16_FLOPS)
    model, train = _paper()
    d = dry_run(model, train, 8)
    for hours in (24.0, 2000.0):
        out = _plan(capsys, "--config", "configs/3b_depth_attention.toml", "--nproc", "8", "--target-hours",
                    str(hours))
        need_per_gpu = d.total_tokens / (hours * 3600) / 8 * d.train_flops_per_token  # FLOP/s each GPU must do
        over = [g for g in ("H100", "A100", "B200") if need_per_gpu / peaks[g] > 0.60]
        flagged = [line for line in out.splitlines() if "unreachable" in line]
        assert (flagged[0].split("unreachable on ")[1].split(":")[0].split(", ") if flagged else []) == over
        expected = 0.40 * peaks["H100"] / d.train_flops_per_token * 8
        assert f"expected at 40% MFU: H100 {expected:,.0f} tokens/s, {d.total_tokens / expected / 3600:,.1f} h" in out
    assert hours == 2000.0 and not flagged and over == []  # a slack target flags nothing
