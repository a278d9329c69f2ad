"""Builders shared by test files in every folder of tests/ (``from helpers import make_data``; pyproject.toml puts
tests/ on ``sys.path``): the prepared corpus, a folder's snapshot, the time limits of subprocesses, the torchrun
launcher, a hand-made ``results.json`` and a three-method study file. Tiny models and batches are in conftest.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from depthattn.data import embedded_corpus_documents, prepare_corpus


#: sha256 of the embedded corpus's train token stream at the default settings, recorded with the single-file prepare
#: (main at e38c03e) before shards existed (tests/data/test_data_scale.py holds the val and tokenizer ones).
EMBEDDED_TRAIN_SHA = "84fe749cdacb6af054b7be965e814fd20de1db5fcc49769fb989fca79d26d2fb"


def make_data(folder: Path) -> Path:
    """Real text: the first 24,000 characters of six embedded documents, BPE vocab 512; returns ``folder / "data"``.
    Tests that only read it take conftest's session fixture ``data_dir`` instead of preparing their own."""
    docs = embedded_corpus_documents()[:6]
    src = folder / "slice.jsonl"
    src.write_text("".join(json.dumps({"text": text[:24000]}) + "\n" for _, text in docs), encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=512, val_fraction=0.2, progress=False)
    return folder / "data"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (symlinks as their target path), by relative path."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = b"-> " + os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


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


def hand_made_run(method, seed, val_loss, bpb, curve, secs=10.0, tokens=400, acc=None):
    """One run of a hand-made ``results.json`` (the fields ``depthattn compare`` writes), ``curve`` as (tokens,
    val_loss) pairs."""
    r = {"run_dir": f"/x/runs/{method}-seed{seed}", "method": method, "num_loops": 1, "seed": seed,
         "params": 1_000_000, "params_counted": 1_000_000, "tokens": tokens, "steps": 4, "val_loss": val_loss,
         "perplexity": math.exp(val_loss), "bits_per_byte": bpb, "train_tokens_per_s": 100.0,
         "train_seconds": secs, "step_tokens_per_s": [100.0, 101.0, 99.0, 100.0],
         "kv_bytes_per_token": 256, "flops_per_token": 1e6, "flops_extra_ratio": 0.0,
         "curve": [{"step": i + 1, "tokens": t, "val_loss": v} for i, (t, v) in enumerate(curve)],
         "train_curve": [{"tokens": t, "loss": v} for t, v in curve], "sample": " and so on"}
    if acc is not None:
        r.update(task_accuracy={"piqa": acc, "average": acc}, task_n={"piqa": 100}, task_chance={"piqa": 0.5})
    return r


def hand_made_results(seeds=(0, 1, 2)):
    """A hand-made ``results.json`` of none and depth_attention over ``seeds``, with its paired statistics and
    conclusion."""
    from depthattn.compare import aggregate, conclusions, paired_stats

    vals = {0: 5.0, 1: 5.1, 2: 4.9}
    none = [hand_made_run("none", s, vals[s], 2.0 + 0.05 * s, [(100, 6.0), (200, 5.5), (400, vals[s])], acc=0.50)
            for s in seeds]
    da = [hand_made_run("depth_attention", s, v, b, [(100, 5.8), (200, 5.0), (400, 4.9)], secs=12.0, acc=0.52)
          for s, v, b in zip(seeds, (4.974, 5.112, 4.860), (1.990, 2.056, 2.080))]
    res = {"settings": {"methods": ["none", "depth_attention"], "seeds": list(seeds), "loops": 1,
                        "preset": "tiny", "model_overrides": {},
                        "train": {"steps": 4, "batch_size": 1, "grad_accum": 1, "seq_len": 100, "lr": 1e-3,
                                  "warmup": 0.05, "min_lr_ratio": 0.1},
                        "data": "/d", "eval_tokens": None, "tasks": ["piqa"], "sample_prompt": "It"},
           "methods": {"none": {"runs": none, **aggregate(none)},
                       "depth_attention": {"runs": da, **aggregate(da)}},
           "wall_seconds": 9.0,
           "history": [{"started_utc": "2026-12-01T10:00:00Z", "wall_seconds": 500.0,
                        "runs": {"none-seed0": {"action": "trained", "seconds": 250.0}}},
                       {"started_utc": "2026-12-01T11:00:00Z", "wall_seconds": 9.0,
                        "runs": {"none-seed0": {"action": "reused", "seconds": 4.5}}}]}
    res["paired"] = paired_stats(res)
    res["conclusion"] = conclusions(res)
    return res


#: A study file of three methods and seeds 0–2 on the tiny preset, its data never read (parts and settings only).
SMALL_STUDY = """
name = "s"
out = "{out}"
data = "D"
preset = "tiny"
methods = ["none", "depth_attention", "attnres"]
seeds = [0, 1, 2]
steps = 4
"""


def small_study(tmp_path: Path, extra: str = ""):
    """``SMALL_STUDY`` plus the TOML text ``extra``, written to ``tmp_path/s.toml`` and loaded (``load_study``; its
    ``out`` is ``tmp_path/out``)."""
    from depthattn.study import load_study

    path = tmp_path / "s.toml"
    path.write_text(SMALL_STUDY.format(out=tmp_path / "out") + extra, encoding="utf-8")
    return load_study(path)
