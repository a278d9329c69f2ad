"""The process a run trains in: seeding and RNG states, the torchrun process group (device and precision:
``depthattn.devices``, re-exported here)."""

from __future__ import annotations

import os
import random
from typing import Any, Mapping

import numpy as np
import torch

from ..devices import autocast_dtype, resolve_device, resolved_precision  # noqa: F401  (re-exported)
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


def rng_state() -> dict[str, Any]:
    """The torch, Python, NumPy (and CUDA) RNG states, as ``trainer_state.pt`` stores them (tensors and lists only,
    so ``torch.load(weights_only=True)`` reads them)."""
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the RNG states saved by ``rng_state``."""
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"][:1]) + (tuple(state["python"][1]),) + tuple(state["python"][2:]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), *n[2:]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
