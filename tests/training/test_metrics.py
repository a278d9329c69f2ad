"""Throughput and tracking: tokens/s, model FLOP/s and MFU, peak memory, TensorBoard events equal to metrics.jsonl."""

from __future__ import annotations

import pytest
import torch

from depthattn.accounting import num_flops
from depthattn.training import TrainConfig, read_metrics, resolve_model_config, train
from depthattn.training.metrics import MetricsLogger, Throughput, device_peak_flops, train_flops_per_token



@pytest.fixture(scope="module")
def run(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("metrics")
    data = data_dir
    cfg = resolve_model_config("tiny", {"cross_layer": "depth_attention"}, 512, "tokenizer.json")
    train(root / "run", cfg, TrainConfig(steps=3, batch_size=2, seq_len=32, eval_every=0, eval_windows=2,
                                         peak_flops=1e12), data, progress=False)
    return root / "run", cfg


def test_rows_carry_tokens_per_s_flops_mfu_and_memory(run):
    run_dir, cfg = run
    rows = read_metrics(run_dir)
    assert len(rows) == 3
    per_token = 3 * num_flops(cfg, 32).total  # includes attention at T = 32 and Depth-Attention's extra
    assert per_token == train_flops_per_token(cfg, 32) and num_flops(cfg, 32).attention > 0
    for r in rows:
        assert r["tokens_per_s"] > 0
        assert r["flops_per_s"] == pytest.approx(r["tokens_per_s"] * per_token, rel=1e-12)
        assert r["mfu"] == pytest.approx(r["flops_per_s"] / 1e12, rel=1e-12)  # the peak_flops override
        assert r["peak_memory_gib"] > 0.01


def test_tensorboard_events_equal_the_metrics_log(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    rows = read_metrics(run_dir)
    assert [e.step for e in acc.Scalars("train/loss")] == [r["step"] for r in rows]
    for e, r in zip(acc.Scalars("train/loss"), rows):
        assert e.value == pytest.approx(r["loss"], rel=1e-6)  # float32 in the event file
    assert [e.step for e in acc.Scalars("val/loss")] == [3]


def test_peak_flops_table_override_and_unknown_gpu(monkeypatch):
    assert device_peak_flops(torch.device("cpu"))[0] is None
    assert device_peak_flops(torch.device("cpu"), 5e14)[0] == 5e14
    for name, peak in (("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB",
                                                                                          312e12)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, n=name: n)
        assert device_peak_flops(torch.device("cuda", 0))[0] == peak
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA Mystery 9000")
    peak, note = device_peak_flops(torch.device("cuda", 0))
    assert peak is None and note.startswith("unknown GPU 'NVIDIA Mystery 9000': MFU omitted")
    cfg = resolve_model_config("tiny", {}, 512, "tokenizer.json")
    row = Throughput(cfg, 32, 2, torch.device("cpu")).update({}, 1000, 0.5)
    assert "mfu" not in row and row["flops_per_s"] == pytest.approx(1000 / 2 / 0.5 * train_flops_per_token(cfg, 32))


def test_wandb_without_the_package_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ValueError, match=r"^TrainConfig.wandb_project='p' needs the wandb package"):
        MetricsLogger(tmp_path, "metrics.jsonl", enabled=True, wandb_project="p")
    assert not (tmp_path / "metrics.jsonl").exists()
