"""The safetensors weights of a model folder, one file or sharded, read and written one tensor at a time.

A folder holds its weights either as one ``model.safetensors`` or as shards named by a
``model.safetensors.index.json`` (the Hugging Face convention: ``{"metadata": {"total_size": bytes}, "weight_map":
{tensor name: shard file}}``, shards ``model-00001-of-00003.safetensors``, ...). :func:`weight_files` finds them and
refuses what cannot be read unambiguously (both forms, a shard the index names but the folder lacks, a
``model-*.safetensors`` the index does not name, a tensor the index puts in a shard that does not hold it);
:func:`stored_shapes` reads only the headers; :func:`read_tensor` reads one tensor (``safetensors.safe_open``: the
file is mapped, only that tensor is copied into memory).

:func:`write_shards` writes tensors given as a name → shape/dtype plan and a function that produces one tensor at a
time, so that no more than one tensor (plus the file system's page cache) is held while a folder of any size is
written: the safetensors layout (8-byte little-endian header length, the JSON header padded with spaces to a
multiple of 8, then each tensor's bytes in header order; safetensors' own format description) is written directly,
because ``safetensors.torch.save_file`` first copies every tensor of a file into one ``bytes`` object. Files it
writes are read back by ``safetensors`` itself in the tests (``tests/folders/test_authors_import.py``). Errors are one
``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import layout
from ..checkpoint_files import safetensors_shapes
from ..config import read_json_object

SINGLE_NAME = layout.WEIGHTS_FILE
INDEX_NAME = layout.WEIGHTS_INDEX_FILE
#: Shards larger than this are split (bytes; Hugging Face's default ``max_shard_size`` is 5 GB).
DEFAULT_SHARD_BYTES = 2 << 30
_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")
#: safetensors dtype names of the torch dtypes a checkpoint holds.
DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
               torch.bool: "BOOL"}


def weight_files(folder: str | os.PathLike) -> tuple[str, dict[str, str]] | None:
    """(the file errors should name, tensor name → the file that holds it) of a folder's safetensors, or None when
    it has neither ``model.safetensors`` nor an index. Raises ``ValueError`` (one line, naming the file) for a
    folder with both, an index without a ``weight_map``, a shard the index names that is missing, a shard-named
    file the index does not name, or a tensor the index places in a shard that does not hold it."""
    folder = os.fspath(folder)
    single, index = os.path.join(folder, SINGLE_NAME), os.path.join(folder, INDEX_NAME)
    if os.path.isfile(single) and os.path.isfile(index):
        raise ValueError(f"{folder} holds both {SINGLE_NAME} and {INDEX_NAME}: keep one of them")
    if os.path.isfile(single):
        return single, {name: single for name in safetensors_shapes(single)}
    if not os.path.isfile(index):
        return None
    weight_map = read_json_object(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index} has no weight_map of tensor name -> shard file")
    named = sorted(set(weight_map.values()))
    for name in named:
        if os.path.basename(name) != name or not os.path.isfile(os.path.join(folder, name)):
            raise ValueError(f"{index} names shard {name!r}, which {folder} does not hold (missing shard)")
    extra = sorted(n for n in os.listdir(folder) if _SHARD.match(n) and n not in named)
    if extra:
        raise ValueError(f"{folder} holds {extra[0]}, a shard {INDEX_NAME} does not name (extra shard; "
                         f"{len(extra)} in all)")
    out: dict[str, str] = {}
    for name in named:
        file = os.path.join(folder, name)
        for key in safetensors_shapes(file):
            if weight_map.get(key) != name:
                raise ValueError(f"{file} holds {key}, which {index} places in {weight_map.get(key)!r}")
            out[key] = file
    missing = sorted(set(weight_map) - set(out))
    if missing:
        raise ValueError(f"{index} places {missing[0]} in {weight_map[missing[0]]}, which does not hold it")
    return index, out


def stored_shapes(files: Mapping[str, str]) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape for the tensors of ``files`` (name → file), from the headers only."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        shapes.update(safetensors_shapes(file))
    return {k: shapes[k] for k in files}


def read_tensor(file: str, name: str) -> torch.Tensor:
    """Tensor ``name`` of safetensors ``file`` (only it is read into memory); ``ValueError`` naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as f:
            return f.get_tensor(name)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read {name} from {file} (truncated or corrupt?): {e}") from e


def plan_shards(plan: Mapping[str, tuple[tuple[int, ...], torch.dtype]], shard_bytes: int) -> list[list[str]]:
    """The tensors of ``plan`` (name → (shape, dtype)), in ``plan``'s order, grouped into shards of at most
    ``shard_bytes`` (a tensor larger than that gets a shard of its own)."""
    if shard_bytes < 1:
        raise ValueError(f"shard_bytes={shard_bytes} must be >= 1")
    shards: list[list[str]] = [[]]
    size = 0
    for name, (shape, dtype) in plan.items():
        n = math.prod(shape) * dtype.itemsize
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def _header(names: list[str], plan: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> bytes:
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        shape, dtype = plan[name]
        n = math.prod(shape) * dtype.itemsize
        entries[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_safetensors(file: str, names: list[str], plan: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                      produce: Callable[[str], torch.Tensor]) -> None:
    """Write one safetensors file holding ``names`` (shapes and dtypes from ``plan``), calling ``produce(name)``
    for one tensor at a time; a produced tensor of another shape or dtype is a ``ValueError`` naming it."""
    with open(file, "wb") as f:
        f.write(_header(names, plan))
        for name in names:
            tensor = produce(name)
            shape, dtype = plan[name]
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(f"{name}: produced {tuple(tensor.shape)} {tensor.dtype}, planned {shape} {dtype}")
            if tensor.numel():
                f.write(memoryview(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
            del tensor


def write_shards(folder: str | os.PathLike, plan: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                 produce: Callable[[str], torch.Tensor], shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[str]:
    """Write the tensors of ``plan`` into ``folder``: one ``model.safetensors`` when they fit in ``shard_bytes``,
    else ``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json``. Returns the files
    written (names). ``produce(name)`` is called once per tensor, in file order."""
    folder = os.fspath(folder)
    shards = plan_shards(plan, shard_bytes)
    if len(shards) == 1:
        write_safetensors(os.path.join(folder, SINGLE_NAME), shards[0], plan, produce)
        return [SINGLE_NAME]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file, shard in zip(names, shards):
        write_safetensors(os.path.join(folder, file), shard, plan, produce)
        weight_map.update({name: file for name in shard})
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in plan.values())
    with open(os.path.join(folder, INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return [*names, INDEX_NAME]
