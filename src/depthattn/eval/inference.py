"""Open a checkpoint for inference (``eval``, ``generate``, ``compare``): model, tokenizer, folder and device."""

from __future__ import annotations

import os

from .. import checkpoint as ckpt
from ..layout import TOKENIZER_FILE
from ..devices import resolve_device


def load_for_inference(path: str | os.PathLike, device: str = "auto", device_option: str = "--device"):
    """(model in eval mode, ``tokenizers.Tokenizer``, checkpoint folder, torch device) for a checkpoint or run
    folder (a Hugging Face Qwen3 folder too; a run folder: its newest checkpoint, read under a shared lock,
``checkpoint.open_checkpoint``, so it works while the run trains). All weight loading goes through
``hf.convert.load_any_model``.
    Raises ``ValueError`` / ``FileNotFoundError`` naming the file (or ``device_option`` for a device that is not
    available)."""
    from ..data import load_tokenizer
    from ..hf.convert import load_any_model  # imported here: transformers only for commands that open models

    dev = resolve_device(device, device_option)
    with ckpt.open_checkpoint(path) as folder:  # a shared lock for the read: a running trainer's pruning waits
        model = load_any_model(folder, device=dev)
        tok_file = folder / TOKENIZER_FILE
        if not tok_file.is_file() and not tok_file.is_symlink():
            raise FileNotFoundError(f"{tok_file} not found: the checkpoint has no tokenizer")
        tokenizer = load_tokenizer(tok_file, model.config.vocab_size)  # size and added tokens bounded first
    if tokenizer.get_vocab_size(with_added_tokens=True) > model.config.vocab_size:
        raise ValueError(f"{tok_file} has {tokenizer.get_vocab_size(with_added_tokens=True)} tokens, more than the "
                         f"model's vocab_size={model.config.vocab_size}")
    return model, tokenizer, folder, dev
