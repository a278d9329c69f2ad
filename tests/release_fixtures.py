"""Folders written by the previous release (commit 97f8652), kept as fixtures (tests/fixtures/release-97f8652/,
made by its make.sh): a prepared data folder, a run killed at step 5 of 8, the uninterrupted run's metrics log, and a
finished ``compare`` folder. Their run.json / results.json record the absolute path of the data folder where they
were made; ``copy_release_fixture`` copies one and points those records at the copy's data folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "release-97f8652"
RECORDED_DATA = "/work/main/tests/fixtures/release-97f8652/data"  # where make.sh ran


def copy_release_fixture(name: str, dest: Path) -> Path:
    """Copy ``data/`` and the fixture folder ``name`` (``run``, ``compare``, ``reference``) under ``dest``, with the
    recorded data path replaced by ``dest/data``; returns ``dest/name``."""
    shutil.copytree(FIXTURES / "data", dest / "data", dirs_exist_ok=True)
    shutil.copytree(FIXTURES / name, dest / name)
    new = str((dest / "data").resolve())
    for f in (dest / name).rglob("*"):
        if f.suffix in (".json", ".md") and f.is_file():
            text = f.read_text(encoding="utf-8")
            if RECORDED_DATA in text:
                f.write_text(text.replace(RECORDED_DATA, new), encoding="utf-8")
    return dest / name


def reference_losses() -> list[float]:
    """The training losses, step by step, of the uninterrupted old-release run."""
    rows = [json.loads(line) for line in (FIXTURES / "reference" / "metrics.jsonl").read_text().splitlines() if line]
    return [r["loss"] for r in rows]


def resumed_to_step_8(out: str) -> bool:
    """Whether ``train``'s last line says it trained the steps from the fixture's checkpoint to step 8."""
    found = re.search(r"trained (\d+) steps \(steps (\d+)-8 of the run\)", out)
    return bool(found) and int(found.group(1)) == 8 - int(found.group(2)) + 1
