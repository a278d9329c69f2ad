"""What every model-folder reader returns: a :class:`ModelFolder` (config, tensors in our names, token ids).

A reader (``native``, ``qwen3``, ``authors``, ``dcp``) turns one on-disk format into a ``ModelFolder``: the
``ModelConfig`` it resolves, a :class:`LazyTensors` mapping from **our** tensor names (Hugging Face Qwen3's, plus
``*.cross_layer.*`` for a method's parameters) to tensors that are read only when asked for, the special-token ids,
and the lines a reader has to say (which choice it made and why). Nothing is loaded until a tensor is asked for, so a
converter can stream a folder of any size one tensor at a time (``depthattn.checkpoint.save_folder``) and a
loader can build the model first and then copy the tensors in (``depthattn.checkpoint.load_model``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from ..config import ModelConfig, read_json_object
from ..layout import CONFIG_FILE, GENERATION_CONFIG_FILE

SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


class LazyTensors(Mapping):
    """Our tensor name → tensor, each produced on access by ``load(name)`` from a header-only ``shapes`` table.

    ``shapes``: name → shape (no tensor read); iterating or ``len`` read nothing; ``self[name]`` reads one tensor
    (a ``KeyError`` for a name it does not hold)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], load: Callable[[str], torch.Tensor]):
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self._load = load

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        return self._load(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


@dataclasses.dataclass
class ModelFolder:
    """An opened model folder of any format.

    Attributes:
        path: the folder.
        format: ``"depthattn"``, ``"qwen3"``, ``"authors"`` or ``"dcp"``.
        config: the ``ModelConfig`` its files resolve to (validated).
        tensors: our names → tensors (:class:`LazyTensors`); for ``kind="qwen3"`` a method's parameters are absent.
        kind: how ``checkpoint.load_weights_into`` takes them (``"checkpoint"``: every key; ``"qwen3"``).
        source: the file errors about the weights name.
        token_ids: ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` (None: the tokenizer's EOS is used).
        notes: one line each, what the reader chose and why (the CLI prints them).
        dtype: the dtype the folder stores its weights in, when its config says (a converter's default).
    """

    path: Path
    format: str
    config: ModelConfig
    tensors: Mapping[str, torch.Tensor]
    kind: str = "checkpoint"
    source: str = ""
    token_ids: dict[str, int | None] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    dtype: torch.dtype | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor, read now (one copy of the weights)."""
        return {name: self.tensors[name] for name in self.tensors}


def hf_token_ids(path: str | os.PathLike) -> dict[str, int | None] | None:
    """``bos``/``eos``/``pad_token_id`` of a Hugging Face folder: ``generation_config.json`` over ``config.json``
    (``generate`` stops at the former's); None when neither names any (the tokenizer's EOS is used then). A missing
    ``pad_token_id`` is the EOS id."""
    ids: dict[str, int | None] = {}
    for name in (CONFIG_FILE, GENERATION_CONFIG_FILE):
        file = os.path.join(os.fspath(path), name)
        if os.path.isfile(file):
            values = read_json_object(file, "Hugging Face config")
            ids.update({k: values[k] for k in SPECIAL_TOKEN_KEYS if values.get(k) is not None})
    if ids and "pad_token_id" not in ids and isinstance(ids.get("eos_token_id"), int):
        ids["pad_token_id"] = ids["eos_token_id"]
    return ids or None


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of the ``DecoderLM`` that ``cfg`` builds, from a meta-device model (nothing allocated)."""
    from ..model import DecoderLM

    with torch.device("meta"):
        model = DecoderLM(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}
