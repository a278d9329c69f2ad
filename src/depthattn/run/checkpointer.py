"""How a run's checkpoints are written and read back into the trainer (``Checkpointer``).

The training loop decides *when* to save (``save_every`` steps, ``save_every_minutes``, a stop signal, the last
step), checks the weights and measures the validation loss first; the ``Checkpointer`` does the rest: the trainer
state of the step (``depthattn.run.state.TrainerState``, full or sharded), the write (``checkpoints.save_checkpoint`` by
rank 0; an FSDP run's ``dcp.save_sharded`` on every rank, or ``dcp.start_async_save`` in the background with
``TrainConfig.async_save``), and what it knows of its saves: the newest checkpoint (``saved``), the save in flight
(``pending``), whether rank 0's part of it is on disk (``on_disk``) and when the last save ended (``last_save``,
``since_save``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..model import DecoderLM
from .checkpoints import ResumeCheckpoint, load_resume_weights, save_checkpoint
from .dcp import PendingSave, finish_async_save, is_sharded, load_sharded, save_sharded, start_async_save
from .state import STATE_FILE, TrainerState


class Checkpointer:
    """The checkpoints of the run in ``run_dir``: ``model``, ``optimizer`` and ``scheduler`` trained with ``cfg`` on
    the prepared data ``data_dir`` (its tokenizer goes into each checkpoint). ``saved``: the newest checkpoint of
    the run so far (the one resumed from), None before the first save. ``is_main``: rank 0 (the writer of full
    checkpoints). ``cfg``: the run's ``TrainConfig`` (``data_parallel``, ``async_save``, ``keep_last``, the world size).
    ``log``: where pruning says what it kept. ``clock``: seconds of a monotonic clock (rank 0's times
    the saves: ``since_save``)."""

    def __init__(self, run_dir: Path, model: DecoderLM, optimizer: torch.optim.Optimizer, scheduler: Any,
                 cfg: Any, data_dir: Path, *, saved: Path | None = None, is_main: bool = True,
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.run_dir, self.model, self.optimizer, self.scheduler = run_dir, model, optimizer, scheduler
        self.cfg, self.data_dir, self.is_main, self.log, self.clock = cfg, data_dir, is_main, log, clock
        self.sharded = cfg.data_parallel == "fsdp"  # DCP shards on every rank, else rank 0's full checkpoint
        self.saved = saved  # the newest checkpoint visible on disk
        self.pending: PendingSave | None = None  # a save whose shards are being written in the background
        self.on_disk = False  # every rank agreed that rank 0's part of ``pending`` is on disk (set once per step)
        self.last_save: float | None = None  # ``clock()`` when the loop started (``start_timer``) or a save ended

    def restore(self, found: ResumeCheckpoint) -> TrainerState:
        """Load the checkpoint read for resume (``checkpoints.read_resume_checkpoint``) into the model (a sharded one's
        shards into the model and the optimizer), the optimizer, the scheduler and the RNGs; return its trainer
        state. Raises ``ValueError`` naming the folder or file for another model config, or a state that does not
        fit."""
        if is_sharded(found.path):
            load_sharded(found.path, self.model, self.optimizer)
        else:
            load_resume_weights(self.model, self.model.config, found.path, found.weights)
            found.weights = None  # loaded: free the CPU copy
        found.state.restore(self.optimizer, self.scheduler, found.path / STATE_FILE)
        return found.state

    def state(self, step: int, tokens_seen: int, *, nonfinite_skips: int, val_loss: float | None,
              guard: dict[str, Any]) -> TrainerState:
        """The trainer state to save at ``step``: with the optimizer's (full), or with the world size and tokens
        per step (sharded: the optimizer goes into DCP)."""
        if self.sharded:
            return TrainerState.capture(step, tokens_seen, self.scheduler, nonfinite_skips=nonfinite_skips,
                                        val_loss=val_loss, guard=guard, world_size=self.cfg.world_size(),
                                        tokens_per_step=self.cfg.tokens_per_step())
        return TrainerState.capture(step, tokens_seen, self.scheduler, self.optimizer, nonfinite_skips=nonfinite_skips,
                                    val_loss=val_loss, guard=guard)

    def save(self, state: TrainerState, *, wait: bool, meet: bool = True) -> None:
        """Write the checkpoint of ``state.step`` (the caller checked that the weights are finite); older ones are
        pruned. Sharded: every rank writes its shards, in the background unless ``wait`` or without
        ``async_save`` (visible after ``finish_pending``). Full: rank 0 writes it; with ``meet`` every rank waits
        for it (torchrun). Collective either way."""
        if self.sharded:
            if self.cfg.async_save and not wait:
                self.pending = start_async_save(self.run_dir, self.model, self.optimizer, self.cfg, self.data_dir,
                                                state.to_dict(), log=self.log)
            else:
                self.saved = save_sharded(self.run_dir, self.model, self.optimizer, self.cfg, self.data_dir,
                                          state.to_dict(), log=self.log)
        else:
            if self.is_main:
                self.saved = save_checkpoint(self.run_dir, self.model, self.cfg, self.data_dir, state.to_dict(),
                                             log=self.log)
            if meet and self.cfg.world_size() > 1:
                torch.distributed.barrier()
        self.last_save = self.clock()

    def upload_done(self) -> bool:
        """Whether rank 0's part of the save in flight is on disk (this process's view; False on other ranks)."""
        return self.is_main and self.pending is not None and self.pending.upload.done()

    def finish_pending(self, wait: bool = True) -> None:
        """Make the save in flight visible (``dcp.finish_async_save``: waits for every rank's shards): when ``wait``,
        else only once its shards are ``on_disk``. Nothing without a save in flight. Collective."""
        if self.pending is not None and (wait or self.on_disk):
            self.saved, self.pending = finish_async_save(self.pending), None

    def start_timer(self) -> None:
        """Time the saves from now (the first optimizer step of the session is next)."""
        self.last_save = self.clock()

    def since_save(self) -> float:
        """Seconds since ``start_timer`` or the end of the last save."""
        return self.clock() - self.last_save
