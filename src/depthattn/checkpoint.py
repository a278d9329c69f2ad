"""Model checkpoints: a folder with ``model.safetensors`` and ``config.json`` (``ModelConfig``), written atomically.

A checkpoint folder is first assembled under a temporary name beside the target and then renamed into place, so a
crash never leaves a half-written checkpoint under the real name. Loading checks the config, the file, every key
and every shape, and raises ``ValueError`` naming the file on any mismatch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .fileio import write_folder_atomically
from .model import DecoderLM

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def model_state_dict(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, tied LM head stored once (safetensors refuses shared storage)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_model_files(model: DecoderLM, folder: str) -> None:
    """Write ``model.safetensors`` and ``config.json`` into an existing folder (no atomicity of its own)."""
    save_file(model_state_dict(model), os.path.join(folder, WEIGHTS_NAME), metadata={"format": "pt"})
    model.config.save_json(os.path.join(folder, CONFIG_NAME))


def save_model(model: DecoderLM, path: str | os.PathLike) -> None:
    """Write a model checkpoint folder atomically."""
    write_folder_atomically(path, lambda tmp: save_model_files(model, tmp))


def load_config(path: str | os.PathLike) -> ModelConfig:
    """Read ``config.json`` of a checkpoint folder. Raises ``ValueError`` / ``FileNotFoundError`` naming it."""
    file = os.path.join(os.fspath(path), CONFIG_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: {os.fspath(path)!r} is not a depthattn checkpoint folder")
    from .hf.convert import is_qwen3_folder, qwen3_to_model_config, _read_json  # HF Qwen3 folders too
    if is_qwen3_folder(path):
        return qwen3_to_model_config(_read_json(file), source=file)
    return ModelConfig.load_json(file)


def load_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read ``model.safetensors``; a truncated or corrupt file raises ``ValueError`` naming it."""
    file = os.path.join(os.fspath(path), WEIGHTS_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: the checkpoint has no safetensors weights")
    try:
        return load_file(file)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read weights {file} (truncated or corrupt?): {e}") from e


def load_weights_into(model: DecoderLM, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state`` into ``model`` with strict key and shape checks; errors name ``source``."""
    expected = model.state_dict()
    if model.config.tie_word_embeddings:
        state = dict(state)
        embed, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
        if embed is not None and head is not None and not torch.equal(embed, head):
            raise ValueError(f"{source} holds an untied lm_head.weight, but the config says "
                             f"tie_word_embeddings=true; fix the config or the weights")
        state.setdefault("lm_head.weight", embed)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source} does not match the model config: missing keys {missing[:5]}"
                         f"{'…' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
                         f"{'…' if len(unexpected) > 5 else ''}")
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise ValueError(f"{source}: {key} has shape {tuple(state[key].shape)}, the config needs "
                             f"{tuple(tensor.shape)}")
    model.load_state_dict(state, strict=True)


def load_model(path: str | os.PathLike, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None) -> DecoderLM:
    """Build the model of a checkpoint folder and load its weights (strict); a Hugging Face Qwen3 folder
    (``"model_type": "qwen3"``) loads as ``cross_layer="none"`` (``depthattn.hf.convert.load_qwen3``)."""
    from .hf.convert import is_qwen3_folder, load_qwen3
    if is_qwen3_folder(path):
        model = load_qwen3(path)
    else:
        model = DecoderLM(load_config(path))
        load_weights_into(model, load_state(path), os.path.join(os.fspath(path), WEIGHTS_NAME))
    model.to(device=device)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


# ---------------------------------------------------------------------------------------------------- run folders
#: A run folder keeps its checkpoints under ``CHECKPOINT_DIR/step_XXXXXXXX/`` (``depthattn.training.runs``).
CHECKPOINT_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


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
    if (path / CONFIG_NAME).is_file():
        return path
    dirs = checkpoint_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"{path} is neither a checkpoint folder (no {CONFIG_NAME}) nor a run folder "
                                f"with checkpoints under {CHECKPOINT_DIR}/")
    return dirs[-1]
