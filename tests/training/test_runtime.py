"""Distributed hygiene without launching processes: the refusals and the process-group timeout."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from depthattn.training import TrainConfig
from depthattn.training.runtime import start_distributed


def test_torchrun_without_data_parallel_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"^launched by torchrun with WORLD_SIZE=2 but TrainConfig.data_parallel is "
                                         r"unset: set data_parallel='ddp' or 'fsdp'"):
        start_distributed(TrainConfig(steps=1))


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_data_parallel_without_torchrun_is_refused(monkeypatch, mode):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=rf"^TrainConfig.data_parallel='{mode}' needs a torchrun launch"):
        start_distributed(TrainConfig(steps=1, data_parallel=mode))


def test_process_group_gets_the_configured_timeout(monkeypatch):
    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kw: seen.update(kw, backend=backend))
    start_distributed(TrainConfig(steps=1, data_parallel="fsdp", dist_timeout_s=42))
    assert seen["timeout"] == timedelta(seconds=42)
    assert TrainConfig().dist_timeout_s == 300  # a few minutes, not gloo's/NCCL's 30
    with pytest.raises(ValueError, match=r"^TrainConfig.dist_timeout_s=0 is invalid"):
        TrainConfig(dist_timeout_s=0)
