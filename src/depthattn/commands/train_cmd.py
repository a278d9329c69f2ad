"""``depthattn train``: train a model from a preset, a TOML config and ``--set`` overrides."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from ..devices import resolve_device
from ..layout import PREPARED_META_FILE, TOKENIZER_FILE
from ..training import TrainConfig, load_toml, resolve_model_config, train
from ..training.config import list_keys, parse_value, split_overrides
from ..training.optim import schedule_factor
from ..training.resume import (DECAY_FIXED, RESUME_FIXED, RunPlan, decay_sets, plan_run, refused_flags,
                               resume_sets)

DEFAULT_PRESET = "small"


def default_data_dir() -> Path:
    """Cache folder for the embedded corpus prepared with the default settings
    (``$DEPTHATTN_CACHE`` or ``$XDG_CACHE_HOME/depthattn`` or ``~/.cache/depthattn``, then ``data/embedded``)."""
    root = os.environ.get("DEPTHATTN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "depthattn")
    return Path(root) / "data" / "embedded"


def ensure_data(path: str | os.PathLike | None, progress: bool = True, log=print, timeout_s: float = 300.0) -> Path:
    """A prepared data folder: ``path`` as given (must be prepared), or the default cache folder, prepared from the
    embedded corpus (``data.prepare_corpus``, default settings) if it has no ``meta.json`` yet.

    Under torchrun only one process prepares it: a process with ``LOCAL_RANK`` 0 (one per node; outside torchrun,
    the process itself) claims the folder's ``.partial`` (``data.staging``: an atomic ``mkdir``, so with a cache
    shared between nodes exactly one of them prepares, the others waiting for it; with a node-local cache, one per
    node), and every other process waits for ``meta.json`` to appear. Nobody waits more than ``timeout_s`` seconds
    (the run's ``dist_timeout_s``); the waiters then load the folder with its shards' sha256 verified. Raises
    ``ValueError`` naming the folder when the wait times out or a ``.partial`` of another host blocks it."""
    from ..data import load_prepared, prepare_corpus

    if path is not None:
        load_prepared(path)  # validates; ValueError naming the file if it is not prepared
        return Path(path)
    folder = default_data_dir()
    if (folder / PREPARED_META_FILE).is_file():
        return folder
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        log(f"preparing the embedded corpus into {folder} (once)")
        prepare_corpus(folder, None, progress=progress, overwrite=True, wait_s=timeout_s, if_missing=True)
        return folder
    deadline = time.monotonic() + timeout_s
    while not (folder / PREPARED_META_FILE).is_file():
        if time.monotonic() > deadline:
            raise ValueError(f"{folder}: waited {timeout_s:g} s (dist_timeout_s) for LOCAL_RANK 0 to prepare the "
                             f"embedded corpus there; see its error, or prepare it once before launching "
                             f"(`depthattn data prepare --out {folder}`)")
        time.sleep(0.2)
    load_prepared(folder, verify=True)  # the waiters check what they did not write
    return folder


#: ``train --data`` help: where the default data lives.
DATA_HELP = ("prepared data folder (make one from your text with `depthattn data prepare --input TEXT --out DIR`); "
             "default: the embedded corpus, prepared once into $DEPTHATTN_CACHE/data/embedded, else "
             "$XDG_CACHE_HOME/depthattn/data/embedded, else ~/.cache/depthattn/data/embedded")


def add_model_options(p: argparse.ArgumentParser, data_help: str = DATA_HELP) -> None:
    """Options shared by ``train`` and ``compare``: preset, config file, overrides."""
    p.add_argument("--preset", default=None, help=f"model preset: tiny, small, 360m, 1.5b, 3b, authors-3b (default "
                                                  f"{DEFAULT_PRESET}, or the config file's); a preset trains "
                                                  f"cross_layer none (vanilla Qwen3) unless --cross-layer, --set or "
                                                  f"the config file names a method (authors-3b: depth_attention); "
                                                  f"each file in configs/ names its method")
    p.add_argument("--config", default=None, metavar="TOML",
                   help="TOML file with optional `preset`, `data`, [model] and [train] tables")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a ModelConfig or TrainConfig field (repeatable), e.g. --set hidden_size=128")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (TrainConfig.steps)")
    p.add_argument("--tokens", type=int, default=None, help="training tokens (TrainConfig.tokens; steps win)")
    p.add_argument("--seed", type=int, default=None, help="TrainConfig.seed")
    p.add_argument("--loops", type=int, default=None, help="ModelConfig.num_loops (looped Transformer)")
    p.add_argument("--data", default=None, metavar="DIR", help=data_help)
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in the backward pass")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the sha256 check of the data shards (TrainConfig.verify_data=false)")


def check_file_values(path: str, preset: str, model: dict, train_kw: dict) -> None:
    """Validate the [model] and [train] values of the config file ``path`` on their own, so that a bad value there
    is named with the file: ``ValueError("PATH: [train] TrainConfig.steps='ten' is invalid: ...")``. An error about
    a field the file does not set (a combination with the preset's values) is left for the full check."""
    from ..config import ModelConfig

    for table, keys, check in (("train", train_kw, lambda: TrainConfig.from_dict(dict(train_kw))),
                               ("model", model, lambda: ModelConfig.from_preset(
                                   preset, **{k: v for k, v in model.items() if k != "vocab_size"}))):
        try:
            check()
        except ValueError as e:
            if any(f"Config.{k}=" in str(e) for k in keys):
                raise ValueError(f"{path}: [{table}] {e}") from None


def gather_settings(args: argparse.Namespace, extra_model: dict | None = None) -> tuple[str, dict, dict, Any]:
    """(preset, model overrides, train overrides, data path) from config file, then flags, then ``--set``."""
    preset, data, model, train_kw = None, None, {}, {}
    if args.config:
        doc = load_toml(args.config)
        preset, data, model, train_kw = doc["preset"], doc["data"], doc["model"], doc["train"]
        check_file_values(args.config, args.preset or preset or DEFAULT_PRESET, model, train_kw)
    preset = args.preset or preset or DEFAULT_PRESET
    data = args.data or data
    flags = {"steps": args.steps, "tokens": args.tokens, "seed": args.seed, "device": args.device}
    train_kw.update({k: v for k, v in flags.items() if v is not None})
    if args.steps is not None and args.tokens is None:
        train_kw.pop("tokens", None)
    if args.tokens is not None and args.steps is None:
        train_kw.pop("steps", None)
    if args.compile:
        train_kw["compile"] = True
    if args.no_verify:
        train_kw["verify_data"] = False
    if args.activation_checkpointing:
        train_kw["activation_checkpointing"] = True
    if args.loops is not None:
        model["num_loops"] = args.loops
    model.update(extra_model or {})
    pairs = {}
    for item in args.set:
        if "=" not in item:
            raise ValueError(f"--set {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        pairs[key.strip()] = parse_value(value.strip(), key.strip())
    m, t = split_overrides(pairs, "--set")
    model.update(m)
    train_kw.update(t)
    if train_kw.get("global_batch_tokens") is not None and "grad_accum" in train_kw:
        raise ValueError(f"grad_accum={train_kw['grad_accum']} and global_batch_tokens="
                         f"{train_kw['global_batch_tokens']} are both set: grad_accum follows from global_batch_tokens "
                         f"for the world size; drop grad_accum (or --set global_batch_tokens=none to give it per rank)")
    return preset, model, train_kw, data


def check_model_settings(preset: str, model_kw: dict) -> None:
    """Validate the preset and model overrides before any data work (vocab_size is checked against the data)."""
    from ..config import ModelConfig

    ModelConfig.from_preset(preset, **{k: v for k, v in model_kw.items() if k != "vocab_size"})


def run_train(args: argparse.Namespace) -> int:
    """Train a model; writes a run folder (run.json, metrics.jsonl, checkpoints/) to --out. Without --data it trains
    on the embedded corpus, prepared once into the cache folder $DEPTHATTN_CACHE/data/embedded (default
    ~/.cache/depthattn/data/embedded, or $XDG_CACHE_HOME/depthattn/data/embedded)."""
    if args.list_keys:
        print(list_keys())
        return 0
    if args.device is not None:
        resolve_device(args.device, "--device")  # before any data work
    if args.dry_run:
        return run_dry_run(args)
    if args.decay_steps is not None and args.decay_from is None:
        raise ValueError("--decay-steps applies to --decay-from only")
    if args.nproc is not None:
        raise ValueError("--nproc applies to --dry-run only (launch N processes with torchrun --nproc_per_node N)")
    if args.resume and args.resume_if_exists:
        raise ValueError("--resume-if-exists starts --out or continues it; drop --resume (or --resume-if-exists)")
    if args.allow_tokenizer_change and args.init_from is None and args.decay_from is None:
        raise ValueError("--allow-tokenizer-change applies to --init-from and --decay-from only")
    if args.decay_from is not None:
        plan = run_decay_from(args)
    elif args.resume:
        sets = resume_sets(args.resume, args.set, parse_value)
        given = refused_flags(RESUME_FIXED, {**vars(args), "set": []})
        if given:
            raise ValueError(f"--resume continues {args.resume} with its recorded config and data; drop "
                             f"{', '.join(given)} (only --device, --compile, --activation-checkpointing, "
                             f"--no-verify, --on-nonfinite, --on-divergence, --no-progress, --set "
                             f"data_parallel=... and --data with a copy of the run's data folder may be given)")
        plan = plan_run("resume", args.resume, data_dir=args.data, sets=sets, overrides=_session_overrides(args))
    else:
        preset, model_kw, train_kw, data = gather_settings(args, {"cross_layer": args.cross_layer}
                                                           if args.cross_layer else None)
        if "steps" not in train_kw and "tokens" not in train_kw:
            train_kw["steps"] = 200
        if args.on_nonfinite is not None:
            train_kw["on_nonfinite"] = args.on_nonfinite
        if args.on_divergence is not None:
            train_kw["on_divergence"] = args.on_divergence
        train_cfg = TrainConfig.from_dict(train_kw)
        schedule_factor(train_cfg, 0)  # refuse a budget shorter than one step, or a WSD decay inside the warm-up
        check_model_settings(preset, model_kw)
        from ..data import load_prepared

        data_dir = ensure_data(data, progress=not args.no_progress, timeout_s=train_cfg.dist_timeout_s)
        prepared = load_prepared(data_dir, verify=False)  # the trainer verifies the shards (rank 0, once)
        model_cfg = resolve_model_config(preset, model_kw, prepared.vocab_size, str(data_dir / TOKENIZER_FILE))
        out = args.out or os.path.join("runs", f"{preset}-{model_cfg.cross_layer}")
        mode = "resume_if_exists" if args.resume_if_exists else "init_from" if args.init_from else "fresh"
        plan = plan_run(mode, out, model_cfg=model_cfg, train_cfg=train_cfg, given=train_kw, data_dir=data_dir,
                        source=args.init_from, allow_tokenizer_change=args.allow_tokenizer_change,
                        data_given=data is not None)
    result = _run_plan(plan, not args.no_progress)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports (and holds the checkpoint)
        return 0
    print(final_line(result, plan.train_cfg))
    return 0


def method_line(plan: RunPlan) -> str:
    """The first line ``train`` prints: the method (``cross_layer``; ``none`` is vanilla Qwen3), the last step and
    the run folder."""
    method = plan.model_cfg.cross_layer
    what = "none (vanilla Qwen3)" if method == "none" else method
    return f"training cross_layer {what} to step {plan.train_cfg.total_steps()} into {plan.run_dir}"


def final_line(result, train_cfg: TrainConfig) -> str:
    """The last line of ``train``: the steps this command trained (a resumed or ``--decay-from`` run starts past
    step 0), the tokens, and the final validation loss with the validation it used (``eval_windows`` windows of
    ``seq_len`` tokens; ``depthattn eval`` scores the whole split, so its loss differs)."""
    if result.final_val_loss is None:
        return f"stopped at step {result.steps}"
    val = (f"final val loss {result.final_val_loss:.4f} (periodic validation: up to {train_cfg.eval_windows} windows "
           f"of {train_cfg.seq_len} tokens of the val split, TrainConfig.eval_windows; `depthattn eval` scores the "
           f"whole split, so its loss differs)")
    if result.steps_this_session == 0:  # resumed a finished run: train() said so
        return f"{val}; checkpoint {result.checkpoint}"
    skipped = (f" ({result.skipped_steps} of the run's steps skipped: non-finite loss or gradient norm, no update; see "
               f"metrics.jsonl)" if result.skipped_steps else "")
    start = result.steps - result.steps_this_session
    steps = (f"trained {result.steps_this_session} steps" if start == 0 else
             f"trained {result.steps_this_session} steps (steps {start + 1}-{result.steps} of the run)")
    tokens = result.tokens // result.steps * result.steps_this_session  # the same tokens every step
    return f"{steps}{skipped}, {tokens:,d} tokens; {val}; checkpoint {result.checkpoint}"


def run_decay_from(args: argparse.Namespace):
    """``train --decay-from RUN_OR_CHECKPOINT --decay-steps N --out NEW``: a new run that decays the source's
    stable-phase checkpoint over N steps with its optimizer state and data position (``training.decay``). ``--set``
    takes ``decay_shape``, ``min_lr_ratio`` and the resumable keys; the source's config, data and seed stay."""
    given = refused_flags(DECAY_FIXED, vars(args))
    if given:
        raise ValueError(f"--decay-from continues the source run's config, data and seed; drop {', '.join(given)}")
    if args.out is None:  # the plan checks --decay-steps
        raise ValueError("--decay-from needs --out NEW_RUN_DIR and --decay-steps N (the steps of the decay)")
    sets = decay_sets(args.set, parse_value)
    return plan_run("decay_from", args.out, source=args.decay_from, decay_steps=args.decay_steps, sets=sets,
                    overrides=_session_overrides(args), allow_tokenizer_change=args.allow_tokenizer_change)


def _session_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The resumable settings a continued run takes from the command (device, compile, ...)."""
    overrides = {k: v for k, v in {"device": args.device, "on_nonfinite": args.on_nonfinite,
                                   "on_divergence": args.on_divergence}.items() if v is not None}
    overrides.update({k: True for k in ("compile", "activation_checkpointing") if getattr(args, k)})
    if args.no_verify:
        overrides["verify_data"] = False
    return overrides


def _run_plan(plan: RunPlan, progress: bool):
    """Print the plan's lines (rank 0) and train it."""
    if int(os.environ.get("RANK", "0")) == 0:
        for line in (method_line(plan), *plan.lines):
            print(line)
    return train(plan.run_dir, plan.model_cfg, plan.train_cfg, plan.data_dir, progress=progress,
                 **plan.train_kwargs())


def run_dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: parameters, FLOPs per token, per-GPU memory and the tokens/s a target wall time needs, from
    the model built on the meta device (``training.dry_run``). Uses the data's vocabulary when --data is given,
    else the preset's (or the config's)."""
    from ..config import ModelConfig
    from ..training.dry_run import dry_run, launch_commands, report

    if args.resume:
        raise ValueError("--dry-run plans a new run; drop --resume")
    preset, model_kw, train_kw, data = gather_settings(args, {"cross_layer": args.cross_layer}
                                                       if args.cross_layer else None)
    if "steps" not in train_kw and "tokens" not in train_kw:
        train_kw["steps"] = 200
    train_cfg = TrainConfig.from_dict(train_kw)
    if data is not None:
        from ..data import load_prepared

        tokens = load_prepared(data).vocab_size
        model_cfg = resolve_model_config(preset, model_kw, tokens, str(Path(data) / TOKENIZER_FILE))
        vocab_source = (f"set by --set or the config file; {data}'s tokenizer holds {tokens:,d}"
                        if "vocab_size" in model_kw else f"{data}'s tokenizer")
    else:
        model_cfg = ModelConfig.from_preset(preset, **model_kw)
        vocab_source = ("set by --set or the config file" if "vocab_size" in model_kw else
                        f"the {preset} preset's; a run takes its data tokenizer's: give --data DIR to plan with it")
    if args.target_hours <= 0:
        raise ValueError(f"--target-hours {args.target_hours} must be > 0")
    if args.gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node {args.gpus_per_node} must be >= 1")
    nproc = args.nproc or 1
    plan = dry_run(model_cfg, train_cfg, nproc)
    extra = ["--set", "data_parallel=ddp"] if nproc > 1 and train_cfg.data_parallel is None else []
    launch = launch_commands(nproc, args.gpus_per_node, launch_args(args) + extra, Path(args.out or "run").name)
    print(report(plan, model_cfg, args.target_hours, launch, vocab_source))
    return 0


def launch_args(args: argparse.Namespace) -> list[str]:
    """The ``train`` options of ``args`` that a launch of the planned run repeats (``--dry-run``, ``--nproc``,
    ``--target-hours`` and ``--gpus-per-node`` dropped), shell-quoted."""
    import shlex

    out: list[str] = []
    for attr, flag in (("config", "--config"), ("preset", "--preset"), ("cross_layer", "--cross-layer"),
                       ("steps", "--steps"), ("tokens", "--tokens"), ("seed", "--seed"), ("loops", "--loops"),
                       ("data", "--data"), ("out", "--out"), ("device", "--device")):
        if getattr(args, attr, None) is not None:
            out += [flag, shlex.quote(str(getattr(args, attr)))]
    for item in args.set:
        out += ["--set", shlex.quote(item)]
    for attr, flag in (("compile", "--compile"), ("activation_checkpointing", "--activation-checkpointing"),
                       ("no_verify", "--no-verify")):
        if getattr(args, attr, False):
            out.append(flag)
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train a model (preset + config + overrides)",
                              description=run_train.__doc__)
    add_model_options(p)
    p.add_argument("--cross-layer", default=None, help="ModelConfig.cross_layer (none, depth_attention, ...)")
    p.add_argument("--out", default=None, help="run folder (default runs/<preset>-<cross_layer>)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run from its newest checkpoint, with its recorded config and data (only "
                        "--device, --compile, --activation-checkpointing, --no-verify, --on-nonfinite, "
                        "--on-divergence, --no-progress and --set data_parallel=ddp|fsdp|null may be given; under "
                        "torchrun a one-process run resumes with ddp, see docs/training-at-scale.md)")
    p.add_argument("--resume-if-exists", action="store_true",
                   help="continue --out if it holds a run (with its recorded settings: a command whose settings "
                        "differ is refused, naming them), else start it: one command for the first launch and every "
                        "requeue (docs/training-at-scale.md)")
    p.add_argument("--on-nonfinite", choices=("stop", "skip"), default=None,
                   help="a NaN/inf loss or gradient norm stops the run (stop, the default) or skips that step "
                        "(skip; TrainConfig.on_nonfinite; may be given with --resume)")
    p.add_argument("--on-divergence", choices=("stop", "warn"), default=None,
                   help="a validation loss more than 1 nat above ln V (V = vocab size), once the run was below ln V "
                        "or past warm-up, stops the run (stop, the default) or warns once and continues (warn; "
                        "TrainConfig.on_divergence; may be given with --resume)")
    p.add_argument("--init-from", default=None, metavar="CHECKPOINT",
                   help="start from this checkpoint's weights, or a run folder's newest checkpoint (its cross_layer "
                        "may differ)")
    p.add_argument("--decay-from", default=None, metavar="RUN_OR_CHECKPOINT",
                   help="start a new run (--out) that decays this stable-phase checkpoint (or a run folder's newest) "
                        "over --decay-steps steps, with its optimizer state and data position (WSD; "
                        "docs/training.md)")
    p.add_argument("--decay-steps", type=int, default=None, help="--decay-from: the steps of the decay")
    p.add_argument("--allow-tokenizer-change", action="store_true",
                   help="--init-from / --decay-from: accept a checkpoint trained on another tokenizer than the data's "
                        "(its weights then see other token ids; recorded in run.json); refused without it")
    p.add_argument("--list-keys", action="store_true",
                   help="print the keys --set takes (ModelConfig and TrainConfig fields, with their defaults); train "
                        "nothing")
    p.add_argument("--dry-run", action="store_true",
                   help="print parameters, FLOPs per token, per-GPU memory and the tokens/s needed; train nothing")
    p.add_argument("--nproc", type=int, default=None, help="--dry-run: data-parallel ranks to plan for (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="--dry-run: GPUs per node for the multi-node torchrun command (default 8)")
    p.add_argument("--target-hours", type=float, default=24.0,
                   help="--dry-run: wall time to plan the tokens/s for (default 24)")
    p.set_defaults(func=run_train)
