"""The process a run trains in: seeding and the torchrun process group (device and precision:
``depthattn.devices``; the RNG states a checkpoint keeps: ``depthattn.run.state``)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from .config import TrainConfig


def start_distributed(train_cfg: TrainConfig) -> TrainConfig:
    """Under ``data_parallel``, join the torchrun process group (gloo on CPU, NCCL on CUDA; a collective that waits
    longer than ``dist_timeout_s`` fails the job instead of hanging it; on CUDA, ``device = auto`` becomes the rank's
    own GPU). Raises ``ValueError`` for ``data_parallel`` without a torchrun launch, and for a torchrun launch of
    several processes without ``data_parallel`` (each would train its own copy of the run)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not train_cfg.data_parallel and world > 1 and not torch.distributed.is_initialized():
        raise ValueError(f"launched by torchrun with WORLD_SIZE={world} but TrainConfig.data_parallel is unset: set "
                         f"data_parallel='ddp' or 'fsdp' (--set data_parallel=fsdp), or run one process")
    if train_cfg.data_parallel and not torch.distributed.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            raise ValueError(f"TrainConfig.data_parallel={train_cfg.data_parallel!r} needs a torchrun launch "
                             f"(torchrun --nproc_per_node N -m depthattn.cli train ...)")
        from datetime import timedelta

        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                             timeout=timedelta(seconds=train_cfg.dist_timeout_s))
        if torch.cuda.is_available() and train_cfg.device == "auto":
            train_cfg = train_cfg.replace(device=f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    return train_cfg


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


# ---------------------------------------------------------------------------------------------------- randomness
def seed_everything(seed: int) -> None:
    """Seed torch, Python's ``random`` and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)

