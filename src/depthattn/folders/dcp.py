"""Reader of sharded FSDP checkpoints: ``config.json`` beside ``dcp/`` (``torch.distributed.checkpoint`` shards,
written by ``depthattn.run.dcp``), no safetensors weights.

DCP reshards on load, so one process reads the full weights: a plain ``DecoderLM`` of the folder's config is
built and ``dcp.load`` fills its state dict (:func:`dcp_load`, no process group). That happens on the first tensor
asked for; opening reads only ``config.json`` (after ``checksums.json`` is verified: it lists rank 0's files, not
the shards, which DCP checks itself).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..accounting import check_model_fits
from .base import LazyTensors, ModelFolder, expected_shapes
from .native import SHARDED_DIR, load_config, verify_folder
from .shards import weight_files


def is_dcp_folder(path: str | os.PathLike) -> bool:
    """A checkpoint folder with ``dcp/`` shards and no safetensors weights."""
    return (Path(path) / SHARDED_DIR).is_dir() and weight_files(path) is None


def dcp_load(states: dict[str, Any], checkpoint_dir: str | os.PathLike, no_dist: bool) -> None:
    """``torch.distributed.checkpoint.load(states)`` from ``checkpoint_dir/dcp``; a missing or corrupt shard is one
    ``ValueError`` naming the folder (DCP raises a ``CheckpointException``, a ``BaseException``, with every rank's
    traceback)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = Path(checkpoint_dir) / SHARDED_DIR
    try:
        # a plain model (export, one process) reads alone even inside a process group: no collective to wait on
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(states, checkpoint_id=str(folder), no_dist=no_dist)
    except (CheckpointException, OSError, RuntimeError, ValueError) as e:
        cause = [line for line in str(e).splitlines() if "Error" in line][-1:] or [type(e).__name__]
        raise ValueError(f"cannot read sharded checkpoint {folder} (a missing or corrupt shard?): "
                         f"{cause[0].strip()}") from e


def open_dcp(path: str | os.PathLike) -> ModelFolder:
    """A sharded FSDP checkpoint as a :class:`~depthattn.folders.base.ModelFolder` (``kind="checkpoint"``); the
    shards are gathered when the first tensor is asked for (memory checked first,
    ``accounting.check_model_fits``)."""
    verify_folder(path)
    cfg = load_config(path)
    gathered: dict[str, torch.Tensor] = {}

    def load(name: str) -> torch.Tensor:
        if not gathered:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            from ..model import DecoderLM

            check_model_fits(cfg, "cpu", torch.float32, os.fspath(path))
            model = DecoderLM(cfg)
            states = {"model": get_model_state_dict(model)}
            dcp_load(states, path, no_dist=True)
            set_model_state_dict(model, states["model"])
            gathered.update({k: v.detach() for k, v in model.state_dict().items()})
        return gathered[name]

    return ModelFolder(Path(path), "dcp", cfg, LazyTensors(expected_shapes(cfg), load), "checkpoint",
                       str(Path(path) / SHARDED_DIR))
