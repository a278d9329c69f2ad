"""Throughput and tracking: tokens/s, model FLOP/s and MFU, peak memory, and the metrics logger (``metrics.jsonl``,
TensorBoard event files, optionally Weights & Biases).

MFU (model FLOPs utilisation, PaLM appendix B; as torchtitan reports it) = achieved model FLOP/s per device / the
device's peak dense bf16 FLOP/s. Model FLOPs per trained token are 3 × the forward FLOPs of
``accounting.num_flops`` (the vanilla matmuls, sequence attention at the training length and the method's extra):
backward costs twice the forward; activation-checkpointing recomputation is not counted (that would be HFU).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ..accounting import num_flops
from ..config import ModelConfig
from ..fileio import atomic_write_text
from ..fileio import json_line
from ..layout import TENSORBOARD_DIR, WANDB_FILE

#: Peak dense (no sparsity) bf16 tensor-core FLOP/s per device, from the vendors' data sheets, matched in order
#: against ``torch.cuda.get_device_name()`` (first substring that occurs wins).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15), ("B200", 2.25e15), ("B100", 1.75e15),
    ("H200", 989e12), ("GH200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),
    ("H800", 989e12), ("H20", 148e12),
    ("A100", 312e12), ("A800", 312e12), ("A30", 165e12), ("A10", 125e12),
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),
    ("MI300X", 1307e12), ("MI325X", 1307e12), ("MI250X", 383e12),
)


#: Row keys measured on the machine (timing, memory), not part of the trajectory a resumed run repeats.
MEASURED_KEYS = frozenset({"tokens_per_s", "flops_per_s", "mfu", "peak_memory_gib"})


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Model FLOPs of one trained token: 3 × forward (``accounting.num_flops(cfg, seq_len).total``)."""
    return 3.0 * num_flops(cfg, seq_len).total


def device_peak_flops(device: torch.device, override: float | None = None) -> tuple[float | None, str]:
    """(peak bf16 FLOP/s of one device or None, a description). ``override`` (``TrainConfig.peak_flops``) wins; a
    CPU or an unknown GPU gives None (MFU is then omitted; the description says why)."""
    if override is not None:
        return float(override), f"TrainConfig.peak_flops={override:.3g}"
    if device.type != "cuda":
        return None, f"no peak FLOP/s for device {device} (MFU omitted; achieved FLOP/s reported)"
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_FLOPS:
        if key in name:
            return peak, f"{name}: peak {peak / 1e12:.0f} TFLOP/s bf16"
    return None, (f"unknown GPU {name!r}: MFU omitted (set TrainConfig.peak_flops to its dense bf16 FLOP/s to "
                  f"report it)")


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory so far: CUDA bytes allocated by tensors on ``device``, or on CPU the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB



@contextlib.contextmanager
def named_os_errors(path: str | os.PathLike):
    """Re-raise an ``OSError`` that names no file (a ``write`` or ``flush`` on a full disk) as the same error naming
    ``path``, so the CLI's line says which file could not be written."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(path)) from e

class Throughput:
    """Adds ``tokens_per_s`` (all ranks), ``flops_per_s`` (model FLOP/s per device), ``mfu`` (when the peak is
    known) and ``peak_memory_gib`` (this rank) to a step's metrics row."""

    def __init__(self, cfg: ModelConfig, seq_len: int, world_size: int, device: torch.device,
                 peak_override: float | None = None):
        self.flops_per_token = train_flops_per_token(cfg, seq_len)
        self.world = world_size
        self.device = device
        self.peak, self.note = device_peak_flops(device, peak_override)

    def update(self, row: dict[str, Any], tokens: int, seconds: float) -> dict[str, Any]:
        tps = tokens / seconds
        flops = tps / self.world * self.flops_per_token
        row.update(tokens_per_s=tps, flops_per_s=flops)
        if self.peak:
            row["mfu"] = flops / self.peak
        row["peak_memory_gib"] = peak_memory_bytes(self.device) / 2**30
        return row


def new_wandb_id() -> str:
    """A fresh W&B run id: 8 random lowercase hex characters (W&B ids are letters, digits, ``-`` and ``_``)."""
    import secrets

    return secrets.token_hex(4)


def wandb_run_id(run_dir: Path, reuse: bool, new_id: Callable[[], str] = new_wandb_id) -> str:
    """The W&B run id of ``run_dir``: the one saved in its ``wandb.json`` when ``reuse`` and the file holds one,
    else ``new_id()``, saved there (atomically) before W&B is started."""
    path = run_dir / WANDB_FILE
    if reuse and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8")).get("id")
        except (OSError, ValueError, AttributeError):
            saved = None  # unreadable: a new W&B run, said by W&B itself
        if isinstance(saved, str) and saved:
            return saved
    run_id = new_id()
    atomic_write_text(path, json.dumps({"id": run_id}) + "\n")
    return run_id


class MetricsLogger:
    """Rank 0's sinks for metrics rows: ``metrics.jsonl`` (appended, flushed per row, strict JSON: a non-finite
    value such as the loss of a skipped step is written as null), TensorBoard event files
    under ``tensorboard/`` (``tensorboard=True``) and a Weights & Biases run (``wandb_project``; honours
    ``WANDB_MODE=offline``). Other ranks get a logger that writes nothing.

    ``purge_step``: the first step this session logs. A resumed run redoes the steps after its checkpoint, which an
    earlier session may have logged already: ``metrics.jsonl`` is truncated before the logger opens it
    (``RunFolder.start``), and the TensorBoard writer is opened with ``SummaryWriter(purge_step=...)``, whose
    ``SessionLog.START`` event at that step makes TensorBoard drop the earlier sessions' events at it and after,
    so each step is shown once.

    W&B: the run id is kept in the run folder's ``wandb.json`` (``layout.WANDB_FILE``); with ``wandb_resume``
    (a session continuing logged steps) a saved id is reused (``wandb.init(id=..., resume="allow")``), so a resumed
    run logs into the same W&B run; otherwise a new id is drawn and saved.

    Raises ``ValueError`` for ``wandb_project`` without the ``wandb`` package installed.
    """

    def __init__(self, run_dir: Path, metrics_file: str, *, enabled: bool, tensorboard: bool = True,
                 wandb_project: str | None = None, config: Mapping[str, Any] | None = None,
                 purge_step: int | None = None, wandb_resume: bool = False):
        self.file = self.tb = self.wandb = None
        if wandb_project is not None:
            try:
                import wandb
            except ImportError:
                raise ValueError(f"TrainConfig.wandb_project={wandb_project!r} needs the wandb package (pip install "
                                 f"wandb), which is not installed; unset it to log to metrics.jsonl and "
                                 f"TensorBoard only") from None
        if not enabled:
            return
        self.file = open(run_dir / metrics_file, "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            with named_os_errors(run_dir / TENSORBOARD_DIR):  # its writer thread's full disk, re-raised here
                self.tb = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge_step)
        if wandb_project is not None:
            run_id = wandb_run_id(run_dir, wandb_resume)
            self.wandb = wandb.init(project=wandb_project, dir=str(run_dir), name=run_dir.name, id=run_id,
                                    config=dict(config or {}), resume="allow",
                                    mode=os.environ.get("WANDB_MODE", "online"))

    def log(self, row: Mapping[str, Any]) -> None:
        if self.file is None:
            return
        with named_os_errors(self.file.name):  # a full disk names metrics.jsonl, not only the run folder
            self.file.write(json_line(row))
            self.file.flush()
        step = int(row["step"])
        scalars = {k: float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        if self.tb is not None:
            with named_os_errors(self.tb.log_dir):
                for key, value in scalars.items():
                    self.tb.add_scalar(tensorboard_tag(key), value, step)
                self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def sync(self) -> None:
        """Make the rows written so far durable (``fsync``): called before a checkpoint is written."""
        if self.file is not None:
            with named_os_errors(self.file.name):
                self.file.flush()
                os.fsync(self.file.fileno())

    def close(self) -> None:
        if self.file is not None:
            with named_os_errors(self.file.name):
                self.file.close()
        if self.tb is not None:
            with named_os_errors(self.tb.log_dir):
                self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except OSError:
            if exc is None:  # a failure of its own; while another error is on its way out, that one is reported
                raise


def tensorboard_tag(key: str) -> str:
    """A row key's TensorBoard tag: ``val/loss``, a key with a slash as it is (``task/arc_easy/acc``,
    ``depth/L3/self``, ``grad_norm/L3``), else ``train/<key>``."""
    return "val/loss" if key == "val_loss" else key if "/" in key else f"train/{key}"


def progress_postfix(row: Mapping[str, Any], val_loss: float | None) -> dict[str, str]:
    """The progress bar's fields: loss, tokens/s, MFU (when known), validation loss (when measured)."""
    out = {"loss": f"{row['loss']:.3f}", "tok_s": f"{row['tokens_per_s']:.0f}"}
    if "mfu" in row:
        out["mfu"] = f"{100 * row['mfu']:.1f}%"
    if val_loss is not None:
        out["val"] = f"{val_loss:.3f}"
    return out


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
