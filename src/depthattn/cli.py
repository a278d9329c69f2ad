"""Command-line interface: ``depthattn <command>``.

Each command lives in its own module that exposes ``register(subparsers)``; that function adds one sub-parser and
sets ``func`` to a plain typed function taking the parsed arguments. This file only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

#: (module, attribute) pairs; each module's ``register(subparsers)`` adds its commands.
COMMAND_MODULES = (
    "depthattn.commands.inspect_cmd",
    "depthattn.commands.data_cmd",
    "depthattn.commands.convert_cmd", "depthattn.commands.analyze_cmd",
    "depthattn.commands.train_cmd", "depthattn.commands.eval_cmd", "depthattn.commands.generate_cmd",
    "depthattn.commands.compare_cmd", "depthattn.commands.export_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="depthattn",
        description="Depth-Attention (arXiv 2606.05014) and cross-layer baselines: data, training, evaluation, "
        "generation and comparison.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def command_name(args: argparse.Namespace) -> str:
    """The full sub-command, e.g. ``train`` or ``data prepare``, for error messages."""
    return " ".join(str(n) for n in (args.command, getattr(args, "data_command", None)) if n)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear message, no traceback
        print(f"depthattn {command_name(args)}: error: {e}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
