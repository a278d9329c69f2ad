"""scripts/bench.py: its report and ratios over several processes' interleaved measurements (pooled by
``depthattn.bench.pool``), and the script run end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import machine_timeout

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def raw(train_none, train_da, dec_none, dec_da):
    """A hand-made ``measure`` result: compiled none and depth_attention, decode at B = 1, no peer."""
    return {"meta": "hand-made", "rows": [["none", "eager"], ["none", "compiled"], ["depth_attention", "compiled"]],
            "decode_batches": [1], "tokens_per_step": 8, "train": True,
            "times": {"none/eager": [1.0] * len(train_none), "none/compiled": train_none,
                      "depth_attention/compiled": train_da, "none/eager/1": [1.0] * len(dec_none),
                      "none/compiled/1": dec_none, "depth_attention/compiled/1": dec_da},
            "mem": {"none": 1, "depth_attention": 1}, "kv": {"none": 1, "depth_attention": 1}}


def test_processes_pool_their_rounds_and_give_an_interval_across_processes(bench):
    # process 1: per-round decode ratios 1.1, 1.3, 1.0 -> median 1.1; process 2: 0.9, 0.95, 1.0 -> 0.95
    a = raw([1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [1.1, 2.6, 4.0])
    b = raw([2.0, 2.0, 2.0], [2.2, 2.2, 2.2], [2.0, 2.0, 2.0], [1.8, 1.9, 2.0])
    pooled = bench.pooled([a, b])
    assert pooled["times"]["depth_attention/compiled/1"] == [1.1, 2.6, 4.0, 1.8, 1.9, 2.0]
    assert pooled["times"]["none/compiled"] == [1.0, 2.0, 4.0, 2.0, 2.0, 2.0]
    assert a["times"]["depth_attention/compiled/1"] == [1.1, 2.6, 4.0]  # inputs untouched
    assert pooled["meta"].splitlines() == ["process 1: hand-made", "process 2: hand-made",
                                           "pooled over 2 processes (2 × the rounds above)"]
    stats = {(c["label"].split(" (")[0], c["name"]): c for c in bench.across_processes([a, b])}
    dec = stats[("compiled depth_attention / compiled vanilla", "decode B=1")]
    assert dec["per_process"] == pytest.approx([1.1, 0.95])
    assert dec["median"] == pytest.approx(1.025)
    assert dec["geomean"] == pytest.approx(math.sqrt(1.1 * 0.95))
    half = 12.7062047 * abs(math.log(1.1) - math.log(0.95)) / math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) * s / sqrt(n)
    mid = (math.log(1.1) + math.log(0.95)) / 2
    assert dec["ci95"] == pytest.approx([math.exp(mid - half), math.exp(mid + half)], rel=1e-5)
    train = stats[("compiled depth_attention / compiled vanilla", "train")]
    assert train["per_process"] == pytest.approx([1.0, 1.1])
    assert bench.across_processes([a])[0]["ci95"] is None  # one process: no interval, never a zero-width one


def full_raw():
    """Every row kind, constant per-round times, so each ratio is known exactly."""
    times = {"none/eager": (1.0, 0.01), "depth_attention/eager": (1.2, 0.012), "none/compiled": (0.8, 0.005),
             "depth_attention/compiled": (0.88, 0.00525), "hf_qwen3/peer": (1.25, 0.01)}
    return {"meta": "hand-made", "rows": [k.split("/") for k in times], "decode_batches": [1], "tokens_per_step": 8,
            "train": True, "times": {**{k: [t, t] for k, (t, _) in times.items()},
                                     **{f"{k}/1": [d, d] for k, (_, d) in times.items()}},
            "mem": {"none": 2**20, "depth_attention": 2**21}, "kv": {"none": 64, "depth_attention": 64}}


def test_report_states_every_ratio_against_the_right_baseline(bench, capsys):
    bench.print_report(full_raw())
    out = capsys.readouterr().out.splitlines()
    assert "| depth_attention | compiled | 9 | 1.100 | 190.5 | 1.050 | 2.0 | 2.000 | 64 | 1.000 |" in out  # vs compiled none
    assert "| depth_attention | eager | 7 | 1.200 | 83.3 | 1.200 | 2.0 | 2.000 | 64 | 1.000 |" in out
    assert "| hf_qwen3 | peer | 6 | 1.250 | 100.0 | 1.000 |  |  |  |  |" in out  # vs our eager none
    assert "- our eager vanilla / HF Qwen3 eager (target <= 1): train 0.800, decode B=1 1.000" in out
    assert "- HF Qwen3 eager decode / our compiled vanilla decode (target >= 2 at B=1): B=1 2.00x" in out
    assert ("- compiled depth_attention / compiled vanilla (target <= 1.02 for depth_attention): train 1.100, "
            "decode B=1 1.050") in out
    assert "- compiled vanilla / eager vanilla: train 0.800, decode B=1 0.500" in out
    bench.print_across_processes([full_raw(), full_raw()])
    out = capsys.readouterr().out
    assert ("- HF Qwen3 eager decode / our compiled vanilla decode (target >= 2 at B=1), B=1: per process 2.00x, "
            "2.00x; median 2.00x, geometric mean 2.00x (95 % interval 2.00x–2.00x)") in out


@pytest.mark.parametrize("argv", [["--rounds", "2", "--processes", "3", "--raw-out", "a.json"],
                                  ["--processes=3", "--rounds", "2", "--raw-out=a.json"]])
def test_a_child_never_spawns_children_of_its_own(bench, argv):
    assert bench.child_argv(argv, Path("c.json")) == ["--rounds", "2", "--processes", "1", "--raw-out", "c.json"]


@pytest.mark.slow
def test_several_processes_end_to_end(tmp_path):
    out = tmp_path / "raw.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--preset", "tiny", "--peer", "off",
                           "--rounds", "1", "--decode-steps", "1", "--context", "8", "--decode-batches", "2",
                           "--batch-size", "1", "--seq-len", "8", "--processes=2", "--raw-out", str(out)],
                          capture_output=True, text=True, timeout=machine_timeout(600))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    raws = record["processes"]
    assert len(raws) == 2 and all(len(r["times"]["depth_attention/eager/2"]) == 1 for r in raws)
    assert record["environment"]["command"].endswith("--processes=2 --raw-out " + str(out))
    assert "pooled over 2 processes" in done.stdout
    assert "| depth_attention | eager |" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--processes", "0"], "--processes must be at least 1, got 0"),
    (["--proc", "2"], "unrecognized arguments: --proc 2"),  # no abbreviations: a child would spawn children
    (["--decode-steps", "0"], "--decode-steps must be at least 1, got 0"),
    (["--decode-batches", "1,x"], "--decode-batches must be comma-separated integers, got '1,x'"),
    (["--methods", "depth_attention"], "--methods must start with none"),
    (["--methods", "none,nosuch"], "--methods: unknown method 'nosuch'"),
    (["--raw-out", "/nonexistent-folder/x.json"], "must name a file in an existing folder"),
    (["--train", "off", "--decode-batches", ""], "--train off with an empty --decode-batches leaves nothing to time")])
def test_bad_arguments_get_one_line(argv, message):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), *argv], capture_output=True, text=True,
                          timeout=machine_timeout(120))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
