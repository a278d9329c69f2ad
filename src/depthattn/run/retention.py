"""Which checkpoints a run keeps: the ``keep_last`` newest and the best one (lowest validation loss), and the small
record of the validation loss each checkpoint folder carries.

Every checkpoint the trainer writes holds ``val_loss.json`` (``{"step": N, "val_loss": x}``, nats per token over the
run's fixed validation windows; written with the folder, so it is covered by its ``checksums.json``). Older
checkpoints (release 97f8652) have none: their value comes from the ``metrics.jsonl`` row of their step, else it is
unknown, and a checkpoint with an unknown value is never the best. The policy functions are pure: they take the
folders and their values and touch no file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..fileio import read_json
from ..layout import VAL_LOSS_FILE  # noqa: F401  (re-exported)



def val_loss_record(step: int, val_loss: float | None) -> str:
    """The text of ``val_loss.json`` for a checkpoint of ``step`` (strict JSON; an unknown or non-finite loss is
    null)."""
    value = float(val_loss) if val_loss is not None and math.isfinite(val_loss) else None
    return json.dumps({"step": int(step), "val_loss": value}, allow_nan=False) + "\n"


def read_val_loss(checkpoint_dir: Path) -> float | None:
    """The validation loss a checkpoint folder records (``val_loss.json``), or None when it has no readable record
    or the record holds no finite number (an unreadable record only loses the checkpoint its "best" status)."""
    try:
        value = read_json(checkpoint_dir / VAL_LOSS_FILE, "validation-loss record").get("val_loss")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def val_losses_from_rows(dirs: Sequence[Path], rows: Sequence[Mapping[str, Any]]) -> dict[Path, float]:
    """``{folder: val_loss}`` for the folders (``step_XXXXXXXX``) whose step has a finite ``val_loss`` in the metrics
    rows (the fallback for checkpoints written before ``val_loss.json``)."""
    by_step = {int(r["step"]): float(r["val_loss"]) for r in rows
               if isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])}
    out = {}
    for d in dirs:
        step = _step_of(d)
        if step is not None and step in by_step:
            out[d] = by_step[step]
    return out


def _step_of(d: Path) -> int | None:
    try:
        return int(d.name.removeprefix("step_"))
    except ValueError:
        return None


def best_checkpoint(dirs: Sequence[Path], val_loss_by_dir: Mapping[Path, float | None]) -> Path | None:
    """The folder with the lowest known, finite validation loss (the newest of equal ones); None when none is known.
    ``dirs`` are oldest first."""
    best, best_loss = None, math.inf
    for d in dirs:
        loss = val_loss_by_dir.get(d)
        if loss is not None and math.isfinite(loss) and loss <= best_loss:
            best, best_loss = d, loss
    return best


def checkpoints_to_prune(dirs: Sequence[Path], keep_last: int, newest: Path,
                         val_loss_by_dir: Mapping[Path, float | None]) -> list[Path]:
    """The folders to delete (oldest first): all of ``dirs`` (oldest first) except ``newest`` (the one just written),
    the ``keep_last - 1`` newest others and the best one (``best_checkpoint``; unknown losses never count)."""
    others = [d for d in dirs if d != newest]
    keep = set(others[max(0, len(others) - (keep_last - 1)):]) if keep_last > 1 else set()
    keep.add(newest)
    best = best_checkpoint(dirs, val_loss_by_dir)
    if best is not None:
        keep.add(best)
    return [d for d in dirs if d not in keep]


def best_leaves_the_newest(dirs: Sequence[Path], keep_last: int, newest: Path,
                           val_loss_by_dir: Mapping[Path, float | None]) -> Path | None:
    """The best folder when this prune is the first to keep it only for being the best (it has just dropped out of
    the ``keep_last`` newest, ``newest`` being the newest of ``dirs``), else None: the log says so once per best."""
    best = best_checkpoint(dirs, val_loss_by_dir)
    ordered = [d for d in dirs if d != newest] + [newest]
    if best is None or len(ordered) <= keep_last:
        return None
    return best if ordered.index(best) == len(ordered) - 1 - keep_last else None
