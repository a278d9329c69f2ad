"""What a run records about itself, read back: the package versions and git revision written into ``run.json``, the
run of a checkpoint folder, and the upgrade of a record written by an older release (``with_model_defaults``,
``recorded_precision``), in one place.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import ModelConfig
from .folder import RunFolder


def versions() -> dict[str, str]:
    """Versions of the packages that determine a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "tokenizers", "numpy", "depthattn"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_revision() -> str | None:
    """``git rev-parse HEAD`` of the package source (with ``-dirty`` when modified), or None without git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def read_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``run.json`` of a run folder (``RunFolder.read_run``)."""
    return RunFolder(run_dir).read_run()


def run_of_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The run.json of the run a checkpoint folder belongs to, if it sits in one."""
    folder = RunFolder(checkpoint_dir.parent.parent)
    if checkpoint_dir.parent.name == RunFolder.CHECKPOINT_DIR and folder.is_run():
        return folder.read_run()
    return None


def read_metrics(run_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (``RunFolder.read_metrics``)."""
    return RunFolder(run_dir).read_metrics(log)


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``summary.json`` if it is present and strict JSON, else None (``RunFolder.read_summary``)."""
    return RunFolder(run_dir).read_summary()


def read_divergence(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``RunFolder.read_divergence``: the run's ``diverged.json``, or None."""
    return RunFolder(run_dir).read_divergence()


def field_differences(a: Mapping[str, Any], b: Mapping[str, Any], ignore: frozenset = frozenset()) -> list[str]:
    """``"key: a vs b"`` for every key where two flat records differ, sorted, except ``ignore``."""
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k) != b.get(k)]


def with_model_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded model config (as a dict) with every ``ModelConfig`` field it lacks at its default."""
    defaults = {f.name: f.default for f in fields(ModelConfig) if f.name not in recorded}
    return {**defaults, **recorded}


def recorded_precision(run: dict[str, Any]) -> str | None:
    """A run.json's resolved precision (older runs recorded only ``autocast``: ``float32`` or ``torch.bfloat16``)."""
    if "resolved_precision" in run:
        return run["resolved_precision"]
    if "autocast" in run:
        return str(run["autocast"]).removeprefix("torch.")
    return None
