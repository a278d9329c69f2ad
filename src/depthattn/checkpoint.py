"""Model checkpoints: Hugging Face model folders (``model_type="depthattn"``), written atomically.

A checkpoint folder holds ``model.safetensors`` (the Hugging Face Qwen3 key names; or, as ``convert --from-authors``
writes a large model, safetensors shards with ``model.safetensors.index.json``), ``config.json`` (``model_type``
``"depthattn"``, ``architectures``, ``auto_map``), ``generation_config.json`` (EOS and padding ids),
``configuration.py`` / ``modeling.py`` (for ``trust_remote_code``) and, when a tokenizer is given, ``tokenizer.json``
and ``tokenizer_config.json`` (``depthattn.checkpoint_files``; docs/hf.md). Training adds its state beside them.

Reading goes through :func:`depthattn.folders.open_model`, one reader per on-disk format (ours, Hugging Face Qwen3,
the authors' hyq718/Depth-Attention folders, DCP): :func:`load_model` opens ours and the authors', builds the model
and copies the tensors in (:func:`model_from_folder`); :func:`save_folder_files` streams any opened folder into a
checkpoint one tensor at a time. The checks below are the ``native`` reader's (``depthattn.folders.native``,
re-exported here).

A checkpoint folder is first assembled under a temporary name beside the target and then renamed into place, so a
crash never leaves a half-written checkpoint under the real name. Loading checks the config, the safetensors header
against the config's shapes (before the model is built), every key and every shape, and raises ``ValueError``
naming the file on any mismatch. Folders of the previous format (flat ``config.json``) still load.

Integrity: ``write_folder_atomically`` records the sha256 of every file in ``checksums.json`` (written last).
Opening a folder (``check_folder_shapes``, hence ``load_model``, ``from_pretrained``, eval, generate, export,
convert) first verifies every file the manifest lists (:func:`verify_folder`; ``trainer_state.pt`` only when resume
reads it), whatever its modification time, and only then parses ``config.json`` and the safetensors header; a
mismatch is an :class:`IntegrityError` (a ``ValueError``) naming the file. Each file is hashed once per process
(``fileio.verify_manifest``): ``sha256_file`` ran at 0.5 GiB/s (2 s per GiB) on the shared 2-core CI machine
(docs/reliability.md).
Our writers that rewrite a file of a sealed folder (``DepthAttnForCausalLM.save_pretrained``) rewrite its entry
(``fileio.rewrite_manifest_entries``); a file edited by hand is refused until ``checksums.json`` is deleted.
Folders without a manifest load unchecked.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from . import checkpoint_files as files
from .accounting import check_model_fits
from .config import ModelConfig
from .cross_layer import names as method_names
from .fileio import IntegrityError, write_folder_atomically
from .folders import open_model
from .folders.base import ModelFolder, expected_shapes
from .folders.native import (CONFIG_NAME, RESUME_ONLY_FILES, SHARDED_DIR, WEIGHTS_NAME,
                             check_folder_shapes, load_config, load_state, read_safetensors, refuse_sharded,
                             verify_file, verify_folder)
from .folders.shards import DEFAULT_SHARD_BYTES, write_shards
from .layout import CHECKPOINT_DIR, STEP_DIR
from .locking import lock_folder
from .model import DecoderLM

__all__ = [
    "CONFIG_NAME", "IntegrityError", "LOADABLE_FORMATS", "ModelFolder", "RESUME_ONLY_FILES", "SHARDED_DIR",
    "TOKENIZER_NAME", "WEIGHTS_NAME", "check_folder_shapes", "expected_shapes", "latest_checkpoint", "load_config",
    "load_model", "load_state", "load_weights_into", "model_from_folder", "model_state_dict", "open_checkpoint",
    "read_safetensors", "refuse_sharded", "save_config_files", "save_folder_files", "save_model", "save_model_files",
    "save_safetensors", "save_torch", "verify_file", "verify_folder",
]

TOKENIZER_NAME = files.TOKENIZER_NAME


def model_state_dict(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, tied LM head stored once (safetensors refuses shared storage).

    Whether the head is tied is read from the tensors (identity), not the config flag: a model whose config says
    ``tie_word_embeddings`` but whose ``lm_head.weight`` is its own tensor (e.g. built on the meta device and
    untied by ``to_empty``) raises ``ValueError`` instead of silently dropping the trained head.
    """
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    if model.config.tie_word_embeddings and not tied:
        raise ValueError("the model's config says tie_word_embeddings=true but lm_head.weight is not the embedding's "
                         "tensor (untied, e.g. by to_empty); call model.tie_weights() before saving")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    return state


def save_safetensors(state: dict[str, torch.Tensor], file: str | os.PathLike) -> None:
    """``safetensors.torch.save_file(state, file, metadata={"format": "pt"})``; a write the file system refuses
    (a full disk, a quota) is the ``OSError`` it is, naming ``file`` (safetensors reports it as a
    ``SafetensorError`` whose message ends in ``(os error N)``)."""
    try:
        save_file(state, os.fspath(file), metadata={"format": "pt"})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), os.fspath(file)) from e


def save_torch(obj: object, file: str | os.PathLike) -> None:
    """``torch.save(obj, file)`` through a Python file object (the same bytes), so that a write the file system
    refuses is an ``OSError`` naming ``file``. ``torch.save`` to a path reports a full disk as a ``RuntimeError``
    "unexpected pos"; to a file object, its zip writer still raises that ``RuntimeError`` when it closes the archive
    after the refused write, with the write's ``OSError`` as its context: that ``OSError`` is raised instead."""
    try:
        with open(file, "wb") as f:
            torch.save(obj, f)
    except (OSError, RuntimeError) as e:
        refused = _os_error_in_chain(e)
        if refused is None or refused.errno is None or (refused is e and e.filename is not None):
            raise
        raise OSError(refused.errno, refused.strerror, refused.filename or os.fspath(file)) from e


def _os_error_in_chain(e: BaseException) -> OSError | None:
    """The first ``OSError`` among ``e`` and its causes / contexts (``__cause__``, else ``__context__``), or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def save_model_files(model: DecoderLM, folder: str, tokenizer_file: str | os.PathLike | None = None,
                     token_ids: dict[str, int | None] | None = None) -> None:
    """Write the Hugging Face model files into an existing folder (no atomicity of its own).

    ``model.safetensors``, ``config.json``, ``generation_config.json`` and the ``trust_remote_code`` modules;
    with ``tokenizer_file`` (a ``tokenizer.json``) also a copy of it. A ``tokenizer.json`` in the folder without a
    ``tokenizer_config.json`` gets one (``checkpoint_files.write_tokenizer_config``). ``token_ids`` (``eos_token_id``,
    ``pad_token_id``, ``bos_token_id``) default to the tokenizer's ``<|endoftext|>`` for EOS and padding.
    """
    state = model_state_dict(model)
    save_safetensors(state, os.path.join(folder, WEIGHTS_NAME))
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    save_config_files(model.config, folder, dtype, tokenizer_file, token_ids)


def save_config_files(cfg: ModelConfig, folder: str | os.PathLike, dtype: str,
                      tokenizer_file: str | os.PathLike | None = None,
                      token_ids: dict[str, int | None] | None = None) -> None:
    """Every Hugging Face file of a checkpoint folder but the weights (``save_model_files`` less
    ``model.safetensors``; also used for sharded FSDP checkpoints): the tokenizer with its ``tokenizer_config.json``
    (the data folder's own when ``tokenizer_file`` has one beside it, so declared special tokens carry over),
    ``config.json``, ``generation_config.json`` and the ``trust_remote_code`` modules. ``dtype``: the weights'
    (``"float32"``)."""
    folder = os.fspath(folder)
    tok = os.path.join(folder, TOKENIZER_NAME)
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, tok)
        beside = os.path.join(os.path.dirname(os.fspath(tokenizer_file)), files.TOKENIZER_CONFIG_NAME)
        if os.path.isfile(beside) and os.path.abspath(beside) != os.path.abspath(
                os.path.join(folder, files.TOKENIZER_CONFIG_NAME)):
            shutil.copyfile(beside, os.path.join(folder, files.TOKENIZER_CONFIG_NAME))
    if os.path.isfile(tok):
        if not os.path.isfile(os.path.join(folder, files.TOKENIZER_CONFIG_NAME)):
            files.write_tokenizer_config(folder, cfg.max_position_embeddings)
        if token_ids is None:
            token_ids = files.tokenizer_token_ids(tok)
    files.write_hf_files(folder, cfg, dtype, token_ids)


def save_model(model: DecoderLM, path: str | os.PathLike, tokenizer_file: str | os.PathLike | None = None,
               token_ids: dict[str, int | None] | None = None) -> None:
    """Write a model checkpoint folder atomically (``save_model_files`` into a temporary sibling, then renamed)."""
    write_folder_atomically(path, lambda tmp: save_model_files(model, tmp, tokenizer_file, token_ids))


def load_weights_into(model: DecoderLM, state: dict[str, torch.Tensor], source: str,
                      kind: str = "checkpoint") -> list[str]:
    """Copy ``state`` into ``model`` with strict key and shape checks; errors name ``source``.

    The one weight loader: checkpoints and resume, ``--init-from`` and Qwen3 import all come through here. ``kind``
    says what ``state`` is:

    * ``"checkpoint"``: a depthattn checkpoint of the model's own config: every key and every shape must match.
    * ``"init_from"``: a depthattn checkpoint that may use another ``cross_layer``: keys under ``cross_layer``
      that one side lacks keep the model's initialisation (missing) or are dropped (unexpected).
    * ``"qwen3"``: the tensors of a Hugging Face Qwen3 folder (``source`` names the folder): parameters only the
      model's method has (``*.cross_layer.*``) keep their vanilla-equivalent initialisation.

    With ``tie_word_embeddings`` the LM head is the embedding: a missing ``lm_head.weight`` is taken from
    ``model.embed_tokens.weight``, and a different one is refused (a Qwen3 folder's is ignored, as transformers
    does). Tensors are cast to the model's dtype. Returns the keys that kept their initialisation (sorted).
    Raises ``ValueError`` naming ``source`` for any other missing or unexpected key or any shape mismatch.
    """
    if kind not in ("checkpoint", "init_from", "qwen3"):
        raise ValueError(f"kind={kind!r} must be 'checkpoint', 'init_from' or 'qwen3'")
    expected = model.state_dict()
    state = dict(state)
    if model.config.tie_word_embeddings:
        embed, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
        if kind == "qwen3":
            state.pop("lm_head.weight", None)
        elif embed is not None and head is not None and not torch.equal(embed, head):
            raise ValueError(f"{source} holds an untied lm_head.weight, but the config says "
                             f"tie_word_embeddings=true; fix the config or the weights")
        state.setdefault("lm_head.weight", embed)
    missing = sorted(set(expected) - set(state))
    unexpected = [k for k in state if k not in expected]

    def method_only(key: str) -> bool:
        return ".cross_layer." in f".{key}"

    if kind == "checkpoint" and (missing or unexpected):
        unexpected = sorted(unexpected)
        raise ValueError(f"{source} does not match the model config: missing keys {missing[:5]}"
                         f"{'…' if len(missing) > 5 else ''}, unexpected keys {unexpected[:5]}"
                         f"{'…' if len(unexpected) > 5 else ''}")
    if kind == "init_from":
        bad = [k for k in unexpected if not method_only(k)]
        if bad:
            raise ValueError(f"{source}: keys {bad[:5]} do not exist in the new model ({model.config.cross_layer}); "
                             f"is it a checkpoint of another architecture?")
        if any(not method_only(k) for k in missing):
            raise ValueError(f"{source} lacks backbone keys {[k for k in missing if not method_only(k)][:5]} of "
                             f"the new model")
    if kind == "qwen3":
        backbone_missing = [k for k in missing if not method_only(k)]
        if unexpected or backbone_missing:
            raise ValueError(f"{source}: weights do not match a Qwen3 model of its config.json: unexpected "
                             f"{sorted(unexpected)[:5]}, missing {backbone_missing[:5]}")
    needs = "config.json needs" if kind == "qwen3" else "the config needs"
    for key, tensor in expected.items():
        if key in state and tuple(state[key].shape) != tuple(tensor.shape):
            raise ValueError(f"{source}: {key} has shape {tuple(state[key].shape)}, {needs} {tuple(tensor.shape)}")
    merged = {k: v for k, v in state.items() if k in expected}
    merged.update({k: expected[k] for k in missing})  # method tensors the source lacks keep their initialisation
    model.load_state_dict(merged, strict=True)
    return missing


#: The formats :func:`load_model` opens (``folders.FORMATS``): a Qwen3 folder is ``hf.convert.load_any_model``'s,
#: a sharded FSDP checkpoint is gathered by ``depthattn export`` first.
LOADABLE_FORMATS = ("depthattn", "authors")


def model_from_folder(folder: ModelFolder, device: torch.device | str = "cpu",
                      dtype: torch.dtype | None = None) -> DecoderLM:
    """Build the ``DecoderLM`` of an opened folder and copy its tensors in (:func:`load_weights_into`, the folder's
    ``kind``), in eval mode on ``device`` (and ``dtype``). Parameters that cannot fit in the memory available (on
    the CPU, where the model is built, and on ``device``) are refused before anything is built
    (``accounting.check_model_fits``)."""
    cfg = folder.config
    check_model_fits(cfg, "cpu", torch.float32, os.fspath(folder.path))
    if torch.device(device).type != "cpu":
        check_model_fits(cfg, device, dtype or torch.float32, os.fspath(folder.path))
    model = DecoderLM(cfg)
    load_weights_into(model, folder.state_dict(), folder.source, kind=folder.kind)
    model.to(device=device)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


def load_model(path: str | os.PathLike, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None) -> DecoderLM:
    """Build the model of a depthattn checkpoint folder (``model.safetensors`` or sharded with an index) or of an
    authors' folder (hyq718/Depth-Attention, converted on the fly: ``folders.authors``) and load its weights
    (strict). A Hugging Face Qwen3 folder raises ``ValueError``: ``depthattn.hf.convert.load_any_model`` opens any
    folder; a sharded FSDP checkpoint raises one naming ``depthattn export``. Memory is checked before anything is
    built (:func:`model_from_folder`)."""
    return model_from_folder(open_model(path, LOADABLE_FORMATS), device, dtype)


def save_folder_files(folder: ModelFolder, out: str | os.PathLike, dtype: torch.dtype | None = None,
                      tokenizer_file: str | os.PathLike | None = None,
                      shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[str]:
    """Write an opened folder (``kind="checkpoint"``: every tensor of its model present) into the existing folder
    ``out`` as a depthattn checkpoint, one tensor at a time: ``model.safetensors`` or shards of at most
    ``shard_bytes`` with ``model.safetensors.index.json``, then the Hugging Face files (:func:`save_config_files`).
    No model is built and no more than one tensor (with its cast to ``dtype``) is held at once. ``dtype``: of the
    weights written (default: the folder's, else float32). A tied head stored apart from the embedding is compared
    and dropped (``ValueError`` when it differs). Returns the weight files written."""
    if folder.kind != "checkpoint":
        raise ValueError(f"{folder.path}: a {folder.format} folder lacks its method's tensors; load it and save the "
                         f"model instead")
    cfg, tensors = folder.config, folder.tensors
    dtype = dtype or folder.dtype or torch.float32
    expected = expected_shapes(cfg)
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        if "lm_head.weight" in tensors and not torch.equal(tensors["lm_head.weight"],
                                                           tensors["model.embed_tokens.weight"]):
            raise ValueError(f"{folder.source} holds an untied lm_head.weight, but the config says "
                             f"tie_word_embeddings=true; fix the config or the weights")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{folder.source} lacks {missing[:5]} of its config's model")
    plan = {name: (shape, dtype) for name, shape in expected.items()}
    written = write_shards(out, plan, lambda name: tensors[name].to(dtype), shard_bytes)
    save_config_files(cfg, out, str(dtype).removeprefix("torch."), tokenizer_file, folder.token_ids)
    return written


# ---------------------------------------------------------------------------------------------------- run folders
def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's checkpoint folders, oldest first (temporary folders of an interrupted save are ignored)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name))


# A run folder keeps its checkpoints under ``CHECKPOINT_DIR/step_XXXXXXXX/`` (the names: ``depthattn.layout``;
# the folder's life: ``depthattn.run.folder``).


def latest_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder as given, or the newest checkpoint of a run folder.

    Raises ``FileNotFoundError`` naming the folder if it does not exist or is neither.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if (path / CONFIG_NAME).is_file():
        return path
    dirs = checkpoint_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"{path} is neither a checkpoint folder (no {CONFIG_NAME}) nor a run folder "
                                f"with checkpoints under {CHECKPOINT_DIR}/")
    return dirs[-1]


@contextlib.contextmanager
def open_checkpoint(path: str | os.PathLike) -> Iterator[Path]:
    """``with open_checkpoint(path) as folder:`` the checkpoint folder ``latest_checkpoint`` picks, held with a
    shared ``flock`` for the read, so a training run's pruning leaves it in place until the ``with`` ends (it is
    deleted at the run's next prune). A run folder whose newest checkpoint is pruned while we wait for the lock
    resolves again. Checkpoints are renamed into place only when complete, so no half-written one is ever found.
    On a file system without ``flock`` the folder is read unlocked. Raises ``FileNotFoundError`` as
    ``latest_checkpoint``."""
    for _ in range(5):
        folder = latest_checkpoint(path)
        try:
            fd = lock_folder(folder, exclusive=False, wait=True)
        except FileNotFoundError:
            continue  # pruned between the listing and the lock: the run has a newer one
        try:
            yield folder
        finally:
            if fd is not None:
                os.close(fd)
        return
    raise FileNotFoundError(f"{path}: its newest checkpoint kept disappearing while being opened (pruned by a "
                            f"running trainer); try again")


# ---------------------------------------------------------------------------------------------------- --init-from
def init_from_checkpoint(model: DecoderLM, path: str | os.PathLike) -> list[str]:
    """Load a checkpoint's weights into ``model`` through ``checkpoint.load_state`` / ``load_weights_into``.

    The checkpoint may use another ``cross_layer``: keys under ``cross_layer`` that one side lacks keep the new
    model's initialisation (missing) or are dropped (unexpected). Every other key and every shape must match.
    Returns the keys that kept their initialisation. Raises ``ValueError`` naming the file otherwise; for another
    vocabulary size, one line naming both and the ``vocab_size`` setting that fits (a padded vocabulary, larger
    than the data's tokenizer, is allowed: ``config.check_vocab_size``).
    """
    source = os.path.join(os.fspath(path), WEIGHTS_NAME)
    state = load_state(path)
    embed = state.get("model.embed_tokens.weight")
    if embed is not None and embed.ndim == 2 and embed.shape[0] != model.config.vocab_size:
        raise ValueError(f"{source} has vocab_size={embed.shape[0]} (model.embed_tokens.weight {tuple(embed.shape)}), "
                         f"the new model {model.config.vocab_size} (the data's tokenizer unless set); give --set "
                         f"vocab_size={embed.shape[0]} to start from it")
    return load_weights_into(model, state, source, kind="init_from")


def init_from_changes(path: str | os.PathLike, cfg: ModelConfig) -> list[str]:
    """The fields of the checkpoint ``path``'s ``config.json`` that ``cfg`` (the model ``--init-from`` loads it
    into) sets otherwise, as ``"name 'new' (checkpoint: 'old')"``: the backbone's (``qk_norm_position``,
    ``rope_theta``, ...), and the method's knobs when both use the same ``cross_layer`` (a new method starts from
    its own knobs). ``initializer_range`` is left out (the weights are loaded). Empty when the config cannot be
    read (the weights loaded, which is what counts)."""
    try:
        old = load_config(path).to_dict()
    except (ValueError, FileNotFoundError):
        return []
    new = cfg.to_dict()
    knob = tuple(f"{m}_" for m in method_names())
    same_method = old.get("cross_layer") == new["cross_layer"]
    return [f"{k} {new[k]!r} (checkpoint: {old.get(k)!r})" for k in new
            if k not in ("cross_layer", "initializer_range") and old.get(k) != new[k]
            and (same_method or not k.startswith(knob))]
