"""The training loop: ``train()`` sets up (or resumes) a run, takes optimizer steps with gradient accumulation, each
followed by validation, logging and a checkpoint when due, and writes the run's summary at the end.

Legend: B micro-batch rows, T sequence length, V vocab.

The pieces live beside this file: ``config`` (``TrainConfig``, TOML and ``--set`` parsing), ``resume`` (what a run
starts from and what may continue it), ``runtime`` (seeding, the torchrun process group), ``periodic`` (validation,
in-loop tasks and depth statistics: the jobs that add keys to a metrics row), ``optim`` (AdamW and the schedule),
``parallelize`` (activation checkpointing, compile, DDP). The run on disk is ``depthattn.run``'s: its folder and
lock, its checkpoints and how the ``Checkpointer`` writes and restores them (the loop decides when), the trainer
state. The loss and the validation loss are ``depthattn.eval.perplexity``'s. Training windows
come from ``data.EpochBatches`` (or ``data.TokenBatches``: ``TrainConfig.data_order``), a pure function of ``(seed,
step, micro_step)``; with the RNG, optimizer and scheduler states restored, a resumed run repeats an uninterrupted
one bit for bit on float32 CPU.

Divergence: the loss and the gradient norm are checked before each optimizer step and the weights before each
checkpoint (every rank agrees); a non-finite value stops the run with ``NonFiniteError`` or skips the step
(``TrainConfig.on_nonfinite``), so no update with a NaN and no checkpoint with a non-finite weight is ever written.
A finite divergence (a validation loss more than 1 nat above ln V) stops the run with ``DivergenceError`` or warns
(``TrainConfig.on_divergence``; ``training.guard``). Every checkpoint records the validation loss of its step
(measured for it when the step had no periodic validation: no RNG is drawn, so the trajectory is unchanged), and
pruning keeps the best checkpoint besides the ``keep_last`` newest (``run.retention``). A run stopped by either
error records why in ``diverged.json`` (``RunFolder.write_divergence``).

Preemption (``preemption``): a SIGTERM, SIGINT or SIGUSR1 while ``train()`` runs is recorded; the current optimizer
step finishes (an evaluation in flight is abandoned), the checkpoint of that step is written and ``train()`` raises
``TrainingPreempted``. Ranks agree on the step, and on time-based saves (``save_every_minutes``, rank 0's clock),
through the one all-reduce each step makes (``_step_verdict``), which also makes the logged loss the mean over ranks.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .. import data
from ..checkpoint import init_from_changes, init_from_checkpoint
from ..compat import Side
from ..checks import check_token_array
from ..config import ModelConfig
from ..data.boundaries import document_boundary_token
from ..devices import autocast_dtype, resolve_device, resolved_precision
from ..eval.perplexity import mean_loss, next_token_loss, validation_windows
from ..layout import TOKENIZER_FILE
from ..model import DecoderLM
from ..progress import progress_bar, write_line
from ..run.checkpointer import Checkpointer
from ..run.checkpoints import (ResumeCheckpoint, check_checkpoint_kind, checkpoint_val_losses, read_resume_checkpoint,
                               set_aside)
from ..run.dcp import is_sharded
from ..run.faults import fault_point
from ..run.folder import RunFolder
from ..run.record import git_revision, run_of_checkpoint, versions
from ..run.retention import best_checkpoint
from .build import build_on_meta, materialize
from .config import TrainConfig, check_vocab_size
from .depth_stats import DepthProbe
from .guard import LN_VOCAB_MARGIN, DivergenceError, Guard
from .in_loop_tasks import TaskSuite, summary_line as task_summary_line
from .metrics import MetricsLogger, Throughput, progress_postfix, run_tokens_per_s
from .optim import build_optimizer, build_scheduler, decay_rule
from .parallelize import parallelize
from .periodic import Periodic, Validation
from .preemption import StopRequest, TrainingPreempted, clock, stop_signals
from .resume import (check_start_pairing, init_source, keep_tokens_per_step, recorded_adamw_impl, resume_point,
                     start_sources)
from .runtime import rank as process_rank, seed_everything, start_distributed


class NonFiniteError(FloatingPointError):
    """A NaN or ±inf loss, gradient norm or weight stopped the run (``TrainConfig.on_nonfinite``). The message is
    one line: the step, which value, and what to do. Nothing non-finite was applied or saved. ``step``: the step
    that failed (None when not known)."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_val_loss: float | None
    train_tokens_per_s: float | None  # this session's; whole-run (from the log) when it resumed at the last step
    checkpoint: Path | None
    steps_this_session: int = 0  # 0: a resumed run that had already finished
    skipped_steps: int = 0  # steps of the whole run whose update was skipped (on_nonfinite="skip"), from the log


@dataclass
class _Trainer:
    """What the loop works on: model, optimizer and data (set up once), its components (checkpoints, periodic jobs,
    the divergence guard) and the counters each step advances."""

    cfg: TrainConfig  # ``steps`` resolved
    model: DecoderLM
    net: torch.nn.Module  # ``model`` as parallelized (DDP, compiled blocks, activation checkpointing)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    batches: Any  # data.EpochBatches or data.TokenBatches (TrainConfig.data_order)
    device: torch.device
    amp: torch.dtype | None
    run_dir: Path
    folder: RunFolder  # ``run_dir``'s files (rank 0 holds its lock)
    is_main: bool
    throughput: Throughput
    ckpt: Checkpointer  # how checkpoints are written, and the newest one (``ckpt.saved``)
    validation: Validation  # the periodic validation loss, and the newest one (``validation.loss``)
    guard: Guard  # the divergence guard (saved, resumed)
    step: int = 0
    tokens_seen: int = 0
    train_time: float = 0.0  # seconds in optimizer steps this session (validation and saving excluded)
    train_tokens: int = 0  # tokens trained this session
    start_step: int = 0  # the step this session started from
    nonfinite_skips: int = 0  # consecutive steps skipped for a non-finite loss or gradient norm (saved, resumed)
    log: Callable[[str], None] = print  # rank 0's one-line messages (other ranks: silent)
    stop: StopRequest | None = None  # this process's record of stop signals (``preemption.stop_signals``)
    stopping: bool = False  # some rank got a stop signal: save this step and raise ``TrainingPreempted``
    save_due: bool = False  # rank 0's clock says ``save_every_minutes`` ran out: save this step
    doc_eos: int | None = None  # doc_mask: the end-of-document token the windows' documents end at, else None
    tasks: TaskSuite | None = None  # in-loop zero-shot tasks (``eval_tasks``)
    depth: DepthProbe | None = None  # depth statistics and per-layer gradient norms (``log_depth_every``)

    @property
    def total_steps(self) -> int:
        return self.cfg.steps

    @property
    def periodic(self) -> list[Periodic]:
        """The periodic jobs, in the order their keys enter the metrics row."""
        return [job for job in (self.validation, self.tasks, self.depth) if job is not None]


# ---------------------------------------------------------------------------------------------------- training
def train(run_dir: str | os.PathLike, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: str | os.PathLike,
          *, resume: bool = False, init_from: str | os.PathLike | None = None, stop_after: int | None = None,
          progress: bool = True, log: Callable[[str], None] = write_line,
          on_step: Callable[[int, int], None] | None = None,
          decay_from: str | os.PathLike | None = None, allow_tokenizer_change: bool = False) -> TrainResult:
    """Train ``model_cfg`` on the prepared data folder ``data_dir`` into ``run_dir``.

    ``resume``: continue from the newest checkpoint of ``run_dir`` (configs must match the recorded ones, except
    ``RESUMABLE_KEYS``; ``grad_accum`` and ``data_parallel`` as ``resume.resume_point`` says). ``init_from``: start
    from a checkpoint's weights (``init_from_checkpoint``), or a run folder's newest checkpoint.
    ``stop_after``: return after this global step (as if interrupted; the last checkpoint stays resumable).
    ``log``: one-line messages (on ``resume``: "resuming RUN from step N of M", or that the run already finished;
    an unreadable newest checkpoint skipped, a torn metrics line dropped, leftovers of interrupted writes removed).
    ``on_step(step, total_steps)``: called after each optimizer step with its validation, logging and checkpoint
    (``compare`` times the first steps with it to estimate the job's duration). ``decay_from``: a checkpoint of
    another run to start from with its weights, optimizer, RNG states and step (``training.decay``: the new run
    folder records it, and resumed before its first checkpoint it starts from it again). ``init_from`` is recorded the
    same way (the checkpoint taken), and so is ``allow_tokenizer_change`` (the caller accepted weights trained on
    another tokenizer: ``training.resume.plan_run`` checks it).

    SIGTERM, SIGINT and SIGUSR1 are handled while it runs (the previous handlers come back after): the step in
    progress finishes, its checkpoint is written, and ``TrainingPreempted`` is raised (see ``preemption``).

    Raises:
        TrainingPreempted: (a ``BaseException``) a stop signal; ``.step`` and ``.checkpoint`` say where the run
            resumes from bit for bit, ``.exit_status`` is 128 + the signal's number.
        NonFiniteError: (a ``FloatingPointError``) a non-finite loss or gradient norm with ``on_nonfinite="stop"``
            or after more than ``max_nonfinite_skips`` consecutive skips, or non-finite weights at a checkpoint;
            the checkpoints already written are finite and stay.
        DivergenceError: (a ``FloatingPointError``) a validation loss > ln V + 1 with ``on_divergence="stop"``
            (``training.guard``); nothing of that step is saved and the best checkpoint stays. Either error is
            recorded in the run folder's ``diverged.json``.
        ValueError: vocabulary mismatch with the data's tokenizer, a budget shorter than one step, a run folder that
            already holds checkpoints (without ``resume``), a config that differs from the checkpoint's on resume,
            a truncated checkpoint file (named), or any invalid setting. Nothing already written is modified.
        RunFolderLocked: (a ``ValueError``) another trainer holds ``run_dir``'s lock (``run.lock.RunLock``);
            nothing was written.
    """
    run_dir, data_dir = Path(run_dir), Path(data_dir).resolve()
    # the run folder's lock (taken in _set_up) and the stop-signal handlers, released however we leave
    with contextlib.ExitStack() as held, stop_signals() as stop:
        t = _set_up(run_dir, model_cfg, train_cfg, data_dir, resume, init_from, log, held, decay_from,
                    allow_tokenizer_change)
        t.stop = stop
        t.ckpt.start_timer()  # save_every_minutes counts from here
        last = t.total_steps if stop_after is None else min(t.total_steps, stop_after)
        t.net.train()
        with _progress_bar(t, progress, f"train {model_cfg.cross_layer}") as bar, _metrics_log(t) as metrics:
            try:
                while t.step < last:
                    row = _optimizer_step(t)
                    fault_point("step")
                    _periodic(t, row)
                    _log_row(t, row, metrics, bar, last)
                    fault_point("logged")
                    _watch(t, row)
                    _maybe_checkpoint(t, metrics)
                    if on_step is not None:
                        on_step(t.step, t.total_steps)
                    if t.stopping:
                        raise TrainingPreempted(t.run_dir, t.step, t.ckpt.saved, t.stop.signum or signal.SIGTERM)
            except (DivergenceError, NonFiniteError) as e:
                if t.is_main:
                    t.folder.write_divergence(_stop_record(t, e))
                raise
        return _finish(t)


# ---------------------------------------------------------------------------------------------------- set-up
def _set_up(run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: Path, resume: bool,
            init_from: str | os.PathLike | None, log: Callable[[str], None], held: contextlib.ExitStack,
            decay_from: str | os.PathLike | None = None, allow_tokenizer_change: bool = False) -> _Trainer:
    """Take the run folder's lock (into ``held``; rank 0, before anything is written), check everything, then build
    model, optimizer and data, restore the newest checkpoint on ``resume`` and (rank 0) write the run folder's
    files."""
    train_cfg = start_distributed(train_cfg)
    train_cfg = train_cfg.for_world(train_cfg.world_size())  # grad_accum from global_batch_tokens, when set
    rank = process_rank()
    folder = RunFolder(run_dir)
    held.enter_context(folder.lock("trainer"))  # RunFolderLocked on every rank when another trainer holds it
    if resume:
        train_cfg = keep_tokens_per_step(run_dir, train_cfg, log if rank == 0 else lambda _: None)
    prepared, val_windows, train_cfg = _load_data(model_cfg, train_cfg, data_dir)
    doc_eos = document_boundary_token(prepared.meta, prepared.train, data_dir) if train_cfg.doc_mask else None
    tasks = TaskSuite.for_run(train_cfg, data_dir / TOKENIZER_FILE, model_cfg.vocab_size, rank,
                              train_cfg.world_size())  # missing benchmark data: refused before anything is written
    device = resolve_device(train_cfg.device)
    amp = autocast_dtype(train_cfg.precision, device)
    record = {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "data": str(data_dir),
              "tokenizer_sha256": prepared.meta["tokenizer_sha256"], "data_fingerprint": prepared.fingerprint,
              "device": str(device), "resolved_precision": resolved_precision(amp),
              "world_size": train_cfg.world_size(), "tokens_per_step": train_cfg.tokens_per_step()}
    say = log if rank == 0 else lambda _: None
    adamw = recorded_adamw_impl(run_dir, train_cfg.adamw_impl, device, resume)
    record["adamw_impl"] = adamw
    init_from, source, allow = start_sources(run_dir, init_from, decay_from, allow_tokenizer_change, resume)
    if source is not None:
        record["decay_from"] = str(source.resolve())
    if init_from is not None:  # resumed before its first checkpoint, the run starts from it again
        record["init_from"] = str(init_from.resolve())
    if allow:
        record["allow_tokenizer_change"] = True
    found = _read_resume(run_dir, resume_point(run_dir, record, data_dir, resume), model_cfg, say)
    decaying = found is None and source is not None
    if decaying:  # the source checkpoint's weights, optimizer, RNG states and step
        source_run = run_of_checkpoint(source) or {}
        check_start_pairing("--decay-from", source, Side.of_run(f"the source run ({source_run.get('data')} when it "
                                                                f"trained)", source_run),
                            Side.of_data(str(data_dir), prepared.meta, prepared.fingerprint), allow, say)
        found = read_resume_checkpoint([source], model_cfg, say, fall_back=False)
    resume_from = found.path if found else None
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume_from is not None:
        check_checkpoint_kind(resume_from, train_cfg.data_parallel)
    model = _build_model(model_cfg, train_cfg, device, amp)
    if init_from is not None and resume_from is None:  # run.json records the checkpoint taken
        data = Side.of_data(str(data_dir), prepared.meta, "")
        record["init_from"] = str(_init_from(model, init_from, train_cfg.data_parallel == "fsdp", data, allow,
                                             say).resolve())
    optimizer, scheduler, groups = _build_optimizer(model, train_cfg, adamw)
    ckpt = Checkpointer(run_dir, model, optimizer, scheduler, train_cfg, data_dir,
                        saved=None if decaying else resume_from, is_main=rank == 0, log=say, clock=clock)
    state = ckpt.restore(found) if found is not None else None  # weights, optimizer, scheduler, RNG states
    step, tokens_seen = (state.step, state.tokens_seen) if state else (0, 0)
    net = torch.nn.parallel.DistributedDataParallel(model) if train_cfg.data_parallel == "ddp" else model
    if resume and rank == 0:
        if step == train_cfg.total_steps():
            log(f"{run_dir} already finished at step {step}; nothing to do")
        else:
            log(f"resuming {run_dir} from step {step} of {train_cfg.total_steps()}")
    if decaying and rank == 0:
        log(f"decaying from {source} (step {step}) over {train_cfg.total_steps() - step} steps into {run_dir}")
    if rank == 0:
        if found is not None:
            set_aside(found.unreadable, log)
        record.update(_environment(train_cfg, device, amp))
        rule = decay_rule(train_cfg.weight_decay_method_params)
        folder.start(record, {**groups, "rule": rule}, resume, step, finished=step == train_cfg.total_steps(), log=log)
    batches = _training_batches(prepared.train, train_cfg, rank, say)
    throughput = Throughput(model_cfg, train_cfg.seq_len, train_cfg.world_size(), device, train_cfg.peak_flops)
    if rank == 0 and device.type == "cuda" and throughput.peak is None:
        log(throughput.note)  # an unknown GPU: said once
    guard = Guard.for_run(model_cfg.vocab_size, train_cfg.warmup_steps(), train_cfg.loss_rise_margin,
                          train_cfg.loss_rise_patience, step, state.guard if state else None)

    def measure(model: DecoderLM, abandon: Callable[[], bool] | None = None) -> float | None:
        return mean_loss(model, val_windows, train_cfg.eval_batch_size, device, amp, abandon=abandon, eos_id=doc_eos)

    return _Trainer(cfg=train_cfg, model=model, net=net, optimizer=optimizer, scheduler=scheduler, batches=batches,
                    device=device, amp=amp, run_dir=run_dir, folder=folder, is_main=rank == 0, throughput=throughput,
                    ckpt=ckpt, validation=Validation(measure, train_cfg.eval_every, train_cfg.steps), guard=guard,
                    step=step, tokens_seen=tokens_seen, start_step=step,
                    nonfinite_skips=state.nonfinite_skips if state else 0, log=say, doc_eos=doc_eos, tasks=tasks,
                    depth=DepthProbe.for_run(train_cfg.log_depth_every, val_windows, device))


def _training_batches(tokens, cfg: TrainConfig, rank: int, log: Callable[[str], None]):
    """The run's training windows: ``data.EpochBatches`` (``data_order="epochs"``: says once how many windows an
    epoch has and how many tail tokens are never a target) or ``data.TokenBatches`` (``"random"``); either way the
    ranks split one global batch."""
    if cfg.data_order == "random":
        return data.TokenBatches(tokens, cfg.batch_size, cfg.seq_len, seed=cfg.seed, rank=rank,
                                 world_size=cfg.world_size())
    batches = data.EpochBatches(tokens, cfg.batch_size, cfg.seq_len, seed=cfg.seed, rank=rank,
                                world_size=cfg.world_size(), grad_accum=cfg.grad_accum)
    log(f"data order: epochs of {batches.num_windows:,d} windows of {cfg.seq_len + 1} tokens (stride {cfg.seq_len}); "
        f"the run covers {batches.epoch(cfg.total_steps()):.3g} epochs; the last {batches.tail_tokens} tokens of the "
        f"train split are never a target (a partial window)")
    return batches


def _distributed() -> bool:
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def _read_resume(run_dir: Path, newest: Path | None, model_cfg: ModelConfig,
                 log: Callable[[str], None]) -> ResumeCheckpoint | None:
    """The checkpoint to resume from, read (``checkpoints.read_resume_checkpoint``: the newest readable one up to
    ``newest``). Under torchrun rank 0 chooses and the other ranks read its choice (an error there: on every rank)."""
    if newest is None:
        return None
    folder = RunFolder(run_dir)
    dirs = [d for d in folder.checkpoints() if d <= newest]
    if not _distributed():
        return read_resume_checkpoint(dirs, model_cfg, log)
    choice: list[Any] = [None]
    if torch.distributed.get_rank() == 0:
        try:
            found = read_resume_checkpoint(dirs, model_cfg, log)
            choice = [("ok", found.path.name)]
        except ValueError as e:
            choice = [("error", str(e))]
    torch.distributed.broadcast_object_list(choice, src=0)
    kind, value = choice[0]
    if kind == "error":
        raise ValueError(value)
    if torch.distributed.get_rank() == 0:
        return found
    return read_resume_checkpoint([folder.checkpoints_dir / value], model_cfg, lambda _: None, fall_back=False)


def _load_prepared(data_dir: Path, verify: bool) -> data.PreparedData:
    """The prepared data; with ``verify``, its shards' sha256 are checked by rank 0 alone (the other ranks wait at a
    barrier, then read the verified folder), so a torchrun job hashes the corpus once, not once per rank."""
    world = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    if world and torch.distributed.get_rank() != 0:
        torch.distributed.barrier()  # rank 0 verifies (an error there ends the job through torchrun)
        return data.load_prepared(data_dir, verify=False)
    prepared = data.load_prepared(data_dir, verify=verify)
    if world:
        torch.distributed.barrier()
    return prepared


def _load_data(model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: Path):
    """(prepared data, validation windows, ``train_cfg`` with ``steps`` resolved) after checking that the data fits
    the model and the budget."""
    prepared = _load_prepared(data_dir, train_cfg.verify_data)
    check_vocab_size(model_cfg.vocab_size, prepared.vocab_size, str(data_dir / TOKENIZER_FILE))  # larger: padded
    total_steps = train_cfg.total_steps()
    if train_cfg.seq_len > model_cfg.max_position_embeddings:
        raise ValueError(f"TrainConfig.seq_len={train_cfg.seq_len} exceeds ModelConfig.max_position_embeddings="
                         f"{model_cfg.max_position_embeddings}")
    if len(prepared.train) < train_cfg.seq_len + 1:
        raise ValueError(f"{data_dir}: the train split has {len(prepared.train)} tokens, fewer than seq_len + 1")
    for split in ("train", "val"):  # the boundary value check of every token the trainer feeds the model
        check_token_array(getattr(prepared, split), model_cfg.vocab_size, f"{data_dir}: the {split} split")
    val_windows = validation_windows(prepared.val, train_cfg.seq_len, train_cfg.eval_windows)
    return prepared, val_windows, train_cfg.replace(steps=total_steps)


def _build_model(model_cfg: ModelConfig, train_cfg: TrainConfig, device: torch.device,
                 amp: torch.dtype | None) -> DecoderLM:
    """Seed the RNGs, build the model on the meta device, apply activation checkpointing, compile and FSDP2
    sharding (``parallelize``; DDP wraps later), then materialise and initialise it on ``device``
    (``build.materialize``: the same weights sharded or not)."""
    seed_everything(train_cfg.seed)
    model = build_on_meta(model_cfg)
    fsdp = train_cfg.data_parallel == "fsdp"
    parallelize(model, activation_checkpointing=train_cfg.activation_checkpointing, compile=train_cfg.compile,
                data_parallel="fsdp" if fsdp else None, param_dtype=amp if fsdp else None,
                replicate=train_cfg.fsdp_replicate)
    return materialize(model, device)


def _init_from(model: DecoderLM, path: Path, fsdp: bool, data: Side, allow_tokenizer_change: bool,
               log: Callable[[str], None]) -> Path:
    """``--init-from``: a checkpoint's weights (``init_from_checkpoint``); a run folder means its newest checkpoint
    (``resume.init_source``, as eval/generate/export take it; the log line names the one taken, and it is
    returned). Its tokenizer must be the data's (``data``), unless ``allow_tokenizer_change``
    (``resume.check_start_pairing``). An FSDP model goes through a full CPU copy on every rank (gathered, loaded,
    scattered back)."""
    source = init_source(path)
    check_start_pairing("--init-from", path, Side.of_folder(f"the checkpoint {source}", source), data,
                        allow_tokenizer_change, log)
    which = f"{source}" if source == Path(path) else f"{source} (the newest checkpoint of run {path})"
    if is_sharded(source):
        raise ValueError(f"--init-from {which} is a sharded (FSDP) checkpoint; gather it first with depthattn export "
                         f"{path} --out DIR and start from DIR")
    if not fsdp:
        kept = init_from_checkpoint(model, source)
    else:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             set_model_state_dict)

        full = DecoderLM(model.config)
        full.load_state_dict(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
        kept = init_from_checkpoint(full, source)
        set_model_state_dict(model, full.state_dict(), options=StateDictOptions(full_state_dict=True))
    log(f"initialised from {which}" + (f" ({len(kept)} cross-layer tensors keep their init)" if kept else ""))
    changes = init_from_changes(source, model.config)
    if changes:  # e.g. another qk_norm_position computes another function of the same weights
        log(f"note: the new model differs from {source}/config.json in {'; '.join(changes)}")
    return source


def _build_optimizer(model: DecoderLM, cfg: TrainConfig, impl: str):
    """(AdamW of the resolved implementation ``impl``, the warm-up + ``lr_schedule`` scheduler, parameter groups as
    written to ``param_groups.json``)."""
    optimizer, groups = build_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps, impl,
                                        method_params=cfg.weight_decay_method_params)
    scheduler = build_scheduler(optimizer, cfg.warmup_steps(), cfg.total_steps(), cfg.min_lr_ratio, cfg.lr_schedule,
                                cfg.decay_steps(), cfg.decay_shape)
    return optimizer, scheduler, groups


def _progress_bar(t: _Trainer, progress: bool, desc: str):
    """A tqdm bar over the run's steps (rank 0, when ``progress``), closed on leaving the ``with``."""
    return contextlib.closing(progress_bar(total=t.total_steps, initial=t.step, desc=desc, unit="step",
                                           enabled=progress and t.is_main, dynamic_ncols=True))


def _metrics_log(t: _Trainer) -> MetricsLogger:
    """Rank 0's metrics sinks (``metrics.jsonl``, TensorBoard, W&B when asked); a silent logger elsewhere. The
    TensorBoard events of steps after ``t.step`` (logged by an earlier session past the checkpoint it resumes from)
    are purged, as ``metrics.jsonl``'s rows are."""
    return MetricsLogger(t.folder.path, t.folder.METRICS_FILE, enabled=t.is_main, tensorboard=t.cfg.tensorboard,
                         purge_step=t.step + 1,  # TensorBoard drops the steps after the checkpoint: they are redone
                         wandb_resume=t.step > 0,  # a session continuing logged steps: the saved W&B run id
                         wandb_project=t.cfg.wandb_project, config={"train": t.cfg.to_dict(),
                                                                    "model": t.model.config.to_dict()})


# ---------------------------------------------------------------------------------------------------- one step
def _accumulate_gradients(t: _Trainer) -> float:
    """Forward and backward over the step's ``grad_accum`` micro-batches (DDP syncs on the last); the summed loss."""
    loss_sum = 0.0
    for micro in range(t.cfg.grad_accum):
        w = t.batches.batch(t.step, micro).to(t.device)
        sync = contextlib.nullcontext()
        if t.cfg.data_parallel == "ddp" and micro < t.cfg.grad_accum - 1:
            sync = t.net.no_sync()
        elif t.cfg.data_parallel == "fsdp":  # reduce-scatter only after the last micro-batch
            t.model.set_requires_gradient_sync(micro == t.cfg.grad_accum - 1)
        with sync:
            loss = next_token_loss(t.net, w, t.device, t.amp, eos_id=t.doc_eos)
            (loss / t.cfg.grad_accum).backward()
        loss_sum += float(loss.detach())
        fault_point("micro")
    return loss_sum


def _optimizer_step(t: _Trainer) -> dict[str, Any]:
    """One optimizer step (gradient accumulation, clipping, scheduler); advances the counters and returns the
    step's metrics row (``loss``: the mean over ranks). A non-finite loss or gradient norm (checked on every rank
    before the update) raises ``NonFiniteError``, or with ``on_nonfinite="skip"`` drops the gradients without an
    update: the step, its batch and the lr schedule still advance, and the row says ``"skipped": true``. Sets
    ``t.stopping``, ``t.save_due`` and ``t.ckpt.on_disk`` (``_step_verdict``)."""
    t0 = time.perf_counter()
    lr = t.scheduler.get_last_lr()[0]
    loss_sum = _accumulate_gradients(t)
    train_loss = loss_sum / t.cfg.grad_accum
    layer_norms = t.depth.grad_norms(t.model) if t.depth is not None and t.depth.due(t.step + 1) else {}
    max_norm = t.cfg.grad_clip if t.cfg.grad_clip > 0 else float("inf")  # inf: measure the norm, clip nothing
    norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), max_norm)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: a DTensor
    bad, train_loss = _step_verdict(t, train_loss, grad_norm)
    if bad is None:
        t.optimizer.step()
        t.nonfinite_skips = 0
    else:
        t.nonfinite_skips += 1
        if t.cfg.on_nonfinite == "stop" or t.nonfinite_skips > t.cfg.max_nonfinite_skips:
            raise NonFiniteError(_nonfinite_message(t, bad, train_loss, grad_norm), step=t.step + 1)
    with warnings.catch_warnings():  # a skipped first step: "lr_scheduler.step() before optimizer.step()" is meant
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.step += 1
    t.tokens_seen += t.cfg.tokens_per_step()
    dt = time.perf_counter() - t0
    t.train_time += dt
    t.train_tokens += t.cfg.tokens_per_step()
    row = {"step": t.step, "tokens": t.tokens_seen, "loss": train_loss, "lr": lr, "grad_norm": grad_norm,
           **layer_norms}
    if t.cfg.data_order == "epochs":
        row["epoch"] = t.batches.epoch(t.step)  # fractional epochs seen after this step
    if bad is not None:
        row.update(skipped=True, nonfinite=bad)
    return t.throughput.update(row, t.cfg.tokens_per_step(), dt)


def _any_rank(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on any rank (every rank gets the same answer; no communication in one process)."""
    if not _distributed():
        return flag
    x = torch.tensor([1.0 if flag else 0.0], device=device)
    torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.MAX)
    return bool(x.item())


def _step_verdict(t: _Trainer, loss: float, grad_norm: float) -> tuple[str | None, float]:
    """What every rank must agree on after a step's backward pass, in one all-reduce of five float64s (none in
    one process): [non-finite here, stop signal here, rank 0's clock says save, rank 0's asynchronous save is on
    disk, this rank's loss], summed. Returns
    (``"loss"`` or ``"grad_norm"`` when that value is not finite on some rank, else None; the loss averaged over
    the ranks, which all see the same number of tokens) and sets ``t.stopping`` (a stop signal on any rank),
    ``t.save_due`` (``save_every_minutes`` ran out on rank 0's clock) and ``t.ckpt.on_disk``."""
    what = "loss" if not math.isfinite(loss) else "grad_norm" if not math.isfinite(grad_norm) else None
    stop = t.stop is not None and t.stop.requested
    due = t.is_main and t.cfg.save_every_minutes > 0 and t.ckpt.since_save() >= 60 * t.cfg.save_every_minutes
    done = t.ckpt.upload_done()
    if _distributed():
        x = torch.tensor([what is not None, stop, due, done, loss], dtype=torch.float64, device=t.device)
        torch.distributed.all_reduce(x, op=torch.distributed.ReduceOp.SUM)
        any_bad, any_stop, any_due, any_done, loss_sum = x.tolist()
        if any_bad and what is None:
            what = "loss"  # another rank's loss (gradient norms are global)
        stop, due, done = any_stop > 0, any_due > 0, any_done > 0
        loss = loss_sum / torch.distributed.get_world_size()
    t.stopping, t.save_due, t.ckpt.on_disk = stop, due, done
    return what, loss


def _nonfinite_message(t: _Trainer, what: str, loss: float, grad_norm: float) -> str:
    """One line: the step, which value, what was (not) saved, and what to do."""
    saved = f"the newest checkpoint {t.ckpt.saved} is finite" if t.ckpt.saved else "no checkpoint was written"
    head = (f"training diverged at step {t.step + 1}: the {'loss' if what == 'loss' else 'gradient norm'} is "
            f"{loss if what == 'loss' else grad_norm}")
    if t.cfg.on_nonfinite == "skip":
        return (f"{head} after {t.nonfinite_skips - 1} consecutive skipped step(s) (max_nonfinite_skips="
                f"{t.cfg.max_nonfinite_skips}); the update was not applied and {saved}; lower TrainConfig.lr (now "
                f"{t.cfg.lr:g}) or raise TrainConfig.max_nonfinite_skips")
    return (f"{head}; the update was not applied and {saved}; lower TrainConfig.lr (now {t.cfg.lr:g}), or skip "
            f"such steps: on_nonfinite=skip (depthattn train --resume {t.run_dir} --on-nonfinite skip)")


def _check_weights_finite(t: _Trainer) -> None:
    """Raise ``NonFiniteError`` naming the first non-finite parameter if any rank holds a NaN or ±inf weight
    (called before every checkpoint, so none is ever written with one)."""
    names, params = zip(*t.model.named_parameters())
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]  # FSDP: this rank's shard
    finite = torch.stack([torch.isfinite(p.detach()).all() for p in local]).tolist()
    bad = [n for n, ok in zip(names, finite) if not ok]
    if _any_rank(bool(bad), t.device):
        saved = f"the newest checkpoint {t.ckpt.saved} stays" if t.ckpt.saved else "no checkpoint was written"
        raise NonFiniteError(f"training diverged by step {t.step}: non-finite weights "
                             f"({', '.join(bad[:3]) or 'on another rank'}{', ...' if len(bad) > 3 else ''}); the "
                             f"checkpoint was not written and {saved}; lower TrainConfig.lr (now {t.cfg.lr:g})",
                             step=t.step)


# ---------------------------------------------------------------------------------------------------- periodic work
def _periodic(t: _Trainer, row: dict[str, Any]) -> None:
    """Into ``row``: the keys of each periodic job due at this step (``t.periodic``: validation, in-loop tasks,
    depth statistics). Not when the run is stopping; a stop signal during a job abandons it (``_stop_agreed``
    between its batches or tasks: every rank stops at the same point) and the later ones, and sets ``t.stopping``.
    Every rank runs each job (collectives under FSDP)."""
    for job in t.periodic:
        if t.stopping:
            return
        if job.due(t.step):
            found = job.run(t.step, t.model, lambda phase=job.phase: _stop_agreed(t, phase))
            if found is None:
                t.stopping = True
                return
            row.update(found)


def _stop_agreed(t: _Trainer, phase: str | None = None) -> bool:
    """Whether a stop signal reached any rank (a one-float all-reduce under torchrun). ``phase``: the fault-injection
    point passed first (``faults.fault_point``)."""
    if phase is not None:
        fault_point(phase)
    return _any_rank(t.stop is not None and t.stop.requested, t.device)


def _log_row(t: _Trainer, row: dict[str, Any], metrics: MetricsLogger, bar, last: int) -> None:
    """Log ``row`` (``metrics.jsonl``, TensorBoard, W&B) every ``log_every`` steps, with a validation, for a skipped
    step, and at ``last``; update the progress bar (loss, tokens/s, MFU, validation loss)."""
    periodic = any("/" in k for k in row)  # in-loop tasks, depth statistics, per-layer gradient norms
    if t.step % t.cfg.log_every == 0 or "val_loss" in row or t.step == last or row.get("skipped") or periodic:
        metrics.log(row)  # every skipped step is logged: the summary counts them from the log
    bar.update(1)
    bar.set_postfix(**progress_postfix(row, t.validation.loss))
    tasks = task_summary_line(row)
    if tasks:  # in-loop zero-shot results: one line on the console per evaluation
        t.log(tasks)


def _watch(t: _Trainer, row: dict[str, Any]) -> None:
    """The divergence guard after a logged step: the training loss into its moving average; at a periodic
    validation, the ln V rule (``_check_val_loss``: may raise ``DivergenceError``) and the sustained-rise warning."""
    if not row.get("skipped"):
        t.guard.observe_train_loss(row["loss"])
    if "val_loss" in row:
        _check_val_loss(t, row["val_loss"])
        note = t.guard.rise_warning(t.step)
        if note:
            t.log(note)


def _check_val_loss(t: _Trainer, val_loss: float) -> None:
    """A validation loss above ln V + 1 (``Guard.above_ln_vocab``, agreed by every rank): ``DivergenceError`` with
    ``on_divergence="stop"``, else one warning line at the first evaluation of such an episode."""
    diverged = _any_rank(t.guard.above_ln_vocab(t.step, val_loss), t.device)
    if t.cfg.on_divergence == "stop" and diverged:
        best = _best_checkpoint(t)
        kept = (f"the best checkpoint {best[0]} (val loss {best[1]:.4f}) is kept" if best else
                f"the newest checkpoint {t.ckpt.saved} is kept (no validation loss recorded)" if t.ckpt.saved else
                "no checkpoint was written")
        start = f" (its weights: --init-from {best[0]})" if best else ""
        raise DivergenceError(
            f"training diverged at step {t.step}: validation loss {val_loss:.4f} is more than {LN_VOCAB_MARGIN:g} nat "
            f"above ln V = {t.guard.ln_vocab:.4f} (V = {t.model.config.vocab_size}: the loss of a uniform "
            f"prediction); {kept}; "
            f"lower TrainConfig.lr (now {t.cfg.lr:g}) and train again{start}, or continue this run anyway: "
            f"depthattn train --resume {t.run_dir} --on-divergence warn",
            step=t.step, val_loss=val_loss, ln_vocab=t.guard.ln_vocab, best_checkpoint=str(best[0]) if best else None,
            best_val_loss=best[1] if best else None)
    if t.guard.first_above(diverged):
        t.log(f"warning: at step {t.step} the validation loss {val_loss:.4f} is more than {LN_VOCAB_MARGIN:g} nat "
              f"above ln V = {t.guard.ln_vocab:.4f} (a uniform prediction): the run diverged; it continues "
              f"(on_divergence=warn)")


def _best_checkpoint(t: _Trainer) -> tuple[Path, float] | None:
    """The run's checkpoint with the lowest recorded validation loss, and that loss (None if none is known)."""
    dirs = t.folder.checkpoints()
    losses = checkpoint_val_losses(t.run_dir, dirs)
    best = best_checkpoint(dirs, losses)
    return (best, losses[best]) if best is not None else None


def _stop_record(t: _Trainer, e: FloatingPointError) -> dict[str, Any]:
    """What ``diverged.json`` says about a run stopped by ``e``."""
    if isinstance(e, DivergenceError):
        return {"step": e.step, "reason": "val_loss", "val_loss": e.val_loss, "ln_vocab": e.ln_vocab,
                "best_checkpoint": e.best_checkpoint, "best_val_loss": e.best_val_loss, "message": str(e)}
    best = _best_checkpoint(t)
    return {"step": e.step if e.step is not None else t.step, "reason": "nonfinite", "val_loss": None,
            "ln_vocab": t.guard.ln_vocab, "best_checkpoint": str(best[0]) if best else None,
            "best_val_loss": best[1] if best else None, "message": str(e)}


def _checkpoint_val_loss(t: _Trainer) -> float:
    """The validation loss of the step about to be saved: the periodic one, else measured now (every rank; no RNG
    is drawn and no row is logged, so the trajectory and the curve are those of a run that never saves) and put
    through the ln V rule before anything is written."""
    val_loss = t.validation.loss_at(t.step)
    if val_loss is not None:
        return val_loss
    val_loss = t.validation.measure(t.model)
    _check_val_loss(t, val_loss)
    return val_loss


def _maybe_checkpoint(t: _Trainer, metrics: MetricsLogger | None = None) -> None:
    """Every ``save_every`` steps, when ``save_every_minutes`` ran out (``t.save_due``), when the run is stopping
    (``t.stopping``) and at the last step, a checkpoint (``Checkpointer.save``) with the validation loss of its
    step (not measured for a preemption's: the grace period goes to the save, and that checkpoint's loss counts as
    unknown); ranks meet after every save but the last. The metrics rows up to the checkpoint are made durable
    first, so a checkpoint never outlives its rows. A stop signal that arrived during a periodic save stops the run
    at this step. With ``async_save`` (FSDP) a periodic save is written in the background and made visible at the
    first step where rank 0's shards are on disk, or before the next save, which is then synchronous if it is a
    preemption's or the last."""
    periodic = bool(t.cfg.save_every and t.step % t.cfg.save_every == 0) or t.save_due or t.stopping
    final = t.step == t.total_steps
    t.ckpt.finish_pending(wait=periodic or final)  # without either: only once its shards are on disk
    if not (periodic or final):
        return
    _check_weights_finite(t)  # collective: every rank raises, or none
    val_loss = None if t.stopping and not final else _checkpoint_val_loss(t)  # every rank (FSDP: a collective)
    if metrics is not None:
        metrics.sync()
    state = t.ckpt.state(t.step, t.tokens_seen, nonfinite_skips=t.nonfinite_skips, val_loss=val_loss,
                         guard=t.guard.state())
    t.ckpt.save(state, wait=t.stopping or final, meet=periodic)
    if periodic and not t.stopping:
        t.stopping = _stop_agreed(t)


# ---------------------------------------------------------------------------------------------------- the end
def _finish(t: _Trainer) -> TrainResult:
    """When the run reached its last step: ``summary.json`` (rank 0). A session that resumed at the last step keeps
    an intact summary of that step, or re-creates it (final validation loss from the metrics log or measured now,
    whole-run throughput from the log). Returns the result of this session."""
    t.ckpt.finish_pending()  # a session that stopped before its last step (stop_after) with a save in flight
    tps = t.train_tokens / t.train_time if t.train_time > 0 else None
    skipped, val_loss, saved = None, t.validation.loss, t.ckpt.saved
    if t.step == t.total_steps:
        rows = t.folder.read_metrics() if t.is_main else None  # read once: skipped steps and, if needed, throughput
        skipped = sum(1 for r in rows or () if r.get("skipped"))
        if val_loss is None:
            val_loss = _final_val_loss(t)
        old = t.folder.read_summary() if t.train_time == 0 else None
        if tps is None:
            tps = (old or {}).get("train_tokens_per_s") or run_tokens_per_s(
                rows if rows is not None else t.folder.read_metrics())
        if t.is_main and not (old and old.get("steps") == t.step and old.get("final_val_loss") is not None):
            t.folder.write_summary({"steps": t.step, "tokens": t.tokens_seen, "final_val_loss": val_loss,
                                    "skipped_steps": skipped,
                                    "train_tokens_per_s": tps, "train_seconds_this_session": t.train_time,
                                    "checkpoint": str(saved) if saved else None})
    return TrainResult(t.run_dir, t.step, t.tokens_seen, val_loss, tps, saved, t.step - t.start_step, skipped or 0)


def _final_val_loss(t: _Trainer) -> float:
    """The validation loss at the last step of a run resumed there: the one logged in ``metrics.jsonl`` at that
    step, else measured now on the restored weights."""
    for row in t.folder.read_metrics():
        if row.get("step") == t.step and row.get("val_loss") is not None:
            return float(row["val_loss"])
    return t.validation.measure(t.model)


def _environment(cfg: TrainConfig, device: torch.device, amp: torch.dtype | None) -> dict[str, Any]:
    """The machine-dependent part of ``run.json``."""
    return dict(versions=versions(), git_revision=git_revision(), world_size=cfg.world_size(), device=str(device),
                autocast=str(amp) if amp else "float32", tokens_per_step=cfg.tokens_per_step(),
                warmup_steps=cfg.warmup_steps())
