"""Sharded checkpoints of FSDP runs with ``torch.distributed.checkpoint`` (DCP).

A sharded checkpoint is an ordinary checkpoint folder ``checkpoints/step_XXXXXXXX/`` whose weights and optimizer
states live under ``dcp/`` (DCP's ``.metadata`` plus one ``.distcp`` file per rank) instead of
``model.safetensors``; ``config.json``, ``tokenizer.json``, ``train_config.json`` and ``trainer_state.pt``
(scheduler, RNG states, step, tokens seen, data position, world size, tokens per step; no optimizer: that is in
DCP) sit beside it. Every rank writes into ``.tmp-step_XXXXXXXX-dcp``; DCP writes its ``.metadata`` only after
every rank finished its shard, then rank 0 adds its files and renames the folder into place after a barrier, so a
checkpoint is visible only once complete (the caller has checked that every rank's weights are finite); older
ones are pruned through ``checkpoints.prune_checkpoints``. ``export_checkpoint`` reads under a shared lock
(``checkpoint.open_checkpoint``), so a running trainer's pruning leaves the folder until the export is done.
``start_async_save`` / ``finish_async_save`` save with the shards written in the background
(``TrainConfig.async_save``). DCP reshards on load: a run resumes on any world size, and
``export`` gathers the full weights in one process (``export_checkpoint``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .. import checkpoint as ckpt
from ..config import ModelConfig
from ..data.tokenizer import read_tokenizer
from ..fileio import atomic_write_text, replace_folder, seal_folder, write_folder_atomically
from ..folders import open_model
from ..folders.dcp import dcp_load
from ..model import DecoderLM
from ..outputs import MODEL_FOLDER, check_output
from ..layout import TOKENIZER_FILE, TRAIN_CONFIG_FILE
from .checkpoints import prune_checkpoints
from .faults import fault_point
from .folder import RunFolder
from .retention import VAL_LOSS_FILE, val_loss_record
from .state import STATE_FILE

DCP_DIR = ckpt.SHARDED_DIR


def is_sharded(checkpoint_dir: str | os.PathLike) -> bool:
    """Whether a checkpoint folder holds DCP shards (an FSDP run's) rather than ``model.safetensors``."""
    return (Path(checkpoint_dir) / DCP_DIR).is_dir()


def _states(model: DecoderLM, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    out = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        out["optimizer"] = get_optimizer_state_dict(model, optimizer)
    return out


def save_sharded(run_dir: Path, model: DecoderLM, optimizer: torch.optim.Optimizer, train_cfg: Any, data_dir: Path,
                 state: dict[str, Any], log: Any = None) -> Path:
    """Collective: every rank writes its shards of the model and optimizer; rank 0 writes the rest (with
    ``val_loss.json`` from ``state["val_loss"]``) and makes the folder visible; the newest ``keep_last`` and the best
    are kept (``checkpoints.prune_checkpoints``, saying so through ``log``). Returns the
    checkpoint folder (on every rank)."""
    import torch.distributed.checkpoint as dcp

    from torch.distributed.checkpoint.api import CheckpointException

    pending = _start(run_dir, model, train_cfg, data_dir, state, log)
    try:
        dcp.save(_states(model, optimizer), checkpoint_id=str(pending.tmp / DCP_DIR))
    except CheckpointException as e:  # a BaseException: the CLI's table would not see it
        raise write_failure(e, pending.tmp / DCP_DIR) from e
    fault_point("save")
    return _publish(pending)


@dataclass
class PendingSave:
    """A sharded checkpoint whose shards are being written in the background (``start_async_save``); rank 0 makes it
    visible in ``finish_async_save``. ``upload`` is DCP's future (every rank has its own)."""

    run_dir: Path
    target: Path
    tmp: Path
    config: ModelConfig
    master_dtype: torch.dtype
    train_cfg: Any
    data_dir: Path
    state: dict[str, Any]
    upload: Any = None
    log: Any = None  # where pruning says what it kept (None: silent)

    @property
    def step(self) -> int:
        return int(self.state["step"])


_checkpoint_group: Any = None  # a gloo group of all ranks for DCP's background collectives (made once)


def start_async_save(run_dir: Path, model: DecoderLM, optimizer: torch.optim.Optimizer, train_cfg: Any,
                     data_dir: Path, state: dict[str, Any], log: Any = None) -> PendingSave:
    """Collective: stage this rank's shards in CPU memory (a copy: training may go on changing the weights) and write
    them in a background thread (``torch.distributed.checkpoint.async_save``, over a gloo group of its own so its
    collectives never interleave with the training's). Nothing is visible until ``finish_async_save``."""
    import torch.distributed.checkpoint as dcp

    global _checkpoint_group
    if _checkpoint_group is None:
        _checkpoint_group = dist.new_group(backend="gloo")
    pending = _start(run_dir, model, train_cfg, data_dir, state, log)
    pending.upload = dcp.async_save(_states(model, optimizer), checkpoint_id=str(pending.tmp / DCP_DIR),
                                    process_group=_checkpoint_group)
    fault_point("save")
    return pending


def finish_async_save(pending: PendingSave) -> Path:
    """Collective: wait for every rank's background write, then make the checkpoint visible as ``save_sharded``
    does. A failed write on any rank raises on every rank (``OSError`` for the system's refusal, else
    ``RuntimeError``; one line naming the folder and the step), and nothing is made visible: the earlier
    checkpoints stay, the temporary folder is removed when the run next starts."""
    from torch.distributed.checkpoint.api import CheckpointException

    error = None
    try:
        pending.upload.result()
    except (Exception, CheckpointException) as e:  # DCP wraps a rank's failure in a CheckpointException
        error = e
    failed = torch.tensor([0.0 if error is None else 1.0])
    dist.all_reduce(failed, group=_checkpoint_group)  # gloo, CPU; DCP's own collectives on it are over
    if failed.item():
        cause = _root_cause(error)
        where = "on another rank" if cause is None else f"{type(cause).__name__}: {cause}"
        message = (f"the asynchronous save of step {pending.step} into {pending.tmp} failed ({where}); it was not "
                   f"made visible, the earlier checkpoints stay")
        if error is not None:  # this rank's own failure: an OSError (torch's opaque full disk: ENOSPC, free space)
            failure = write_failure(error, pending.tmp / DCP_DIR)
            raise OSError(failure.errno, f"{message}: {failure.strerror}", failure.filename) from error
        raise RuntimeError(message) from error
    return _publish(pending)


def _root_cause(error: BaseException | None) -> BaseException | None:
    """The first rank's own exception inside DCP's ``CheckpointException`` (which gathers every rank's), else
    ``error`` itself."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(error, CheckpointException) and error.failures:
        return next(iter(error.failures.values()))[0]
    return error


def _start(run_dir: Path, model: DecoderLM, train_cfg: Any, data_dir: Path, state: dict[str, Any],
           log: Any = None) -> PendingSave:
    """Rank 0 makes the empty temporary folder; every rank waits for it."""
    target = RunFolder(run_dir).checkpoint_path(state["step"])
    tmp = target.parent / f".tmp-{target.name}-dcp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / DCP_DIR).mkdir(parents=True)
    dist.barrier()
    master = next(iter(model.parameters())).dtype  # the sharded master weights' dtype
    return PendingSave(run_dir, target, tmp, model.config, master, train_cfg, data_dir, state, log=log)


def _publish(p: PendingSave) -> Path:
    """After every rank's shards and DCP's metadata are on disk: rank 0 adds its files, seals the folder and renames
    it into place, then prunes; every rank returns the checkpoint folder."""
    dist.barrier()  # every shard and the metadata are on disk
    if dist.get_rank() == 0:
        tmp, target = p.tmp, p.target
        ckpt.save_config_files(p.config, tmp, str(p.master_dtype).removeprefix("torch."),
                               p.data_dir / TOKENIZER_FILE)
        atomic_write_text(tmp / TRAIN_CONFIG_FILE, json.dumps(p.train_cfg.to_dict(), indent=2) + "\n")
        ckpt.save_torch(p.state, tmp / STATE_FILE)
        atomic_write_text(tmp / VAL_LOSS_FILE, val_loss_record(p.state["step"], p.state.get("val_loss")))
        # durable before it is visible: umask modes, every file and folder fsync'd (DCP fsyncs its own shards too);
        # checksums.json covers rank 0's files (trainer state, configs, tokenizer), not the dcp/ shards (hashing
        # every rank's shards on rank 0 would cost ~3 s per GiB per checkpoint)
        seal_folder(tmp, manifest=True, unhashed=(f"{DCP_DIR}/",))
        replace_folder(tmp, target)  # a folder of the same step (an earlier session's) is never lost first
        prune_checkpoints(p.run_dir, p.train_cfg.keep_last, target, p.log)  # via .trash-step_*, never the newest
    dist.barrier()
    return p.target


def write_failure(e: BaseException, folder: Path) -> OSError:
    """The ``OSError`` of a failed ``dcp.save`` into ``folder``: a rank's own ``OSError`` as it is; otherwise (torch's
    writer reports a full disk as ``RuntimeError`` "unexpected pos", without an errno) ENOSPC when the file system
    has less than 16 MiB left, else EIO, with the rank's message and the free space."""
    failures = getattr(e, "failures", {}) or {}
    causes = [f[0] if isinstance(f, tuple) else f for f in failures.values()] or [e]
    for cause in causes:
        if isinstance(cause, OSError) and cause.errno is not None:
            return OSError(cause.errno, cause.strerror, cause.filename or os.fspath(folder))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    code = errno.ENOSPC if free is not None and free < (16 << 20) else errno.EIO
    said = next((str(c).splitlines()[0] for c in causes if str(c)), type(e).__name__)
    return OSError(code, f"{os.strerror(code)} (DCP could not write its shards: {said})", os.fspath(folder))


def check_config(checkpoint_dir: Path, model_cfg: ModelConfig) -> None:
    """Refuse a checkpoint written for another model config (``ValueError`` naming it and the differences)."""
    recorded = ckpt.load_config(checkpoint_dir).to_dict()
    wanted = model_cfg.to_dict()
    problems = [f"{k}: {recorded.get(k)!r} vs {wanted.get(k)!r}" for k in sorted(set(recorded) | set(wanted))
                if recorded.get(k) != wanted.get(k)]
    if problems:
        raise ValueError(f"checkpoint {checkpoint_dir} was written for another model config ({'; '.join(problems)})")


def _is_sharded_model(model: DecoderLM) -> bool:
    from torch.distributed.tensor import DTensor

    return dist.is_initialized() and any(isinstance(p, DTensor) for p in model.parameters())


def load_sharded(checkpoint_dir: Path, model: DecoderLM, optimizer: torch.optim.Optimizer | None) -> None:
    """Load a sharded checkpoint into an FSDP (or, in one process, a plain) model and its optimizer, resharding to
    this world size. Raises ``ValueError`` naming the folder for another model config or a missing or corrupt
    shard."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    check_config(checkpoint_dir, model.config)
    states = _states(model, optimizer)
    dcp_load(states, checkpoint_dir, no_dist=not _is_sharded_model(model))
    set_model_state_dict(model, states["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, states["optimizer"])


def export_checkpoint(source: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Gather a checkpoint (a run folder: its newest) into an ordinary checkpoint folder at ``out``
    (a Hugging Face model folder: ``model.safetensors``, ``config.json``, ``generation_config.json``,
    ``tokenizer.json``, ``tokenizer_config.json``), read by ``eval``, ``generate``, ``convert`` and
    ``from_pretrained``. One process, no process group. Returns the folder it read. Raises ``ValueError`` /
    ``FileNotFoundError`` naming the folder (nothing is written under ``out`` then), also for an ``out`` that is,
    contains or lies inside ``source``, or that exists (only with ``overwrite``, and only a model folder we wrote,
    is it replaced: :func:`depthattn.outputs.check_output`). The checkpoint is read under a shared lock
    (``checkpoint.open_checkpoint``): a running trainer's pruning leaves it in place until the export is done."""
    with ckpt.open_checkpoint(source) as src:
        out = check_output(out, [source, src], MODEL_FOLDER, overwrite)
        folder = open_model(src, ("depthattn", "dcp"))  # checksums.json first, then config and shapes / DCP shards
        model = ckpt.model_from_folder(folder)

        tokenizer = src / TOKENIZER_FILE
        if tokenizer.is_file() or tokenizer.is_symlink():  # the copy must be a tokenizer (a dangling link: refused)
            read_tokenizer(tokenizer, model.config.vocab_size)

        def fill(tmp: str) -> None:  # the Hugging Face files (config, generation, tokenizer configs) and weights
            ckpt.save_model_files(model, tmp, tokenizer_file=tokenizer if tokenizer.exists() else None)

        write_folder_atomically(out, fill)
    return src
