"""Writing a training checkpoint and reading one back for a resume; pruning the old ones.

A training checkpoint is ``checkpoints/step_XXXXXXXX/``: a Hugging Face model folder (``checkpoint.save_model_files``),
plus ``train_config.json``, ``trainer_state.pt`` (``state.TrainerState``) and ``val_loss.json``
(``retention``); an FSDP run's holds ``dcp/`` shards instead (``run.dcp``). Every folder is assembled under a
temporary name (``fileio.write_folder_atomically``), so a failure never damages what is already there.

Crash consistency (docs/reliability.md, "Training runs"): resume takes the newest *readable* checkpoint, saying which
one it skipped and why; unreadable ones are set aside (``set_aside``).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .. import checkpoint as ckpt
from ..checkpoint import SHARDED_DIR
from ..config import ModelConfig
from ..fileio import atomic_write_text, write_folder_atomically
from ..layout import CONFIG_FILE, TOKENIZER_FILE, TRAIN_CONFIG_FILE
from ..model import DecoderLM
from .faults import fault_point
from .folder import RunFolder
from .record import field_differences
from .retention import (VAL_LOSS_FILE, best_leaves_the_newest, checkpoints_to_prune, read_val_loss, val_loss_record,
                        val_losses_from_rows)
from .state import STATE_FILE, TrainerState


def checkpoint_val_losses(run_dir: Path, dirs: list[Path]) -> dict[Path, float | None]:
    """``{folder: validation loss}``: each checkpoint's ``val_loss.json``, else (checkpoints of older releases, which
    have none) its step's ``metrics.jsonl`` row, else None (unknown; a record of ``null``, e.g. a preemption's
    checkpoint, stays unknown without reading the log)."""
    losses = {d: read_val_loss(d) for d in dirs}
    missing = [d for d, v in losses.items() if v is None and not (d / VAL_LOSS_FILE).exists()]
    if missing:
        losses.update(val_losses_from_rows(missing, RunFolder(run_dir).read_metrics(log=lambda _: None)))
    return losses


def prune_checkpoints(run_dir: Path, keep_last: int, newest: Path, log: Callable[[str], None] | None = None) -> None:
    """Keep ``newest`` (the checkpoint just written), the ``keep_last - 1`` newest others and the best one (lowest
    recorded validation loss: ``retention.checkpoints_to_prune``), saying in one line through ``log`` when the best
    stays only for being the best; the others are deleted by ``RunFolder.delete_checkpoints`` (through
    ``.trash-step_XXXXXXXX``; one being read is left for the next prune, said through ``log``)."""
    folder = RunFolder(run_dir)
    dirs = folder.checkpoints()
    losses = checkpoint_val_losses(run_dir, dirs)
    kept = best_leaves_the_newest(dirs, keep_last, newest, losses)
    if kept is not None and log is not None:
        log(f"keeping {kept} (val loss {losses[kept]:.4f}, the lowest of the run) besides the {keep_last} newest "
            f"checkpoint(s)")
    folder.delete_checkpoints(checkpoints_to_prune(dirs, keep_last, newest, losses), log or (lambda _: None),
                              lambda: fault_point("prune"))


def check_checkpoint_kind(checkpoint: Path, data_parallel: str | None) -> None:
    """Refuse to resume ``checkpoint`` with a ``data_parallel`` that cannot read it: a sharded (FSDP) checkpoint
    (``dcp/`` shards, ``run.dcp``) needs ``"fsdp"``; a full one (``model.safetensors``, the optimizer in
    ``trainer_state.pt``) needs ``null`` or ``"ddp"``, which write the same. The ``ValueError`` gives commands that
    work."""
    sharded = (checkpoint / SHARDED_DIR).is_dir()
    if sharded == (data_parallel == "fsdp"):
        return
    run = checkpoint.parent.parent
    if sharded:
        raise ValueError(f"cannot resume from {checkpoint} with data_parallel={data_parallel or 'null'}: it is a "
                         f"sharded (FSDP) checkpoint; resume it with FSDP on any number of ranks (DCP reshards): "
                         f"torchrun --nproc_per_node N -m depthattn.cli train --resume {run} --set "
                         f"data_parallel=fsdp; or start a new run from its weights: depthattn export {run} --out "
                         f"DIR, then depthattn train --init-from DIR ... (a fresh optimizer and schedule)")
    raise ValueError(f"cannot resume from {checkpoint} with data_parallel=fsdp: it is a full (one-process or DDP) "
                     f"checkpoint; resume it with DDP on any number of ranks: torchrun --nproc_per_node N -m "
                     f"depthattn.cli train --resume {run} --set data_parallel=ddp; or start a new FSDP run from its "
                     f"weights: depthattn train --init-from {run} --set data_parallel=fsdp ... (a fresh optimizer "
                     f"and schedule)")


#: What the checkpoint readers raise for a missing, truncated or corrupt file (or one failing its integrity check).
UNREADABLE_ERRORS = (OSError, ValueError, RuntimeError, KeyError, EOFError)


@dataclass
class ResumeCheckpoint:
    """The checkpoint a run resumes from, read: ``state`` is its ``trainer_state.pt``, ``weights`` its
    ``model.safetensors`` tensors (None for a sharded checkpoint: ``run.dcp`` reads it into the model);
    ``unreadable`` are newer checkpoint folders that could not be read (``set_aside`` moves them away)."""

    path: Path
    state: TrainerState
    weights: dict[str, torch.Tensor] | None
    unreadable: list[Path] = field(default_factory=list)


def _read_checkpoint(d: Path) -> tuple[TrainerState, dict[str, torch.Tensor] | None]:
    state = TrainerState.from_file(d)
    if (d / SHARDED_DIR).is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        FileSystemReader(str(d / SHARDED_DIR)).read_metadata()  # DCP's index; the shards are read by run.dcp
        return state, None
    return state, ckpt.load_state(d)


def read_resume_checkpoint(dirs: list[Path], model_cfg: ModelConfig, log: Callable[[str], None],
                           fall_back: bool = True) -> ResumeCheckpoint:
    """Read the newest of ``dirs`` (oldest first) that can be read; one line through ``log`` for each one skipped
    (naming the file and the error) and for the one taken instead. ``fall_back=False``: the newest or an error.

    Raises ``ValueError`` for a checkpoint written for another model config (not a reason to fall back), or when
    no checkpoint can be read (naming each one and why)."""
    problems: list[str] = []
    said: list[str] = []
    for d in reversed(dirs):
        try:
            ckpt.verify_file(d, CONFIG_FILE)  # a flipped bit is damage (fall back), not another config
            recorded = ckpt.load_config(d).to_dict()
        except UNREADABLE_ERRORS as e:
            recorded, error = None, e
        if recorded is not None:
            mismatch = field_differences(recorded, model_cfg.to_dict())
            if mismatch:
                raise ValueError(f"checkpoint {d} was written for another model config ({'; '.join(mismatch)})")
            try:
                state, weights = _read_checkpoint(d)
                for line in said:  # only when falling back: the error below already names each one
                    log(line)
                if problems:
                    log(f"resuming from the previous checkpoint {d} instead")
                return ResumeCheckpoint(d, state, weights, [p for p in dirs if p > d])
            except UNREADABLE_ERRORS as e:
                error = e
        problems.append(f"{d.name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
        said.append(f"checkpoint {d} is unreadable ({problems[-1].split(': ', 1)[1]})")
        if not fall_back:
            break
    raise ValueError(f"cannot resume from {dirs[-1].parent}: no readable checkpoint ({'; '.join(problems)})")


def set_aside(unreadable: list[Path], log: Callable[[str], None]) -> None:
    """Rename unreadable checkpoint folders to ``.unreadable-step_XXXXXXXX`` (kept for inspection, no longer
    taken for a checkpoint by resume, pruning, eval or export), saying so in one line."""
    for d in unreadable:
        aside = d.with_name(f".unreadable-{d.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(d, aside)
        log(f"moved the unreadable checkpoint {d} to {aside}")


def load_resume_weights(model: DecoderLM, model_cfg: ModelConfig, checkpoint_dir: Path,
                        weights: dict[str, torch.Tensor] | None = None) -> None:
    """Load the weights of the checkpoint to resume from (``weights``: already read), refusing one written for
    another model config."""
    problems = field_differences(ckpt.load_config(checkpoint_dir).to_dict(), model_cfg.to_dict())
    if problems:
        raise ValueError(f"checkpoint {checkpoint_dir} was written for another model config ({'; '.join(problems)})")
    if weights is None:
        weights = ckpt.load_state(checkpoint_dir)
    ckpt.load_weights_into(model, weights, str(checkpoint_dir / ckpt.WEIGHTS_NAME))


def save_checkpoint(run_dir: Path, model: DecoderLM, train_cfg: Any, data_dir: Path, state: dict,
                    log: Callable[[str], None] | None = None) -> Path:
    """Write ``checkpoints/step_XXXXXXXX/`` atomically (``state``: the ``trainer_state.pt`` record,
    ``TrainerState.to_dict()``; ``val_loss.json`` from ``state["val_loss"]``), then
    keep only the newest ``keep_last`` and the best (``prune_checkpoints``; never the one just written); return its
    path. ``train_cfg``: the run's ``TrainConfig`` (``to_dict()`` is written, ``keep_last`` prunes). The caller
    checks that the weights are finite (``loop._check_weights_finite``)."""
    step = state["step"]
    target = RunFolder(run_dir).checkpoint_path(step)

    def fill(tmp: str) -> None:
        ckpt.save_model_files(model, tmp, tokenizer_file=data_dir / TOKENIZER_FILE)  # the Hugging Face files
        fault_point("save")
        atomic_write_text(os.path.join(tmp, TRAIN_CONFIG_FILE), json.dumps(train_cfg.to_dict(), indent=2) + "\n")
        ckpt.save_torch(state, os.path.join(tmp, STATE_FILE))
        atomic_write_text(os.path.join(tmp, VAL_LOSS_FILE), val_loss_record(step, state.get("val_loss")))

    write_folder_atomically(target, fill)
    fault_point("saved")
    prune_checkpoints(run_dir, train_cfg.keep_last, target, log)
    return target
