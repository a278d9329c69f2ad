"""Fault injection on the trainer (docs/reliability.md, "Training runs"): kill -9 at seeded random points (step
boundaries, inside checkpoint writes, mid-prune), a full disk at chosen writes, NaN losses / gradients / weights,
torn and missing metrics logs, unreadable checkpoints. Each ends with a resume that must equal an uninterrupted run
bit for bit, or one clear error with the earlier checkpoints intact."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import signal
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from depthattn.checkpoint import checkpoint_dirs
from depthattn.cli import main
from depthattn.data import load_prepared
from depthattn.training import NonFiniteError, TrainConfig, read_metrics, train
from depthattn.training import loop as loop_module
from depthattn.training import metrics as metrics_module
from depthattn.training.metrics import MEASURED_KEYS
from depthattn.run.faults import FAULT_ENV


STEPS = 8
CFG = dict(steps=STEPS, batch_size=2, seq_len=32, lr=3e-3, warmup=0.1, eval_every=4, eval_windows=2,
           eval_batch_size=2, save_every=2, keep_last=2, tensorboard=False)
CHECKPOINT_FILES = {"model.safetensors", "config.json", "train_config.json", "trainer_state.pt", "tokenizer.json"}


def train_quiet(folder, model_cfg, data_dir, *, resume=False, **overrides) -> list[str]:
    """Train with ``CFG`` (+ overrides); the log lines."""
    lines: list[str] = []
    train(folder, model_cfg, TrainConfig(**{**CFG, **overrides}), data_dir, resume=resume, progress=False,
          log=lines.append)
    return lines


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_cfg, data_dir) -> Path:
    """An uninterrupted run."""
    folder = tmp_path_factory.mktemp("ref") / "run"
    train_quiet(folder, model_cfg, data_dir)
    return folder


def curve(folder: Path) -> list[dict]:
    """The metrics rows without the machine-measured keys (timing, memory)."""
    return [{k: v for k, v in r.items() if k not in MEASURED_KEYS} for r in read_metrics(folder)]


def strict_rows(folder: Path) -> list[dict]:
    """metrics.jsonl parsed by a strict JSON parser (NaN / Infinity constants rejected)."""
    def refuse(constant):
        raise ValueError(f"non-JSON constant {constant}")

    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line, parse_constant=refuse) for line in lines if line.strip()]


def weights_bytes(folder: Path, step: int = STEPS) -> bytes:
    return (folder / f"checkpoints/step_{step:08d}/model.safetensors").read_bytes()


def assert_same_as_reference(folder: Path, reference: Path, steps: int = STEPS) -> None:
    """Final weights, optimizer state and curve equal the uninterrupted run's, bit for bit; no debris left."""
    assert weights_bytes(folder, steps) == weights_bytes(reference, steps)
    a = torch.load(folder / f"checkpoints/step_{steps:08d}/trainer_state.pt", weights_only=True)
    b = torch.load(reference / f"checkpoints/step_{steps:08d}/trainer_state.pt", weights_only=True)
    for key, state in b["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(a["optimizer"]["state"][key][name], value), (key, name)
    assert a["rng"]["torch"].equal(b["rng"]["torch"]) and a["step"] == b["step"] == steps
    assert curve(folder) == curve(reference)
    assert [p.name for p in checkpoint_dirs(folder)] == [p.name for p in checkpoint_dirs(reference)]
    assert not [p.name for p in (folder / "checkpoints").iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    strict_rows(folder)


def assert_checkpoints_complete(folder: Path) -> None:
    """Every folder under a real checkpoint name is whole (a kill never leaves a half-written or half-deleted one)."""
    for d in checkpoint_dirs(folder):
        assert CHECKPOINT_FILES <= {p.name for p in d.iterdir()}, d
        load_file(d / "model.safetensors")
        torch.load(d / "trainer_state.pt", weights_only=True)


# ------------------------------------------------------------------------------------------------ kill -9
def killed_session(point: str, folder: Path, model_cfg, data_dir, resume: bool, steps: int) -> int:
    """Run a training session in a forked child with ``DEPTHATTN_FAULT_PHASE=point`` (it SIGKILLs itself there);
    its exit code (-9 when killed). Forking skips a fresh interpreter's imports (seconds each on CI)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.environ[FAULT_ENV] = point
            torch.set_num_threads(1)
            train_quiet(folder, model_cfg, data_dir, resume=resume, steps=steps)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def upcoming_faults(folder: Path, steps: int) -> list[str]:
    """The fault phases a session resuming ``folder`` reaches, in order (CFG: a save every 2 steps, keep 2)."""
    dirs = checkpoint_dirs(folder)
    start = int(dirs[-1].name.removeprefix("step_")) if dirs else 0
    events, count = [], len(dirs)
    for s in range(start + 1, steps + 1):
        events += ["step", "logged"]
        if s % CFG["save_every"] == 0 or s == steps:
            count += 1
            events += ["save", "saved"] + ["prune"] * max(0, count - CFG["keep_last"])
            count = min(count, CFG["keep_last"])
    return events


def test_kill_at_seeded_random_points_then_resume_equals_uninterrupted(tmp_path, model_cfg, data_dir):
    """Issue 13 measured 38 kills that all resumed bit-exactly; this guards that, and the debris rules: 6 kills of a
    12-step run, each session resuming the last one's folder: one in each phase (in a seeded random order, at a
    seeded random occurrence among the session's next points), then one anywhere."""
    steps, rng, kills = 12, random.Random(13), []
    reference, folder = tmp_path / "reference", tmp_path / "run"
    train_quiet(reference, model_cfg, data_dir, steps=steps)
    phases = ["step", "logged", "save", "saved", "prune"]
    rng.shuffle(phases)
    for phase in phases + [None]:
        events = upcoming_faults(folder, steps)
        near = events[:8] if phase is None or phase in events[:8] else events
        i = rng.choice([j for j, e in enumerate(near) if phase in (None, e)])
        point = f"{events[i]}:{events[:i + 1].count(events[i])}"
        code = killed_session(point, folder, model_cfg, data_dir, resume=folder.exists(), steps=steps)
        assert code == -signal.SIGKILL, point
        kills.append(point)
        assert_checkpoints_complete(folder)
        assert len(checkpoint_dirs(folder)) <= CFG["keep_last"] + 1  # +1: killed between a save and its prune
    train_quiet(folder, model_cfg, data_dir, resume=True, steps=steps)
    assert_same_as_reference(folder, reference, steps)


def test_debris_of_interrupted_writes_is_removed_when_the_run_resumes(tmp_path, reference, model_cfg, data_dir):
    folder = tmp_path / "run"
    shutil.copytree(reference, folder)
    shutil.rmtree(folder / "checkpoints/step_00000008")
    (folder / "checkpoints/.tmp-step_00000008-x1y2").mkdir()  # a killed checkpoint write
    (folder / "checkpoints/.tmp-step_00000008-x1y2/model.safetensors").write_bytes(b"partial")
    (folder / "checkpoints/.trash-step_00000002").mkdir()  # a killed prune
    (folder / "checkpoints/.trash-step_00000002/config.json").write_text("{}")
    (folder / ".tmp-abcdrun.json").write_text("{")  # a killed atomic_write_text
    lines = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert any(line.startswith("removed leftovers of an interrupted write") and ".tmp-step_00000008-x1y2" in line
               and ".trash-step_00000002" in line and ".tmp-abcdrun.json" in line for line in lines), lines
    assert_same_as_reference(folder, reference)
    assert not (folder / ".tmp-abcdrun.json").exists()


def test_prune_moves_a_folder_away_before_deleting_it(tmp_path, model_cfg, data_dir, monkeypatch):
    """A kill mid-delete must leave no half-deleted folder under a real name: the folder is renamed first."""
    seen = []
    real_rmtree = shutil.rmtree

    def watching_rmtree(path, *a, **kw):
        seen.append(Path(path).name)
        return real_rmtree(path, *a, **kw)

    from depthattn.run import checkpoints as runs
    monkeypatch.setattr(runs.shutil, "rmtree", watching_rmtree)
    train_quiet(tmp_path / "run", model_cfg, data_dir, steps=6, eval_every=0)
    pruned = [name for name in seen if "step_00000002" in name]
    assert pruned and all(name == ".trash-step_00000002" for name in pruned), seen


# ------------------------------------------------------------------------------------------------ full disk
def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_in_a_checkpoint_write_keeps_earlier_ones_and_resumes(tmp_path, reference, model_cfg, data_dir,
                                                                        monkeypatch):
    real_save, calls = torch.save, []

    def save(obj, f, *a, **kw):  # the trainer state of the 2nd checkpoint (step 4) hits a full disk
        calls.append(f)
        if len(calls) == 2:
            _enospc()
        return real_save(obj, f, *a, **kw)

    folder = tmp_path / "run"
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError, match="No space left"):
        train_quiet(folder, model_cfg, data_dir)
    monkeypatch.setattr(torch, "save", real_save)
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["step_00000002"]  # no half-written step 4
    assert_checkpoints_complete(folder)
    train_quiet(folder, model_cfg, data_dir, resume=True)
    assert_same_as_reference(folder, reference)


def test_disk_full_mid_metrics_append_leaves_a_torn_line_that_resume_drops(tmp_path, reference, model_cfg,
                                                                         data_dir, monkeypatch):
    """Issue 13: a torn last line of metrics.jsonl made --resume fail with a JSON error naming no file."""
    class FullAfter:
        def __init__(self, f, rows):
            self.f, self.rows = f, rows

        def write(self, text):
            self.rows -= 1
            if self.rows == 0:  # half the row reaches the disk, then the disk is full
                self.f.write(text[:len(text) // 2])
                self.f.flush()
                _enospc()
            return self.f.write(text)

        def __getattr__(self, name):
            return getattr(self.f, name)

    folder = tmp_path / "run"
    monkeypatch.setattr(metrics_module, "open", lambda *a, **kw: FullAfter(open(*a, **kw), 5), raising=False)
    with pytest.raises(OSError, match="No space left"):
        train_quiet(folder, model_cfg, data_dir)
    monkeypatch.undo()
    assert not (folder / "metrics.jsonl").read_text().endswith("\n")  # torn
    lines = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert any("metrics.jsonl:5: dropped a torn last line" in line for line in lines), lines
    assert_same_as_reference(folder, reference)


def test_disk_full_while_pruning_keeps_every_checkpoint_whole(tmp_path, reference, model_cfg, data_dir,
                                                              monkeypatch):
    from depthattn.run import checkpoints as runs

    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name.startswith(".trash-"):
            _enospc()
        return real_replace(src, dst)

    folder = tmp_path / "run"
    monkeypatch.setattr(runs.os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        train_quiet(folder, model_cfg, data_dir)
    monkeypatch.undo()
    assert [p.name for p in checkpoint_dirs(folder)] == ["step_00000002", "step_00000004", "step_00000006"]
    assert_checkpoints_complete(folder)
    train_quiet(folder, model_cfg, data_dir, resume=True)
    assert_same_as_reference(folder, reference)


# ------------------------------------------------------------------------------------------------ divergence
def inject_nan_loss(monkeypatch, at_calls):
    """Make the training loss (hence every gradient) NaN at the given 1-based forward calls of this session."""
    real, calls = loop_module.next_token_loss, [0]

    def loss(*a, **kw):
        calls[0] += 1
        out = real(*a, **kw)
        return out * float("nan") if calls[0] in at_calls else out

    monkeypatch.setattr(loop_module, "next_token_loss", loss)


def all_finite(checkpoint: Path) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in load_file(checkpoint / "model.safetensors").values())


def test_lr_1e6_stops_with_one_line_and_saves_no_nan_checkpoint(tmp_path, model_cfg, data_dir):
    """Issue 13: the NaN update was applied and saved, keep_last pruned the last finite checkpoint, and
    metrics.jsonl held "grad_norm": NaN."""
    folder = tmp_path / "run"
    with pytest.raises(NonFiniteError) as err:
        train_quiet(folder, model_cfg, data_dir, lr=1e6, save_every=1, keep_last=1, eval_every=0)
    message = str(err.value)
    assert isinstance(err.value, FloatingPointError) and "\n" not in message
    assert message.startswith("training diverged") and "lower TrainConfig.lr (now 1e+06)" in message
    dirs = checkpoint_dirs(folder)
    assert len(dirs) == 1 and all_finite(dirs[0]), dirs  # the newest finite checkpoint survived keep_last=1
    rows = strict_rows(folder)
    assert rows and rows[-1]["step"] == int(dirs[0].name.removeprefix("step_"))
    assert all(v is None or isinstance(v, (int, float, bool, str)) for r in rows for v in r.values())


def test_nan_loss_stop_then_resume_with_skip_equals_a_skipping_run(tmp_path, model_cfg, data_dir, monkeypatch,
                                                                    capsys):
    stop, skip = tmp_path / "stop", tmp_path / "skip"
    inject_nan_loss(monkeypatch, {5})
    with pytest.raises(NonFiniteError) as err:
        train_quiet(stop, model_cfg, data_dir)
    assert re.fullmatch(r"training diverged at step 5: the loss is nan; the update was not applied and the newest "
                        r"checkpoint \S*step_00000004 is finite; lower TrainConfig.lr \(now 0.003\), or skip such "
                        rf"steps: on_nonfinite=skip \(depthattn train --resume {re.escape(str(stop))} --on-nonfinite "
                        r"skip\)", str(err.value)), str(err.value)
    assert [p.name for p in checkpoint_dirs(stop)] == ["step_00000002", "step_00000004"]
    inject_nan_loss(monkeypatch, {1})  # the resumed session's first step is step 5 again
    capsys.readouterr()
    assert main(["train", "--resume", str(stop), "--on-nonfinite", "skip", "--no-progress"]) == 0  # as the hint says
    assert (f"trained {STEPS - 4} steps (steps 5-{STEPS} of the run) (1 of the run's steps skipped: non-finite loss"
            in capsys.readouterr().out)
    assert json.loads((stop / "summary.json").read_text())["skipped_steps"] == 1
    assert json.loads((stop / "run.json").read_text())["train"]["on_nonfinite"] == "skip"

    inject_nan_loss(monkeypatch, {5})
    train_quiet(skip, model_cfg, data_dir, on_nonfinite="skip", save_every=1, keep_last=STEPS)
    assert weights_bytes(skip, 5) == weights_bytes(skip, 4)  # a skipped step updates nothing
    assert weights_bytes(skip, 6) != weights_bytes(skip, 5)
    assert weights_bytes(stop) == weights_bytes(skip)
    assert curve(stop) == curve(skip)
    rows = {r["step"]: r for r in strict_rows(skip)}
    assert rows[5]["skipped"] is True and rows[5]["nonfinite"] == "loss" and rows[5]["loss"] is None
    assert all("skipped" not in r for s, r in rows.items() if s != 5)
    assert rows[6]["lr"] < rows[5]["lr"] < rows[4]["lr"]  # the schedule advanced through the skipped step


def test_consecutive_skips_are_bounded_and_the_count_survives_resume(tmp_path, model_cfg, data_dir, monkeypatch):
    folder = tmp_path / "run"
    inject_nan_loss(monkeypatch, set(range(3, 100)))
    with pytest.raises(NonFiniteError, match=r"at step 5: the loss is nan after 2 consecutive skipped step\(s\) "
                                             r"\(max_nonfinite_skips=2\); .* or raise "
                                             r"TrainConfig.max_nonfinite_skips$"):
        train_quiet(folder, model_cfg, data_dir, on_nonfinite="skip", max_nonfinite_skips=2)
    state = torch.load(folder / "checkpoints/step_00000004/trainer_state.pt", weights_only=True)
    assert state["nonfinite_skips"] == 2
    assert weights_bytes(folder, 4) == weights_bytes(folder, 2)
    rows = strict_rows(folder)
    assert [r["step"] for r in rows if r.get("skipped")] == [3, 4]
    inject_nan_loss(monkeypatch, {1})
    with pytest.raises(NonFiniteError, match="at step 5: .* after 2 consecutive"):  # counted across the resume
        train_quiet(folder, model_cfg, data_dir, resume=True, on_nonfinite="skip", max_nonfinite_skips=2)


def test_non_finite_weights_are_never_checkpointed(tmp_path, model_cfg, data_dir, monkeypatch):
    """Finite loss and gradients can still overflow a weight (e.g. a huge lr with weight decay): checked at save."""
    real = loop_module._optimizer_step

    def step(t):
        row = real(t)
        if t.step == 3:
            with torch.no_grad():
                t.model.model.embed_tokens.weight[0, 0] = float("inf")
        return row

    monkeypatch.setattr(loop_module, "_optimizer_step", step)
    folder = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"^training diverged by step 4: non-finite weights "
                                             r"\(model\.embed_tokens\.weight"):
        train_quiet(folder, model_cfg, data_dir)
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["step_00000002"]
    assert all_finite(folder / "checkpoints/step_00000002")


def test_on_nonfinite_is_validated_and_may_change_on_resume():
    with pytest.raises(ValueError, match=r"^TrainConfig.on_nonfinite='ignore' is invalid: must be 'stop' or 'skip'"):
        TrainConfig(steps=1, on_nonfinite="ignore")
    with pytest.raises(ValueError, match=r"^TrainConfig.max_nonfinite_skips=-1 is invalid"):
        TrainConfig(steps=1, max_nonfinite_skips=-1)
    from depthattn.training.config import RESUMABLE_KEYS
    assert {"on_nonfinite", "max_nonfinite_skips"} <= RESUMABLE_KEYS
    assert TrainConfig().on_nonfinite == "stop"


# ------------------------------------------------------------------------------------------------ run files
def _copy_without_last_checkpoint(reference: Path, folder: Path) -> None:
    shutil.copytree(reference, folder)
    shutil.rmtree(folder / f"checkpoints/step_{STEPS:08d}")


def test_torn_last_metrics_line_is_dropped_with_a_note(tmp_path, reference, model_cfg, data_dir):
    folder = tmp_path / "run"
    _copy_without_last_checkpoint(reference, folder)
    text = (folder / "metrics.jsonl").read_text()
    (folder / "metrics.jsonl").write_text(text[:len(text) - 40])  # killed mid-append of the step-8 row
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:8: dropped a torn last line"):
        assert [r["step"] for r in read_metrics(folder)] == list(range(1, STEPS))
    lines = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert any(f"{folder / 'metrics.jsonl'}:8: dropped a torn last line" in line for line in lines), lines
    assert_same_as_reference(folder, reference)


def test_bad_middle_metrics_line_is_one_error_naming_file_and_line(tmp_path, reference, model_cfg, data_dir):
    folder = tmp_path / "run"
    _copy_without_last_checkpoint(reference, folder)
    lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (folder / "metrics.jsonl").write_text("".join(lines))
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=rf"^{folder / 'metrics.jsonl'}:3: not a metrics row"):
        train_quiet(folder, model_cfg, data_dir, resume=True)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_resume_with_metrics_deleted_says_so_and_logs_afresh(tmp_path, reference, model_cfg, data_dir):
    folder = tmp_path / "run"
    shutil.copytree(reference, folder)
    shutil.rmtree(folder / "checkpoints/step_00000008")
    (folder / "metrics.jsonl").unlink()
    lines = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert f"{folder / 'metrics.jsonl'} is missing: the metrics log restarts at step 7 (rows of steps 1-6 are " \
           f"lost)" in lines
    assert curve(folder) == curve(reference)[6:]
    assert weights_bytes(folder) == weights_bytes(reference)


def test_resume_with_lost_tail_rows_says_so(tmp_path, reference, model_cfg, data_dir):
    """Rows lost before they reached the disk (a power cut; the trainer now fsyncs them before each checkpoint):
    resume says where the log ends, and the rows from the checkpoint on are the reference's."""
    folder = tmp_path / "run"
    shutil.copytree(reference, folder)
    shutil.rmtree(folder / "checkpoints/step_00000008")
    lines = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    (folder / "metrics.jsonl").write_text("".join(lines[:3]))
    said = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert any(line.startswith(f"{folder / 'metrics.jsonl'} ends at step 3, before the checkpoint of step 6")
               for line in said), said
    assert curve(folder) == curve(reference)[:3] + curve(reference)[6:]
    assert weights_bytes(folder) == weights_bytes(reference)


def test_checkpoint_is_written_after_its_metrics_rows_are_durable(tmp_path, monkeypatch, model_cfg, data_dir):
    from depthattn.run import checkpointer
    from depthattn.training import metrics as metrics_mod

    events: list[str] = []
    real_sync, real_save = metrics_mod.MetricsLogger.sync, checkpointer.save_checkpoint
    monkeypatch.setattr(metrics_mod.MetricsLogger, "sync", lambda self: (events.append("sync"), real_sync(self)))
    monkeypatch.setattr(checkpointer, "save_checkpoint", lambda *a, **k: (events.append("save"), real_save(*a, **k))[1])
    train_quiet(tmp_path / "run", model_cfg, data_dir)
    assert events and events[0] == "sync" and all(a == "sync" for a, b in zip(events, events[1:]) if b == "save")


@pytest.mark.parametrize("damage", ["truncated trainer state", "missing weights", "corrupt config",
                                    "one bit in config"])
def test_unreadable_newest_checkpoint_resumes_from_the_previous_one(tmp_path, reference, model_cfg, data_dir,
                                                                    damage):
    folder = tmp_path / "run"
    shutil.copytree(reference, folder)
    newest = folder / "checkpoints/step_00000008"
    if damage == "truncated trainer state":
        state = newest / "trainer_state.pt"
        state.write_bytes(state.read_bytes()[:1000])
        named = "trainer_state.pt"
    elif damage == "missing weights":
        (newest / "model.safetensors").unlink()
        named = "model.safetensors"
    elif damage == "corrupt config":
        (newest / "config.json").write_text('{"hidden_size": ')
        named = "config.json"
    else:  # bit rot turning num_hidden_layers 4 into 5: damage (checksums.json says so), not another model config
        config = newest / "config.json"
        st, text = config.stat(), config.read_bytes()
        at = text.index(b'"num_hidden_layers": ') + len(b'"num_hidden_layers": ')
        config.write_bytes(text[:at] + bytes([text[at] ^ 0x01]) + text[at + 1:])
        os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
        named = "config.json"
    lines = train_quiet(folder, model_cfg, data_dir, resume=True)
    assert any(line.startswith(f"checkpoint {newest} is unreadable (") and named in line for line in lines), lines
    assert f"resuming from the previous checkpoint {folder / 'checkpoints/step_00000006'} instead" in lines
    assert any(line.startswith(f"moved the unreadable checkpoint {newest} to ") for line in lines)
    assert (folder / "checkpoints/.unreadable-step_00000008").is_dir()
    assert_same_as_reference(folder, reference)


def test_metrics_writer_is_strict_json(tmp_path):
    from depthattn.fileio import json_line
    from depthattn.training.metrics import MetricsLogger

    assert json_line({"step": 1, "loss": float("nan"), "grad_norm": float("inf")}) == \
        '{"step": 1, "loss": null, "grad_norm": null}\n'
    with MetricsLogger(tmp_path, "m.jsonl", enabled=True, tensorboard=False) as log:
        log.log({"step": 1, "loss": float("nan"), "lr": 1e-3})
    assert json.loads((tmp_path / "m.jsonl").read_text(), parse_constant=lambda c: 1 / 0) == \
        {"step": 1, "loss": None, "lr": 1e-3}



def test_perplexity_of_a_nan_model_is_an_error_not_nan(data_dir, model_cfg):
    """Issue 13: eval printed perplexity nan and exited 0 for the diverged checkpoint."""
    from depthattn import DecoderLM
    from depthattn.data import load_tokenizer
    from depthattn.eval.perplexity import evaluate_perplexity

    model = DecoderLM(model_cfg)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    data = load_prepared(data_dir)
    with pytest.raises(FloatingPointError, match=r"^the model's mean loss over \d+ tokens is nan: its logits"):
        evaluate_perplexity(model, data.val, load_tokenizer(data_dir / "tokenizer.json"), seq_len=32,
                            max_tokens=64, progress=False)
