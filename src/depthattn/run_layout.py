"""A run folder's checkpoint folders (``checkpoint_dirs``) and what start-up cleanup may remove (``is_debris``); its
file names are re-exported from ``depthattn.layout`` (the lock and its ``flock`` primitives: ``depthattn.run.lock``)."""

from __future__ import annotations

import os
from pathlib import Path

from .fileio import is_temporary
from .layout import (CHECKPOINT_DIR, COMPARE_DATA_DIR, COMPARE_FILES, COMPARE_FOLDER_NAMES,  # noqa: F401
                     COMPARE_RUNS_DIR, DEBRIS_PREFIXES, DIVERGED_FILE, EVAL_CACHE_FILE, LOCK_FILE, METRICS_FILE,
                     PARAM_GROUPS_FILE, RUN_FILE, RUN_FILES, RUN_FOLDER_NAMES, STEP_DIR, SUMMARY_FILE,
                     TENSORBOARD_DIR, TRASHED_STEP_DIR, WANDB_FILE, ZERO_SHOT_DIR, step_dir_name)
from .layout import RESULTS_FILE as COMPARE_RESULTS_FILE  # noqa: F401


def is_debris(name: str) -> bool:
    """Whether ``name``, an entry of a run folder or of its ``checkpoints/``, is a leftover of an interrupted write or
    prune of the project's own writers: a ``fileio`` temporary of one of ``RUN_FILES`` or of a folder
    (``.tmp-<random>run.json``, ``.tmp-step_XXXXXXXX-<random>``, ``.old-step_XXXXXXXX-<random>``,
    ``.tmp-step_XXXXXXXX-dcp``) or a trashed checkpoint (``.trash-step_XXXXXXXX``). Every such name starts with one of
    ``DEBRIS_PREFIXES``; a user's file that does too (``.tmp-notes.txt``) is not debris."""
    return name.startswith(DEBRIS_PREFIXES) and (is_temporary(name, RUN_FILES) or bool(TRASHED_STEP_DIR.match(name)))


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))
