"""Decay from a checkpoint (``depthattn train --decay-from``): a new run that starts WSD's decay phase from a
stable-phase checkpoint of another run, with that checkpoint's weights, optimizer and RNG states and data position.

Warmup–stable–decay (Hägele et al. 2024, arXiv 2405.18392) keeps the peak learning rate after warm-up, so any
checkpoint of the stable phase can be decayed into a finished model. The new run's config is the source run's
recorded one with ``steps = S + N`` (``S`` the checkpoint's step, ``N`` the decay steps), ``lr_schedule = "wsd"``,
``decay_fraction = N / (S + N)`` (so ``decay_steps()`` is ``N``) and the source's warm-up kept as a fraction of the
new budget (the same number of warm-up steps): its schedule is the one of an uninterrupted WSD run of ``S + N`` steps
whose decay starts at ``S``, and since the training windows are a function of the step (the data position), the
new run repeats that run's steps ``S + 1 .. S + N`` (bit for bit on float32 CPU; tests/training/test_schedules.py).

The source must be in its stable phase at ``S``: its learning rate at ``S`` is the peak (``lr_schedule`` ``"wsd"``
before its own decay, or ``"constant"``, past warm-up). The new run folder records the source checkpoint
(``run.json``: ``decay_from``); resumed before its first checkpoint, it starts from the source again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..checkpoint import latest_checkpoint
from ..run.record import run_of_checkpoint
from ..run.state import STATE_FILE, load_trainer_state
from .config import TrainConfig
from .optim import schedule_factor


def source_checkpoint(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(checkpoint folder, its run's ``run.json``) of ``--decay-from PATH``: a checkpoint folder inside a run
    folder, or a run folder (its newest checkpoint). Raises ``ValueError`` naming the path when it is neither, has
    no trainer state, or sits in no run folder (its recorded config is needed)."""
    try:
        ckpt = latest_checkpoint(path)
    except FileNotFoundError as e:
        raise ValueError(f"--decay-from: {e}") from None
    if not (ckpt / STATE_FILE).is_file():
        raise ValueError(f"--decay-from {ckpt}: no {STATE_FILE} (an exported model, not a training checkpoint); give a "
                         f"run folder or one of its checkpoints/step_XXXXXXXX")
    run = run_of_checkpoint(ckpt)
    if run is None:
        raise ValueError(f"--decay-from {ckpt}: not inside a run folder (RUN/checkpoints/step_XXXXXXXX), so its "
                         f"recorded config is unknown")
    return ckpt, run


def checkpoint_step(ckpt: Path) -> int:
    """The optimizer step a training checkpoint was saved at (its ``trainer_state.pt``)."""
    return int(load_trainer_state(ckpt)["step"])


def decay_config(recorded: Mapping[str, Any], step: int, decay_steps: int, checkpoint: Path,
                 overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The train config of a run that decays the source run (``recorded``: its ``run.json``) from its checkpoint
    at ``step`` over ``decay_steps`` steps (module docstring); ``overrides`` (``resume.DECAY_SETTABLE`` and
    resumable keys) on top. A source ``adamw_impl="auto"`` keeps the implementation it resolved to (``run.json``).

    Raises ``ValueError`` (naming ``checkpoint``) when ``decay_steps < 1`` or the source's learning rate at
    ``step`` is not its peak (inside warm-up, a cosine/linear schedule, or its own decay)."""
    if not isinstance(decay_steps, int) or decay_steps < 1:
        raise ValueError(f"--decay-steps {decay_steps} must be an integer >= 1")
    src = TrainConfig.from_recorded(recorded["train"])
    warm = src.warmup_steps()
    factor = schedule_factor(src, step)
    if step < warm or factor != 1.0:
        raise ValueError(f"--decay-from {checkpoint}: not a stable-phase checkpoint (step {step} of a "
                         f"{src.lr_schedule!r} schedule with {warm} warm-up steps: lr factor {factor:.4g}, not 1); "
                         f"decay a checkpoint of a lr_schedule=wsd or constant run past its warm-up and before its "
                         f"decay")
    new_total = step + decay_steps
    values = src.to_dict() | {"steps": new_total, "tokens": None, "lr_schedule": "wsd",
                              "decay_fraction": decay_steps / new_total, "warmup": warm / new_total}
    if src.adamw_impl == "auto" and recorded.get("adamw_impl"):
        values["adamw_impl"] = recorded["adamw_impl"]
    values.update(overrides or {})
    cfg = TrainConfig.from_dict(values)
    assert cfg.decay_steps() == decay_steps and cfg.warmup_steps() == warm  # round() of the exact fractions
    return cfg


def check_world(recorded: Mapping[str, Any], cfg: TrainConfig, world: int) -> None:
    """Refuse (``ValueError``, one line) a decay run whose tokens per step on ``world`` ranks differ from the
    source run's (its ``run.json``): the data position would not continue."""
    per_step = cfg.for_world(world)
    tokens = per_step.batch_size * per_step.grad_accum * per_step.seq_len * world
    if recorded.get("tokens_per_step") not in (None, tokens):
        raise ValueError(f"--decay-from: the source run trained {recorded['tokens_per_step']} tokens per step on "
                         f"{recorded.get('world_size', 1)} rank(s), this launch would train {tokens} on {world}; "
                         f"launch on {recorded.get('world_size', 1)} rank(s)")
