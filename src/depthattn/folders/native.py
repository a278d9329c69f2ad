"""Reader of depthattn's own checkpoint folders (``model_type="depthattn"``, or the previous flat ``config.json``).

The weights are ``model.safetensors`` or sharded safetensors with ``model.safetensors.index.json``
(:mod:`depthattn.folders.shards`), in our names. Opening a folder first verifies every file its ``checksums.json``
lists (:func:`verify_folder`), then compares the raw ``config.json`` sizes with the safetensors headers, then every
shape with a meta-device model of the config (:func:`check_folder_shapes`), all before any tensor is read or any
model built; each failure is one ``ValueError`` naming the file (an :class:`~depthattn.fileio.IntegrityError` for a
damaged one). A sharded FSDP checkpoint (``dcp/``) is the ``dcp`` reader's.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .. import checkpoint_files as files
from .. import layout
from ..config import ModelConfig, read_json_object
from ..fileio import verify_manifest
from .authors_config import looks_like_authors
from .base import LazyTensors, ModelFolder, expected_shapes, hf_token_ids
from .shards import SINGLE_NAME, read_tensor, stored_shapes, weight_files

WEIGHTS_NAME = SINGLE_NAME
CONFIG_NAME = layout.CONFIG_FILE
#: The folder of an FSDP run's sharded (DCP) weights inside a checkpoint folder (``depthattn.run.dcp``).
SHARDED_DIR = layout.SHARDED_DIR
#: Files of a checkpoint folder only ``--resume`` reads, and verifies when it reads them (``run.checkpoints``);
#: :func:`verify_folder` leaves them out, so eval and export do not hash the optimizer state.
RESUME_ONLY_FILES = (layout.TRAINER_STATE_FILE,)


def model_config_from_json(values: dict, source: str) -> ModelConfig:
    """``checkpoint_files.model_config_from_json``, with the command to use when the object is an authors' config
    (hyq718/Depth-Attention: ``model_type="llama"`` with their switches): ``ValueError`` naming ``source``."""
    if looks_like_authors(values):
        raise ValueError(f"{source}: model_type={values.get('model_type')!r}: this looks like a hyq718/Depth-Attention "
                         f"checkpoint, not a depthattn one; convert it with depthattn convert --from-authors "
                         f"{os.path.dirname(source) or '.'} --out DIR")
    return files.model_config_from_json(values, source)


def load_config(path: str | os.PathLike) -> ModelConfig:
    """Read ``config.json`` of a depthattn checkpoint folder (Hugging Face or previous flat format). Raises
    ``ValueError`` / ``FileNotFoundError`` naming it (a Hugging Face Qwen3 folder, or another ``model_type``, is a
    ``ValueError`` saying so)."""
    file = os.path.join(os.fspath(path), CONFIG_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: {os.fspath(path)!r} is not a depthattn checkpoint folder")
    return model_config_from_json(read_json_object(file, "model config"), file)


def refuse_sharded(path: str | os.PathLike) -> None:
    """Raise ``ValueError`` (one line naming the folder) for a sharded FSDP checkpoint, which holds DCP shards
    instead of safetensors weights and is read through ``depthattn export``."""
    if os.path.isdir(os.path.join(os.fspath(path), SHARDED_DIR)) and weight_files(path) is None:
        raise ValueError(f"{os.fspath(path)} is a sharded FSDP checkpoint ({SHARDED_DIR}/ shards, no {WEIGHTS_NAME}): "
                         f"gather it first with `depthattn export {os.fspath(path)} --out DIR` and use DIR")


def verify_folder(path: str | os.PathLike) -> list[str]:
    """Verify every file of a checkpoint folder that its ``checksums.json`` lists (but :data:`RESUME_ONLY_FILES`)
    against its sha256, before anything in it is parsed; returns the names checked (none without a manifest).
    Raises :class:`~depthattn.fileio.IntegrityError` naming the first damaged or missing file."""
    return verify_manifest(path, skip=RESUME_ONLY_FILES)


def verify_file(folder: str | os.PathLike, name: str) -> bool:
    """Check file ``name`` of a checkpoint folder against the folder's ``checksums.json`` (written by
    ``fileio.write_folder_atomically``); raises :class:`~depthattn.fileio.IntegrityError` (a ``ValueError``) naming
    the file, with the expected and actual digest prefixes, on a mismatch. Returns False, checking nothing, for a
    folder without a manifest (written before manifests existed, or by another tool) or a file it does not list.
    Reads the whole file once per process (sha256 in 1 MiB chunks: about 2 s per GiB on one shared core,
    ``fileio.verify_manifest``)."""
    return bool(verify_manifest(folder, [name]))


def check_folder_shapes(path: str | os.PathLike, cfg: ModelConfig | None = None) -> ModelConfig:
    """Refuse a folder whose ``config.json`` shapes disagree with its safetensors headers, or whose config says
    ``tie_word_embeddings`` while the weights hold a different ``lm_head.weight`` (one ``ValueError`` naming the
    files), before any model is built; returns the config checked (``cfg``, or the folder's).

    The raw ``config.json`` sizes are compared with the headers first (``checkpoint_files.check_header_fields``:
    layer count and embedding), then ``ModelConfig`` validates them (upper bounds included), and only then is a
    meta-device model built for the full name and shape comparison: a hostile ``num_hidden_layers`` or
    ``vocab_size`` is one line, never an allocation. Before any of it, every file the folder's ``checksums.json``
    lists is verified (:func:`verify_folder`): a flipped bit in a safetensors header or ``config.json`` is an
    :class:`~depthattn.fileio.IntegrityError` naming the file, never a parse error or a shape complaint."""
    verify_folder(path)
    config_file = os.path.join(os.fspath(path), CONFIG_NAME)
    found = weight_files(path)
    file, stored = (found[0], stored_shapes(found[1])) if found is not None else (None, None)
    if cfg is None:
        if not os.path.isfile(config_file):
            load_config(path)  # raises FileNotFoundError naming it
        values = read_json_object(config_file, "model config")
        if stored is not None:
            files.check_header_fields(values, stored, config_file, file)
        cfg = model_config_from_json(values, config_file)
    elif stored is not None:
        files.check_header_fields(cfg.to_dict(), stored, config_file, file)
    if stored is not None:
        shapes = files.check_shapes(cfg, expected_shapes(cfg), file, config_file, stored)
        if cfg.tie_word_embeddings and {"lm_head.weight", "model.embed_tokens.weight"} <= set(shapes):
            where = found[1]
            if not torch.equal(read_tensor(where["lm_head.weight"], "lm_head.weight"),
                               read_tensor(where["model.embed_tokens.weight"], "model.embed_tokens.weight")):
                raise ValueError(f"{file} holds an untied lm_head.weight, but the config says "
                                 f"tie_word_embeddings=true; fix the config or the weights")
    return cfg


def read_safetensors(file: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file; a truncated or corrupt file raises ``ValueError`` naming it."""
    try:
        return load_file(file)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read weights {os.fspath(file)} (truncated or corrupt?): {e}") from e


def _weights(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """(file named in errors, name → file) of a checkpoint's weights, each verified against ``checksums.json``
    when listed there; ``FileNotFoundError`` for a folder without weights."""
    refuse_sharded(path)
    found = weight_files(path)
    if found is None:
        raise FileNotFoundError(f"{os.path.join(os.fspath(path), WEIGHTS_NAME)} not found: the checkpoint has no "
                                f"safetensors weights")
    for file in sorted(set(found[1].values()) | {found[0]}):
        verify_file(path, os.path.relpath(file, path).replace(os.sep, "/"))
    return found


def load_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read the weights (``model.safetensors`` or every shard of ``model.safetensors.index.json``), each file
    verified against the folder's ``checksums.json`` when it has one (:func:`verify_file`;
    :class:`~depthattn.fileio.IntegrityError` naming the file on a mismatch); a truncated or corrupt file raises
    ``ValueError`` naming it."""
    _, where = _weights(path)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(set(where.values())):
        state.update(read_safetensors(file))
    return state


def open_native(path: str | os.PathLike) -> ModelFolder:
    """A depthattn checkpoint folder as a :class:`~depthattn.folders.base.ModelFolder` (config and shapes checked
    by :func:`check_folder_shapes`, weights verified, nothing read yet)."""
    cfg = check_folder_shapes(path)
    source, where = _weights(path)
    tensors = LazyTensors(stored_shapes(where), lambda name: read_tensor(where[name], name))
    return ModelFolder(Path(path), "depthattn", cfg, tensors, "checkpoint", source, hf_token_ids(path))
