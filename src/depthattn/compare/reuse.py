"""What a comparison does with a run folder before evaluating it: train it afresh, resume it from its newest
checkpoint, reuse it finished, or reuse its divergence verdict (``ensure_trained``; the rules of what may differ are
``training.resume.plan_run``'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import ModelConfig
from ..run.folder import RunFolder
from ..training import DivergenceError, NonFiniteError, TrainConfig, train
from ..training.resume import plan_run


def ensure_trained(run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: Path,
                   progress: bool, log: Callable[[str], None], on_step: Callable[[int, int], None] | None = None
                   ) -> str:
    """Train, resume (from the newest checkpoint), or reuse the run in ``run_dir`` (ValueError if it holds a
    different config). Returns what it did: "reused", "resumed at step N", "trained", or "diverged at step N" (this
    session's training stopped by the divergence guard or a non-finite value, or with ``on_divergence="stop"`` an
    earlier session's verdict, from the run's ``diverged.json``, reused)."""
    folder = RunFolder(run_dir)
    plan = plan_run("reuse", run_dir, model_cfg=model_cfg, train_cfg=train_cfg, data_dir=data_dir)
    for line in plan.lines:
        log(line)
    if plan.resume:
        verdict = folder.read_divergence()
        setting = "on_nonfinite=skip" if verdict and verdict.get("reason") == "nonfinite" else "on_divergence=warn"
        if verdict is not None and getattr(train_cfg, setting.split("=")[0]) == "stop":  # the same rule would stop it
            log(f"reusing the verdict of {run_dir}: diverged at step {verdict['step']} (to try again: delete that "
                f"folder, or continue it past the divergence with --set {setting})")
            return f"diverged at step {verdict['step']}"
        if folder.summary_file.is_file() and folder.checkpoints():
            log(f"reusing finished run {run_dir}")
            return "reused"
    resume = plan.resume
    try:
        res = train(run_dir, model_cfg, train_cfg, data_dir, progress=progress, log=log, on_step=on_step,
                    **plan.train_kwargs())
    except (DivergenceError, NonFiniteError) as e:  # the run stopped itself (diverged.json says why): go on
        log(f"{run_dir}: {e}")
        return f"diverged at step {e.step}"
    return f"resumed at step {res.steps - res.steps_this_session}" if resume else "trained"
