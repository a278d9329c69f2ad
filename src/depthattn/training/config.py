"""Training settings: the typed ``TrainConfig`` and the parsing of run configs (TOML files, ``--set`` overrides).

Model architecture lives in ``depthattn.config.ModelConfig``; ``split_overrides`` and ``load_toml`` route each key
to one of the two dataclasses and name unknown keys. ``RESUMABLE_KEYS`` are the train settings a resumed run may change.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..config import LIST_KEYS_HINT, ModelConfig, _finite, did_you_mean


#: ``TrainConfig.data_order`` choices: windows in seeded epochs, or drawn uniformly with replacement.
DATA_ORDERS = ("epochs", "random")
#: ``TrainConfig.lr_schedule`` choices (``optim.lr_factor``).
LR_SCHEDULES = ("cosine", "wsd", "linear", "constant")
#: ``TrainConfig.decay_shape`` choices: the shape of WSD's decay phase (``optim.lr_factor``).
DECAY_SHAPES = ("linear", "1-sqrt")
#: ``TrainConfig.adamw_impl`` choices (``optim.adamw_kwargs``). ``"torch_default"``: ``torch.optim.AdamW``'s own choice
#: (``foreach=None, fused=None``: foreach when every tensor is on CUDA, else the for-loop), what release 97f8652 ran.
ADAMW_IMPLS = ("auto", "fused", "foreach", "plain", "torch_default")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping settings (model architecture lives in ``ModelConfig``).

    The budget is ``steps`` optimizer steps, or ``tokens`` training tokens (``steps = tokens // tokens_per_step``);
    ``steps`` wins when both are set. One step consumes ``batch_size × grad_accum × seq_len`` tokens (per
    data-parallel rank). ``warmup`` is a fraction of the steps (paper: 0.02), at least one step.

    ``weight_decay_method_params``: false (default) exempts the cross-layer methods' mixing parameters from weight
    decay (spec-baselines.md §8); true decays them as the authors' runs did (the Hugging Face Trainer's default
    split; ``optim.decays``, docs/authors-checkpoints.md). Norm gains never decay.

    ``save_every_minutes``: also save when this many minutes (rank 0's monotonic clock) have passed since the
    session started or last saved, at the end of the step where they ran out (0: off). Beside ``save_every``
    (steps); a run recorded before this key existed reads it as 0 (``LEGACY_DEFAULTS``). ``async_save`` (FSDP only):
    periodic checkpoints are written in the background (``torch.distributed.checkpoint.async_save``) while the steps
    go on, and made visible at the first step after the shards are on disk; the next save, a preemption save and
    the last one wait for it first and are written synchronously.

    ``on_nonfinite``: what a step whose loss or gradient norm is NaN/±inf does (checked before the optimizer
    step): ``"stop"`` raises ``training.NonFiniteError``; ``"skip"`` drops the step's gradients without an optimizer
    update (the step still counts: its batch is consumed and the lr schedule advances), logs ``"skipped": true``,
    and stops after more than ``max_nonfinite_skips`` consecutive skipped steps. See docs/reliability.md.

    Finite divergence (``training.guard``): ``on_divergence="stop"`` (default) raises ``training.DivergenceError``
    when a validation loss (periodic, or the one measured for a checkpoint) exceeds ln V (V = vocab size: the loss
    of a uniform prediction, where a fresh model starts) by more than 1 nat, once the run has been below ln V or past
    warm-up;
    ``"warn"`` says so in one line and continues. A smoothed training loss (EMA, ``guard.LOSS_EMA_DECAY`` per step)
    that stays more than ``loss_rise_margin`` nats above its running minimum at ``loss_rise_patience`` consecutive
    evaluations warns in one line (0 turns that warning off); it never stops a run. A recorded config without
    ``on_divergence`` (an older release's run.json) resumes with ``"warn"`` (``LEGACY_DEFAULTS``).

    ``data_order``: how training windows are drawn. ``"epochs"`` (default): every window of ``seq_len + 1`` tokens
    at stride ``seq_len`` once per epoch, in a seeded order of the global sample index (the same at any world size
    and ``grad_accum`` split; the partial last window is dropped: ``data.EpochBatches``); ``"random"``: window
    starts drawn uniformly with replacement per ``(seed, step, micro_step)`` (``data.TokenBatches``), what runs
    recorded without this key did (``LEGACY_DEFAULTS``).

    Schedule (``optim.lr_factor``): ``lr_schedule`` ``"cosine"`` (default), ``"linear"``, ``"constant"`` or
    ``"wsd"`` (warmup–stable–decay: peak lr until the last ``decay_fraction`` of the steps, then ``decay_shape``
    ``"linear"`` or ``"1-sqrt"`` down to ``min_lr_ratio``; ``depthattn train --decay-from`` decays a stable-phase
    checkpoint into a new run, ``training.decay``). ``adamw_impl``: ``"auto"`` (fused where the device has it, else
    foreach), ``"fused"``, ``"foreach"``, ``"plain"`` (the for-loop) or ``"torch_default"`` (torch's own choice,
    what release 97f8652 used: a recorded config without the key reads as it, ``LEGACY_DEFAULTS``); the resolved one
    is recorded in ``run.json`` (``adamw_impl``) and a resumed ``"auto"`` run keeps it.

    ``global_batch_tokens``: the global batch in tokens (over all data-parallel ranks). When set, ``grad_accum``
    follows from it for the world size (``for_world``: ``global_batch_tokens / (batch_size × seq_len × world)``,
    refused when that is not a whole number); unset, ``grad_accum`` is taken as given (per rank).

    ``doc_mask``: document masking (docs/training.md): each window's documents (they end at EOS tokens) attend only
    within themselves and their RoPE positions restart at 0 (``DecoderLM.forward``'s ``document_ids``), in
    training and in the periodic validation. Off by default, as the Depth-Attention authors trained; a recorded
    run without the key reads false, today's behaviour (``LEGACY_DEFAULTS``). Refused before training on data
    without document boundaries (``data.boundaries``).

    Zero-shot tasks during training (``training.in_loop_tasks``): ``eval_tasks`` (names of ``eval.tasks.TASKS``; a
    comma-separated string or ``"all"`` is turned into the list; empty: none) are scored every ``eval_tasks_every``
    steps (0: only at the last step) and at the last step, on the first ``eval_tasks_limit`` documents of each
    (None: all). ``log_depth_every``: every that many steps the depth statistics of a fixed probe batch and the
    per-layer gradient norms are logged (``training.depth_stats``; 0: off, what a run recorded before the key
    existed reads, ``LEGACY_DEFAULTS``). None of the four changes the trajectory; all may change on resume.

    Raises:
        ValueError: naming the field and the value, for any impossible setting (an unknown task name: with the
            list of choices).
    """

    seed: int = 0
    data_order: str = "epochs"
    steps: int | None = None
    tokens: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    seq_len: int = 256
    doc_mask: bool = False
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.02
    weight_decay: float = 0.1
    weight_decay_method_params: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 16
    eval_batch_size: int = 8
    save_every: int = 0
    save_every_minutes: float = 30.0
    async_save: bool = False
    keep_last: int = 2
    log_every: int = 1
    precision: str = "auto"
    device: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    data_parallel: str | None = None
    fsdp_replicate: int = 1
    dist_timeout_s: float = 300.0
    peak_flops: float | None = None
    tensorboard: bool = True
    verify_data: bool = True
    wandb_project: str | None = None
    on_nonfinite: str = "stop"
    max_nonfinite_skips: int = 10
    on_divergence: str = "stop"
    loss_rise_margin: float = 1.0
    loss_rise_patience: int = 3
    eval_tasks: list[str] = field(default_factory=list)
    eval_tasks_every: int = 0
    eval_tasks_limit: int | None = None
    log_depth_every: int = 100
    lr_schedule: str = "cosine"
    decay_fraction: float = 0.2
    decay_shape: str = "linear"
    adamw_impl: str = "auto"
    global_batch_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.eval_tasks, str):  # --set eval_tasks=arc_easy,piqa (or "all")
            self.eval_tasks = [t.strip() for t in self.eval_tasks.split(",") if t.strip()]
        if isinstance(self.eval_tasks, tuple):
            self.eval_tasks = list(self.eval_tasks)
        if self.eval_tasks == ["all"]:
            from ..eval.tasks import TASKS

            self.eval_tasks = list(TASKS)
        self.validate()

    def validate(self) -> None:
        def need(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is invalid: {why}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        for name in ("batch_size", "grad_accum", "seq_len", "eval_windows", "eval_batch_size", "keep_last",
                     "log_every"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 1, name, "must be an integer >= 1")
        for name in ("seed", "eval_every", "save_every", "max_nonfinite_skips", "loss_rise_patience"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 0, name, "must be an integer >= 0")
        for name in ("steps", "tokens"):
            v = getattr(self, name)
            need(v is None or (is_int(v) and v >= 1), name, "must be an integer >= 1 (or unset)")
        for name in ("lr", "eps"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and _finite(v) and v > 0, name, "must be a finite number > 0")
        for name in ("min_lr_ratio", "beta1", "beta2"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and 0 <= v < 1 or (name == "min_lr_ratio" and v == 1), name,
                 "must be in [0, 1)")
        need(isinstance(self.warmup, (int, float)) and 0 <= self.warmup < 1, "warmup",
             "must be a fraction of the steps in [0, 1)")
        for name in ("weight_decay", "grad_clip", "save_every_minutes"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and _finite(v) and v >= 0, name, "must be a finite number >= 0")
        need(isinstance(self.weight_decay_method_params, bool), "weight_decay_method_params", "must be true or false")
        need(self.precision in ("auto", "float32", "bfloat16"), "precision", "must be auto, float32 or bfloat16")
        need(isinstance(self.device, str) and bool(self.device), "device", "must be auto, cpu, cuda or cuda:N")
        need(isinstance(self.compile, bool), "compile", "must be true or false")
        need(isinstance(self.doc_mask, bool), "doc_mask", "must be true or false")
        need(isinstance(self.activation_checkpointing, bool), "activation_checkpointing", "must be true or false")
        need(self.data_parallel in (None, "ddp", "fsdp"), "data_parallel", "must be null, 'ddp' or 'fsdp'")
        need(is_int(self.fsdp_replicate) and self.fsdp_replicate >= 1, "fsdp_replicate",
             "must be an integer >= 1 (HSDP replica groups; 1: plain FSDP)")
        need(isinstance(self.dist_timeout_s, (int, float)) and not isinstance(self.dist_timeout_s, bool)
             and _finite(self.dist_timeout_s) and self.dist_timeout_s > 0, "dist_timeout_s",
             "must be a number of seconds > 0")
        need(self.peak_flops is None or (isinstance(self.peak_flops, (int, float)) and not isinstance(
            self.peak_flops, bool) and _finite(self.peak_flops) and self.peak_flops > 0), "peak_flops",
             "must be a device's peak dense bf16 FLOP/s > 0 (e.g. 989e12 for an H100 SXM), or unset")
        need(isinstance(self.tensorboard, bool), "tensorboard", "must be true or false")
        need(isinstance(self.verify_data, bool), "verify_data", "must be true or false")
        need(isinstance(self.async_save, bool), "async_save", "must be true or false")
        need(not self.async_save or self.data_parallel == "fsdp", "async_save",
             "applies to sharded checkpoints: set data_parallel='fsdp', or async_save=false")
        need(self.data_order in DATA_ORDERS, "data_order", f"must be one of {', '.join(DATA_ORDERS)}")
        need(self.on_nonfinite in ("stop", "skip"), "on_nonfinite", "must be 'stop' or 'skip'")
        need(self.on_divergence in ("stop", "warn"), "on_divergence", "must be 'stop' or 'warn'")
        need(isinstance(self.loss_rise_margin, (int, float)) and not isinstance(self.loss_rise_margin, bool)
             and _finite(self.loss_rise_margin) and self.loss_rise_margin > 0, "loss_rise_margin",
             "must be a finite number of nats > 0")
        need(self.lr_schedule in LR_SCHEDULES, "lr_schedule", f"choose one of {', '.join(LR_SCHEDULES)}")
        need(self.decay_shape in DECAY_SHAPES, "decay_shape", f"choose one of {', '.join(DECAY_SHAPES)}")
        need(isinstance(self.decay_fraction, (int, float)) and not isinstance(self.decay_fraction, bool)
             and 0 < self.decay_fraction < 1, "decay_fraction", "must be a fraction of the steps in (0, 1) (a decay "
             "over every step would start inside the warm-up, which is at least one step)")
        need(self.adamw_impl in ADAMW_IMPLS, "adamw_impl", f"choose one of {', '.join(ADAMW_IMPLS)}")
        g = self.global_batch_tokens
        need(g is None or (is_int(g) and g >= 1 and g % (self.batch_size * self.seq_len) == 0),
             "global_batch_tokens", f"must be a multiple of batch_size × seq_len = {self.batch_size * self.seq_len} "
             f"(tokens per step over all ranks), or unset")
        self._validate_periodic_stats(need, is_int)
        need(self.wandb_project is None or (isinstance(self.wandb_project, str) and bool(self.wandb_project)),
             "wandb_project", "must be a Weights & Biases project name, or unset")

    def _validate_periodic_stats(self, need, is_int) -> None:
        """``eval_tasks`` (known task names, ``eval.tasks.TASKS``), ``eval_tasks_every``, ``eval_tasks_limit``,
        ``log_depth_every``."""
        from ..eval.tasks import TASKS

        need(isinstance(self.eval_tasks, list) and all(isinstance(t, str) for t in self.eval_tasks), "eval_tasks",
             "must be a list of task names (or a comma-separated string, or \"all\")")
        unknown = [t for t in self.eval_tasks if t not in TASKS]
        need(not unknown, "eval_tasks", f"unknown task name(s) {unknown}; choose from {sorted(TASKS)} or 'all'")
        need(len(set(self.eval_tasks)) == len(self.eval_tasks), "eval_tasks", "names a task twice")
        for name in ("eval_tasks_every", "log_depth_every"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 0, name, "must be an integer >= 0")
        need(self.eval_tasks_limit is None or (is_int(self.eval_tasks_limit) and self.eval_tasks_limit >= 1),
             "eval_tasks_limit", "must be a number of documents per task >= 1 (or unset: every document)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_recorded(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """``from_dict`` of a recorded config (``run.json``'s ``train``, a checkpoint's ``train_config.json``): a key
        it lacks takes its ``LEGACY_DEFAULTS`` value (what runs written before that key existed did), not the
        default of a new run."""
        return cls.from_dict(with_legacy_defaults(values))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """Build from a mapping; unknown keys raise ``ValueError`` naming them."""
        unknown = sorted(set(values) - TRAIN_KEYS)
        if unknown:
            raise ValueError(f"unknown TrainConfig key(s) {unknown}{did_you_mean(unknown[0], TRAIN_KEYS)}; "
                             f"{LIST_KEYS_HINT}")
        return cls(**dict(values))

    def replace(self, **overrides: Any) -> "TrainConfig":
        values = self.to_dict()
        values.update(overrides)
        return TrainConfig.from_dict(values)

    def world_size(self) -> int:
        return torch.distributed.get_world_size() if self.data_parallel and torch.distributed.is_initialized() else 1

    def tokens_per_step(self) -> int:
        """Training tokens per optimizer step, over all data-parallel ranks."""
        return self.batch_size * self.grad_accum * self.seq_len * self.world_size()

    def for_world(self, world: int) -> "TrainConfig":
        """This config on ``world`` data-parallel ranks: with ``global_batch_tokens`` set, ``grad_accum`` follows
        (``global_batch_tokens / (batch_size × seq_len × world)``); unset, itself. Raises ``ValueError`` in one line
        when that is not a whole number."""
        if self.global_batch_tokens is None:
            return self
        per_accum = self.batch_size * self.seq_len * world
        if self.global_batch_tokens % per_accum:
            raise ValueError(f"TrainConfig.global_batch_tokens={self.global_batch_tokens} is not a multiple of "
                             f"batch_size {self.batch_size} × seq_len {self.seq_len} × {world} rank(s) = "
                             f"{per_accum}; choose a world size or batch_size that divides it")
        accum = self.global_batch_tokens // per_accum
        return self if accum == self.grad_accum else self.replace(grad_accum=accum)

    def decay_steps(self) -> int:
        """Steps of WSD's decay phase: ``round(decay_fraction × total_steps)``, at least 1 (0 for other
        schedules)."""
        return max(1, round(self.decay_fraction * self.total_steps())) if self.lr_schedule == "wsd" else 0

    def total_steps(self) -> int:
        """Resolved number of optimizer steps. Raises ``ValueError`` if the budget is shorter than one step."""
        if self.steps is not None:
            return self.steps
        if self.tokens is None:
            raise ValueError("set a training budget: TrainConfig.steps or TrainConfig.tokens")
        per_step = self.global_batch_tokens or self.tokens_per_step()
        steps = self.tokens // per_step
        if steps < 1:
            raise ValueError(f"TrainConfig.tokens={self.tokens} is shorter than one optimizer step of "
                             f"{per_step} tokens (batch_size {self.batch_size} × grad_accum "
                             f"{self.grad_accum} × seq_len {self.seq_len}); raise the budget or shrink the batch")
        return steps

    def warmup_steps(self) -> int:
        return max(1, round(self.warmup * self.total_steps()))


TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
#: Train keys that may change on ``--resume`` without changing the trajectory (``adamw_impl``: only its rounding; a
#: resumed run keeps its recorded implementation unless one is asked for, ``resume.recorded_adamw_impl``).
RESUMABLE_KEYS = frozenset({"eval_batch_size", "save_every", "save_every_minutes", "async_save", "keep_last",
                            "log_every", "device", "compile", "activation_checkpointing", "fsdp_replicate",
                            "dist_timeout_s", "peak_flops", "tensorboard", "wandb_project", "verify_data",
                            "on_nonfinite", "max_nonfinite_skips", "on_divergence", "loss_rise_margin",
                            "loss_rise_patience", "adamw_impl", "eval_tasks", "eval_tasks_every",
                            "eval_tasks_limit", "log_depth_every"})

#: The value of a train key that a recorded config written before the key existed must read as: the behaviour of
#: the release that wrote it (a new run gets the dataclass default). Add a key here with every key added to
#: ``TrainConfig`` whose default changes what a run does.
#: Release 97f8652 had no divergence guard (its runs resume warn-only: same numbers, same exit status, one line) and
#: no time-based saves, drew its windows uniformly with replacement, built AdamW with torch's default
#: implementation, had no document masking (listed although ``doc_mask``'s new-run default is the same: a missing
#: key otherwise compares as None on resume) and logged no depth statistics (``log_depth_every``: a resumed old run
#: logs what it did).
LEGACY_DEFAULTS: dict[str, Any] = {"on_divergence": "warn", "save_every_minutes": 0.0, "data_order": "random",
                                   "adamw_impl": "torch_default", "doc_mask": False, "log_depth_every": 0}


def with_legacy_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded train config (as a dict) with every key it lacks filled in: the ``LEGACY_DEFAULTS`` value, else
    the ``TrainConfig`` default (a key added with its default = the old behaviour reads as that)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                if f.name not in recorded and f.default is not dataclasses.MISSING}
    return {**defaults, **{k: v for k, v in LEGACY_DEFAULTS.items() if k not in recorded}, **recorded}


#: Keys whose value ``none`` is the string (``cross_layer="none"``: vanilla), not "unset".
NONE_IS_A_NAME = frozenset({"cross_layer"})


def parse_value(text: str, key: str | None = None) -> Any:
    """A ``--set`` value as TOML (``3``, ``1e-3``, ``true``, ``"x"``); bare words stay strings; ``none``/``null``
    is ``None``, except for ``key`` in ``NONE_IS_A_NAME`` (``--set cross_layer=none`` is the vanilla model)."""
    import tomllib

    word = text.strip().lower()
    if word in ("none", "null"):
        return "none" if key in NONE_IS_A_NAME and word == "none" else None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def split_overrides(pairs: Mapping[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``{key: value}`` into (model overrides, train overrides). Unknown keys raise ``ValueError`` naming
    ``source`` and the key."""
    model, train = {}, {}
    for key, value in pairs.items():
        if key in MODEL_KEYS:
            model[key] = value
        elif key in TRAIN_KEYS:
            train[key] = value
        else:
            raise ValueError(f"{source}: unknown key {key!r}{did_you_mean(key, MODEL_KEYS | TRAIN_KEYS)}; "
                             f"{LIST_KEYS_HINT}")
    return model, train


def list_keys() -> str:
    """The ``--set`` keys, one per line with their default, under a ``ModelConfig`` and a ``TrainConfig``
    heading (``depthattn train --list-keys``)."""
    out = []
    for cls in (ModelConfig, TrainConfig):
        table = "model" if cls is ModelConfig else "train"
        out.append(f"{cls.__name__} keys (--set KEY=VALUE, or a config file's [{table}] table):")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
            out.append(f"  {f.name} = {default!r}")
    return "\n".join(out)


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run config TOML: optional top-level ``preset`` and ``data``, tables ``[model]`` and ``[train]``.

    Returns ``{"preset": str | None, "data": str | None, "model": {...}, "train": {...}}``. Raises ``ValueError``
    naming the file and the key for unknown keys, a wrong section, a ``preset`` or ``data`` that is not a string, a
    TOML syntax error or a file that is not UTF-8 text; ``FileNotFoundError`` if the file is missing.
    """
    import tomllib

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} not found")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from e
    except UnicodeDecodeError as e:  # a binary file: TOML is UTF-8 text
        raise ValueError(f"{path}: not a TOML file (not UTF-8 text: byte {e.object[e.start:e.start + 1].hex()} at "
                         f"offset {e.start})") from None
    unknown = sorted(set(doc) - {"preset", "data", "model", "train"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {unknown}; expected preset, data, [model], [train]")
    for key, meaning in (("preset", "a preset name such as \"tiny\""), ("data", "a prepared data folder path")):
        if key in doc and not (isinstance(doc[key], str) and doc[key]):
            raise ValueError(f"{path}: `{key} = {doc[key]!r}` must be a non-empty string ({meaning})")
    out = {"preset": doc.get("preset"), "data": doc.get("data"), "model": {}, "train": {}}
    for section, keys in (("model", MODEL_KEYS), ("train", TRAIN_KEYS)):
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"{path}: [{section}] must be a table")
        bad = sorted(set(table) - keys)
        if bad:
            raise ValueError(f"{path}: unknown [{section}] key(s) {bad}{did_you_mean(bad[0], keys)}; {LIST_KEYS_HINT}")
        out[section] = dict(table)
    return out


def check_vocab_size(vocab_size: Any, tokenizer_size: int, tokenizer_file: str) -> None:
    """A model vocabulary holds every token of the tokenizer: ``vocab_size >= tokenizer_size`` (larger: padded rows
    that are never a target). ``ValueError`` in one line naming both and ``tokenizer_file`` otherwise (a
    non-integer is left for ``ModelConfig``'s own check)."""
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and vocab_size < tokenizer_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's vocabulary of {tokenizer_size} "
                         f"tokens ({tokenizer_file}); use at least {tokenizer_size} (larger pads the embedding), or "
                         f"drop the vocab_size setting to use the tokenizer's")


def resolve_model_config(preset: str, overrides: Mapping[str, Any], data_vocab_size: int,
                         tokenizer_file: str) -> ModelConfig:
    """``ModelConfig.from_preset(preset, **overrides)`` with ``vocab_size`` taken from the data's tokenizer, unless
    ``overrides`` sets a larger one: a padded embedding (the authors' 3B models: 50,304 rows for the GPT-NeoX-20B
    tokenizer's 50,277 tokens) whose extra rows no token of the data ever reaches, as input or target.

    Raises:
        ValueError: if ``overrides`` sets ``vocab_size`` below the tokenizer's vocabulary size (naming both and the
            tokenizer file), or for any invalid field.
    """
    overrides = dict(overrides)
    check_vocab_size(overrides.setdefault("vocab_size", data_vocab_size), data_vocab_size, tokenizer_file)
    return ModelConfig.from_preset(preset, **overrides)
