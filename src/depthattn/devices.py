"""Which device and precision a command runs in: one rule for training, evaluation, comparison and generation.

``precision = "auto"`` resolves to float32 on CPU and bf16 autocast (float32 master weights) on CUDA; the resolved
precision is what ``run.json`` records and what a resumed run must keep.
"""

from __future__ import annotations

import platform

import torch


def resolve_device(name: str, option: str = "TrainConfig.device") -> torch.device:
    """``auto`` → cuda if available, else cpu; otherwise the named device. ``ValueError`` naming ``option`` (the
    setting or flag it came from) for a bad name or CUDA that is not available."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    given = f"{option} {name}" if option.startswith("--") else f"{option}={name!r}"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"{given} is not a device ({e})") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{given}: CUDA is not available on this machine (use cpu or auto)")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA under ``auto``; float32 (no autocast) on CPU under ``auto``."""
    if precision == "float32" or (precision == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def resolved_precision(amp: torch.dtype | None) -> str:
    """The precision a run actually trains in, as recorded in ``run.json``: ``"float32"`` or ``"bfloat16"``."""
    return "float32" if amp is None else str(amp).removeprefix("torch.")


def accelerator_name(device: str) -> str | None:
    """The name of the CUDA device a device setting runs on (``torch.cuda.get_device_name``, e.g. ``NVIDIA H200``):
    for ``cuda`` / ``cuda:N``, and for ``auto`` where CUDA is available; None for any other setting or where CUDA is
    not available."""
    if not (device.startswith("cuda") or device == "auto") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.device(device) if device.startswith("cuda") else 0)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform.processor()`` or the machine type)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
