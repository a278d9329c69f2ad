"""Run folders on disk: the run record, metrics log, checkpoints and the trainer state inside them, and the
policy for resuming a run.

A *run folder* holds::

    run.json            resolved model + train config, data folder and fingerprint, resolved precision, package
                        versions, git revision
    param_groups.json   which parameters get weight decay (optim.py)
    metrics.jsonl       one JSON object per logged step: step, tokens, loss, lr, grad_norm, tokens_per_s,
                        and val_loss when measured
    summary.json        written when the run reaches its last step (strict JSON: an unknown number is null)
    checkpoints/step_XXXXXXXX/   a Hugging Face model folder (checkpoint.save_model_files: model.safetensors,
                                 config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
                                 configuration.py, modeling.py), plus train_config.json and trainer_state.pt
                                 (optimizer, scheduler, RNG states, step, tokens seen, data position)
                                 (an FSDP run's: dcp/ shards of model and optimizer instead, see ``training.dcp``)

Every file is written atomically and every checkpoint folder is assembled under a temporary name
(``fileio.write_folder_atomically``), so a failure never damages what is already there. Where the checkpoints
of a run folder are (``checkpoint_dirs``, ``latest_checkpoint``) is ``depthattn.checkpoint``'s; what may change when
a run resumes (``config_differences``, ``resume_point``) is decided here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping

import torch

from .. import checkpoint as ckpt
from ..checkpoint import CHECKPOINT_DIR, checkpoint_dirs
from ..config import ModelConfig
from ..fileio import atomic_write_text, write_folder_atomically
from ..model import DecoderLM
from .config import RESUMABLE_KEYS, TrainConfig
from .runtime import rng_state, set_rng_state

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PARAM_GROUPS_FILE = "param_groups.json"
STATE_FILE = "trainer_state.pt"
TRAIN_CONFIG_FILE = "train_config.json"
TOKENIZER_FILE = "tokenizer.json"


# ---------------------------------------------------------------------------------------------------- environment
def versions() -> dict[str, str]:
    """Versions of the packages that determine a run's numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "tokenizers", "numpy", "depthattn"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_revision() -> str | None:
    """``git rev-parse HEAD`` of the package source (with ``-dirty`` when modified), or None without git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(cfg: TrainConfig, device: torch.device, amp: torch.dtype | None) -> dict[str, Any]:
    """The machine-dependent part of ``run.json``."""
    return dict(versions=versions(), git_revision=git_revision(), world_size=cfg.world_size(), device=str(device),
                autocast=str(amp) if amp else "float32", tokens_per_step=cfg.tokens_per_step(),
                warmup_steps=cfg.warmup_steps())


# ---------------------------------------------------------------------------------------------------- run folders
def read_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``run.json`` of a run folder (``ValueError`` / ``FileNotFoundError`` naming it)."""
    file = Path(run_dir) / RUN_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: {os.fspath(run_dir)!r} is not a depthattn run folder")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {file}: {e}") from e


def run_of_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The run.json of the run a checkpoint folder belongs to, if it sits in one."""
    run_dir = checkpoint_dir.parent.parent
    if checkpoint_dir.parent.name == CHECKPOINT_DIR and (run_dir / RUN_FILE).is_file():
        return read_run(run_dir)
    return None


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    file = Path(run_dir) / METRICS_FILE
    if not file.is_file():
        return []
    with open(file, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop logged rows past ``last_step`` (logged before a crash, after the checkpoint we resume from)."""
    rows = [r for r in read_metrics(run_dir) if r["step"] <= last_step]
    atomic_write_text(run_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------------------------------------- resume policy
def _diff(a: Mapping[str, Any], b: Mapping[str, Any], ignore: frozenset = frozenset()) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k) != b.get(k)]


def config_differences(recorded: Mapping[str, Any], model: Mapping[str, Any], train: Mapping[str, Any]) -> list[str]:
    """``"key: recorded vs requested"`` for every field where a run's ``run.json`` differs from a requested model
    and train config (as dicts), ignoring ``RESUMABLE_KEYS``: empty when the run may be resumed with them."""
    return _diff(recorded["model"], model) + _diff(recorded["train"], train, RESUMABLE_KEYS)


def _recorded_precision(run: dict[str, Any]) -> str | None:
    """A run.json's resolved precision (older runs recorded only ``autocast``: ``float32`` or ``torch.bfloat16``)."""
    if "resolved_precision" in run:
        return run["resolved_precision"]
    if "autocast" in run:
        return str(run["autocast"]).removeprefix("torch.")
    return None


def keep_tokens_per_step(run_dir: Path, train_cfg: TrainConfig, log) -> TrainConfig:
    """On resume under another world size than the run's: ``grad_accum`` rescaled so one step keeps the recorded
    tokens per step (said in one line through ``log``), or ``ValueError`` when no whole ``grad_accum`` does. Never
    a silent change of the global batch."""
    if not (run_dir / RUN_FILE).is_file():
        return train_cfg
    old = read_run(run_dir)
    was, world = int(old.get("world_size", 1)), train_cfg.world_size()
    recorded = old.get("tokens_per_step")
    if was == world or recorded is None or train_cfg.tokens_per_step() == recorded:
        return train_cfg
    per_accum = train_cfg.batch_size * train_cfg.seq_len * world
    if recorded % per_accum:
        raise ValueError(f"cannot resume {run_dir} on {world} rank(s): it trained {recorded} tokens per step on {was}, "
                         f"not a multiple of batch_size {train_cfg.batch_size} × seq_len {train_cfg.seq_len} × "
                         f"{world} ranks = {per_accum}; resume on {was} rank(s) or a world size that divides it")
    accum = recorded // per_accum
    log(f"resuming on {world} rank(s) instead of {was}: grad_accum {train_cfg.grad_accum} -> {accum} keeps "
        f"{recorded} tokens per step")
    return train_cfg.replace(grad_accum=accum)


def resume_point(run_dir: Path, record: dict[str, Any], data_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from (None: start afresh). Refuses a config, tokenizer, data (fingerprint) or resolved
    precision that differs from the recorded run, and, without ``resume``, a run folder that already holds
    checkpoints."""
    if not resume:
        if checkpoint_dirs(run_dir):
            raise ValueError(f"run folder {run_dir} already holds checkpoints; pass --resume to continue it or "
                             f"choose another --out")
        return None
    old = read_run(run_dir)
    train = dict(record["train"])
    if old.get("world_size", 1) != record.get("world_size", 1) and old.get("tokens_per_step") == record.get(
            "tokens_per_step"):
        train["grad_accum"] = old["train"].get("grad_accum")  # rescaled by keep_tokens_per_step
    problems = config_differences(old, record["model"], train)
    if problems:
        raise ValueError(f"cannot resume {run_dir}: the requested config differs from the recorded one "
                         f"({'; '.join(problems)})")
    if old.get("tokenizer_sha256") != record["tokenizer_sha256"]:
        raise ValueError(f"cannot resume {run_dir}: data {data_dir} has another tokenizer than the run's "
                         f"{old.get('data')}")
    if old.get("data_fingerprint") not in (None, record["data_fingerprint"]):
        raise ValueError(f"cannot resume {run_dir}: data folder {data_dir} holds other data than the run trained on "
                         f"({old.get('data')}; fingerprint {record['data_fingerprint'][:12]} vs "
                         f"{old['data_fingerprint'][:12]}: other documents, split, seed or tokens); resume with the "
                         f"run's data folder")
    was = _recorded_precision(old)
    if was is not None and was != record["resolved_precision"]:
        raise ValueError(f"cannot resume {run_dir}: it trained in {was} (device {old.get('device')}, precision "
                         f"{old['train'].get('precision')!r}), but on device {record['device']} this session would "
                         f"train in {record['resolved_precision']}; resume with --device set to the run's device "
                         f"type so the precision stays {was}")
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def load_resume_weights(model: DecoderLM, model_cfg: ModelConfig, checkpoint_dir: Path) -> None:
    """Load the weights of the checkpoint to resume from, refusing one written for another model config."""
    problems = _diff(ckpt.load_config(checkpoint_dir).to_dict(), model_cfg.to_dict())
    if problems:
        raise ValueError(f"checkpoint {checkpoint_dir} was written for another model config ({'; '.join(problems)})")
    ckpt.load_weights_into(model, ckpt.load_state(checkpoint_dir), str(checkpoint_dir / ckpt.WEIGHTS_NAME))


# ---------------------------------------------------------------------------------------------------- state
def trainer_state(optimizer: torch.optim.Optimizer, scheduler: Any, step: int, tokens_seen: int) -> dict[str, Any]:
    """What ``trainer_state.pt`` holds: optimizer, scheduler and RNG states, step, tokens seen, data position."""
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
            "step": step, "tokens_seen": tokens_seen, "data_position": step}


def restore_trainer_state(state: Mapping[str, Any], optimizer: torch.optim.Optimizer, scheduler: Any,
                          checkpoint_dir: Path) -> tuple[int, int]:
    """Load a ``trainer_state`` into ``optimizer``, ``scheduler`` and the RNGs; return (step, tokens seen).

    Raises ``ValueError`` naming the state file if it does not fit the optimizer or its data position is off.
    """
    file = checkpoint_dir / STATE_FILE
    try:
        if "optimizer" in state:  # a sharded checkpoint's optimizer states are in DCP (training.dcp)
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (KeyError, ValueError, RuntimeError) as e:
        raise ValueError(f"{file}: optimizer/scheduler state does not fit the model ({e})") from e
    set_rng_state(state["rng"])
    step, tokens_seen = int(state["step"]), int(state["tokens_seen"])
    if int(state["data_position"]) != step:
        raise ValueError(f"{file}: data position {state['data_position']} != step {step}")
    return step, tokens_seen


def load_trainer_state(checkpoint_dir: Path) -> dict[str, Any]:
    file = checkpoint_dir / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: the checkpoint has no trainer state to resume from")
    ckpt.verify_file(checkpoint_dir, STATE_FILE)  # checksums.json, when the folder has one (IntegrityError)
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a truncated or corrupt pickle/zip
        raise ValueError(f"cannot read trainer state {file} (truncated or corrupt?): {e}") from e


def init_from_checkpoint(model: DecoderLM, path: str | os.PathLike) -> list[str]:
    """Load a checkpoint's weights into ``model`` through ``checkpoint.load_state`` / ``load_weights_into``.

    The checkpoint may use another ``cross_layer``: keys under ``cross_layer`` that one side lacks keep the new
    model's initialisation (missing) or are dropped (unexpected). Every other key and every shape must match.
    Returns the keys that kept their initialisation. Raises ``ValueError`` naming the file otherwise.
    """
    source = os.path.join(os.fspath(path), ckpt.WEIGHTS_NAME)
    return ckpt.load_weights_into(model, ckpt.load_state(path), source, kind="init_from")


# ---------------------------------------------------------------------------------------------------- writing
def save_checkpoint(run_dir: Path, model: DecoderLM, train_cfg: TrainConfig, data_dir: Path, state: dict) -> Path:
    """Write ``checkpoints/step_XXXXXXXX/`` atomically, then keep only the newest ``keep_last``; return its path."""
    step = state["step"]
    target = run_dir / CHECKPOINT_DIR / f"step_{step:08d}"

    def fill(tmp: str) -> None:
        ckpt.save_model_files(model, tmp, tokenizer_file=data_dir / TOKENIZER_FILE)  # the Hugging Face files
        atomic_write_text(os.path.join(tmp, TRAIN_CONFIG_FILE), json.dumps(train_cfg.to_dict(), indent=2) + "\n")
        torch.save(state, os.path.join(tmp, STATE_FILE))

    write_folder_atomically(target, fill)
    for old in checkpoint_dirs(run_dir)[:-train_cfg.keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def start_run_files(run_dir: Path, record: Mapping[str, Any], groups: Any, resume: bool, step: int,
                    finished: bool = False) -> None:
    """Write ``run.json`` and ``param_groups.json``; ``metrics.jsonl`` starts empty, or on ``resume`` keeps its rows
    up to ``step``. A stale ``summary.json`` is dropped, unless the run resumes at its last step (``finished``):
    then the summary stays and the trainer checks or re-creates it at the end."""
    if resume:
        _truncate_metrics(run_dir, step)
    else:
        atomic_write_text(run_dir / METRICS_FILE, "")
    atomic_write_text(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
    atomic_write_text(run_dir / PARAM_GROUPS_FILE, json.dumps(groups, indent=2) + "\n")
    if not finished:
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)


def _finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, recursively: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """Write ``summary.json`` as strict JSON (non-finite numbers become null)."""
    atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(_finite_or_none(summary), indent=2, allow_nan=False) + "\n")


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``summary.json`` if it is present and strict JSON, else None."""
    file = Path(run_dir) / SUMMARY_FILE
    try:
        return json.loads(file.read_text(encoding="utf-8"),
                          parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"non-JSON constant {c}")))
    except (OSError, ValueError):
        return None


def run_tokens_per_s(rows: list[Mapping[str, Any]]) -> float | None:
    """Whole-run training throughput from the metrics log: tokens / Σ step time (rows skipped by ``log_every``
    count at the rate of the next logged row); None without timed rows."""
    prev, seconds, tokens = 0, 0.0, 0
    for r in rows:
        if not r.get("tokens_per_s"):
            continue
        seconds += (r["tokens"] - prev) / r["tokens_per_s"]
        tokens += r["tokens"] - prev
        prev = r["tokens"]
    return tokens / seconds if seconds > 0 else None
