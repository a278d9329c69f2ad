"""Every way a run starts or continues goes through ``training.resume.plan_run``: a fresh start, ``--init-from``,
``--resume``, ``--resume-if-exists``, ``--decay-from`` and ``compare``'s reuse. One test per way the old merging
went wrong (a resume before the first checkpoint of an ``--init-from`` run, another tokenizer of the same size under
``--decay-from`` and ``--init-from``, a data folder at a new path), and the plan of each mode checked directly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from depthattn.cli import main
from depthattn.data import embedded_corpus_documents, load_prepared, prepare_corpus
from depthattn.training import TrainConfig, read_metrics, read_run, train

TINY = ["--preset", "tiny", "--no-progress", "--set", "batch_size=4", "--set", "seq_len=64", "--set",
        "eval_windows=2", "--set", "eval_every=2", "--set", "device=cpu", "--set", "precision=float32"]
CFG = dict(batch_size=4, seq_len=64, eval_windows=2, eval_every=2, device="cpu", precision="float32",
           tensorboard=False)


@pytest.fixture(scope="module")
def other_tokenizer_data(tmp_path_factory, data_dir) -> Path:
    """Real text of six other embedded documents, prepared with its own BPE tokenizer of the same size as
    ``data_dir``'s (512): the same vocabulary size, other token ids."""
    folder = tmp_path_factory.mktemp("other_tok")
    src = folder / "slice.jsonl"
    docs = embedded_corpus_documents()[6:12]
    src.write_text("".join(json.dumps({"text": text[:24000]}) + "\n" for _, text in docs), encoding="utf-8")
    prepare_corpus(folder / "data", [str(src)], vocab_size=512, val_fraction=0.2, progress=False, log=None)
    ours, theirs = load_prepared(data_dir), load_prepared(folder / "data")
    assert theirs.vocab_size == ours.vocab_size == 512
    assert theirs.meta["tokenizer_sha256"] != ours.meta["tokenizer_sha256"]
    return folder / "data"


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run)]


# ------------------------------------------------------------------------------------------------ the findings
def test_a_resume_before_the_first_checkpoint_starts_from_init_from_again(data_dir, tmp_path, capsys):
    source = tmp_path / "source"
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "4", "--out", str(source)]) == 0
    fresh = tmp_path / "fresh"
    start = ["train", *TINY, "--data", str(data_dir), "--steps", "2", "--init-from", str(source)]
    assert main([*start, "--out", str(fresh)]) == 0
    scratch = tmp_path / "scratch"  # what a resume that forgot --init-from trains: the same run from random weights
    assert main([*start[:-2], "--out", str(scratch)]) == 0
    assert _losses(fresh)[0] < _losses(scratch)[0] - 0.1
    newest = source / "checkpoints" / "step_00000004"
    crashed = tmp_path / "crashed"  # as if killed before its first checkpoint: run.json, no checkpoint
    assert main([*start, "--out", str(crashed)]) == 0
    shutil.rmtree(crashed / "checkpoints")
    (crashed / "summary.json").unlink()
    capsys.readouterr()
    assert main(["train", "--resume", str(crashed), "--no-progress"]) == 0
    assert f"initialised from {newest}" in capsys.readouterr().out
    assert _losses(crashed) == _losses(fresh)  # step 1 included: exactly the fresh --init-from run's, not scratch's
    assert read_run(fresh)["init_from"] == read_run(crashed)["init_from"] == str(newest.resolve())  # the one taken


def test_decay_from_refuses_a_data_folder_re_prepared_with_another_tokenizer(data_dir, other_tokenizer_data,
                                                                             tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    source = tmp_path / "source"
    assert main(["train", *TINY, "--data", str(data), "--steps", "4", "--set", "lr_schedule=constant",
                 "--set", "warmup=0.25", "--set", "save_every=2", "--out", str(source)]) == 0
    shutil.rmtree(data)
    shutil.copytree(other_tokenizer_data, data)  # re-prepared in place: another tokenizer of the same size
    out = tmp_path / "decay"
    command = ["train", "--decay-from", str(source), "--decay-steps", "2", "--out", str(out), "--no-progress"]
    assert main(command) == 2
    err = _one_error(capsys)
    assert f"--decay-from {source / 'checkpoints' / 'step_00000004'}: data folder {data} has another tokenizer" in err
    assert "--allow-tokenizer-change" in err and not out.exists()
    assert main([*command, "--allow-tokenizer-change"]) == 0  # on purpose: recorded
    assert "--allow-tokenizer-change" in capsys.readouterr().out
    assert read_run(out)["allow_tokenizer_change"] is True and len(_losses(out)) == 2


def test_init_from_refuses_a_checkpoint_of_another_tokenizer(data_dir, other_tokenizer_data, tmp_path, capsys):
    source = tmp_path / "source"
    assert main(["train", *TINY, "--data", str(other_tokenizer_data), "--steps", "2", "--out", str(source)]) == 0
    out = tmp_path / "new"
    command = ["train", *TINY, "--data", str(data_dir), "--steps", "2", "--init-from", str(source), "--out", str(out)]
    assert main(command) == 2
    err = _one_error(capsys)
    assert f"--init-from {source}: data folder {data_dir} has another tokenizer than the checkpoint" in err
    assert "--allow-tokenizer-change" in err and "vocab_size" not in err and not out.exists()
    assert main(["train", *TINY, "--data", str(data_dir), "--steps", "2", "--out", str(out),
                 "--allow-tokenizer-change"]) == 2  # only with --init-from / --decay-from
    assert "applies to --init-from and --decay-from only" in _one_error(capsys)
    assert main([*command, "--allow-tokenizer-change"]) == 0
    record = read_run(out)
    assert record["allow_tokenizer_change"] is True and record["init_from"].endswith("step_00000002")


def test_a_run_whose_data_folder_moved_continues_there_with_data(data_dir, tmp_path, capsys):
    old, new = tmp_path / "mount_a" / "data", tmp_path / "mount_b" / "data"
    shutil.copytree(data_dir, old)
    run = tmp_path / "run"
    command = ["train", *TINY, "--data", str(old), "--steps", "4", "--set", "save_every=2", "--out", str(run)]
    assert main(command) == 0
    final = (run / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes()
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    (run / "summary.json").unlink()
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    new.parent.mkdir()
    os.rename(old, new)  # the same bytes at a new mount point
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--data", str(new), "--no-progress"]) == 0
    assert f"the run's data folder moved: {run} continues on {new}" in capsys.readouterr().out
    assert read_run(run)["data"] == str(new.resolve())
    assert (run / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes() == final  # bit for bit
    assert main(["train", "--resume", str(twin), "--no-progress"]) == 2
    assert f"the run's data folder {old} no longer exists; give --data DIR" in _one_error(capsys)
    other = tmp_path / "other"  # the same tokenizer, another split: another fingerprint stays refused
    prepare_corpus(other, [str(data_dir.parent / "slice.jsonl")], tokenizer=new / "tokenizer.json",
                   val_fraction=0.4, seed=5, progress=False, log=None)
    assert main(["train", "--resume", str(twin), "--data", str(other), "--no-progress"]) == 2
    assert f"cannot resume {twin}: data folder {other} holds other data" in _one_error(capsys)
    requeue = [a if a != str(old) else str(new) for a in command]
    assert main([a if a != str(run) else str(twin) for a in requeue] + ["--resume-if-exists"]) == 0
    assert read_run(twin)["data"] == str(new.resolve())
    assert (twin / "checkpoints" / "step_00000004" / "model.safetensors").read_bytes() == final


# ------------------------------------------------------------------------------------------------ the plan, per mode
def test_plan_run_for_each_mode(data_dir, model_cfg, tmp_path):
    from depthattn.training.resume import RunPlan, plan_run

    cfg = TrainConfig(steps=4, save_every=2, lr_schedule="constant", warmup=0.25, **CFG)
    fresh = plan_run("fresh", tmp_path / "a", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir)
    assert fresh == RunPlan("fresh", tmp_path / "a", model_cfg, cfg, data_dir)
    assert fresh.train_kwargs() == dict(resume=False, init_from=None, decay_from=None, allow_tokenizer_change=False)
    train(tmp_path / "a", model_cfg, cfg, data_dir, progress=False, **fresh.train_kwargs())

    init = plan_run("init_from", tmp_path / "b", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir,
                    source=tmp_path / "a")
    assert (init.resume, init.init_from, init.decay_from, init.lines) == (False, tmp_path / "a", None, [])
    with pytest.raises(ValueError, match="--init-from needs a checkpoint"):
        plan_run("init_from", tmp_path / "b", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir)

    resumed = plan_run("resume", tmp_path / "a", overrides={"device": "cpu", "compile": True}, environ={})
    assert (resumed.resume, resumed.data_dir, resumed.model_cfg, resumed.init_from) == (True, data_dir, model_cfg,
                                                                                          None)
    assert resumed.train_cfg == TrainConfig.from_recorded(read_run(tmp_path / "a")["train"]).replace(compile=True)
    torchrun = plan_run("resume", tmp_path / "a", environ={"WORLD_SIZE": "2"})
    assert torchrun.train_cfg.data_parallel == "ddp" and "resumes with data_parallel=ddp" in torchrun.lines[0]

    again = plan_run("resume_if_exists", tmp_path / "a", model_cfg=model_cfg, train_cfg=cfg.replace(compile=True),
                     given={"compile": True}, data_dir=data_dir, environ={})
    assert (again.mode, again.resume, again.train_cfg.compile, again.lines) == ("resume_if_exists", True, True, [])
    with pytest.raises(ValueError, match=r"was recorded with other settings \(recorded vs given: lr: 0.001 vs 0.1\)"):
        plan_run("resume_if_exists", tmp_path / "a", model_cfg=model_cfg, train_cfg=cfg.replace(lr=0.1),
                 data_dir=data_dir, environ={})
    first = plan_run("resume_if_exists", tmp_path / "new", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir)
    assert (first.resume, first.train_cfg) == (False, cfg)

    decay = plan_run("decay_from", tmp_path / "d", source=tmp_path / "a", decay_steps=2,
                     sets={"min_lr_ratio": 0.0}, environ={})
    assert decay.decay_from == tmp_path / "a" / "checkpoints" / "step_00000004" and decay.data_dir == data_dir
    assert (decay.resume, decay.train_cfg.steps, decay.train_cfg.decay_steps(), decay.train_cfg.min_lr_ratio) == (
        False, 6, 2, 0.0)

    reuse = plan_run("reuse", tmp_path / "a", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir)
    assert (reuse.resume, reuse.train_cfg, reuse.data_dir) == (True, cfg, data_dir)
    with pytest.raises(ValueError, match=r"holds a run with other settings \(seed: 0 vs 1\)"):
        plan_run("reuse", tmp_path / "a", model_cfg=model_cfg, train_cfg=cfg.replace(seed=1), data_dir=data_dir)
    assert plan_run("reuse", tmp_path / "c", model_cfg=model_cfg, train_cfg=cfg, data_dir=data_dir).resume is False
    with pytest.raises(ValueError, match="unknown start mode 'restart'"):
        plan_run("restart", tmp_path / "a")


# ------------------------------------------------------------------------------------------ the library's own path
def test_train_itself_resumes_from_the_recorded_init_from_and_checks_the_tokenizer(data_dir, model_cfg,
                                                                                   other_tokenizer_data, tmp_path):
    """``training.train`` (the public API, no plan) applies the same rules: a resume before the first checkpoint
    starts from the recorded ``init_from`` again, and a checkpoint of another tokenizer is refused."""
    cfg = TrainConfig(steps=2, save_every=2, **CFG)
    quiet = dict(progress=False, log=lambda _: None)
    train(tmp_path / "source", model_cfg, cfg, data_dir, **quiet)
    newest = tmp_path / "source" / "checkpoints" / "step_00000002"
    train(tmp_path / "fresh", model_cfg, cfg, data_dir, init_from=tmp_path / "source", **quiet)
    train(tmp_path / "crashed", model_cfg, cfg, data_dir, init_from=tmp_path / "source", **quiet)
    shutil.rmtree(tmp_path / "crashed" / "checkpoints")
    (tmp_path / "crashed" / "summary.json").unlink()
    train(tmp_path / "crashed", model_cfg, cfg, data_dir, resume=True, **quiet)  # no init_from given
    assert _losses(tmp_path / "crashed") == _losses(tmp_path / "fresh")
    assert read_run(tmp_path / "crashed")["init_from"] == str(newest.resolve())
    shutil.rmtree(tmp_path / "source")  # resumed from its own checkpoint, the run no longer reads its init_from
    (tmp_path / "crashed" / "summary.json").unlink()
    assert train(tmp_path / "crashed", model_cfg, cfg, data_dir, resume=True, **quiet).steps == 2
    other = tmp_path / "other"
    train(other, model_cfg, cfg, other_tokenizer_data, **quiet)
    with pytest.raises(ValueError, match=rf"--init-from {other}: data folder .* has another tokenizer"):
        train(tmp_path / "mixed", model_cfg, cfg, data_dir, init_from=other, **quiet)
    assert not (tmp_path / "mixed").exists()


def test_compare_reuses_a_run_whose_data_folder_moved_and_eval_needs_a_tokenizer(data_dir, tmp_path, capsys):
    """compare's reuse takes the run's data at another path (the same tokenizer and fingerprint), as ``--resume``
    does; ``eval --data`` of a checkpoint without ``tokenizer.json`` is refused in one line (nothing to pair)."""
    old = tmp_path / "old"
    shutil.copytree(data_dir, old)
    out = tmp_path / "cmp"
    args = ["compare", "--preset", "tiny", "--no-progress", "--methods", "none", "--steps", "2", "--eval-tokens",
            "128", "--set", "batch_size=2", "--set", "seq_len=32", "--set", "eval_every=0", "--set",
            "eval_windows=2", "--set", "eval_batch_size=2", "--set", "save_every=2", "--out", str(out)]
    assert main([*args, "--data", str(old)]) == 0
    before = (out / "results.json").read_text()
    new = tmp_path / "new"
    shutil.move(old, new)
    capsys.readouterr()
    assert main([*args, "--data", str(new)]) == 0
    said = capsys.readouterr().out
    assert "the run's data folder moved" in said and "reusing finished run" in said
    first, again = json.loads(before)["methods"]["none"], json.loads((out / "results.json").read_text())["methods"]
    assert again["none"]["runs"][0]["val_loss"] == first["runs"][0]["val_loss"]
    checkpoint = out / "runs" / "none-seed0" / "checkpoints" / "step_00000002"
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare)
    (bare / "tokenizer.json").unlink()  # a model folder without a tokenizer, as a converted one may be
    manifest = json.loads((bare / "checksums.json").read_text())
    del manifest["sha256"]["tokenizer.json"]
    (bare / "checksums.json").write_text(json.dumps(manifest))
    assert main(["eval", str(bare), "--data", str(new)]) == 2
    assert f"{bare / 'tokenizer.json'} not found: the checkpoint has no tokenizer" in _one_error(capsys)
