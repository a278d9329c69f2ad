"""Builders shared by test files in every folder of tests/ (``from helpers import make_data``; pyproject.toml puts
tests/ on ``sys.path``): the prepared corpus, the torchrun launcher and the time limits of subprocesses. Tiny models
and batches are in conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.data import embedded_corpus_documents, prepare_corpus


def make_data(folder: Path) -> Path:
    """Real text: the first 24,000 characters of six embedded documents, BPE vocab 512; returns ``folder / "data"``.
    Tests that only read it take conftest's session fixture ``data_dir`` instead of preparing their own."""
    docs = embedded_corpus_documents()[:6]
    src = folder / "slice.jsonl"
    src.write_text("".join(json.dumps({"text": text[:24000]}) + "\n" for _, text in docs), encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=512, val_fraction=0.2, progress=False)
    return folder / "data"


def machine_timeout(seconds: float) -> float:
    """A time limit of ``seconds`` on an idle 2-core machine, scaled to this one: times the load per core when it is
    above 1 (a shared machine), times 2 / cores on fewer than 2 cores, times ``DEPTHATTN_TEST_TIMEOUT_SCALE`` (default
    1) for a machine slower still. Seconds, float."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    scale = max(1.0, load / cores) * max(1.0, 2 / cores)
    return seconds * scale * float(os.environ.get("DEPTHATTN_TEST_TIMEOUT_SCALE", "1"))


def torchrun(args: list[str], cwd: Path, *, nproc: int = 2, timeout_s: float = 120, env: dict[str, str] | None = None,
             launch: tuple[str, ...] = (), check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=NPROC LAUNCH ARGS`` in ``cwd``: one thread per process, the depthattn
    cache in ``cwd / "cache"`` unless ``env`` names another, SIGINT at its default disposition (a non-interactive
    shell's ``&`` leaves it ignored, and an ignored signal stays ignored). Fails the test after
    ``machine_timeout(timeout_s)`` seconds, and on a non-zero exit when ``check``, showing the processes' output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DEPTHATTN_CACHE": str(cwd / "cache"), "PYTHONUNBUFFERED": "1",
           **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *launch, *args]
    limit = machine_timeout(timeout_s)
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in {limit:.0f} s: {cmd}\n{e.stdout}\n{e.stderr}")
    if check:
        assert res.returncode == 0, f"torchrun failed ({res.returncode}): {cmd}\n{res.stdout}\n{res.stderr}"
    return res
