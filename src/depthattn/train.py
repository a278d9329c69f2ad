"""The training loop: typed ``TrainConfig``, run folders, checkpoints with exact resume, periodic validation.

Legend: B micro-batch rows, T sequence length, V vocab.

A *run folder* holds::

    run.json            resolved model + train config, data folder, package versions, git revision
    param_groups.json   which parameters get weight decay (optim.py)
    metrics.jsonl       one JSON object per logged step: step, tokens, loss, lr, grad_norm, tokens_per_s,
                        and val_loss when measured
    summary.json        written when the run reaches its last step
    checkpoints/step_XXXXXXXX/   model.safetensors, config.json, tokenizer.json, train_config.json,
                                 trainer_state.pt (optimizer, scheduler, RNG states, step, tokens seen, data position)

Every file is written atomically and every checkpoint folder is assembled under a temporary name
(``checkpoint.write_folder_atomically``), so a failure never damages what is already there. Training windows come from
``data.TokenBatches``, a pure function of ``(seed, step, micro_step)``; with the RNG, optimizer and scheduler states
restored, a resumed run repeats an uninterrupted one bit for bit on float32 CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import checkpoint as ckpt
from .config import ModelConfig, atomic_write_text
from .model import DecoderLM
from .optim import build_optimizer, build_scheduler

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
STATE_FILE = "trainer_state.pt"
TRAIN_CONFIG_FILE = "train_config.json"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


# ---------------------------------------------------------------------------------------------------- config
@dataclass
class TrainConfig:
    """Optimisation and bookkeeping settings (model architecture lives in ``ModelConfig``).

    The budget is ``steps`` optimizer steps, or ``tokens`` training tokens (``steps = tokens // tokens_per_step``);
    ``steps`` wins when both are set. One step consumes ``batch_size × grad_accum × seq_len`` tokens (per
    data-parallel rank). ``warmup`` is a fraction of the steps (paper: 0.02), at least one step.

    Raises:
        ValueError: naming the field and the value, for any impossible setting.
    """

    seed: int = 0
    steps: int | None = None
    tokens: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.02
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 16
    eval_batch_size: int = 8
    save_every: int = 0
    keep_last: int = 2
    log_every: int = 1
    precision: str = "auto"
    device: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    data_parallel: str | None = None

    def __post_init__(self) -> None:
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
        for name in ("seed", "eval_every", "save_every"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 0, name, "must be an integer >= 0")
        for name in ("steps", "tokens"):
            v = getattr(self, name)
            need(v is None or (is_int(v) and v >= 1), name, "must be an integer >= 1 (or unset)")
        for name in ("lr", "eps"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, name, "must be a finite number > 0")
        for name in ("min_lr_ratio", "beta1", "beta2"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and 0 <= v < 1 or (name == "min_lr_ratio" and v == 1), name,
                 "must be in [0, 1)")
        need(isinstance(self.warmup, (int, float)) and 0 <= self.warmup < 1, "warmup",
             "must be a fraction of the steps in [0, 1)")
        for name in ("weight_decay", "grad_clip"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, name, "must be a finite number >= 0")
        need(self.precision in ("auto", "float32", "bfloat16"), "precision", "must be auto, float32 or bfloat16")
        need(isinstance(self.device, str) and bool(self.device), "device", "must be auto, cpu, cuda or cuda:N")
        need(isinstance(self.compile, bool), "compile", "must be true or false")
        need(isinstance(self.activation_checkpointing, bool), "activation_checkpointing", "must be true or false")
        need(self.data_parallel in (None, "ddp", "fsdp"), "data_parallel", "must be null, 'ddp' or 'fsdp'")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """Build from a mapping; unknown keys raise ``ValueError`` naming them."""
        unknown = sorted(set(values) - TRAIN_KEYS)
        if unknown:
            raise ValueError(f"unknown TrainConfig key(s) {unknown}; valid keys are {sorted(TRAIN_KEYS)}")
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

    def total_steps(self) -> int:
        """Resolved number of optimizer steps. Raises ``ValueError`` if the budget is shorter than one step."""
        if self.steps is not None:
            return self.steps
        if self.tokens is None:
            raise ValueError("set a training budget: TrainConfig.steps or TrainConfig.tokens")
        steps = self.tokens // self.tokens_per_step()
        if steps < 1:
            raise ValueError(f"TrainConfig.tokens={self.tokens} is shorter than one optimizer step of "
                             f"{self.tokens_per_step()} tokens (batch_size {self.batch_size} × grad_accum "
                             f"{self.grad_accum} × seq_len {self.seq_len}); raise the budget or shrink the batch")
        return steps

    def warmup_steps(self) -> int:
        return max(1, round(self.warmup * self.total_steps()))


TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
#: Train keys that may change on ``--resume`` without changing the trajectory.
RESUMABLE_KEYS = frozenset({"eval_batch_size", "save_every", "keep_last", "log_every", "device", "compile",
                            "activation_checkpointing"})


def parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (``3``, ``1e-3``, ``true``, ``"x"``); bare words stay strings; ``none``/``null``
    is ``None``."""
    import tomllib

    if text.strip().lower() in ("none", "null"):
        return None
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
            raise ValueError(f"{source}: unknown key {key!r}; model keys: {sorted(MODEL_KEYS)}; "
                             f"train keys: {sorted(TRAIN_KEYS)}")
    return model, train


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a run config TOML: optional top-level ``preset`` and ``data``, tables ``[model]`` and ``[train]``.

    Returns ``{"preset": str | None, "data": str | None, "model": {...}, "train": {...}}``. Raises ``ValueError``
    naming the file and the key for unknown keys, a wrong section, or a TOML syntax error; ``FileNotFoundError`` if
    the file is missing.
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
    unknown = sorted(set(doc) - {"preset", "data", "model", "train"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {unknown}; expected preset, data, [model], [train]")
    out = {"preset": doc.get("preset"), "data": doc.get("data"), "model": {}, "train": {}}
    for section, keys in (("model", MODEL_KEYS), ("train", TRAIN_KEYS)):
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"{path}: [{section}] must be a table")
        bad = sorted(set(table) - keys)
        if bad:
            raise ValueError(f"{path}: unknown [{section}] key(s) {bad}; valid keys are {sorted(keys)}")
        out[section] = dict(table)
    return out


def resolve_model_config(preset: str, overrides: Mapping[str, Any], data_vocab_size: int,
                         tokenizer_file: str) -> ModelConfig:
    """``ModelConfig.from_preset(preset, **overrides)`` with ``vocab_size`` taken from the data's tokenizer.

    Raises:
        ValueError: if ``overrides`` sets ``vocab_size`` to anything but the tokenizer's vocabulary size (naming
            both and the tokenizer file), or for any invalid field.
    """
    overrides = dict(overrides)
    if "vocab_size" in overrides and overrides["vocab_size"] != data_vocab_size:
        raise ValueError(f"vocab_size={overrides['vocab_size']} does not match the tokenizer's vocabulary of "
                         f"{data_vocab_size} tokens ({tokenizer_file}); drop the vocab_size setting to use the "
                         f"tokenizer's")
    overrides["vocab_size"] = data_vocab_size
    return ModelConfig.from_preset(preset, **overrides)


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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"TrainConfig.device={name!r} is not a device ({e})") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device={name!r}: CUDA is not available on this machine")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA under ``auto``; float32 (no autocast) on CPU under ``auto``."""
    if precision == "float32" or (precision == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# ---------------------------------------------------------------------------------------------------- run folders
def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name))


def latest_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder as given, or the newest checkpoint of a run folder.

    Raises ``FileNotFoundError`` naming the folder if it is neither.
    """
    path = Path(path)
    if (path / ckpt.CONFIG_NAME).is_file():
        return path
    dirs = checkpoint_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"{path} is neither a checkpoint folder (no {ckpt.CONFIG_NAME}) nor a run folder "
                                f"with checkpoints under {CHECKPOINT_DIR}/")
    return dirs[-1]


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


def _diff(a: Mapping[str, Any], b: Mapping[str, Any], ignore: frozenset = frozenset()) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k) != b.get(k)]


# ---------------------------------------------------------------------------------------------------- state
def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"][:1]) + (tuple(state["python"][1]),) + tuple(state["python"][2:]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), *n[2:]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_trainer_state(checkpoint_dir: Path) -> dict[str, Any]:
    file = checkpoint_dir / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: the checkpoint has no trainer state to resume from")
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
    state = ckpt.load_state(path)
    own = model.state_dict()
    extra = [k for k in state if k not in own]
    bad = [k for k in extra if "cross_layer" not in k]
    if bad:
        raise ValueError(f"{source}: keys {bad[:5]} do not exist in the new model ({model.config.cross_layer}); "
                         f"is it a checkpoint of another architecture?")
    kept = sorted(k for k in own if k not in state)
    if any("cross_layer" not in k for k in kept):
        missing = [k for k in kept if "cross_layer" not in k]
        raise ValueError(f"{source} lacks backbone keys {missing[:5]} of the new model")
    merged = {k: own[k] for k in kept}
    merged.update({k: v for k, v in state.items() if k in own})
    ckpt.load_weights_into(model, merged, source)
    return kept


# ---------------------------------------------------------------------------------------------------- evaluation
def validation_windows(val: np.ndarray, seq_len: int, n: int) -> torch.Tensor:
    """``[n', T + 1]`` int64: ``n' = min(n, (N - 1) // T)`` non-overlapping windows spread evenly over the split
    (the fixed set used for periodic validation). Raises ``ValueError`` if the split is shorter than a window."""
    total = (len(val) - 1) // seq_len
    if total < 1:
        raise ValueError(f"the validation split has {len(val)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    idx = np.unique(np.linspace(0, total - 1, min(n, total)).round().astype(np.int64))
    return torch.from_numpy(np.stack([np.asarray(val[i * seq_len:i * seq_len + seq_len + 1], dtype=np.int64)
                                      for i in idx]))


@torch.no_grad()
def mean_loss(model: torch.nn.Module, windows_BT1: torch.Tensor, batch_size: int, device: torch.device,
              amp: torch.dtype | None) -> float:
    """Mean next-token cross-entropy (nats) over every target of ``windows`` (equal-length rows)."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows_BT1), batch_size):
        w = windows_BT1[i:i + batch_size].to(device)
        with autocast(device, amp):
            logits = model(w[:, :-1]).logits
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten(), reduction="sum"))
        count += w[:, 1:].numel()
    model.train(was)
    return total / count


# ---------------------------------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_val_loss: float | None
    train_tokens_per_s: float
    checkpoint: Path | None


def _save_checkpoint(run_dir: Path, model: DecoderLM, train_cfg: TrainConfig, data_dir: Path, state: dict) -> Path:
    step = state["step"]
    target = run_dir / CHECKPOINT_DIR / f"step_{step:08d}"

    def fill(tmp: str) -> None:
        ckpt.save_model_files(model, tmp)
        shutil.copyfile(data_dir / TOKENIZER_FILE, os.path.join(tmp, TOKENIZER_FILE))
        atomic_write_text(os.path.join(tmp, TRAIN_CONFIG_FILE), json.dumps(train_cfg.to_dict(), indent=2) + "\n")
        torch.save(state, os.path.join(tmp, STATE_FILE))

    ckpt.write_folder_atomically(target, fill)
    for old in checkpoint_dirs(run_dir)[:-train_cfg.keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def train(run_dir: str | os.PathLike, model_cfg: ModelConfig, train_cfg: TrainConfig, data_dir: str | os.PathLike,
          *, resume: bool = False, init_from: str | os.PathLike | None = None, stop_after: int | None = None,
          progress: bool = True, log: Callable[[str], None] = print) -> TrainResult:
    """Train ``model_cfg`` on the prepared data folder ``data_dir`` into ``run_dir``.

    ``resume``: continue from the newest checkpoint of ``run_dir`` (configs must match the recorded ones, except
    ``RESUMABLE_KEYS``). ``init_from``: start from a checkpoint's weights (``init_from_checkpoint``).
    ``stop_after``: return after this global step (as if interrupted; the last checkpoint stays resumable).

    Raises:
        ValueError: vocabulary mismatch with the data's tokenizer, a budget shorter than one step, a run folder that
            already holds checkpoints (without ``resume``), a config that differs from the checkpoint's on resume,
            a truncated checkpoint file (named), or any invalid setting. Nothing already written is modified.
    """
    from .data import TokenBatches, load_prepared

    run_dir, data_dir = Path(run_dir), Path(data_dir).resolve()
    if train_cfg.data_parallel == "fsdp":
        raise ValueError("TrainConfig.data_parallel='fsdp': the trainer does not gather sharded checkpoints yet; "
                         "use 'ddp'")
    if train_cfg.data_parallel and not torch.distributed.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            raise ValueError(f"TrainConfig.data_parallel={train_cfg.data_parallel!r} needs a torchrun launch")
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available() and train_cfg.device == "auto":
            train_cfg = train_cfg.replace(device=f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    data = load_prepared(data_dir)
    if model_cfg.vocab_size != data.vocab_size:
        raise ValueError(f"ModelConfig.vocab_size={model_cfg.vocab_size} does not match the tokenizer's vocabulary of "
                         f"{data.vocab_size} tokens ({data_dir / TOKENIZER_FILE})")
    total_steps = train_cfg.total_steps()
    if train_cfg.seq_len > model_cfg.max_position_embeddings:
        raise ValueError(f"TrainConfig.seq_len={train_cfg.seq_len} exceeds ModelConfig.max_position_embeddings="
                         f"{model_cfg.max_position_embeddings}")
    if len(data.train) < train_cfg.seq_len + 1:
        raise ValueError(f"{data_dir}: the train split has {len(data.train)} tokens, fewer than seq_len + 1")
    val_windows = validation_windows(data.val, train_cfg.seq_len, train_cfg.eval_windows)
    train_cfg = train_cfg.replace(steps=total_steps)
    device = resolve_device(train_cfg.device)
    amp = autocast_dtype(train_cfg.precision, device)
    record = {"model": model_cfg.to_dict(), "train": train_cfg.to_dict(), "data": str(data_dir),
              "tokenizer_sha256": data.meta["tokenizer_sha256"]}

    resume_from: Path | None = None
    if resume:
        old = read_run(run_dir)
        problems = _diff(old["model"], record["model"]) + _diff(old["train"], record["train"], RESUMABLE_KEYS)
        if problems:
            raise ValueError(f"cannot resume {run_dir}: the requested config differs from the recorded one "
                             f"({'; '.join(problems)})")
        if old.get("tokenizer_sha256") != record["tokenizer_sha256"]:
            raise ValueError(f"cannot resume {run_dir}: data {data_dir} has another tokenizer than the run's "
                             f"{old.get('data')}")
        dirs = checkpoint_dirs(run_dir)
        resume_from = dirs[-1] if dirs else None
    elif checkpoint_dirs(run_dir):
        raise ValueError(f"run folder {run_dir} already holds checkpoints; pass --resume to continue it or choose "
                         f"another --out")
    run_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(train_cfg.seed)
    random.seed(train_cfg.seed)
    np.random.seed(train_cfg.seed)
    model = DecoderLM(model_cfg).to(device)
    if resume_from is not None:
        ck_cfg = ckpt.load_config(resume_from)
        problems = _diff(ck_cfg.to_dict(), model_cfg.to_dict())
        if problems:
            raise ValueError(f"checkpoint {resume_from} was written for another model config ({'; '.join(problems)})")
        ckpt.load_weights_into(model, ckpt.load_state(resume_from), str(resume_from / ckpt.WEIGHTS_NAME))
        state = load_trainer_state(resume_from)
    elif init_from is not None:
        kept = init_from_checkpoint(model, init_from)
        log(f"initialised from {init_from}" + (f" ({len(kept)} cross-layer tensors keep their init)" if kept else ""))
        state = None
    else:
        state = None

    from .parallelize import parallelize

    net = parallelize(model, activation_checkpointing=train_cfg.activation_checkpointing, compile=train_cfg.compile,
                      data_parallel=train_cfg.data_parallel)
    rank = torch.distributed.get_rank() if train_cfg.world_size() > 1 else 0
    is_main = rank == 0
    optimizer, groups = build_optimizer(model, train_cfg.lr, train_cfg.weight_decay,
                                        (train_cfg.beta1, train_cfg.beta2), train_cfg.eps)
    scheduler = build_scheduler(optimizer, train_cfg.warmup_steps(), total_steps, train_cfg.min_lr_ratio)
    step, tokens_seen = 0, 0
    if state is not None:
        try:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, RuntimeError) as e:
            raise ValueError(f"{resume_from / STATE_FILE}: optimizer/scheduler state does not fit the model ({e})") \
                from e
        _set_rng_state(state["rng"])
        step, tokens_seen = int(state["step"]), int(state["tokens_seen"])
        if int(state["data_position"]) != step:
            raise ValueError(f"{resume_from / STATE_FILE}: data position {state['data_position']} != step {step}")

    if is_main:
        if resume_from is None and not resume:
            atomic_write_text(run_dir / METRICS_FILE, "")
        elif resume:
            _truncate_metrics(run_dir, step)
        record.update(versions=versions(), git_revision=git_revision(), world_size=train_cfg.world_size(),
                      device=str(device), autocast=str(amp) if amp else "float32",
                      tokens_per_step=train_cfg.tokens_per_step(), warmup_steps=train_cfg.warmup_steps())
        atomic_write_text(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
        atomic_write_text(run_dir / "param_groups.json", json.dumps(groups, indent=2) + "\n")
        (run_dir / SUMMARY_FILE).unlink(missing_ok=True)

    batches = TokenBatches(data.train, train_cfg.batch_size, train_cfg.seq_len, seed=train_cfg.seed, rank=rank)
    last = total_steps if stop_after is None else min(total_steps, stop_after)
    val_loss = None
    train_time, train_tokens = 0.0, 0
    saved: Path | None = resume_from
    net.train()
    bar = tqdm(total=total_steps, initial=step, desc=f"train {model_cfg.cross_layer}", unit="step",
               disable=not (progress and is_main), dynamic_ncols=True)
    metrics_file = open(run_dir / METRICS_FILE, "a", encoding="utf-8") if is_main else None
    try:
        while step < last:
            t0 = time.perf_counter()
            lr = scheduler.get_last_lr()[0]
            loss_sum = 0.0
            for micro in range(train_cfg.grad_accum):
                w = batches.batch(step, micro).to(device)
                sync = contextlib.nullcontext()
                if train_cfg.data_parallel == "ddp" and micro < train_cfg.grad_accum - 1:
                    sync = net.no_sync()
                with sync:
                    with autocast(device, amp):
                        logits = net(w[:, :-1]).logits
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten())
                    (loss / train_cfg.grad_accum).backward()
                loss_sum += float(loss.detach())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
                              if train_cfg.grad_clip > 0 else
                              torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += train_cfg.tokens_per_step()
            dt = time.perf_counter() - t0
            train_time += dt
            train_tokens += train_cfg.tokens_per_step()
            train_loss = loss_sum / train_cfg.grad_accum
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"training loss became {train_loss} at step {step}")
            row: dict[str, Any] = {"step": step, "tokens": tokens_seen, "loss": train_loss, "lr": lr,
                                   "grad_norm": grad_norm, "tokens_per_s": train_cfg.tokens_per_step() / dt}
            if (train_cfg.eval_every and step % train_cfg.eval_every == 0) or step == total_steps:
                val_loss = mean_loss(model, val_windows, train_cfg.eval_batch_size, device, amp)
                row["val_loss"] = val_loss
            if metrics_file and (step % train_cfg.log_every == 0 or "val_loss" in row or step == last):
                metrics_file.write(json.dumps(row) + "\n")
                metrics_file.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            **({"val": f"{val_loss:.3f}"} if val_loss is not None else {}))
            if is_main and ((train_cfg.save_every and step % train_cfg.save_every == 0) or step == total_steps):
                state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                         "rng": _rng_state(), "step": step, "tokens_seen": tokens_seen, "data_position": step}
                saved = _save_checkpoint(run_dir, model, train_cfg, data_dir, state)
            if train_cfg.world_size() > 1 and train_cfg.save_every and step % train_cfg.save_every == 0:
                torch.distributed.barrier()
    finally:
        bar.close()
        if metrics_file:
            metrics_file.close()
    tps = train_tokens / train_time if train_time > 0 else float("nan")
    if is_main and step == total_steps:
        summary = {"steps": step, "tokens": tokens_seen, "final_val_loss": val_loss, "train_tokens_per_s": tps,
                   "train_seconds_this_session": train_time, "checkpoint": str(saved) if saved else None}
        atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return TrainResult(run_dir, step, tokens_seen, val_loss, tps, saved)
