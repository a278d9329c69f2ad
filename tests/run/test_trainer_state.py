"""``trainer_state.pt`` (``depthattn.run.state.TrainerState``) and how the trainer saves (``run.checkpointer``).

* Each shape is written byte for byte as the trainer wrote it before ``TrainerState`` (the dicts of the full and the
  sharded save, spelled out here), and read back unchanged; a record of an older release (the 97f8652 fixture)
  reads, with the keys added since taking their meaning-preserving values.
* ``restore`` loads the optimizer, scheduler and RNG states and refuses a record that does not fit (naming the file).
* The ``Checkpointer``'s own state: saved / pending / on disk / last save, through a synchronous, a background and a
  finished save; the loop decides when it is asked to save (steps and flags of a tiny run).
"""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from depthattn.run.state import FULL_KEYS, SHARDED_KEYS, STATE_FILE, TrainerState, rng_state, upgraded
from depthattn.training import TrainConfig, train
from depthattn.run import checkpointer as checkpointer_module
from depthattn.run.checkpointer import Checkpointer
from depthattn.training.optim import build_optimizer, build_scheduler

from conftest import make_model

FIXTURE = Path(__file__).parents[1] / "fixtures" / "release-97f8652" / "run" / "checkpoints"
GUARD = {"armed": True, "above": False, "ema": 5.5, "ema_min": 5.25, "ema_min_step": 3, "rise_evals": 0,
         "rise_warned": False}


def _stepped():
    """A tiny model's AdamW and schedule after one step (moments allocated, as in any checkpoint)."""
    torch.manual_seed(0)
    model = make_model()
    optimizer, _ = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), 1e-8)
    scheduler = build_scheduler(optimizer, 1, 10, 0.1)
    model(torch.randint(0, model.config.vocab_size, (2, 8))).logits.sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ------------------------------------------------------------------------------------------------ the two shapes
def test_a_full_record_is_the_dict_the_trainer_wrote_byte_for_byte():
    _, optimizer, scheduler = _stepped()
    old = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
           "step": 7, "tokens_seen": 448, "data_position": 7, "nonfinite_skips": 1, "val_loss": 5.75,
           "guard": dict(GUARD)}  # the dict the trainer wrote before TrainerState
    new = TrainerState.capture(7, 448, scheduler, optimizer, nonfinite_skips=1, val_loss=5.75, guard=dict(GUARD))
    assert list(new.to_dict()) == list(FULL_KEYS) == list(old) and not new.sharded
    assert _bytes(new.to_dict()) == _bytes(old)
    assert _same(TrainerState.from_dict(torch.load(io.BytesIO(_bytes(old)), weights_only=True)).to_dict(), old)


def test_a_sharded_record_is_the_dict_the_trainer_wrote_byte_for_byte():
    model, optimizer, scheduler = _stepped()
    cfg = TrainConfig(data_parallel="fsdp", batch_size=2, seq_len=32, grad_accum=3)
    old = {"scheduler": scheduler.state_dict(), "rng": rng_state(), "step": 7, "tokens_seen": 448,
           "data_position": 7, "world_size": cfg.world_size(), "tokens_per_step": cfg.tokens_per_step(),
           "nonfinite_skips": 0, "val_loss": None, "guard": dict(GUARD)}  # loop._maybe_checkpoint's FSDP dict
    saver = Checkpointer(Path("unused"), model, optimizer, scheduler, cfg, Path("unused"))
    new = saver.state(7, 448, nonfinite_skips=0, val_loss=None, guard=dict(GUARD))
    assert new.sharded and new.optimizer is None and (new.world_size, new.tokens_per_step) == (1, 192)
    assert list(new.to_dict()) == list(SHARDED_KEYS) == list(old)
    assert _bytes(new.to_dict()) == _bytes(old)
    assert _same(TrainerState.from_dict(torch.load(io.BytesIO(_bytes(old)), weights_only=True)).to_dict(), old)


def test_the_full_checkpointers_state_is_the_full_shape():
    model, optimizer, scheduler = _stepped()
    state = Checkpointer(Path("unused"), model, optimizer, scheduler, TrainConfig(), Path("unused")).state(
        3, 192, nonfinite_skips=0, val_loss=6.0, guard={})
    assert list(state.to_dict()) == list(FULL_KEYS)
    assert _same(state.optimizer, optimizer.state_dict()) and state.world_size is None


def test_a_record_of_release_97f8652_reads_with_todays_meaning():
    for step in (2, 4):
        raw = torch.load(FIXTURE / f"step_{step:08d}" / STATE_FILE, weights_only=True)
        assert "val_loss" not in raw and "guard" not in raw  # written before either existed
        state = TrainerState.from_file(FIXTURE / f"step_{step:08d}")
        assert (state.step, state.tokens_seen, state.data_position) == (step, 64 * step, step)
        assert (state.nonfinite_skips, state.val_loss, state.guard, state.sharded) == (0, None, {}, False)
        written = state.to_dict()
        assert list(written) == list(FULL_KEYS)
        assert all(_same(raw[k], written[k]) for k in raw)


def test_upgrading_is_one_function_and_a_record_without_a_required_key_is_refused_by_name():
    assert upgraded({"scheduler": {}, "rng": {}, "step": 1, "tokens_seen": 2, "data_position": 1}) == {
        "nonfinite_skips": 0, "val_loss": None, "guard": {}, "scheduler": {}, "rng": {}, "step": 1,
        "tokens_seen": 2, "data_position": 1}
    with pytest.raises(KeyError, match=r"ckpt/trainer_state\.pt lacks \['rng', 'data_position'\]"):
        TrainerState.from_dict({"scheduler": {}, "step": 1, "tokens_seen": 2}, "ckpt/trainer_state.pt")


# ------------------------------------------------------------------------------------------------ restore
def test_restore_loads_optimizer_scheduler_and_rngs():
    _, optimizer, scheduler = _stepped()
    state = TrainerState.capture(1, 64, scheduler, optimizer)
    draws = (torch.rand(3), random.random(), np.random.rand())
    _, fresh_opt, fresh_sched = _stepped()
    fresh_opt.state.clear()
    torch.manual_seed(123)
    state.restore(fresh_opt, fresh_sched, "x/trainer_state.pt")
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (draws[0].tolist(), *draws[1:])
    assert _same(fresh_opt.state_dict(), optimizer.state_dict())
    assert fresh_sched.state_dict() == scheduler.state_dict()


def test_restore_refuses_a_state_that_does_not_fit_naming_the_file():
    _, optimizer, scheduler = _stepped()
    off = TrainerState.capture(4, 256, scheduler, optimizer, data_position=3)
    with pytest.raises(ValueError, match=r"^x/trainer_state\.pt: data position 3 != step 4$"):
        off.restore(optimizer, scheduler, "x/trainer_state.pt")
    other = make_model(num_hidden_layers=1)
    small, _ = build_optimizer(other, 1e-3, 0.1, (0.9, 0.95), 1e-8)
    with pytest.raises(ValueError, match=r"^x/trainer_state\.pt: optimizer/scheduler state does not fit the model"):
        TrainerState.capture(1, 64, scheduler, optimizer).restore(small, scheduler, "x/trainer_state.pt")


# ------------------------------------------------------------------------------------------------ the Checkpointer
class FakeUpload:
    def __init__(self):
        self.finished = False

    def done(self) -> bool:
        return self.finished


def test_checkpointer_state_through_sync_background_and_finished_saves(monkeypatch):
    """FSDP with async_save (the DCP writers replaced by recorders): a periodic save goes to the background
    (pending, not yet saved), is made visible only once on disk (or when waited for), and a save with ``wait`` is
    synchronous; each save ends the save timer."""
    calls = []
    monkeypatch.setattr(checkpointer_module, "start_async_save", lambda run, model, opt, cfg, data, state, log: (
        calls.append(("start", state["step"])), SimpleNamespace(step=state["step"], upload=FakeUpload()))[1])
    monkeypatch.setattr(checkpointer_module, "finish_async_save", lambda p: (
        calls.append(("finish", p.step)), Path(f"ckpts/step_{p.step:08d}"))[1])
    monkeypatch.setattr(checkpointer_module, "save_sharded", lambda run, model, opt, cfg, data, state, log: (
        calls.append(("sync", state["step"])), Path(f"ckpts/step_{state['step']:08d}"))[1])
    model, optimizer, scheduler = _stepped()
    ticks = iter([100.0, 130.0, 200.0, 260.0, 300.0])
    saver = Checkpointer(Path("run"), model, optimizer, scheduler, TrainConfig(data_parallel="fsdp", async_save=True),
                         Path("data"), saved=Path("ckpts/step_00000002"), clock=lambda: next(ticks))
    saver.start_timer()
    assert (saver.saved, saver.pending, saver.since_save()) == (Path("ckpts/step_00000002"), None, 30.0)
    saver.save(saver.state(4, 256, nonfinite_skips=0, val_loss=5.0, guard={}), wait=False)
    assert saver.pending is not None and saver.saved == Path("ckpts/step_00000002") and saver.last_save == 200.0
    assert not saver.upload_done()
    saver.finish_pending(wait=False)  # not on disk: still in flight
    assert saver.pending is not None and calls == [("start", 4)]
    saver.pending.upload.finished = True
    assert saver.upload_done()
    saver.on_disk = True  # what the step's all-reduce agreed
    saver.finish_pending(wait=False)
    assert (saver.pending, saver.saved) == (None, Path("ckpts/step_00000004"))
    saver.save(saver.state(6, 384, nonfinite_skips=0, val_loss=None, guard={}), wait=True)  # a stop or the last
    assert (saver.pending, saver.saved, saver.last_save) == (None, Path("ckpts/step_00000006"), 260.0)
    saver.finish_pending()  # nothing in flight: nothing happens
    assert calls == [("start", 4), ("finish", 4), ("sync", 6)]
    other_rank = Checkpointer(Path("run"), model, optimizer, scheduler, TrainConfig(data_parallel="fsdp"),
                              Path("data"), is_main=False)
    other_rank.pending = SimpleNamespace(upload=SimpleNamespace(done=lambda: True))
    assert not other_rank.upload_done()  # only rank 0's view counts


def test_the_loop_decides_when_and_the_checkpointer_writes(tmp_path, model_cfg, data_dir, monkeypatch):
    """save_every=4 over 6 steps: a periodic save at 4 (in the background if asked, every rank meets) and the last
    at 6 (waited for; not periodic: no meeting after it); both written by the one-process writer."""
    asked = []
    real = Checkpointer.save

    def spy(self, state, *, wait, meet=True):
        asked.append((state.step, wait, meet, state.sharded))
        return real(self, state, wait=wait, meet=meet)

    monkeypatch.setattr(Checkpointer, "save", spy)
    run = tmp_path / "run"
    result = train(run, model_cfg, TrainConfig(steps=6, batch_size=2, seq_len=32, eval_every=0, eval_windows=2,
                                               eval_batch_size=2, save_every=4, keep_last=5, device="cpu",
                                               tensorboard=False), data_dir, progress=False, log=lambda _: None)
    assert asked == [(4, False, True, False), (6, True, False, False)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000004", "step_00000006"]
    assert result.checkpoint == run / "checkpoints" / "step_00000006"
    shutil.rmtree(run)
