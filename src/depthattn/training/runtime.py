"""The process a run trains in: device, precision, seeding, the torchrun process group (the RNG states a
checkpoint keeps: ``depthattn.run.state``).

``precision = "auto"`` resolves to float32 on CPU and bf16 autocast (float32 master weights) on CUDA; the resolved
precision is what ``run.json`` records and what a resumed run must keep (``runs.resume_point``).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from .config import TrainConfig


# ---------------------------------------------------------------------------------------------------- device
def resolve_device(name: str, option: str = "TrainConfig.device") -> torch.device:
    """``auto`` → cuda if available, else cpu; otherwise the named device. ``ValueError`` naming ``option`` (the
    setting or flag it came from) for a bad name or CUDA that is not available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    given = f"{option} {name}" if option.startswith("--") else f"{option}={name!r}"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"{given} is not a device ({e})") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{given}: CUDA is not available on this machine (use cpu or auto)")
    return device


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


# ---------------------------------------------------------------------------------------------------- precision
def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA under ``auto``; float32 (no autocast) on CPU under ``auto``."""
    if precision == "float32" or (precision == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def resolved_precision(amp: torch.dtype | None) -> str:
    """The precision a run actually trains in, as recorded in ``run.json``: ``"float32"`` or ``"bfloat16"``."""
    return "float32" if amp is None else str(amp).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------------- randomness
def seed_everything(seed: int) -> None:
    """Seed torch, Python's ``random`` and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)

