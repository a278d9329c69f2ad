"""The trainer's periodic jobs (``training.periodic``): validation, in-loop tasks and depth statistics.

* Each job is due at the steps the loop ran it at before it was one (the conditions spelled out here).
* The loop runs the due jobs in order, merging their keys into the row; an abandoned job stops the others and the
  run, and its abandon check passes the job's fault-injection phase (``eval``, ``tasks``).
* A tiny run's rows hold each job's keys at its steps, in job order, and the validation row is the loss of the
  checkpoint of that step (``Validation.measure`` on the saved weights).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from depthattn import DecoderLM
from depthattn import checkpoint as ckpt
from depthattn.training import TrainConfig, read_metrics, train
from depthattn.training import loop as loop_module
from depthattn.training.depth_stats import DepthProbe
from depthattn.training.in_loop_tasks import TaskSuite
from depthattn.training.periodic import Validation


def test_each_job_is_due_where_the_loop_ran_it():
    last, steps = 10, range(1, 11)
    for every in (0, 3, 4):
        validation = Validation(lambda model, abandon=None: 0.0, every, last)
        tasks = TaskSuite({}, None, 1, every, last)
        assert [s for s in steps if validation.due(s)] == [s for s in steps if (every and s % every == 0) or s == last]
        assert [s for s in steps if tasks.due(s)] == [s for s in steps if s == last or (every and s % every == 0)]
    depth = DepthProbe(4, torch.zeros(1, 4, dtype=torch.long), torch.device("cpu"))
    assert [s for s in steps if depth.due(s)] == [4, 8]
    assert (Validation.phase, TaskSuite.phase, DepthProbe.phase) == ("eval", "tasks", None)


class Job:
    def __init__(self, phase, keys, due=True, abandon=False):
        self.phase, self.keys, self.is_due, self.abandon, self.ran = phase, keys, due, abandon, []

    def due(self, step):
        return self.is_due

    def run(self, step, model, abandon=None):
        self.ran.append(step)
        if self.abandon and abandon():
            return None
        return dict(self.keys)


def _trainer(jobs, requested=False):
    return SimpleNamespace(stopping=False, step=6, model="model", periodic=jobs, device=torch.device("cpu"),
                           stop=SimpleNamespace(requested=requested))


def test_the_loop_merges_the_due_jobs_keys_in_order():
    jobs = [Job("eval", {"val_loss": 1.5}), Job("tasks", {"task/x/acc": 0.5}, due=False), Job(None, {"depth/a": 2.0})]
    t, row = _trainer(jobs), {"step": 6}
    loop_module._periodic(t, row)
    assert list(row.items()) == [("step", 6), ("val_loss", 1.5), ("depth/a", 2.0)] and not t.stopping
    assert [j.ran for j in jobs] == [[6], [], [6]]


def test_a_stop_signal_abandons_the_job_and_the_later_ones_at_its_phase(monkeypatch):
    phases = []
    monkeypatch.setattr(loop_module, "fault_point", phases.append)
    jobs = [Job("eval", {"val_loss": 1.5}), Job("tasks", {"task/x/acc": 0.5}, abandon=True), Job(None, {"d": 1.0})]
    t, row = _trainer(jobs, requested=True), {"step": 6}
    loop_module._periodic(t, row)
    assert t.stopping and row == {"step": 6, "val_loss": 1.5} and phases == ["tasks"]
    assert [j.ran for j in jobs] == [[6], [6], []]
    t.step, row = 7, {"step": 7}
    loop_module._periodic(t, row)  # a stopping run runs no job
    assert row == {"step": 7} and [j.ran for j in jobs] == [[6], [6], []]


def test_a_tiny_runs_rows_hold_each_jobs_keys_at_its_steps(tmp_path, model_cfg, data_dir):
    run = tmp_path / "run"
    cfg = TrainConfig(steps=6, batch_size=2, seq_len=32, eval_every=4, eval_windows=4, eval_batch_size=4,
                      save_every=4, keep_last=5, log_every=1, log_depth_every=3, device="cpu", tensorboard=False)
    train(run, model_cfg, cfg, data_dir, progress=False, log=lambda _: None)
    rows = read_metrics(run)
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 6]
    assert [r["step"] for r in rows if any(k.startswith("depth/") for k in r)] == [3, 6]
    last = list(rows[-1])
    assert last.index("val_loss") < min(i for i, k in enumerate(last) if k.startswith("depth/"))
    model = DecoderLM(ckpt.load_config(run / "checkpoints/step_00000004"))
    model.load_state_dict(ckpt.load_state(run / "checkpoints/step_00000004"))
    _, val_windows, _ = loop_module._load_data(model_cfg, cfg, data_dir)  # the run's validation windows
    measured = loop_module.mean_loss(model, val_windows, cfg.eval_batch_size, torch.device("cpu"), None)
    assert rows[3]["step"] == 4 and rows[3]["val_loss"] == measured
