"""End to end through ``depthattn.cli.main`` (in-process): train -> resume -> eval -> generate -> compare, and the
one-line errors for bad input."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.training import read_metrics


TINY = ["--preset", "tiny", "--no-progress", "--set", "batch_size=4", "--set", "seq_len=64", "--set",
        "eval_windows=4", "--set", "eval_every=3", "--set", "save_every=3"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir) -> Path:
    run = tmp_path_factory.mktemp("cli_runs") / "run"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "6", "--cross-layer", "depth_attention",
                 "--out", str(run)]) == 0
    return run


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Never prepare into the user's cache folder from a test."""
    monkeypatch.setenv("DEPTHATTN_CACHE", str(tmp_path / "cache"))


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_train_cli_writes_run_folder(run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    assert run["model"]["cross_layer"] == "depth_attention" and run["train"]["steps"] == 6
    assert run["model"]["vocab_size"] == 512  # from the data's tokenizer
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    ck = run_dir / "checkpoints/step_00000006"
    assert {p.name for p in ck.iterdir()} == {"model.safetensors", "config.json", "generation_config.json",
                                              "tokenizer.json", "tokenizer_config.json", "configuration.py",
                                              "modeling.py", "train_config.json", "trainer_state.pt", "val_loss.json",
                                              "checksums.json"}
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 7)) and all(r["tokens_per_s"] > 0 for r in rows)


def test_resume_cli_repeats_the_run(run_dir, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / "checkpoints/step_00000006")
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    from depthattn.training.metrics import MEASURED_KEYS  # timing and memory: not part of the trajectory

    strip = [{k: v for k, v in r.items() if k not in MEASURED_KEYS} for r in read_metrics(run)]
    assert strip == [{k: v for k, v in r.items() if k not in MEASURED_KEYS} for r in read_metrics(run_dir)]


def test_eval_cli_numbers_are_consistent(run_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(run_dir), "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"val loss (\S+)\s+perplexity (\S+)\s+bits/byte (\S+)\s+\(([\d,]+) tokens, ([\d,]+) bytes", printed)
    res = json.loads(out.read_text())
    assert float(m.group(1)) == pytest.approx(res["loss"], abs=1e-6)
    assert float(m.group(2)) == pytest.approx(res["perplexity"], abs=1e-4)
    assert res["perplexity"] == pytest.approx(math.exp(res["loss"]), rel=1e-12)
    assert res["bits_per_byte"] == pytest.approx(res["nats"] / (math.log(2) * res["bytes"]), rel=1e-12)
    meta = json.loads((data_dir / "meta.json").read_text())
    assert res["tokens"] == meta["splits"]["val"]["tokens"] - 1  # the whole split; the first token has no context
    assert res["bytes"] <= meta["splits"]["val"]["bytes"] and int(m.group(5).replace(",", "")) == res["bytes"]
    # the final periodic validation loss (a subset of windows) is in the same range
    assert abs(json.loads((run_dir / "summary.json").read_text())["final_val_loss"] - res["loss"]) < 0.5


def test_generate_cli_streams_text(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--max-new-tokens", "12", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The whale") and len(first.strip()) > len("The whale")
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--max-new-tokens", "12", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first  # seeded sampling is reproducible


def test_compare_cli_report_matches_printed_table(data_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", *TINY, "--data", str(data_dir), "--steps", "4", "--methods", "none,depth_attention",
            "--out", str(out), "--eval-tokens", "600", "--tasks", "piqa", "--limit", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    png = (out / "loss_curves.png").read_bytes()
    assert "| fwd FLOPs/token incl. attn (T=64) |" in printed and "| fwd FLOPs/token incl. attn (T=64) |" in report
    assert "median of the per-step training throughput" in report and "attention at the training length T = 64" in report
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in printed.splitlines() if line.startswith("| none") or line.startswith("| depth_attention")}
    assert set(rows) == {"none", "depth_attention"}
    for method, cells in rows.items():
        r = results["methods"][method]["runs"][0]
        assert "| " + method + " | " + " | ".join(cells) + " |" in report
        assert int(cells[0].replace(",", "")) == r["params"] == r["params_counted"]
        assert int(cells[1].replace(",", "")) == r["tokens"] == 4 * 4 * 64
        assert float(cells[2]) == pytest.approx(r["val_loss"], abs=5e-5)
        assert float(cells[3]) == pytest.approx(math.exp(r["val_loss"]), abs=5e-3)
        assert float(cells[4]) == pytest.approx(r["bits_per_byte"], abs=5e-5)
        assert r["eval_tokens"] == 600 and r["sample"].replace("\n", " ") in report.replace("\n", " ") or r["sample"].strip() == ""
        acc = r["zero_shot"]["tasks"]["piqa"]["acc"]
        assert 0 <= acc <= 1 and r["task_accuracy"] == {"piqa": acc, "average": acc}
        assert float(cells[-2]) == pytest.approx(acc, abs=5e-5) and float(cells[-1]) == pytest.approx(acc, abs=5e-5)
    assert "| piqa | average |" in report
    a, b = (results["methods"][m]["runs"][0] for m in ("none", "depth_attention"))
    assert a["params"] == b["params"] and a["kv_bytes_per_token"] == b["kv_bytes_per_token"] == 2 * 4 * 2 * 16 * 2
    assert b["flops_per_token"] > a["flops_per_token"]
    assert a["val_loss"] != b["val_loss"]
    # a second call reuses the finished runs and reproduces the same numbers
    before = hashes(out / "runs")
    assert main(args) == 0
    assert capsys.readouterr().out.count("| none |") == 1
    again = json.loads((out / "results.json").read_text())
    assert again["methods"]["none"]["mean"] == results["methods"]["none"]["mean"] or \
        again["methods"]["none"]["mean"]["val_loss"] == results["methods"]["none"]["mean"]["val_loss"]
    assert {k: v for k, v in hashes(out / "runs").items() if "checkpoints" in k} == \
        {k: v for k, v in before.items() if "checkpoints" in k}
    # the report keeps the history: the first invocation's wall time and the runs' training time survive the rerun
    assert len(again["history"]) == 2 and again["history"][0] == results["history"][0]
    assert {r["action"] for r in again["history"][1]["runs"].values()} == {"reused"}
    assert [r["train_seconds"] for r in again["methods"]["none"]["runs"]] == \
        [r["train_seconds"] for r in results["methods"]["none"]["runs"]]
    assert f"1. {results['history'][0]['started_utc']}: " in (out / "report.md").read_text()
    # the console says the result first: the conclusion lines come before the table
    assert "on one seed: inconclusive" in printed and printed.index("`depth_attention` is ") < printed.index("| method |")


def test_compare_keys_runs_and_eval_cache_by_data_fingerprint(data_dir, tmp_path):
    from depthattn.compare import CompareSettings, run_compare
    from depthattn.data import load_prepared, prepare_corpus
    from depthattn.training import TrainConfig

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    settings = CompareSettings(methods=["none"], seeds=[0], loops=1, preset="tiny", model_overrides={},
                               train=TrainConfig(steps=2, batch_size=2, seq_len=32, eval_every=0, eval_windows=2),
                               eval_tokens=None)
    out = tmp_path / "cmp"
    res = run_compare(out, settings, data, progress=False, log=lambda *a: None)
    run = out / "runs" / "none-seed0"
    fingerprint = load_prepared(data).fingerprint
    assert json.loads((run / "run.json").read_text())["data_fingerprint"] == fingerprint
    cache = json.loads((run / "eval.json").read_text())
    assert cache["key"]["data_fingerprint"] == fingerprint
    assert cache["result"]["loss"] == res["methods"]["none"]["runs"][0]["val_loss"]
    # the folder is re-prepared in place (same tokenizer, other split): the finished run is not reused
    prepare_corpus(data, [str(data_dir.parent / "slice.jsonl")], tokenizer=data_dir / "tokenizer.json",
                   val_fraction=0.4, seed=5, progress=False, overwrite=True)
    before = hashes(run)
    with pytest.raises(ValueError, match=r"other settings \(data .*fingerprint differs"):
        run_compare(out, settings, data, progress=False, log=lambda *a: None)
    assert hashes(run) == before


def test_compare_evaluates_in_the_precision_the_run_trained_in(data_dir, tmp_path):
    """A run trained in bf16 autocast (on CPU here; float32 on CUDA is the same rule) is evaluated in it: compare's
    final val loss is evaluate_perplexity's under bf16, not under float32 (it used "auto", which is float32 on CPU and
    bf16 on CUDA whatever the run trained in)."""
    import torch

    from depthattn.compare import CompareSettings, run_compare
    from depthattn.data import load_prepared
    from depthattn.eval.inference import load_for_inference
    from depthattn.eval.perplexity import evaluate_perplexity
    from depthattn.training import TrainConfig

    settings = CompareSettings(methods=["depth_attention"], seeds=[0], loops=1, preset="tiny", model_overrides={},
                               train=TrainConfig(steps=3, batch_size=2, seq_len=32, eval_every=0, eval_windows=2,
                                                 precision="bfloat16"),
                               eval_tokens=400)
    res = run_compare(tmp_path / "cmp", settings, data_dir, progress=False, log=lambda *a: None)
    model, tokenizer, _, dev = load_for_inference(tmp_path / "cmp/runs/depth_attention-seed0", "cpu", "--device")
    data = load_prepared(data_dir)
    loss = {amp: evaluate_perplexity(model, data.val, tokenizer, seq_len=32, batch_size=8, max_tokens=400,
                                     device=dev, amp_dtype=amp, progress=False).loss
            for amp in (torch.bfloat16, None)}
    assert loss[torch.bfloat16] != loss[None]
    assert res["methods"]["depth_attention"]["runs"][0]["val_loss"] == loss[torch.bfloat16]
    # an eval.json written before the cache key named the precision was evaluated under "auto" (float32 here): it
    # is reused only where that is the run's precision; this bf16 run is evaluated again
    from depthattn.compare import evaluate_run

    run = tmp_path / "cmp/runs/depth_attention-seed0"
    cache = json.loads((run / "eval.json").read_text())
    assert cache["key"].pop("amp") == "torch.bfloat16"
    cache["result"]["loss"] = 1.0
    (run / "eval.json").write_text(json.dumps(cache))
    assert evaluate_run(run, 400, 8, [], None, "native", False)["val_loss"] == loss[torch.bfloat16]
    meta = json.loads((run / "run.json").read_text())
    meta["resolved_precision"] = "float32"  # as a float32 run's would read: the old entry is its own
    (run / "run.json").write_text(json.dumps(meta))
    cache["key"].pop("amp", None)
    (run / "eval.json").write_text(json.dumps(cache))
    assert evaluate_run(run, 400, 8, [], None, "native", False)["val_loss"] == 1.0


@pytest.mark.parametrize("argv, message", [
    (["train", "--preset", "huge", "--steps", "1"], "unknown preset 'huge'"),
    (["train", "--preset", "tiny", "--set", "hidden=3"], "--set: unknown key 'hidden'"),
    (["train", "--preset", "tiny", "--tokens", "10"], "TrainConfig.tokens=10 is shorter than one optimizer step"),
    (["compare", "--methods", "none,fancy"], "--methods: unknown method(s) ['fancy']"),
])
def test_bad_arguments_print_one_error(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith(f"depthattn {argv[0]}: error:")


def test_bad_files_print_one_error_and_touch_nothing(run_dir, data_dir, tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('preset = "tiny"\n[model]\nhidden_sise = 8\n')
    assert main(["train", "--config", str(cfg), "--data", str(data_dir)]) == 2
    assert "bad.toml: unknown [model] key(s) ['hidden_sise']" in capsys.readouterr().err
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--set", "vocab_size=100"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size=100 " in err and "512 tokens" in err and "tokenizer.json" in err
    run = tmp_path / "t"
    shutil.copytree(run_dir, run)
    weights = run / "checkpoints/step_00000006/model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = hashes(run)
    assert main(["eval", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "step_00000006/model.safetensors" in err and "truncated or corrupt" in err
    # resume takes the previous readable checkpoint (test_reliability_train.py); with none readable: one error
    older = run / "checkpoints/step_00000003/model.safetensors"
    older.write_bytes(older.read_bytes()[:100])
    before = hashes(run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no readable checkpoint" in err and "step_00000006/model.safetensors" in err
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(run)]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert hashes(run) == before
    # evaluating on data with another tokenizer
    other = tmp_path / "other"
    shutil.copytree(data_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["model"]["vocab"]["zzzz"] = tok["model"]["vocab"].pop(next(iter(tok["model"]["vocab"])))
    (other / "tokenizer.json").write_text(json.dumps(tok))
    assert main(["eval", str(run_dir), "--data", str(other), "--no-progress"]) == 2
    assert "tokenizer mismatch" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- new-user trial
@pytest.mark.parametrize("flags, named", [
    (["--steps", "8"], "--steps"), (["--tokens", "4096"], "--tokens"), (["--cross-layer", "none"], "--cross-layer"),
    (["--seed", "0"], "--seed"), (["--loops", "2"], "--loops"), (["--data", "somewhere"], "--data"),
    (["--out", "elsewhere"], "--out"), (["--preset", "tiny", "--steps", "2"], "--preset, --steps"),
])
def test_resume_refuses_flags_that_would_change_the_run(run_dir, tmp_path, capsys, flags, named):
    run = tmp_path / "r"
    shutil.copytree(run_dir, run)
    before = hashes(run)
    assert main(["train", "--resume", str(run), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthattn train: error: --resume") and f"drop {named} (" in err[0]
    assert hashes(run) == before


def test_resume_says_where_it_starts_and_when_there_is_nothing_to_do(run_dir, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / "checkpoints/step_00000006")
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {run} from step 3 of 6" in out and "trained 3 steps (steps 4-6 of the run)" in out
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"{run} already finished at step 6; nothing to do" in out
    assert "resuming" not in out and "trained" not in out


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "piqaa"], "--tasks: unknown task name(s) ['piqaa']"),
    (["--tasks", "piqa", "--limit", "0"], "--limit 0 must be >= 1"),
    (["--limit", "5"], "--limit counts examples per zero-shot task and needs --tasks"),
    (["--seeds", "0,a"], "--seeds '0,a': 'a' is not an integer"),
    (["--seeds", "1,1"], "--seeds '1,1' lists a seed twice"),
])
def test_compare_checks_cheap_arguments_before_training(data_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("depthattn compare: error:")
    assert not out.exists()  # nothing trained


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "piqaa"], "--tasks: unknown task name(s) ['piqaa']"),
    (["--tasks", "piqa", "--limit", "0"], "--limit 0 must be >= 1"),
    (["--limit", "5"], "use --max-tokens"),
    (["--skip-perplexity"], "--skip-perplexity leaves nothing to do without --tasks"),
])
def test_eval_checks_tasks_and_limit_before_perplexity(run_dir, capsys, extra, message):
    assert main(["eval", str(run_dir), "--no-progress", *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1 and message in err[0]  # no perplexity line before the error


def test_eval_no_progress_hides_the_zero_shot_bar(run_dir, capfd):
    assert main(["eval", str(run_dir), "--tasks", "piqa", "--limit", "2", "--skip-perplexity", "--no-progress"]) == 0
    captured = capfd.readouterr()
    assert "piqa" in captured.out and captured.err == ""


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["eval", "generate"])
def test_device_errors_name_the_flag(run_dir, capsys, command):
    argv = [command, str(run_dir), "--device", "cuda"] + (["--prompt", "The"] if command == "generate" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda: CUDA is not available" in err[0] and "TrainConfig" not in err[0]


def test_generate_refuses_a_too_long_budget_before_printing(run_dir, capsys):
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--max-new-tokens", "100000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the prompt is not echoed
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "--max-new-tokens 100000" in err[0] and "max_position_embeddings=" in err[0]


def test_version(capsys):
    from depthattn import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"depthattn {__version__}"


def test_train_help_names_the_data_cache(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "~/.cache/depthattn" in text and "$DEPTHATTN_CACHE" in text


def test_train_on_a_raw_text_folder_suggests_preparing_it_elsewhere(tmp_path, capsys):
    raw = tmp_path / "mytext"
    raw.mkdir()
    (raw / "a.txt").write_text("Some text.\n")
    assert main(["train", "--preset", "tiny", "--steps", "1", "--data", str(raw)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"depthattn data prepare --input {raw} --out NEW_DIR" in err[0]
    assert f"--out {raw}`" not in err[0]


def test_data_prepare_errors_name_the_subcommand(tmp_path, capsys):
    assert main(["data", "prepare", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthattn data prepare: error:") and "missing.txt" in err[0]


def test_inspect_says_what_its_flop_columns_count(capsys):
    from depthattn.accounting import num_flops
    from depthattn.config import ModelConfig

    assert main(["inspect", "--preset", "tiny", "--cross-layer", "none,depth_attention", "--seq-len", "64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    vocab = ModelConfig.from_preset("tiny").vocab_size
    assert lines[0].startswith(f"preset tiny, vocab {vocab} (")
    head = [c.strip() for c in lines[1].split("|")[1:-1]]
    assert head[3:5] == ["fwd FLOPs/token (matmul, excl. attention)", "fwd FLOPs/token incl. attention (seq_len=64)"]
    row = [c.strip() for c in lines[4].split("|")[1:-1]]
    fl = num_flops(ModelConfig.from_preset("tiny", cross_layer="depth_attention"), 64)
    assert row[0] == "depth_attention"
    assert float(row[3]) == pytest.approx(fl.vanilla + fl.extra, rel=1e-3)
    assert float(row[4]) == pytest.approx(fl.total, rel=1e-3)


def test_compare_throughput_is_the_median_after_the_first_step():
    from depthattn.compare.evaluate import train_tokens_per_s

    rows = [{"step": 1, "tokens": 100, "tokens_per_s": 10.0}, {"step": 2, "tokens": 200, "tokens_per_s": 100.0},
            {"step": 3, "tokens": 300, "tokens_per_s": 110.0}, {"step": 4, "tokens": 400, "tokens_per_s": 1000.0}]
    assert train_tokens_per_s(rows) == 110.0  # the slow warm-up step and the outlier do not move it
    assert train_tokens_per_s(rows[:1]) == 10.0
    assert math.isnan(train_tokens_per_s([]))


def test_generate_compile_without_a_working_compiler_prints_one_line(run_dir, capsys, monkeypatch):
    import importlib

    gen = importlib.import_module("depthattn.generate")  # the module (``depthattn.generate`` is also a function)

    def broken(gm, example_inputs):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\ndetails")

    monkeypatch.setattr(gen, "DEFAULT_BACKEND", broken)
    assert main(["generate", str(run_dir), "--prompt", "The whale", "--compile"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed before the error
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "--compile" in err[0] and "no working C++ compiler" in err[0]


def test_interrupted_compare_resumes_the_partial_run_bit_identical(data_dir, tmp_path, monkeypatch):
    """A compare stopped inside its second run (after step 4; last checkpoint at step 3) continues that run from
    step 3, not from 0, reuses the finished one, and ends with the same weights and numbers as an uninterrupted one."""
    import depthattn.compare.reuse as reuse
    from depthattn.compare import CompareSettings, run_compare
    from depthattn.training import TrainConfig

    settings = CompareSettings(methods=["none", "depth_attention"], seeds=[0], loops=1, preset="tiny",
                               model_overrides={},
                               train=TrainConfig(steps=6, batch_size=2, seq_len=32, eval_every=3, eval_windows=2,
                                                 save_every=3, keep_last=1),
                               eval_tokens=300)
    whole = run_compare(tmp_path / "whole", settings, data_dir, progress=False, log=lambda *a: None)

    real_train = reuse.train

    def interrupted(run_dir, *args, **kw):
        if Path(run_dir).name.startswith("depth_attention"):
            real_train(run_dir, *args, stop_after=4, **kw)
            raise KeyboardInterrupt
        return real_train(run_dir, *args, **kw)

    monkeypatch.setattr(reuse, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_compare(tmp_path / "cut", settings, data_dir, progress=False, log=lambda *a: None)
    monkeypatch.setattr(reuse, "train", real_train)
    logs: list[str] = []
    again = run_compare(tmp_path / "cut", settings, data_dir, progress=False, log=logs.append)
    actions = {k: v["action"] for k, v in again["history"][-1]["runs"].items()}
    assert actions == {"none-seed0": "reused", "depth_attention-seed0": "resumed at step 3"}
    assert any("from step 3 of 6" in line for line in logs), logs
    for method in settings.methods:
        a, b = whole["methods"][method]["runs"][0], again["methods"][method]["runs"][0]
        assert a["val_loss"] == b["val_loss"] and a["curve"] == b["curve"]
        assert [r["loss"] for r in a["train_curve"]] == [r["loss"] for r in b["train_curve"]]
        name = f"{method}-seed0/checkpoints/step_00000006/model.safetensors"
        assert (tmp_path / "whole/runs" / name).read_bytes() == (tmp_path / "cut/runs" / name).read_bytes()
