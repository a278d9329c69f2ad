"""``depthattn data lm-eval-tasks``: write lm-evaluation-harness task definitions (YAML + JSONL) over the locally
installed zero-shot benchmark files, so that the ``lm_eval`` command runs offline on a checkpoint with
``--include_path``. The tasks are named ``depthattn_<task>`` (``depthattn_arc_easy``, ...) so that lm-eval's own
``arc_easy`` (which downloads from the Hub) is never shadowed; they are the ones ``depthattn eval --harness lm-eval``
scores (``eval.lm_eval_adapter.write_task_files``), over the same (context, continuation) pairs as the native scorer.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

#: The file that marks a folder as written by this command (its task list); the only folder --out may replace.
MARKER = "depthattn_lm_eval_tasks.json"

DESCRIPTION = """\
Write lm-evaluation-harness task files (depthattn_<task>.yaml over depthattn's JSONL renderings of the installed
benchmark files) into OUT, and print the lm_eval command that uses them:

  lm_eval --model hf --model_args pretrained=CKPT,trust_remote_code=True --device cpu \\
          --include_path OUT --tasks depthattn_arc_easy,depthattn_piqa --limit 100

Runs offline; needs the benchmark files (`depthattn data fetch-eval`) and, to run lm_eval, lm-eval==0.4.13.
"""


def write_lm_eval_tasks(out: str | os.PathLike, tasks: list[str]) -> list[str]:
    """Write ``depthattn_<task>.yaml`` + ``<task>.jsonl`` for ``tasks`` into ``out`` (created if missing) and the
    marker file; returns the lm-eval task names. A folder that exists and holds anything but a previous run of this
    command is refused with one ``ValueError`` line listing what is there; a previous run's files are replaced.
    Raises ``ValueError`` for an unknown task or missing benchmark data (saying which command installs it)."""
    from ..eval.lm_eval_adapter import write_task_files
    from ..eval.tasks import parse_tasks, task_file

    names = parse_tasks(tasks)
    for name in names:
        task_file(name)  # missing data: the fetch-eval hint, before anything is written
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / MARKER).is_file():
        there = sorted(p.name for p in folder.iterdir())
        raise ValueError(f"--out {folder} is not empty and was not written by `depthattn data lm-eval-tasks` "
                         f"({len(there)} entries: {', '.join(there[:5])}{', ...' if len(there) > 5 else ''}); "
                         f"choose an empty or new folder")
    folder.mkdir(parents=True, exist_ok=True)
    written = write_task_files(names, str(folder.resolve()))
    (folder / MARKER).write_text(json.dumps({"tasks": written}, indent=2) + "\n", encoding="utf-8")
    return written


def run(args: argparse.Namespace) -> int:
    from ..eval.tasks import TASKS

    tasks = write_lm_eval_tasks(args.out, args.tasks.split(",") if args.tasks != "all" else list(TASKS))
    print(f"wrote {len(tasks)} lm-eval task(s) to {args.out}: {', '.join(tasks)}")
    print(f"run: lm_eval --model hf --model_args pretrained=CKPT,trust_remote_code=True --device cpu "
          f"--include_path {args.out} --tasks {','.join(tasks)} --limit 100")
    return 0


def register_data_subcommand(data_subparsers) -> None:
    """Add ``lm-eval-tasks`` to the ``depthattn data`` sub-command group."""
    p = data_subparsers.add_parser("lm-eval-tasks", help="write lm-eval task files over the local benchmark files",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the task files (new, empty, or an earlier one)")
    p.add_argument("--tasks", default="all", help="comma-separated tasks (default all: lambada, hellaswag, piqa, "
                                                  "arc_easy, arc_challenge, winogrande, openbookqa, sciq, boolq)")
    p.set_defaults(func=run)
