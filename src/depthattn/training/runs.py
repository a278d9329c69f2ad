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

Crash consistency (docs/reliability.md, "Training runs"): a torn last line of ``metrics.jsonl`` (a kill or a full
disk mid-append) is dropped with a note; old checkpoints are renamed to ``.trash-step_XXXXXXXX`` before they are
deleted, so a kill mid-prune never leaves a half-deleted folder under a real name; leftovers of interrupted writes
(``.tmp-*``, ``.old-*``, ``.trash-*``) are removed when a run starts; resume takes the newest *readable* checkpoint,
saying which one it skipped and why. ``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` (tests only) kills the process with
SIGKILL the n-th time a named phase is reached (``fault_point``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from .. import checkpoint as ckpt
from ..checkpoint import CHECKPOINT_DIR, SHARDED_DIR, checkpoint_dirs
from ..config import ModelConfig
from ..fileio import atomic_write_text, loads_json, read_json, write_folder_atomically
from ..model import DecoderLM
from .config import RESUMABLE_KEYS, TrainConfig
from .metrics import finite_or_none, json_line
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
        return read_json(file, "run record")
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {file}: {e}") from e


def run_of_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The run.json of the run a checkpoint folder belongs to, if it sits in one."""
    run_dir = checkpoint_dir.parent.parent
    if checkpoint_dir.parent.name == CHECKPOINT_DIR and (run_dir / RUN_FILE).is_file():
        return read_run(run_dir)
    return None


def read_metrics(run_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (empty without the file).

    A last line that does not parse (torn by a kill or a full disk mid-append) is dropped with a note through
    ``log`` (default: a ``UserWarning``) naming the file. Raises ``ValueError`` naming the file and line number for
    a bad line anywhere else, or a row that is not a JSON object with a ``step``."""
    file = Path(run_dir) / METRICS_FILE
    if not file.is_file():
        return []
    try:
        text = file.read_text(encoding="utf-8", errors="replace")  # a bad byte fails that line's parse
    except OSError as e:
        raise ValueError(f"cannot read {file}: {e}") from e
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            row = loads_json(line, f"{file}:{n}")
            if not (isinstance(row, dict) and "step" in row):
                raise ValueError("not a JSON object with a step")
        except ValueError as e:
            if i == len(lines) - 1:
                (log or (lambda m: warnings.warn(m, stacklevel=3)))(
                    f"{file}:{n}: dropped a torn last line (an interrupted write): {line[:60]!r}")
                break
            raise ValueError(f"{file}:{n}: not a metrics row ({e}); fix or delete that line") from e
        rows.append(row)
    return rows


def _truncate_metrics(run_dir: Path, last_step: int, log: Callable[[str], None], log_every: int = 1) -> None:
    """Drop logged rows past ``last_step`` (logged before a crash, after the checkpoint we resume from); a missing
    log restarts empty, and a log that ends a ``log_every`` or more before ``last_step`` (rows lost), are said through
    ``log``.

    The log is rewritten only when a row (or a torn last line) is dropped, and then through
    ``fileio.atomic_write_text``: the rows are written to a temporary file beside it, fsync'd, and renamed over it
    (the folder fsync'd after), so a reader, a kill or a full disk (``OSError``, the temporary removed) at any
    moment leaves the old log whole or the new one, never no file or a part of one."""
    file = run_dir / METRICS_FILE
    if not file.is_file() and last_step > 0:
        log(f"{file} is missing: the metrics log restarts at step {last_step + 1} (rows of steps 1-{last_step} are "
            f"lost)")
    rows = [r for r in read_metrics(run_dir, log) if r["step"] <= last_step]
    last_logged = max((int(r["step"]) for r in rows), default=0)
    if file.is_file() and last_step - last_logged >= max(1, log_every):
        log(f"{file} ends at step {last_logged}, before the checkpoint of step {last_step} (logging every "
            f"{log_every}): the rows in between were lost in a crash before they reached the disk; the curve has a "
            f"gap there")
    text = "".join(json_line(r) for r in rows)
    try:
        unchanged = file.read_text(encoding="utf-8") == text
    except (OSError, ValueError):  # missing, or not UTF-8 (read_metrics dropped the torn line): rewrite
        unchanged = False
    if not unchanged:
        atomic_write_text(file, text)


# ---------------------------------------------------------------------------------------------------- faults, debris
FAULT_ENV = "DEPTHATTN_FAULT_PHASE"
_fault_counts: dict[str, int] = {}


def fault_point(phase: str) -> None:
    """Test hook: with ``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` set, SIGKILL this process the n-th time ``phase`` is
    reached (phases: ``step`` after an optimizer step, ``logged`` after its metrics row, ``save`` inside a
    checkpoint write, ``saved`` after the rename before pruning, ``prune`` after a folder moved to the trash).
    Does nothing when the variable is unset."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or spec.partition(":")[0] != phase:
        return
    _fault_counts[phase] = _fault_counts.get(phase, 0) + 1
    if _fault_counts[phase] == int(spec.partition(":")[2] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


#: Name prefixes of leftovers of interrupted writes and prunes (fileio temporaries, replaced and trashed folders).
DEBRIS_PREFIXES = (".tmp-", ".old-", ".trash-")


def remove_debris(run_dir: Path, log: Callable[[str], None]) -> list[str]:
    """Delete leftovers of interrupted writes in ``run_dir`` and its ``checkpoints/`` (names starting with
    ``DEBRIS_PREFIXES``), saying what was removed in one line; returns their names."""
    removed = []
    for folder in (run_dir, run_dir / CHECKPOINT_DIR):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if p.name.startswith(DEBRIS_PREFIXES):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(str(p.relative_to(run_dir)))
    if removed:
        log(f"removed leftovers of an interrupted write in {run_dir}: {', '.join(removed)}")
    return removed


def prune_checkpoints(run_dir: Path, keep_last: int, newest: Path) -> None:
    """Keep ``newest`` (the checkpoint just written) and the ``keep_last - 1`` newest others; each older folder is
    renamed to ``.trash-step_XXXXXXXX`` first, then deleted, so no half-deleted folder keeps a checkpoint's name."""
    others = [d for d in checkpoint_dirs(run_dir) if d != newest]
    for old in others[:max(0, len(others) - (keep_last - 1))]:
        trash = old.with_name(f".trash-{old.name}")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(old, trash)
        fault_point("prune")
        shutil.rmtree(trash, ignore_errors=True)  # a leftover is removed when the run next starts


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
    tokens per step, or ``ValueError`` when no whole ``grad_accum`` does. Never a silent change of the global batch,
    nor of the data: one line through ``log`` says the world-size change, the rescale, and that the batches of the
    remaining steps differ from the uninterrupted run's (``data.TokenBatches`` draws each micro-step's windows by
    ``(seed, step, micro_step)`` and splits them among the ranks, so another ``grad_accum`` × world size draws other
    windows: the same number of tokens per step, not the same tokens). Same world size: nothing said."""
    if not (run_dir / RUN_FILE).is_file():
        return train_cfg
    old = read_run(run_dir)
    was, world = int(old.get("world_size", 1)), train_cfg.world_size()
    if was == world:
        return train_cfg
    recorded = old.get("tokens_per_step")
    differ = (f"the batches of the remaining steps differ from the uninterrupted run's (windows are drawn per rank "
              f"and micro-step), so its curve and weights will not repeat it exactly; resume on {was} rank(s) for a "
              f"bit-exact continuation")
    if recorded is None or train_cfg.tokens_per_step() == recorded:
        log(f"resuming on {world} rank(s) instead of {was}: {differ}")
        return train_cfg
    per_accum = train_cfg.batch_size * train_cfg.seq_len * world
    if recorded % per_accum:
        raise ValueError(f"cannot resume {run_dir} on {world} rank(s): it trained {recorded} tokens per step on {was}, "
                         f"not a multiple of batch_size {train_cfg.batch_size} × seq_len {train_cfg.seq_len} × "
                         f"{world} ranks = {per_accum}; resume on {was} rank(s) or a world size that divides it")
    accum = recorded // per_accum
    log(f"resuming on {world} rank(s) instead of {was}: grad_accum {train_cfg.grad_accum} -> {accum} keeps "
        f"{recorded} tokens per step; {differ}")
    return train_cfg.replace(grad_accum=accum)


def resumed_data_parallel(recorded: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str | None, str]:
    """The ``data_parallel`` a resumed run takes when none is requested (``depthattn train --resume`` without
    ``--set data_parallel=...``), and a line saying the change (empty: none). The rule: the recorded value, except
    that a one-process run (``null``) launched by torchrun with several ranks (``WORLD_SIZE`` > 1 in ``environ``)
    takes ``"ddp"``, and a ``"ddp"`` run launched without torchrun (no ``WORLD_SIZE``) takes ``null``: both write
    full checkpoints, so either reads the other's. An ``"fsdp"`` run stays ``"fsdp"`` (its checkpoints are sharded:
    it needs torchrun, on any number of ranks)."""
    world = int(environ.get("WORLD_SIZE", "0") or 0)
    if recorded is None and world > 1:
        return "ddp", (f"the run trained in one process (data_parallel null); launched on {world} ranks it resumes "
                       f"with data_parallel=ddp (--set data_parallel=... chooses)")
    if recorded == "ddp" and "WORLD_SIZE" not in environ:
        return None, ("the run trained with data_parallel=ddp; launched as one process (no torchrun) it resumes with "
                      "data_parallel null")
    return recorded, ""


def check_checkpoint_kind(checkpoint: Path, data_parallel: str | None) -> None:
    """Refuse to resume ``checkpoint`` with a ``data_parallel`` that cannot read it: a sharded (FSDP) checkpoint
    (``dcp/`` shards, ``training.dcp``) needs ``"fsdp"``; a full one (``model.safetensors``, the optimizer in
    ``trainer_state.pt``) needs ``null`` or ``"ddp"``, which write the same. The ``ValueError`` gives commands that
    work."""
    sharded = (checkpoint / SHARDED_DIR).is_dir()
    if sharded == (data_parallel == "fsdp"):
        return
    run = checkpoint.parent.parent
    if sharded:
        raise ValueError(f"cannot resume from {checkpoint} with data_parallel={data_parallel or 'null'}: it is a "
                         f"sharded (FSDP) checkpoint; resume it with FSDP on any number of ranks (DCP reshards): "
                         f"torchrun --nproc_per_node N -m depthattn.cli train --resume {run} --set "
                         f"data_parallel=fsdp; or start a new run from its weights: depthattn export {run} --out "
                         f"DIR, then depthattn train --init-from DIR ... (a fresh optimizer and schedule)")
    raise ValueError(f"cannot resume from {checkpoint} with data_parallel=fsdp: it is a full (one-process or DDP) "
                     f"checkpoint; resume it with DDP on any number of ranks: torchrun --nproc_per_node N -m "
                     f"depthattn.cli train --resume {run} --set data_parallel=ddp; or start a new FSDP run from its "
                     f"weights: depthattn train --init-from {run} --set data_parallel=fsdp ... (a fresh optimizer "
                     f"and schedule)")


def resume_point(run_dir: Path, record: dict[str, Any], data_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from (None: start afresh). Refuses a config, tokenizer, data (fingerprint) or resolved
    precision that differs from the recorded run, and, without ``resume``, a run folder that already holds
    checkpoints. ``grad_accum`` (rescaled by ``keep_tokens_per_step``) and ``data_parallel`` (``check_checkpoint_kind``
    refuses one that cannot read the checkpoint) may differ."""
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
    # data_parallel may change (resumed_data_parallel); whether it reads the checkpoint is check_checkpoint_kind's
    train["data_parallel"] = old["train"].get("data_parallel")
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


#: What the checkpoint readers raise for a missing, truncated or corrupt file (or one failing its integrity check).
UNREADABLE_ERRORS = (OSError, ValueError, RuntimeError, KeyError, EOFError)
_STATE_KEYS = ("scheduler", "rng", "step", "tokens_seen", "data_position")


@dataclass
class ResumeCheckpoint:
    """The checkpoint a run resumes from, read: ``state`` is its ``trainer_state.pt``, ``weights`` its
    ``model.safetensors`` tensors (None for a sharded checkpoint: ``training.dcp`` reads it into the model);
    ``unreadable`` are newer checkpoint folders that could not be read (``set_aside`` moves them away)."""

    path: Path
    state: dict[str, Any]
    weights: dict[str, torch.Tensor] | None
    unreadable: list[Path] = field(default_factory=list)


def _read_checkpoint(d: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    state = load_trainer_state(d)
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise KeyError(f"{d / STATE_FILE} lacks {missing}")
    if (d / SHARDED_DIR).is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        FileSystemReader(str(d / SHARDED_DIR)).read_metadata()  # DCP's index; the shards are read by training.dcp
        return state, None
    return state, ckpt.load_state(d)


def read_resume_checkpoint(dirs: list[Path], model_cfg: ModelConfig, log: Callable[[str], None],
                           fall_back: bool = True) -> ResumeCheckpoint:
    """Read the newest of ``dirs`` (oldest first) that can be read; one line through ``log`` for each one skipped
    (naming the file and the error) and for the one taken instead. ``fall_back=False``: the newest or an error.

    Raises ``ValueError`` for a checkpoint written for another model config (not a reason to fall back), or when
    no checkpoint can be read (naming each one and why)."""
    problems: list[str] = []
    said: list[str] = []
    for d in reversed(dirs):
        try:
            ckpt.verify_file(d, "config.json")  # a flipped bit is damage (fall back), not another config
            recorded = ckpt.load_config(d).to_dict()
        except UNREADABLE_ERRORS as e:
            recorded, error = None, e
        if recorded is not None:
            mismatch = _diff(recorded, model_cfg.to_dict())
            if mismatch:
                raise ValueError(f"checkpoint {d} was written for another model config ({'; '.join(mismatch)})")
            try:
                state, weights = _read_checkpoint(d)
                for line in said:  # only when falling back: the error below already names each one
                    log(line)
                if problems:
                    log(f"resuming from the previous checkpoint {d} instead")
                return ResumeCheckpoint(d, state, weights, [p for p in dirs if p > d])
            except UNREADABLE_ERRORS as e:
                error = e
        problems.append(f"{d.name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
        said.append(f"checkpoint {d} is unreadable ({problems[-1].split(': ', 1)[1]})")
        if not fall_back:
            break
    raise ValueError(f"cannot resume from {dirs[-1].parent}: no readable checkpoint ({'; '.join(problems)})")


def set_aside(unreadable: list[Path], log: Callable[[str], None]) -> None:
    """Rename unreadable checkpoint folders to ``.unreadable-step_XXXXXXXX`` (kept for inspection, no longer
    taken for a checkpoint by resume, pruning, eval or export), saying so in one line."""
    for d in unreadable:
        aside = d.with_name(f".unreadable-{d.name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(d, aside)
        log(f"moved the unreadable checkpoint {d} to {aside}")


def load_resume_weights(model: DecoderLM, model_cfg: ModelConfig, checkpoint_dir: Path,
                        weights: dict[str, torch.Tensor] | None = None) -> None:
    """Load the weights of the checkpoint to resume from (``weights``: already read), refusing one written for
    another model config."""
    problems = _diff(ckpt.load_config(checkpoint_dir).to_dict(), model_cfg.to_dict())
    if problems:
        raise ValueError(f"checkpoint {checkpoint_dir} was written for another model config ({'; '.join(problems)})")
    if weights is None:
        weights = ckpt.load_state(checkpoint_dir)
    ckpt.load_weights_into(model, weights, str(checkpoint_dir / ckpt.WEIGHTS_NAME))


# ---------------------------------------------------------------------------------------------------- state
def trainer_state(optimizer: torch.optim.Optimizer, scheduler: Any, step: int, tokens_seen: int,
                  nonfinite_skips: int = 0) -> dict[str, Any]:
    """What ``trainer_state.pt`` holds: optimizer, scheduler and RNG states, step, tokens seen, data position, and
    the number of consecutive non-finite steps skipped up to ``step`` (``TrainConfig.on_nonfinite="skip"``)."""
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state(),
            "step": step, "tokens_seen": tokens_seen, "data_position": step, "nonfinite_skips": nonfinite_skips}


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
    """Write ``checkpoints/step_XXXXXXXX/`` atomically, then keep only the newest ``keep_last``
    (``prune_checkpoints``; never the one just written); return its path. The caller checks that the weights are
    finite (``loop._check_weights_finite``)."""
    step = state["step"]
    target = run_dir / CHECKPOINT_DIR / f"step_{step:08d}"

    def fill(tmp: str) -> None:
        ckpt.save_model_files(model, tmp, tokenizer_file=data_dir / TOKENIZER_FILE)  # the Hugging Face files
        fault_point("save")
        atomic_write_text(os.path.join(tmp, TRAIN_CONFIG_FILE), json.dumps(train_cfg.to_dict(), indent=2) + "\n")
        ckpt.save_torch(state, os.path.join(tmp, STATE_FILE))

    write_folder_atomically(target, fill)
    fault_point("saved")
    prune_checkpoints(run_dir, train_cfg.keep_last, target)
    return target


def start_run_files(run_dir: Path, record: Mapping[str, Any], groups: Any, resume: bool, step: int,
                    finished: bool = False, log: Callable[[str], None] = print) -> None:
    """Remove leftovers of interrupted writes (``remove_debris``), write ``run.json`` and ``param_groups.json``;
    ``metrics.jsonl`` starts empty, or on ``resume`` keeps its rows up to ``step`` (a torn last line dropped, a
    missing log restarted: each said through ``log``). A stale ``summary.json`` is dropped, unless the run resumes
    at its last step (``finished``): then the summary stays and the trainer checks or re-creates it at the end."""
    remove_debris(run_dir, log)
    if resume:
        _truncate_metrics(run_dir, step, log, int(record.get("train", {}).get("log_every", 1)))
    else:
        atomic_write_text(run_dir / METRICS_FILE, "")
    atomic_write_text(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
    atomic_write_text(run_dir / PARAM_GROUPS_FILE, json.dumps(groups, indent=2) + "\n")
    if not finished:
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """Write ``summary.json`` as strict JSON (non-finite numbers become null)."""
    atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(finite_or_none(summary), indent=2, allow_nan=False) + "\n")


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``summary.json`` if it is present and strict JSON, else None."""
    file = Path(run_dir) / SUMMARY_FILE
    try:
        return read_json(file, "run summary",
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
