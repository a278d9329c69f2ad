"""Run folders: the checkpoints and the trainer state inside them, and the policy for resuming a run.

The run folder's layout and life (its files, the lock, the metrics log, listing and deleting checkpoints, start-up
cleanup, the summary) are ``run.folder.RunFolder``'s (the names: ``depthattn.layout``); this module
decides what goes into a checkpoint and what may change when a run resumes::

    checkpoints/step_XXXXXXXX/   a Hugging Face model folder (checkpoint.save_model_files: model.safetensors,
                                 config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
                                 configuration.py, modeling.py), plus train_config.json and trainer_state.pt
                                 (optimizer, scheduler, RNG states, step, tokens seen, data position) and
                                 val_loss.json (the validation loss of the step: ``run.retention``)
                                 (an FSDP run's: dcp/ shards of model and optimizer instead, see ``training.dcp``)

Every checkpoint folder is assembled under a temporary name (``fileio.write_folder_atomically``), so a failure never
damages what is already there. Which checkpoints pruning keeps (``prune_checkpoints``), which checkpoint a run
resumes from and what may differ (``config_differences``, ``resume_point``, ``read_resume_checkpoint``) are decided
here; what ``trainer_state.pt`` holds is ``depthattn.run.state.TrainerState``'s.

Crash consistency (docs/reliability.md, "Training runs"): resume takes the newest *readable* checkpoint, saying which
one it skipped and why; unreadable ones are set aside (``set_aside``). ``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` (tests
only) kills the process with SIGKILL the n-th time a named phase is reached (``fault_point``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from .. import checkpoint as ckpt
from ..checkpoint import SHARDED_DIR
from ..compat import Side, check_pairing
from ..config import ModelConfig
from ..cross_layer import names as method_names
from ..fileio import atomic_write_text, write_folder_atomically
from ..model import DecoderLM
from ..run.state import STATE_FILE, TrainerState, load_trainer_state  # the first and last: also decay.py's, dcp.py's
from .config import RESUMABLE_KEYS, TrainConfig, with_legacy_defaults
from .preemption import deliver_fault_signal
from ..run.retention import (VAL_LOSS_FILE, best_leaves_the_newest, checkpoints_to_prune, read_val_loss, val_loss_record,
                        val_losses_from_rows)
from ..layout import TOKENIZER_FILE, TRAIN_CONFIG_FILE  # noqa: F401  (re-exported)
from ..run.folder import RunFolder


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
    """The ``run.json`` of a run folder (``RunFolder.read_run``)."""
    return RunFolder(run_dir).read_run()


def run_of_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The run.json of the run a checkpoint folder belongs to, if it sits in one."""
    folder = RunFolder(checkpoint_dir.parent.parent)
    if checkpoint_dir.parent.name == RunFolder.CHECKPOINT_DIR and folder.is_run():
        return folder.read_run()
    return None


def read_metrics(run_dir: str | os.PathLike, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (``RunFolder.read_metrics``)."""
    return RunFolder(run_dir).read_metrics(log)


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``summary.json`` if it is present and strict JSON, else None (``RunFolder.read_summary``)."""
    return RunFolder(run_dir).read_summary()


# ---------------------------------------------------------------------------------------------------- faults, debris
FAULT_ENV = "DEPTHATTN_FAULT_PHASE"
_fault_counts: dict[str, int] = {}


def fault_point(phase: str) -> None:
    """Test hook: with ``DEPTHATTN_FAULT_PHASE=<phase>:<n>`` set, SIGKILL this process the n-th time ``phase`` is
    reached (phases: ``step`` after an optimizer step, ``logged`` after its metrics row, ``save`` inside a
    checkpoint write, ``saved`` after the rename before pruning, ``prune`` after a folder moved to the trash).
    Does nothing when the variable is unset. ``DEPTHATTN_FAULT_SIGNAL`` sends a signal at a phase instead
    (``preemption.deliver_fault_signal``; further phases: ``micro`` after each micro-batch's backward pass, ``eval``
    between validation batches)."""
    deliver_fault_signal(phase)
    spec = os.environ.get(FAULT_ENV)
    if not spec or spec.partition(":")[0] != phase:
        return
    _fault_counts[phase] = _fault_counts.get(phase, 0) + 1
    if _fault_counts[phase] == int(spec.partition(":")[2] or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_val_losses(run_dir: Path, dirs: list[Path]) -> dict[Path, float | None]:
    """``{folder: validation loss}``: each checkpoint's ``val_loss.json``, else (checkpoints of older releases, which
    have none) its step's ``metrics.jsonl`` row, else None (unknown; a record of ``null``, e.g. a preemption's
    checkpoint, stays unknown without reading the log)."""
    losses = {d: read_val_loss(d) for d in dirs}
    missing = [d for d, v in losses.items() if v is None and not (d / VAL_LOSS_FILE).exists()]
    if missing:
        losses.update(val_losses_from_rows(missing, RunFolder(run_dir).read_metrics(log=lambda _: None)))
    return losses


def prune_checkpoints(run_dir: Path, keep_last: int, newest: Path, log: Callable[[str], None] | None = None) -> None:
    """Keep ``newest`` (the checkpoint just written), the ``keep_last - 1`` newest others and the best one (lowest
    recorded validation loss: ``retention.checkpoints_to_prune``), saying in one line through ``log`` when the best
    stays only for being the best; the others are deleted by ``RunFolder.delete_checkpoints`` (through
    ``.trash-step_XXXXXXXX``; one being read is left for the next prune, said through ``log``)."""
    folder = RunFolder(run_dir)
    dirs = folder.checkpoints()
    losses = checkpoint_val_losses(run_dir, dirs)
    kept = best_leaves_the_newest(dirs, keep_last, newest, losses)
    if kept is not None and log is not None:
        log(f"keeping {kept} (val loss {losses[kept]:.4f}, the lowest of the run) besides the {keep_last} newest "
            f"checkpoint(s)")
    folder.delete_checkpoints(checkpoints_to_prune(dirs, keep_last, newest, losses), log or (lambda _: None),
                              lambda: fault_point("prune"))


# ---------------------------------------------------------------------------------------------------- resume policy
def _diff(a: Mapping[str, Any], b: Mapping[str, Any], ignore: frozenset = frozenset()) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k) != b.get(k)]


def config_differences(recorded: Mapping[str, Any], model: Mapping[str, Any], train: Mapping[str, Any]) -> list[str]:
    """``"key: recorded vs requested"`` for every field where a run's ``run.json`` differs from a requested model
    and train config (as dicts), ignoring ``RESUMABLE_KEYS``; a key the recorded train config lacks compares as its
    ``config.LEGACY_DEFAULTS`` value, else its ``TrainConfig`` default (as ``TrainConfig.from_recorded`` reads it),
    and a key the recorded model config lacks as its ``ModelConfig`` default (a field added later defaults to what
    older releases computed). Empty when the run may be resumed with them."""
    return (_diff(with_model_defaults(recorded["model"]), model)
            + _diff(with_legacy_defaults(recorded["train"]), train, RESUMABLE_KEYS))


def with_model_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded model config (as a dict) with every ``ModelConfig`` field it lacks at its default."""
    defaults = {f.name: f.default for f in fields(ModelConfig) if f.name not in recorded}
    return {**defaults, **recorded}


def recorded_precision(run: dict[str, Any]) -> str | None:
    """A run.json's resolved precision (older runs recorded only ``autocast``: ``float32`` or ``torch.bfloat16``)."""
    if "resolved_precision" in run:
        return run["resolved_precision"]
    if "autocast" in run:
        return str(run["autocast"]).removeprefix("torch.")
    return None


def keep_tokens_per_step(run_dir: Path, train_cfg: TrainConfig, log) -> TrainConfig:
    """On resume under another world size than the run's: ``grad_accum`` rescaled so one step keeps the recorded
    tokens per step, or ``ValueError`` when no whole ``grad_accum`` does. Never a silent change of the global batch,
    nor of the data: one line through ``log`` says the world-size change, the rescale, and what happens to the
    batches. ``data_order="epochs"``: they are the uninterrupted run's (``data.EpochBatches`` orders the windows by
    the global sample index alone, and each rank takes its slice of each step's global batch), so the run continues
    it up to the order of floating-point reductions. ``"random"``: they differ (``data.TokenBatches`` draws each
    micro-step's windows by ``(seed, step, micro_step)`` and splits them among the ranks, so another ``grad_accum``
    × world size draws other windows: the same number of tokens per step, not the same tokens). Same world size:
    nothing said."""
    folder = RunFolder(run_dir)
    if not folder.is_run():
        return train_cfg
    old = folder.read_run()
    was, world = int(old.get("world_size", 1)), train_cfg.world_size()
    if was == world:
        return train_cfg
    recorded = old.get("tokens_per_step")
    differ = (f"the batches of the remaining steps differ from the uninterrupted run's (windows are drawn per rank "
              f"and micro-step), so its curve and weights will not repeat it exactly; resume on {was} rank(s) for a "
              f"bit-exact continuation")
    if train_cfg.data_order == "epochs":
        differ = (f"the batches of the remaining steps are the same as the uninterrupted run's (data_order=epochs: "
                  f"the window order depends only on the seed and the global sample index), so it continues it up "
                  f"to the order of floating-point sums; resume on {was} rank(s) for a bit-exact continuation")
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


def recorded_adamw_impl(run_dir: Path, request: str, device: torch.device, resume: bool) -> str:
    """The AdamW implementation of this session (``optim.resolve_adamw_impl``): on ``resume`` of a run whose
    ``run.json`` recorded the one it resolved to (``adamw_impl``) and whose ``request`` is still ``"auto"``, that
    one (a run keeps its implementation wherever it resumes); else ``request`` resolved on ``device``. Raises
    ``ValueError`` when the implementation is not available on ``device``."""
    from .optim import resolve_adamw_impl

    folder = RunFolder(run_dir)
    recorded = folder.read_run().get("adamw_impl") if resume and folder.is_run() else None
    return resolve_adamw_impl(recorded if recorded and request == "auto" else request, device)


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
    folder = RunFolder(run_dir)
    if not resume:
        if folder.checkpoints():
            raise ValueError(f"run folder {run_dir} already holds checkpoints; pass --resume to continue it or "
                             f"choose another --out")
        return None
    old = folder.read_run()
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
    check_pairing(f"cannot resume {run_dir}", Side.of_run(f"the run trained on ({old.get('data')})", old),
                  Side.of_run(str(data_dir), record), "resume with the run's data folder")
    was = recorded_precision(old)
    if was is not None and was != record["resolved_precision"]:
        raise ValueError(f"cannot resume {run_dir}: it trained in {was} (device {old.get('device')}, precision "
                         f"{old['train'].get('precision')!r}), but on device {record['device']} this session would "
                         f"train in {record['resolved_precision']}; resume with --device set to the run's device "
                         f"type so the precision stays {was}")
    return folder.newest_checkpoint()


#: What the checkpoint readers raise for a missing, truncated or corrupt file (or one failing its integrity check).
UNREADABLE_ERRORS = (OSError, ValueError, RuntimeError, KeyError, EOFError)


@dataclass
class ResumeCheckpoint:
    """The checkpoint a run resumes from, read: ``state`` is its ``trainer_state.pt``, ``weights`` its
    ``model.safetensors`` tensors (None for a sharded checkpoint: ``training.dcp`` reads it into the model);
    ``unreadable`` are newer checkpoint folders that could not be read (``set_aside`` moves them away)."""

    path: Path
    state: TrainerState
    weights: dict[str, torch.Tensor] | None
    unreadable: list[Path] = field(default_factory=list)


def _read_checkpoint(d: Path) -> tuple[TrainerState, dict[str, torch.Tensor] | None]:
    state = TrainerState.from_file(d)
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


# ---------------------------------------------------------------------------------------------------- --init-from
def init_from_checkpoint(model: DecoderLM, path: str | os.PathLike) -> list[str]:
    """Load a checkpoint's weights into ``model`` through ``checkpoint.load_state`` / ``load_weights_into``.

    The checkpoint may use another ``cross_layer``: keys under ``cross_layer`` that one side lacks keep the new
    model's initialisation (missing) or are dropped (unexpected). Every other key and every shape must match.
    Returns the keys that kept their initialisation. Raises ``ValueError`` naming the file otherwise; for another
    vocabulary size, one line naming both and the ``vocab_size`` setting that fits (a padded vocabulary, larger
    than the data's tokenizer, is allowed: ``config.check_vocab_size``).
    """
    source = os.path.join(os.fspath(path), ckpt.WEIGHTS_NAME)
    state = ckpt.load_state(path)
    embed = state.get("model.embed_tokens.weight")
    if embed is not None and embed.ndim == 2 and embed.shape[0] != model.config.vocab_size:
        raise ValueError(f"{source} has vocab_size={embed.shape[0]} (model.embed_tokens.weight {tuple(embed.shape)}), "
                         f"the new model {model.config.vocab_size} (the data's tokenizer unless set); give --set "
                         f"vocab_size={embed.shape[0]} to start from it")
    return ckpt.load_weights_into(model, state, source, kind="init_from")


def init_from_changes(path: str | os.PathLike, cfg: ModelConfig) -> list[str]:
    """The fields of the checkpoint ``path``'s ``config.json`` that ``cfg`` (the model ``--init-from`` loads it
    into) sets otherwise, as ``"name 'new' (checkpoint: 'old')"``: the backbone's (``qk_norm_position``,
    ``rope_theta``, ...), and the method's knobs when both use the same ``cross_layer`` (a new method starts from
    its own knobs). ``initializer_range`` is left out (the weights are loaded). Empty when the config cannot be
    read (the weights loaded, which is what counts)."""
    try:
        old = ckpt.load_config(path).to_dict()
    except (ValueError, FileNotFoundError):
        return []
    new = cfg.to_dict()
    knob = tuple(f"{m}_" for m in method_names())
    same_method = old.get("cross_layer") == new["cross_layer"]
    return [f"{k} {new[k]!r} (checkpoint: {old.get(k)!r})" for k in new
            if k not in ("cross_layer", "initializer_range") and old.get(k) != new[k]
            and (same_method or not k.startswith(knob))]


# ---------------------------------------------------------------------------------------------------- writing
def save_checkpoint(run_dir: Path, model: DecoderLM, train_cfg: TrainConfig, data_dir: Path, state: dict,
                    log: Callable[[str], None] | None = None) -> Path:
    """Write ``checkpoints/step_XXXXXXXX/`` atomically (``state``: the ``trainer_state.pt`` record,
    ``TrainerState.to_dict()``; ``val_loss.json`` from ``state["val_loss"]``), then
    keep only the newest ``keep_last`` and the best (``prune_checkpoints``; never the one just written); return its
    path. The caller checks that the weights are finite (``loop._check_weights_finite``)."""
    step = state["step"]
    target = RunFolder(run_dir).checkpoint_path(step)

    def fill(tmp: str) -> None:
        ckpt.save_model_files(model, tmp, tokenizer_file=data_dir / TOKENIZER_FILE)  # the Hugging Face files
        fault_point("save")
        atomic_write_text(os.path.join(tmp, TRAIN_CONFIG_FILE), json.dumps(train_cfg.to_dict(), indent=2) + "\n")
        ckpt.save_torch(state, os.path.join(tmp, STATE_FILE))
        atomic_write_text(os.path.join(tmp, VAL_LOSS_FILE), val_loss_record(step, state.get("val_loss")))

    write_folder_atomically(target, fill)
    fault_point("saved")
    prune_checkpoints(run_dir, train_cfg.keep_last, target, log)
    return target


def write_divergence(run_dir: Path, record: Mapping[str, Any]) -> None:
    """``RunFolder.write_divergence``: ``diverged.json``, why the run stopped."""
    RunFolder(run_dir).write_divergence(record)


def read_divergence(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``RunFolder.read_divergence``: the run's ``diverged.json``, or None."""
    return RunFolder(run_dir).read_divergence()


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
