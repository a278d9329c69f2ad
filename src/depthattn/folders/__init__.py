"""Model folders on disk, one reader per format, behind one :func:`open_model`.

========== ======================================================================== ===============================
format     what the folder is                                                       reader
========== ======================================================================== ===============================
depthattn  our checkpoints (``model_type="depthattn"`` or the previous flat config) ``folders.native.open_native``
qwen3      Hugging Face Qwen3 (``model_type="qwen3"``)                               ``folders.qwen3.open_qwen3``
authors    hyq718/Depth-Attention's Llama + q/k-norm (``llama`` + their switches)   ``folders.authors.open_authors``
dcp        an FSDP run's sharded checkpoint (``dcp/``, no safetensors)              ``folders.dcp.open_dcp``
========== ======================================================================== ===============================

Each reader returns a :class:`~depthattn.folders.base.ModelFolder`: the ``ModelConfig``, the tensors in our names
(read on demand), the special-token ids and what it chose. Loading (``depthattn.checkpoint.load_model``),
converting (``depthattn convert``) and exporting (``depthattn export``) all open folders here; the readers import
only lower layers (config, checkpoint_files, fileio, model), never the loaders above them. The readers are imported
when a folder is opened, so importing one of them (``folders.authors_config``) costs nothing else.
"""

from __future__ import annotations

import os
from typing import Any

from ..layout import CONFIG_FILE

FORMATS = ("depthattn", "qwen3", "authors", "dcp")


def folder_format(path: str | os.PathLike) -> str:
    """Which reader opens ``path``: from ``config.json``'s ``model_type`` / ``architectures`` and the weights
    present; a folder without ``config.json`` is "depthattn" (whose reader says it is missing)."""
    from ..config import read_json_object
    from .authors_config import looks_like_authors
    from .dcp import is_dcp_folder

    file = os.path.join(os.fspath(path), CONFIG_FILE)
    if not os.path.isfile(file):
        return "depthattn"
    values = read_json_object(file, "model config")
    architectures = values.get("architectures")
    if values.get("model_type") == "qwen3" or (isinstance(architectures, list) and "Qwen3ForCausalLM" in architectures):
        return "qwen3"
    if looks_like_authors(values):  # a Llama folder with their switches
        return "authors"
    return "dcp" if is_dcp_folder(path) else "depthattn"


def open_model(path: str | os.PathLike, formats: tuple[str, ...] = FORMATS, overrides: dict[str, Any] | None = None,
               qk_norm_position: str | None = None, allow_vanilla: bool = False):
    """Open a model folder of any of ``formats`` (:data:`FORMATS`) as a
    :class:`~depthattn.folders.base.ModelFolder`; nothing but headers and configs is read.

    A folder of a format not in ``formats`` is read as a depthattn checkpoint, whose reader refuses it in one line
    saying what it is and which command reads it. ``overrides``: ``ModelConfig`` fields for a Qwen3 folder (the
    method and its knobs). ``qk_norm_position`` / ``allow_vanilla``: the authors' reader's choices
    (``folders.authors_config``). Every file ``checksums.json`` lists is verified before any is parsed
    (``folders.native.verify_folder``). Raises ``ValueError`` / ``FileNotFoundError`` naming the file."""
    from .native import verify_folder

    verify_folder(path)
    fmt = folder_format(path)
    if fmt not in formats:
        fmt = "depthattn"
    if fmt == "qwen3":
        from .qwen3 import open_qwen3

        return open_qwen3(path, **(overrides or {}))
    if fmt == "authors":
        from .authors import open_authors

        return open_authors(path, qk_norm_position, allow_vanilla)
    if fmt == "dcp":
        from .dcp import open_dcp

        return open_dcp(path)
    from .native import open_native

    return open_native(path)
