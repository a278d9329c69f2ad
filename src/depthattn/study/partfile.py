"""A published study part: one small JSON file per part, ``PUBLISH/PART.json`` (``published`` reads them to build
docs/results.md; the fields are described in results/README.md).

A part's file is the part's ``depthattn compare`` results.json, with the study's record of it (``study``: part,
group, label, command, commits, hardware), less what the report does not read and the run folders keep: the
per-step training loss, throughput and text sample of each run, and the summaries recomputed from the runs
(``compare.aggregate``'s mean and std, ``compare.paired_stats``, ``compare.conclusions``). Each run keeps its
final metrics, its validation curve at its evaluation steps and, where its method logs them, its depth statistics
(``depth.extract``), the last two as columns (``{"step": [...], key: [...]}``) so a long run stays small.

    compact(results, depth)  -> the part's record          dumps(record) -> its text
    load(path)               -> the record as compare's results.json shape (curves and depth rows as rows)
"""

from __future__ import annotations

import json
from pathlib import Path

#: The ``format`` of a part's file; ``load`` refuses any other.
FORMAT = "depthattn-study-part/1"
#: The keys of compare's results.json a part's file leaves out: at the top, per method and per run.
DROPPED = {"top": ("paired", "conclusion"), "method": ("mean", "std"),
           "run": ("train_curve", "step_tokens_per_s", "sample")}
#: The run keys stored as columns.
COLUMNS = ("curve", "depth")


def path(publish: Path, part: str) -> Path:
    """Where part ``part`` is published under ``publish``."""
    return Path(publish) / f"{part}.json"


def columns(rows: list[dict]) -> dict[str, list]:
    """``[{k: v, ...}, ...]`` as ``{k: [v, ...]}``, keys in first-seen order; a row lacking a key holds None."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return {k: [row.get(k) for row in rows] for k in keys}


def rows(cols: dict[str, list]) -> list[dict]:
    """The inverse of ``columns`` (None cells left out)."""
    n = len(next(iter(cols.values()), []))
    return [{k: v[i] for k, v in cols.items() if v[i] is not None} for i in range(n)]


def compact(results: dict, depth: dict[str, dict[str, list[dict]]]) -> dict:
    """The part's record from compare's ``results`` (with its ``study`` record) and the depth statistics of its runs
    (``{method: {str(seed): rows}}``, rows as ``depth.extract`` gives them; a run without rows has none)."""
    methods = {}
    for name, m in results["methods"].items():
        runs = []
        for r in m["runs"]:
            run = {k: v for k, v in r.items() if k not in DROPPED["run"]}
            run["curve"] = columns(r["curve"])
            found = depth.get(name, {}).get(str(r["seed"]))
            if found:
                run["depth"] = columns(found)
            runs.append(run)
        methods[name] = {"runs": runs, **{k: v for k, v in m.items() if k not in ("runs", *DROPPED["method"])}}
    rest = {k: v for k, v in results.items() if k not in ("study", "methods", *DROPPED["top"])}
    return {"format": FORMAT, "study": results["study"], **rest, "methods": methods}


def expand(record: dict) -> dict:
    """A part's record in compare's results.json shape: each run's ``curve`` and ``depth`` as rows."""
    methods = {name: dict(m, runs=[dict(r, **{k: rows(r[k]) for k in COLUMNS if k in r}) for r in m["runs"]])
               for name, m in record["methods"].items()}
    return dict(record, methods=methods)


def load(file: Path) -> dict:
    """The part published in ``file``, expanded (``expand``). Raises ``ValueError`` naming the file if it is not
    JSON or not of ``FORMAT``."""
    try:
        record = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the published part {file}: {e}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        got = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{file} is not a published study part (format {got!r}, expected {FORMAT!r})")
    return expand(record)


def dumps(value, indent: int = 0) -> str:
    """``value`` as JSON text that diffs well and stays small: one key per line, every list of plain values (a
    column) on one line; numbers as ``json`` writes them (floats round-trip exactly)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(value, dict) and value:
        items = (f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1)}" for k, v in value.items())
        text = "{\n" + ",\n".join(items) + "\n" + pad + "}"
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        text = "[\n" + ",\n".join(inner + dumps(v, indent + 1) for v in value) + "\n" + pad + "]"
    else:
        text = json.dumps(value, ensure_ascii=False)
    return text + ("\n" if indent == 0 else "")
