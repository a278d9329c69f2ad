"""How a run starts or continues: one plan for every way (``plan_run``), and the rules it applies.

The modes: ``"fresh"`` (a new run, optionally from a checkpoint's weights: ``source``), ``"init_from"`` (the same,
``source`` required), ``"resume"`` (continue a run with its recorded settings), ``"resume_if_exists"`` (resume when
``run_dir`` holds a run, else fresh), ``"decay_from"`` (a new run that decays another run's stable-phase checkpoint,
``training.decay``) and ``"reuse"`` (``compare``: continue or reuse the run in ``run_dir`` when it was recorded with
the same settings, else start it). Each returns a ``RunPlan``: what to load (the run's own checkpoints, a checkpoint's
weights, a checkpoint to decay from, or nothing), the settings and data to run with, and the lines to print.

What may differ when a run continues: the ``RESUMABLE_KEYS`` (``config_differences``), ``grad_accum`` at another world
size with the same tokens per step (``keep_tokens_per_step``), ``data_parallel`` (``resumed_data_parallel``)
and the data folder's path (the same tokenizer and data fingerprint at another path: said in one line, recorded).
Whether weights and data belong together (tokenizer, data fingerprint) is ``compat.check_pairing``'s, the check
``eval`` makes too; a new run from another tokenizer's weights needs ``allow_tokenizer_change`` (recorded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ..checkpoint import latest_checkpoint
from ..compat import Side, check_pairing, data_differs, tokenizer_differs
from ..config import ModelConfig
from ..fileio import read_json
from ..layout import COMPARE_RUNS_DIR, RESULTS_FILE, RUN_FILE
from ..outputs import RUN_FOLDER, check_new_output, run_folder_foreign_entries
from ..run.folder import RunFolder
from ..run.record import field_differences, recorded_precision, with_model_defaults
from .config import LEGACY_DEFAULTS, RESUMABLE_KEYS, TrainConfig, with_legacy_defaults
from .decay import check_world, checkpoint_step, decay_config, source_checkpoint

MODES = ("fresh", "init_from", "resume", "resume_if_exists", "decay_from", "reuse")

#: Options that would change a run's recorded config; ``--resume`` refuses them (attribute, flag). ``--data`` is
#: taken when it holds the run's data (``plan_run``).
RESUME_FIXED = (("config", "--config"), ("preset", "--preset"), ("set", "--set"), ("init_from", "--init-from"),
                ("steps", "--steps"), ("tokens", "--tokens"), ("cross_layer", "--cross-layer"), ("seed", "--seed"),
                ("loops", "--loops"), ("out", "--out"), ("allow_tokenizer_change", "--allow-tokenizer-change"))

#: ``--set`` keys that ``--resume`` accepts: how the resumed run is spread over the ranks.
RESUME_SETTABLE = ("data_parallel",)

#: Options a ``--decay-from`` run refuses: its config, data and seed are the source run's.
DECAY_FIXED = tuple(item for item in RESUME_FIXED if item[0] not in ("set", "out", "allow_tokenizer_change")) + (
    ("data", "--data"), ("resume", "--resume"), ("resume_if_exists", "--resume-if-exists"))

#: ``--set`` keys a decay run may give besides the resumable ones and ``data_parallel``: its shape and floor.
DECAY_SETTABLE = frozenset({"decay_shape", "min_lr_ratio"})

#: How a run records a tokenizer change made on purpose (``run.json``), and the flag that asks for it.
ALLOW_TOKENIZER_CHANGE = "allow_tokenizer_change"
TOKENIZER_REMEDY = ("prepare the data with the checkpoint's tokenizer (data prepare --tokenizer), or give "
                    "--allow-tokenizer-change to train its weights on another tokenizer's ids on purpose")


@dataclass
class RunPlan:
    """What ``train`` runs: ``resume`` (continue ``run_dir``'s newest checkpoint; with none yet, start as the run
    did: from ``init_from`` or ``decay_from`` when recorded), ``init_from`` (a checkpoint or run folder whose weights
    a new run starts from), ``decay_from`` (a checkpoint to decay from), the configs and data folder, whether a
    tokenizer change was accepted, and the lines to print (rank 0)."""

    mode: str
    run_dir: Path
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    data_dir: Path
    resume: bool = False
    init_from: Path | None = None
    decay_from: Path | None = None
    allow_tokenizer_change: bool = False
    lines: list[str] = field(default_factory=list)

    def train_kwargs(self) -> dict[str, Any]:
        """The keywords of ``training.train`` that carry out this plan."""
        return dict(resume=self.resume, init_from=self.init_from, decay_from=self.decay_from,
                    allow_tokenizer_change=self.allow_tokenizer_change)


def refused_flags(fixed: tuple[tuple[str, str], ...], values: Mapping[str, Any]) -> list[str]:
    """The flags of ``fixed`` (attribute, flag) that ``values`` (e.g. ``vars(args)``) gives."""
    return [flag for attr, flag in fixed if values.get(attr) is not None and values.get(attr) is not False
            and values.get(attr) != []]  # a --seed 0 is given


def resume_sets(run_dir: Any, items: list[str], parse: Callable[[str, str], Any]) -> dict[str, Any]:
    """The ``--set KEY=VALUE`` items given with ``--resume`` (``RESUME_SETTABLE`` keys only: ``ValueError`` naming
    any other), parsed by ``parse(value, key)``."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in RESUME_SETTABLE:
            raise ValueError(f"--resume continues {run_dir} with its recorded config; --set {item!r} would change "
                             f"it (with --resume, --set takes only {', '.join(RESUME_SETTABLE)}=...)")
        pairs[key.strip()] = parse(value.strip(), key.strip())
    return pairs


def decay_sets(items: list[str], parse: Callable[[str, str], Any]) -> dict[str, Any]:
    """The ``--set`` items given with ``--decay-from`` (``DECAY_SETTABLE``, ``data_parallel`` and resumable keys)."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in DECAY_SETTABLE | RESUMABLE_KEYS | {"data_parallel"}:
            raise ValueError(f"--decay-from: --set {item!r} would change the source run's config (it takes "
                             f"{', '.join(sorted(DECAY_SETTABLE))}, data_parallel and the resumable keys)")
        pairs[key.strip()] = parse(value.strip(), key.strip())
    return pairs


def continued_data_parallel(recorded: str | None, sets: Mapping[str, Any], lines: list[str],
                            environ: Mapping[str, str] = os.environ) -> str | None:
    """``data_parallel`` of a continued run: the one in ``sets`` when given, else the recorded one adapted to the
    launch (``resume.resumed_data_parallel``; the change appended to ``lines``)."""
    if "data_parallel" in sets:
        return sets["data_parallel"]
    value, line = resumed_data_parallel(recorded, environ)
    if line:
        lines.append(line)
    return value


def holds_run(out: Path) -> bool:
    """``--resume-if-exists``: whether ``out`` holds a run to continue (its ``run.json``), or is new (missing, empty,
    or only leftovers of an interrupted first start, a killed trainer's lock file included). ``ValueError`` naming
    the folder and what is in it for a folder of other files: never train into them."""
    if (out / RUN_FILE).is_file():
        return True
    if not out.exists():
        return False
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a run folder")
    others = run_folder_foreign_entries(out)  # without a run.json: all but a killed first start's lock and leftovers
    if others:
        raise ValueError(f"--resume-if-exists: --out {out} holds files but no {RUN_FILE}, so it is not a run to "
                         f"continue ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); choose another "
                         f"--out")
    return False


def _prepared(data_dir: Path):
    from ..data import load_prepared

    return load_prepared(data_dir, verify=False)  # the trainer verifies the shards (rank 0, once)


def continued_data(run_dir: Path, run: Mapping[str, Any], data_dir: Path | None, what: str,
                   lines: list[str]) -> Path:
    """The data folder a continued run reads: the recorded one, or ``data_dir`` when given and it holds the run's
    data (the same tokenizer and fingerprint: ``compat.check_pairing``) at another path, said in one line (the new
    path is recorded in ``run.json``). ``ValueError`` in one line for a ``data_dir`` that is not prepared data or holds
    other data, and for a recorded folder that is gone when no ``data_dir`` is given."""
    recorded = Path(run["data"])
    if data_dir is None:
        if not recorded.exists():
            raise ValueError(f"{what}: the run's data folder {recorded} no longer exists; give --data DIR with a copy "
                             f"of it (the same tokenizer and data fingerprint) to continue there")
        return recorded
    data_dir = Path(data_dir)
    if recorded.exists() and data_dir.resolve() == recorded.resolve():
        return recorded
    try:
        prepared = _prepared(data_dir)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what} continues {run_dir} with its recorded config and data: --data {data_dir} is not a "
                         f"prepared data folder ({str(e).splitlines()[0]}); drop --data (the run's is {recorded}) or "
                         f"give a copy of the run's data folder") from None
    check_pairing(f"cannot resume {run_dir}", Side.of_run(f"the run ({recorded})", run),
                  Side.of_data(str(data_dir), prepared.meta, prepared.fingerprint),
                  "resume with a copy of the run's data folder")
    lines.append(f"the run's data folder moved: {run_dir} continues on {data_dir} (the same tokenizer and data "
                 f"fingerprint as {recorded}); run.json records the new path")
    return data_dir


def init_source(source: str | os.PathLike) -> Path:
    """``--init-from``: the checkpoint folder it takes (a run folder's newest); ``FileNotFoundError`` naming the
    flag."""
    try:
        return latest_checkpoint(source)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--init-from: {e}") from None


def start_sources(run_dir: Path, init_from: str | os.PathLike | None, decay_from: str | os.PathLike | None,
                  allow_tokenizer_change: bool, resume: bool) -> tuple[Path | None, Path | None, bool]:
    """What a run starts from: ``(init_from, decay_from, allow_tokenizer_change)`` as given, or, on ``resume``, as its
    ``run.json`` recorded them, so a run resumed before its first checkpoint starts from the same weights again."""
    recorded = RunFolder(run_dir).read_run() if resume and RunFolder(run_dir).is_run() else {}
    init_from = init_from if init_from is not None else recorded.get("init_from")
    decay_from = decay_from if decay_from is not None else recorded.get("decay_from")
    allow = allow_tokenizer_change or bool(recorded.get(ALLOW_TOKENIZER_CHANGE, False))
    return (None if init_from is None else Path(init_from)), (None if decay_from is None else Path(decay_from)), allow


def check_start_pairing(flag: str, source: Path, model: Side, data: Side, allow_tokenizer_change: bool,
                        log: Callable[[str], None]) -> None:
    """``--init-from`` / ``--decay-from`` (``flag``) of the checkpoint ``source`` (its tokenizer and, for a decay, its
    run's data: ``model``) onto the prepared ``data``: refused in one ``ValueError`` line when the tokenizers differ
    (and, for a decay, the data fingerprints) unless ``allow_tokenizer_change``; a change made on purpose is said
    through ``log``."""
    decay = flag == "--decay-from"
    remedy = ("decay on the data the source run trained on (prepare it again with its tokenizer and settings), or "
              "give --allow-tokenizer-change to decay on another tokenizer's data on purpose") if decay else (
        TOKENIZER_REMEDY)
    check_pairing(f"{flag} {source}", model, data, remedy, allow_tokenizer_change,
                  check_data=decay and not allow_tokenizer_change)
    if allow_tokenizer_change and tokenizer_differs(model, data):
        log(f"--allow-tokenizer-change: {source}'s weights {'decay' if decay else 'train'} on {data.name}'s "
            f"tokenizer ids (another tokenizer than the {'source run' if decay else 'checkpoint'}'s); run.json "
            f"records it")


def recorded_settings(out: Path, run: Mapping[str, Any], model_cfg: ModelConfig, train_cfg: TrainConfig,
                      given: Mapping[str, Any], world: int) -> TrainConfig:
    """``--resume-if-exists`` on an existing run: its recorded train config, with the resumable settings the command
    gave (``RESUMABLE_KEYS``: device, compile, save cadence, ...). ``ValueError`` in one line listing every other
    setting (``resume.config_differences``) where the command differs from the record. A budget given in tokens is
    compared as tokens; a ``grad_accum`` that a resume at another world size rescaled (same tokens per step) is not
    a difference."""
    recorded = TrainConfig.from_recorded(run["train"])
    train_cfg = train_cfg.for_world(world)  # grad_accum from global_batch_tokens, as the trainer resolves it
    want = train_cfg.to_dict()
    if want["steps"] is None and want["tokens"] == recorded.tokens:
        want["steps"] = recorded.steps  # resolved from tokens when the run started
    if train_cfg.batch_size * train_cfg.grad_accum * train_cfg.seq_len * world == run.get("tokens_per_step"):
        want["grad_accum"] = recorded.grad_accum
    problems = config_differences(run, model_cfg.to_dict(), want)
    if problems:
        raise ValueError(f"--resume-if-exists: {out} was recorded with other settings (recorded vs given: "
                         f"{'; '.join(problems)}); give the recorded ones to continue it, or choose another --out")
    return recorded.replace(**{k: v for k, v in given.items() if k in RESUMABLE_KEYS})


def same_run(run_dir: Path, run: Mapping[str, Any], model_cfg: ModelConfig, train_cfg: TrainConfig,
             data_dir: Path, lines: list[str]) -> None:
    """``compare``: refuse (one line) a run folder recorded with other settings or other data than requested (the
    tokenizer and data fingerprint, ``compat``'s rule); the run's data at another path is accepted, said through
    ``lines``."""
    want_train = train_cfg.replace(steps=train_cfg.total_steps()).to_dict()
    problems = config_differences(run, model_cfg.to_dict(), want_train)
    prepared = _prepared(data_dir)
    model, data = Side.of_run(str(run_dir), run), Side.of_data(str(data_dir), prepared.meta, prepared.fingerprint)
    if tokenizer_differs(model, data):
        problems.append(f"data {data_dir}: its tokenizer differs from the run's")
    if data_differs(model, data):
        problems.append(f"data {data_dir}: fingerprint differs from the run's (the folder was re-prepared)")
    if problems:
        raise ValueError(f"{run_dir} holds a run with other settings ({'; '.join(problems)}); use another --out or "
                         f"delete that folder")
    if Path(run["data"]).resolve() != data_dir.resolve():
        lines.append(f"the run's data folder moved: {run_dir} goes on with {data_dir} (the same tokenizer and data "
                     f"fingerprint as {run['data']})")


def keep_recorded_behaviour(out: Path, train_cfg: TrainConfig, explicit: set[str],
                            log: Callable[[str], None] = print) -> TrainConfig:
    """``train_cfg`` for a compare folder ``out`` written by an older release: a trajectory-changing key (not in
    ``RESUMABLE_KEYS``) that its ``results.json`` or a run's ``run.json`` did not record, and that the command did not
    set (``explicit``), takes its ``LEGACY_DEFAULTS`` value, so the folder's runs are reused and new seeds or methods
    train as they did (e.g. ``data_order="random"``); one line says so. A new folder: ``train_cfg`` unchanged."""
    recorded = []
    results = out / RESULTS_FILE
    if results.is_file():
        recorded.append(read_json(results, "compare results.json").get("settings", {}).get("train", {}))
    for run in sorted((out / COMPARE_RUNS_DIR).glob(f"*/{RUN_FILE}")) if (out / COMPARE_RUNS_DIR).is_dir() else ():
        recorded.append(read_json(run, RUN_FILE).get("train", {}))
    old = {k: v for k, v in LEGACY_DEFAULTS.items() if k not in RESUMABLE_KEYS and k not in explicit
           and any(k not in r for r in recorded) and getattr(train_cfg, k) != v}
    if not old:
        return train_cfg
    said = ", ".join(f"{k}={v}" for k, v in old.items())
    log(f"{out} was written before {', '.join(old)} existed: its runs keep {said} (the new default needs another "
        f"--out, or --set {', '.join(f'{k}=...' for k in old)} and a folder without these runs)")
    return train_cfg.replace(**old)


def _decay_plan(run_dir: Path, source: Any, decay_steps: int | None, sets: Mapping[str, Any],
                overrides: Mapping[str, Any], allow_tokenizer_change: bool, environ: Mapping[str, str]) -> RunPlan:
    if decay_steps is None:
        raise ValueError("--decay-from needs --out NEW_RUN_DIR and --decay-steps N (the steps of the decay)")
    check_new_output(run_dir, RUN_FOLDER)
    ckpt, run = source_checkpoint(source)
    lines: list[str] = []
    data_dir = Path(run["data"])
    data_parallel = continued_data_parallel(run["train"].get("data_parallel"), sets, lines, environ)
    train_cfg = decay_config(run, checkpoint_step(ckpt), decay_steps, ckpt,
                             {**sets, **overrides, "data_parallel": data_parallel})
    check_world(run, train_cfg, int(environ.get("WORLD_SIZE", "1")))
    return RunPlan("decay_from", run_dir, ModelConfig.from_dict(run["model"]), train_cfg, data_dir, decay_from=ckpt,
                   allow_tokenizer_change=allow_tokenizer_change, lines=lines)


def plan_run(mode: str, run_dir: str | os.PathLike, *, model_cfg: ModelConfig | None = None,
             train_cfg: TrainConfig | None = None, given: Mapping[str, Any] | None = None,
             data_dir: str | os.PathLike | None = None, source: str | os.PathLike | None = None,
             decay_steps: int | None = None, sets: Mapping[str, Any] | None = None,
             overrides: Mapping[str, Any] | None = None, allow_tokenizer_change: bool = False,
             data_given: bool = True, environ: Mapping[str, str] = os.environ) -> RunPlan:
    """The plan of a run that starts or continues in ``run_dir`` (module docstring for the modes).

    ``model_cfg``, ``train_cfg``, ``data_dir``: the requested settings (``fresh``, ``init_from``,
    ``resume_if_exists``, ``reuse``); ``given``: the train keys the command set (``resume_if_exists`` keeps their
    resumable ones). ``source``: the checkpoint or run folder to start from (``init_from``, ``fresh``) or to decay
    (``decay_from``, with ``decay_steps``). ``sets``: ``--set`` pairs a continued run takes (``RESUME_SETTABLE``;
    with ``decay_from`` also ``DECAY_SETTABLE`` and the resumable keys); ``overrides``: resumable train settings
    (device, compile, ...). ``resume`` may give ``data_dir``: a folder with the run's tokenizer and data
    fingerprint at another path; so may ``resume_if_exists`` when ``data_given`` (``data_dir`` is the command's
    choice, not a default: a continued run then keeps its recorded folder).

    Raises ``ValueError`` (one line; nothing written) for an unknown mode, settings that differ from a recorded run's,
    a tokenizer that is not the data's (unless ``allow_tokenizer_change``, for ``init_from``/``fresh`` with
    ``source``/``decay_from``), other data than the run's, or a missing source."""
    run_dir = Path(run_dir)
    sets, overrides, lines = dict(sets or {}), dict(overrides or {}), []
    if mode not in MODES:
        raise ValueError(f"unknown start mode {mode!r} (one of {', '.join(MODES)})")
    if mode == "decay_from":
        return _decay_plan(run_dir, source, decay_steps, sets, overrides, allow_tokenizer_change, environ)
    if mode == "resume":
        run = RunFolder(run_dir).read_run()
        data = continued_data(run_dir, run, None if data_dir is None else Path(data_dir), "--resume", lines)
        overrides["data_parallel"] = continued_data_parallel(run["train"].get("data_parallel"), sets, lines, environ)
        train_cfg = TrainConfig.from_recorded({**run["train"], **overrides})  # an older run: its behaviour
        return _continued(mode, run_dir, run, ModelConfig.from_dict(run["model"]), train_cfg, data, lines)
    assert model_cfg is not None and train_cfg is not None and data_dir is not None, mode
    data = Path(data_dir)
    folder = RunFolder(run_dir)
    if mode == "resume_if_exists" and holds_run(run_dir):
        run = folder.read_run()
        world = int(environ.get("WORLD_SIZE", "1"))
        train_cfg = recorded_settings(run_dir, run, model_cfg, train_cfg, given or {}, world)
        data = continued_data(run_dir, run, data if data_given else None, "--resume-if-exists", lines)
        return _continued(mode, run_dir, run, model_cfg, train_cfg, data, lines)
    if mode == "reuse" and folder.is_run():
        run = folder.read_run()
        same_run(run_dir, run, model_cfg, train_cfg, data, lines)
        return _continued(mode, run_dir, run, model_cfg, train_cfg, data, lines)
    if mode == "init_from" and source is None:
        raise ValueError("--init-from needs a checkpoint or run folder")
    if mode != "reuse":  # a new run writes only into a new or empty folder, or one of its own runs
        check_new_output(run_dir, RUN_FOLDER)
    if source is not None:
        init_source(source)  # a missing one is refused before anything is written
    return RunPlan(mode, run_dir, model_cfg, train_cfg, data, init_from=None if source is None else Path(source),
                   allow_tokenizer_change=allow_tokenizer_change, lines=lines)


def _continued(mode: str, run_dir: Path, run: Mapping[str, Any], model_cfg: ModelConfig, train_cfg: TrainConfig,
               data: Path, lines: list[str]) -> RunPlan:
    """A run that continues: its own checkpoints, else what it started from (``start_sources``, read by the
    trainer)."""
    return RunPlan(mode, run_dir, model_cfg, train_cfg, data, resume=True, lines=lines)


# ---------------------------------------------------------------------------------------------------- the rules
def config_differences(recorded: Mapping[str, Any], model: Mapping[str, Any], train: Mapping[str, Any]) -> list[str]:
    """``"key: recorded vs requested"`` for every field where a run's ``run.json`` differs from a requested model
    and train config (as dicts), ignoring ``RESUMABLE_KEYS``; a key the recorded train config lacks compares as its
    ``config.LEGACY_DEFAULTS`` value, else its ``TrainConfig`` default (as ``TrainConfig.from_recorded`` reads it),
    and a key the recorded model config lacks as its ``ModelConfig`` default (a field added later defaults to what
    older releases computed). Empty when the run may be resumed with them."""
    return (field_differences(with_model_defaults(recorded["model"]), model)
            + field_differences(with_legacy_defaults(recorded["train"]), train, RESUMABLE_KEYS))


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
