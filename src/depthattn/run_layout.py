"""A run folder's checkpoint folders (``checkpoint_dirs``), and its file names re-exported from ``depthattn.layout``
(the lock and its ``flock`` primitives: ``depthattn.run.lock``)."""

from __future__ import annotations

import os
from pathlib import Path

from .layout import (CHECKPOINT_DIR, DEBRIS_PREFIXES, DIVERGED_FILE, LOCK_FILE, METRICS_FILE,  # noqa: F401
                     PARAM_GROUPS_FILE, RUN_FILE, STEP_DIR, SUMMARY_FILE, WANDB_FILE, step_dir_name)


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))
