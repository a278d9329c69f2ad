"""``trainer_state.pt``: where a run stands and what it needs to continue bit for bit (``TrainerState``).

A checkpoint folder holds one, beside the weights. It is written in one of two shapes, told apart by the optimizer:

* a full checkpoint (one process or DDP; the weights in ``model.safetensors``) keeps the optimizer's state dict;
* a sharded checkpoint (FSDP; the weights and optimizer states under ``dcp/``) has no optimizer, and records the
  world size and global tokens per step that wrote it.

Records of older releases lack keys added since; ``upgraded`` is the one place that reads them into today's shape.
The RNG states are the torch, Python, NumPy (and CUDA) generators' (``rng_state`` / ``set_rng_state``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .. import checkpoint as ckpt
from ..layout import TRAINER_STATE_FILE

STATE_FILE = TRAINER_STATE_FILE

#: The keys every record has (a record without one cannot be resumed from: ``KeyError`` naming the file).
REQUIRED_KEYS = ("scheduler", "rng", "step", "tokens_seen", "data_position")
#: The keys written, in order, for each shape.
FULL_KEYS = ("optimizer", "scheduler", "rng", "step", "tokens_seen", "data_position", "nonfinite_skips", "val_loss",
             "guard")
SHARDED_KEYS = ("scheduler", "rng", "step", "tokens_seen", "data_position", "world_size", "tokens_per_step",
                "nonfinite_skips", "val_loss", "guard")


@dataclass
class TrainerState:
    """One ``trainer_state.pt``.

    ``step``: optimizer steps taken; ``tokens_seen``: training tokens (all ranks) up to ``step``; ``data_position``:
    the step the training windows continue at (``step`` when written; a record where they differ is refused on
    restore); ``rng``: ``rng_state()``; ``scheduler``: the lr scheduler's state dict; ``optimizer``: the optimizer's
    state dict (None in a sharded checkpoint: DCP holds it); ``nonfinite_skips``: consecutive steps skipped for a
    non-finite loss or gradient norm up to ``step``; ``val_loss``: the validation loss of ``step`` in nats (None:
    unknown, e.g. a preemption's checkpoint); ``guard``: the divergence guard's state (``training.guard.Guard``);
    ``world_size`` / ``tokens_per_step``: the ranks and global tokens per step that wrote a sharded checkpoint (None in
    a full one)."""

    step: int
    tokens_seen: int
    rng: dict[str, Any]
    scheduler: dict[str, Any]
    optimizer: dict[str, Any] | None = None
    nonfinite_skips: int = 0
    val_loss: float | None = None
    guard: dict[str, Any] = field(default_factory=dict)
    world_size: int | None = None
    tokens_per_step: int | None = None
    data_position: int | None = None  # None: ``step``

    def __post_init__(self) -> None:
        if self.data_position is None:
            self.data_position = self.step

    @property
    def sharded(self) -> bool:
        """Whether this is a sharded checkpoint's record (no optimizer state: that is in DCP)."""
        return self.optimizer is None

    @classmethod
    def capture(cls, step: int, tokens_seen: int, scheduler: Any, optimizer: torch.optim.Optimizer | None = None,
                **rest: Any) -> "TrainerState":
        """The state now: ``scheduler``'s and (full checkpoints) ``optimizer``'s state dicts and this process's RNG
        states, with the counters given (``rest``: the other fields)."""
        return cls(step=step, tokens_seen=tokens_seen, rng=rng_state(), scheduler=scheduler.state_dict(),
                   optimizer=None if optimizer is None else optimizer.state_dict(), **rest)

    def to_dict(self) -> dict[str, Any]:
        """What ``torch.save`` writes: ``FULL_KEYS`` or ``SHARDED_KEYS``, in that order."""
        return {k: getattr(self, k) for k in (SHARDED_KEYS if self.sharded else FULL_KEYS)}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], file: str | Path = STATE_FILE) -> "TrainerState":
        """Read a record of either shape, of this release or an older one (``upgraded``; ``file`` names it in
        errors)."""
        r = upgraded(record, file)
        return cls(step=int(r["step"]), tokens_seen=int(r["tokens_seen"]), rng=r["rng"], scheduler=r["scheduler"],
                   optimizer=r.get("optimizer"), nonfinite_skips=int(r["nonfinite_skips"]), val_loss=r["val_loss"],
                   guard=dict(r["guard"] or {}), world_size=r.get("world_size"),
                   tokens_per_step=r.get("tokens_per_step"), data_position=int(r["data_position"]))

    @classmethod
    def from_file(cls, checkpoint_dir: Path) -> "TrainerState":
        """The trainer state of a checkpoint folder (``load_trainer_state``, then ``from_dict``). Raises what
        ``load_trainer_state`` raises, and ``KeyError`` naming the file for a record without a ``REQUIRED_KEYS``
        key."""
        return cls.from_dict(load_trainer_state(checkpoint_dir), checkpoint_dir / STATE_FILE)

    def restore(self, optimizer: torch.optim.Optimizer, scheduler: Any, file: str | Path) -> None:
        """Load this state into ``optimizer`` (a full checkpoint's; a sharded one's optimizer comes from DCP),
        ``scheduler`` and the RNGs. Raises ``ValueError`` naming ``file`` if it does not fit the optimizer or its
        data position is not its step."""
        try:
            if self.optimizer is not None:
                optimizer.load_state_dict(self.optimizer)
            scheduler.load_state_dict(self.scheduler)
        except (KeyError, ValueError, RuntimeError) as e:
            raise ValueError(f"{file}: optimizer/scheduler state does not fit the model ({e})") from e
        set_rng_state(self.rng)
        if self.data_position != self.step:
            raise ValueError(f"{file}: data position {self.data_position} != step {self.step}")


def upgraded(record: Mapping[str, Any], file: str | Path = STATE_FILE) -> dict[str, Any]:
    """``record`` in today's shape. ``KeyError`` naming ``file`` and the keys when one of ``REQUIRED_KEYS`` is
    missing. Keys added by later releases take the value that means what the older trainer did: ``nonfinite_skips``
    0 (no step skipped), ``val_loss`` None (not recorded), ``guard`` empty (a fresh divergence guard, armed past
    warm-up)."""
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise KeyError(f"{file} lacks {missing}")
    return {"nonfinite_skips": 0, "val_loss": None, "guard": {}, **record}


def load_trainer_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The record in ``checkpoint_dir``'s ``trainer_state.pt``, as saved (checked against ``checksums.json`` when
    the folder has one: ``checkpoint.IntegrityError``). Raises ``FileNotFoundError`` (no such file) or
    ``ValueError`` (truncated or corrupt) naming the file."""
    file = checkpoint_dir / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: the checkpoint has no trainer state to resume from")
    ckpt.verify_file(checkpoint_dir, STATE_FILE)  # checksums.json, when the folder has one (IntegrityError)
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a truncated or corrupt pickle/zip
        raise ValueError(f"cannot read trainer state {file} (truncated or corrupt?): {e}") from e


# ---------------------------------------------------------------------------------------------------- randomness
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
