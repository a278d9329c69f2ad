"""The docs test: every code block of README.md and docs/*.md is tagged with its language and marked with how it is
tested (tests/doc_blocks.py), and every block marked ``run`` runs (with its stated substitutions) and exits 0, in
order, one folder per file. A documented command that stops working fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.checkpoint_files import REMOTE_CODE_FILES
from depthattn.fileio import file_states, rewrite_manifest_entries

from authors_docs import padded_authors_folder
from doc_blocks import DOC_FILES, LANGUAGES, ROOT, RUNNABLE, all_blocks, blocks
from helpers import machine_timeout
from release_fixtures import copy_release_fixture

BLOCK_TIMEOUT_S = 300  # on an idle 2-core machine; machine_timeout scales it to this one


def test_every_block_is_tagged_and_marked():
    problems = []
    for b in all_blocks():
        if b.language not in LANGUAGES:
            problems.append(f"{b.where}: language tag {b.language!r}; use one of {sorted(LANGUAGES)}")
        if b.action is None:
            problems.append(f"{b.where}: no <!-- doctest: run | vllm | skip: REASON --> marker above the block")
        elif b.action != "skip" and b.language not in RUNNABLE:
            problems.append(f"{b.where}: a {b.language} block cannot be run; mark it skip with the reason")
        else:
            try:
                b.prepared()
            except AssertionError as e:
                problems.append(str(e))
    assert problems == []
    assert _runnable_files(), "no doc block is marked run"


def _runnable_files() -> list[Path]:
    return [f for f in DOC_FILES if any(b.action == "run" for b in blocks(f))]


def _folder(tmp_path: Path) -> dict[str, str]:
    """Lay out the folder a file's blocks run in (fixtures, the repository's configs/ and scripts/) and return the
    environment: no network, a private cache, this interpreter's scripts first on PATH."""
    copy_release_fixture("run", tmp_path / "fixture")
    copy_release_fixture("compare", tmp_path / "fixture")
    # the fixture's checkpoints with this release's copies of configuration.py / modeling.py (the 97f8652 copies
    # predate later model fields: docs/hf.md, "Checkpoints of older releases"), manifests updated
    for folder in (tmp_path / "fixture").rglob("step_*"):
        before = file_states(folder)
        for name in REMOTE_CODE_FILES:
            shutil.copyfile(ROOT / "src" / "depthattn" / "hf" / name, folder / name)
        rewrite_manifest_entries(folder, before)
    padded_authors_folder(tmp_path / "fixture" / "authors-da", 576)
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "DEPTHATTN_CACHE": str(tmp_path / "cache"), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1"}


@pytest.mark.docs
@pytest.mark.parametrize("doc", _runnable_files(), ids=lambda f: str(f.relative_to(ROOT)))
def test_documented_blocks_run(doc: Path, tmp_path):
    env = _folder(tmp_path)
    for b in blocks(doc):
        if b.action != "run":
            continue
        code = b.prepared()
        if b.language == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            script = tmp_path / f"block_{b.line}.py"
            script.write_text(code, encoding="utf-8")
            cmd = [sys.executable, str(script)]
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=machine_timeout(BLOCK_TIMEOUT_S), stdin=subprocess.DEVNULL)
        assert res.returncode == 0, (f"{b.where} exited {res.returncode}\n--- block as run:\n{code}\n--- stderr:\n"
                                     f"{res.stderr[-3000:]}\n--- stdout:\n{res.stdout[-1500:]}")


def test_committed_docs_hold_no_absolute_path_of_the_machine_that_wrote_them():
    """Pages, benchmark logs (results/bench) and published results show paths relative to the checkout, or none (a
    temporary folder, a venv's site-packages); example paths a reader replaces (/shared/..., /path/to/...) are not a
    machine's."""
    import re

    machine = re.compile(r"(?<![\w.~])/(?:tmp|work|home|root|Users|farm|var/folders)/[\w.-]")
    files = [p for folder in ("docs", "results") for p in (ROOT / folder).rglob("*")
             if p.suffix in (".md", ".txt", ".json")] + [ROOT / "README.md"]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if machine.search(line)]
    assert found == []
