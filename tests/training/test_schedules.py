"""Learning-rate schedules (cosine, linear, constant, WSD with linear / 1-sqrt decay), decay from a stable-phase
checkpoint (``train --decay-from``), the AdamW implementations (fused / foreach equal to the for-loop within
rounding) and the W&B run id kept across a resume."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from depthattn.checkpoint import checkpoint_dirs, load_state
from depthattn.cli import main
from depthattn.training import TrainConfig, read_metrics, read_run, train
from depthattn.training.config import LEGACY_DEFAULTS
from depthattn.training.decay import decay_config
from depthattn.training.metrics import wandb_run_id
from depthattn.training.optim import (adamw_kwargs, build_scheduler, fused_adamw_supported, lr_factor,
                                      resolve_adamw_impl, schedule_factor)

from conftest import make_model


# ------------------------------------------------------------------------------------------------ shapes
# Key steps of a 100-step budget with 10 warm-up steps and floor 0.1, written out by hand: the decay of cosine and
# linear runs over steps 10..99 (89 intervals); WSD's decay_fraction 0.21 decays over the last 21 steps, 79..99.
def _cfg(**kw) -> TrainConfig:
    return TrainConfig(steps=100, warmup=0.1, min_lr_ratio=0.1, **kw)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_warmup_is_linear_for_every_schedule(schedule):
    cfg = _cfg(lr_schedule=schedule, decay_fraction=0.21)
    assert [schedule_factor(cfg, s) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert schedule_factor(cfg, 10) == 1.0


def test_schedule_values_at_key_steps():
    cos, lin, const = _cfg(), _cfg(lr_schedule="linear"), _cfg(lr_schedule="constant")
    # p = (step - 10) / 89
    assert schedule_factor(cos, 99) == pytest.approx(0.1, abs=1e-12)
    assert schedule_factor(cos, 10 + 89 / 2) == pytest.approx(0.55)  # cos(pi/2) = 0: halfway
    assert schedule_factor(cos, 10 + 89 / 4) == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2)
    assert schedule_factor(lin, 99) == pytest.approx(0.1, abs=1e-12)
    assert schedule_factor(lin, 10 + 89 / 4) == pytest.approx(0.775)
    assert schedule_factor(lin, 10 + 89 / 2) == pytest.approx(0.55)
    assert [schedule_factor(const, s) for s in (10, 50, 99)] == [1.0, 1.0, 1.0]
    wsd = _cfg(lr_schedule="wsd", decay_fraction=0.21)
    sqrt = _cfg(lr_schedule="wsd", decay_fraction=0.21, decay_shape="1-sqrt")
    assert wsd.decay_steps() == 21
    for cfg in (wsd, sqrt):  # stable at the peak up to the decay's first step, then the floor at the last
        assert [schedule_factor(cfg, s) for s in (10, 50, 78, 79)] == [1.0] * 4
        assert schedule_factor(cfg, 99) == pytest.approx(0.1, abs=1e-12)
    # q = (step - 79) / 20
    assert schedule_factor(wsd, 84) == pytest.approx(0.1 + 0.9 * 0.75)
    assert schedule_factor(wsd, 89) == pytest.approx(0.55)
    assert schedule_factor(sqrt, 84) == pytest.approx(0.1 + 0.9 * 0.5)  # 1 - sqrt(1/4)
    assert schedule_factor(sqrt, 89) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))
    assert schedule_factor(sqrt, 81) < schedule_factor(wsd, 81)  # 1-sqrt drops faster first
    f = [schedule_factor(sqrt, s) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(f, f[1:]))


def test_the_scheduler_applies_the_schedule_to_the_optimizer():
    cfg = _cfg(lr_schedule="wsd", decay_fraction=0.21, decay_shape="1-sqrt")
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=2e-3)
    sched = build_scheduler(opt, cfg.warmup_steps(), cfg.total_steps(), cfg.min_lr_ratio, cfg.lr_schedule,
                            cfg.decay_steps(), cfg.decay_shape)
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2e-3 * schedule_factor(cfg, s) for s in range(100)], rel=1e-12)


def test_cosine_default_is_the_previous_schedule():
    cfg = _cfg()
    assert cfg.lr_schedule == "cosine" and cfg.decay_steps() == 0
    assert [schedule_factor(cfg, s) for s in range(100)] == [lr_factor(s, 10, 100, 0.1) for s in range(100)]


@pytest.mark.parametrize("key, value, choices", [
    ("lr_schedule", "cosin", "cosine, wsd, linear, constant"),
    ("decay_shape", "sqrt", "linear, 1-sqrt"),
    ("adamw_impl", "apex", "auto, fused, foreach, plain, torch_default"),
])
def test_unknown_names_list_the_choices(key, value, choices):
    with pytest.raises(ValueError, match=rf"^TrainConfig.{key}='{value}' is invalid: choose one of {choices}$"):
        TrainConfig(steps=10, **{key: value})


def test_bad_schedule_settings_are_one_line_before_training(tmp_path, capsys):
    for fraction in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"^TrainConfig.decay_fraction=.* must be a fraction of the steps in"):
            TrainConfig(steps=10, decay_fraction=fraction)
    with pytest.raises(ValueError, match=r"the WSD decay of 9 steps starts at step 1, inside the warm-up of 2 steps"):
        schedule_factor(TrainConfig(steps=10, warmup=0.2, lr_schedule="wsd", decay_fraction=0.9), 0)
    out = tmp_path / "never"
    assert main(["train", "--preset", "tiny", "--steps", "10", "--set", "lr_schedule=wsd", "--set", "warmup=0.2",
                 "--set", "decay_fraction=0.9", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "inside the warm-up" in err and not out.exists()
    assert main(["train", "--preset", "tiny", "--steps", "10", "--set", "lr_schedule=step", "--out", str(out)]) == 2
    assert "choose one of cosine, wsd, linear, constant" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ decay-from
BASE = dict(batch_size=4, seq_len=64, lr=3e-3, warmup=0.1, eval_every=0, eval_windows=4, keep_last=5, log_every=1,
            device="cpu", precision="float32", tensorboard=False)


@pytest.fixture(scope="module")
def decay_runs(tmp_path_factory, data_dir, model_cfg):
    """A: a constant-lr run of 10 steps saved at 6 and 10; U: an uninterrupted 10-step WSD run whose decay starts at
    step 6 (the config ``--decay-from`` derives); D: ``train --decay-from A/step 6 --decay-steps 4``."""
    root = tmp_path_factory.mktemp("decay")
    train(root / "a", model_cfg, TrainConfig(steps=10, lr_schedule="constant", save_every=6, **BASE), data_dir,
          progress=False)
    ckpt = checkpoint_dirs(root / "a")[0]
    assert ckpt.name == "step_00000006"
    u_cfg = decay_config(read_run(root / "a"), 6, 4, ckpt)
    train(root / "u", model_cfg, u_cfg, data_dir, progress=False)
    assert main(["train", "--decay-from", str(ckpt), "--decay-steps", "4", "--out", str(root / "d"),
                 "--no-progress"]) == 0
    return root, ckpt, u_cfg


def test_decay_config_is_a_wsd_run_decaying_from_the_checkpoint(decay_runs):
    root, ckpt, u_cfg = decay_runs
    assert (u_cfg.steps, u_cfg.lr_schedule, u_cfg.decay_steps(), u_cfg.warmup_steps()) == (10, "wsd", 4, 1)
    lrs = [3e-3 * schedule_factor(u_cfg, s) for s in range(10)]
    assert lrs[:7] == [3e-3] * 7 and lrs[-1] == pytest.approx(3e-4) and lrs[7] < 3e-3
    run = read_run(root / "d")
    assert run["decay_from"] == str(ckpt.resolve()) and run["train"] == u_cfg.to_dict()


def test_decay_from_continues_optimizer_and_data_exactly(decay_runs):
    root, _, _ = decay_runs
    a, u, d = (read_metrics(root / k) for k in "aud")
    key = ("step", "loss", "lr", "grad_norm")
    pick = lambda rows: [tuple(r[k] for k in key) for r in rows]  # noqa: E731
    assert pick(a[:7]) == pick(u[:7])  # same lr up to step 7 (the decay's first update is at the peak)
    assert [r["step"] for r in d] == [7, 8, 9, 10]
    assert pick(d) == pick(u[6:])  # bit for bit: the optimizer state, RNG and data position were carried over
    assert [r["lr"] for r in d[1:]] != [r["lr"] for r in a[7:]]  # and the lr did decay
    assert a[9]["loss"] != u[9]["loss"]
    wd, wu = load_state(checkpoint_dirs(root / "d")[-1]), load_state(checkpoint_dirs(root / "u")[-1])
    assert all(torch.equal(wd[k], wu[k]) for k in wu)


def test_decay_from_resumes_as_its_own_run(decay_runs, tmp_path, capsys):
    root, ckpt, _ = decay_runs
    out = tmp_path / "d2"
    assert main(["train", "--decay-from", str(ckpt), "--decay-steps", "4", "--out", str(out), "--no-progress",
                 "--set", "save_every=2"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]  # the steps it trained, not the step it reached
    assert last.startswith(f"trained 4 steps (steps 7-10 of the run), {4 * 4 * 64:,d} tokens; final val loss ")
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0  # finished: nothing to do
    assert read_metrics(out)[-1]["loss"] == read_metrics(root / "d")[-1]["loss"]


def test_decay_from_refuses_what_cannot_decay(decay_runs, tmp_path, capsys):
    root, ckpt, _ = decay_runs
    u_last = checkpoint_dirs(root / "u")[-1]  # in (the end of) its own decay: lr factor 0.1
    cases = [
        (["--decay-from", str(u_last), "--decay-steps", "2"], "not a stable-phase checkpoint"),
        (["--decay-from", str(ckpt), "--decay-steps", "0"], "--decay-steps 0 must be an integer >= 1"),
        (["--decay-from", str(ckpt)], "needs --out NEW_RUN_DIR and --decay-steps N"),
        (["--decay-from", str(ckpt), "--decay-steps", "2", "--set", "lr=1"], "--set 'lr=1' would change"),
        (["--decay-from", str(ckpt), "--decay-steps", "2", "--steps", "5"], "drop --steps"),
        (["--decay-from", str(tmp_path / "nope"), "--decay-steps", "2"], "does not exist"),
        (["--decay-steps", "2"], "--decay-steps applies to --decay-from only"),
    ]
    for argv, message in cases:
        out = tmp_path / "refused"
        assert main(["train", *argv, "--out", str(out), "--no-progress"]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and err.count("\n") == 0, (argv, err)
        assert not out.exists()
    assert main(["train", "--decay-from", str(ckpt), "--decay-steps", "2", "--out", str(root / "a")]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ AdamW
def _adamw_run(impl: str, steps: int = 20) -> dict[str, torch.Tensor]:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **adamw_kwargs(impl))
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


#: Stated tolerance: after 20 AdamW steps at lr 1e-2 on float32, fused and foreach weights are within 1e-6 (absolute;
#: weights are O(0.1)) of the for-loop's: the kernels order the same float32 operations differently.
ADAMW_ATOL = 1e-6


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_fast_adamw_equals_the_plain_update_within_rounding(impl):
    if impl == "fused" and not fused_adamw_supported(torch.device("cpu")):
        pytest.skip(f"torch {torch.__version__} has no fused AdamW on CPU")
    plain, fast = _adamw_run("plain"), _adamw_run(impl)
    start = {n: p.detach() for n, p in make_model().named_parameters()}
    worst = max((fast[n] - plain[n]).abs().max().item() for n in plain)
    moved = min((plain[n] - start[n]).abs().max().item() for n in plain)
    assert worst <= ADAMW_ATOL and moved > 100 * ADAMW_ATOL, (worst, moved)


def test_adamw_impl_resolution_and_legacy_default():
    cpu = torch.device("cpu")
    assert resolve_adamw_impl("auto", cpu) == ("fused" if fused_adamw_supported(cpu) else "foreach")
    assert resolve_adamw_impl("plain", cpu) == "plain"
    assert resolve_adamw_impl("auto", torch.device("cuda")) == "fused"  # torch lists CUDA's fused kernel
    assert LEGACY_DEFAULTS["adamw_impl"] == "torch_default"  # release 97f8652: torch.optim.AdamW's own choice
    assert TrainConfig.from_recorded({"steps": 3}).adamw_impl == "torch_default"
    assert TrainConfig(steps=3).adamw_impl == "auto"


def test_run_json_records_the_implementation_and_resume_keeps_it(decay_runs):
    root, _, _ = decay_runs
    expected = resolve_adamw_impl("auto", torch.device("cpu"))
    assert read_run(root / "a")["adamw_impl"] == expected and read_run(root / "a")["train"]["adamw_impl"] == "auto"
    from depthattn.training.resume import recorded_adamw_impl

    run = json.loads((root / "a" / "run.json").read_text())
    run["adamw_impl"] = "foreach"  # as if resolved elsewhere: a resumed "auto" run keeps it
    (root / "u2").mkdir()
    (root / "u2" / "run.json").write_text(json.dumps(run))
    assert recorded_adamw_impl(root / "u2", "auto", torch.device("cpu"), resume=True) == "foreach"
    assert recorded_adamw_impl(root / "u2", "plain", torch.device("cpu"), resume=True) == "plain"
    assert recorded_adamw_impl(root / "u2", "auto", torch.device("cpu"), resume=False) == expected


# ------------------------------------------------------------------------------------------------ W&B
def test_wandb_run_id_is_saved_and_reused(tmp_path):
    ids = iter(["first", "second"])
    assert wandb_run_id(tmp_path, False, lambda: next(ids)) == "first"
    assert json.loads((tmp_path / "wandb.json").read_text()) == {"id": "first"}
    assert wandb_run_id(tmp_path, True, lambda: "unused") == "first"
    assert wandb_run_id(tmp_path, False, lambda: next(ids)) == "second"  # a fresh start: a new W&B run


def test_a_resumed_run_passes_its_wandb_id(tmp_path, data_dir, model_cfg, monkeypatch):
    """At the boundary (no wandb needed): the ``wandb.init`` keywords of a run and of its resume."""
    calls: list[dict] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(kw) or types.SimpleNamespace(log=lambda *a, **k: None,
                                                                      finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = TrainConfig(steps=4, save_every=2, wandb_project="p", **BASE)
    train(tmp_path / "r", model_cfg, cfg, data_dir, progress=False, stop_after=2)
    train(tmp_path / "r", model_cfg, cfg, data_dir, progress=False, resume=True)
    saved = json.loads((tmp_path / "r" / "wandb.json").read_text())["id"]
    assert [c["id"] for c in calls] == [saved, saved] and {c["resume"] for c in calls} == {"allow"}
    train(tmp_path / "fresh", model_cfg, cfg, data_dir, progress=False, stop_after=1)
    assert calls[-1]["id"] != saved  # another run: another W&B run


def test_wandb_offline_resume_logs_into_the_same_run(tmp_path, data_dir, model_cfg, monkeypatch):
    """The real package in offline mode (skipped where wandb is not installed; it is not a dependency)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrainConfig(steps=4, save_every=2, wandb_project="p", **BASE)
    run = tmp_path / "r"
    train(run, model_cfg, cfg, data_dir, progress=False, stop_after=2)
    first = json.loads((run / "wandb.json").read_text())["id"]
    train(run, model_cfg, cfg, data_dir, progress=False, resume=True)
    assert json.loads((run / "wandb.json").read_text())["id"] == first
    sessions = sorted(Path(run, "wandb").glob("offline-run-*"))
    assert len(sessions) == 2 and all(s.name.endswith(f"-{first}") for s in sessions)
