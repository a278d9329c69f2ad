"""Command-line interface: ``depthattn [--debug] <command>``.

Each command lives in its own module that exposes ``register(subparsers)``; that function adds one sub-parser and
sets ``func`` to a plain typed function taking the parsed arguments. This file assembles them and turns every
failure into one line on stderr (``--debug``: the traceback too):

==========================================================  =========  =============================================
failure                                                     exit code  line
==========================================================  =========  =============================================
bad flag or flag value (argparse)                           2          ``depthattn CMD: error: <argparse's message>
                                                                       (did you mean X?); see depthattn CMD --help``
an input path that does not exist                           2          ``depthattn CMD: error: FLAG PATH does not
                                                                       exist``
bad input (``ValueError``: a bad file, a decoding error,    2          ``depthattn CMD: error: <message naming the
incl. ``UnicodeError``, JSON and TOML errors), missing                 file, flag or field>``
file (``FileNotFoundError``); also a file whose sha256
differs from ``checksums.json`` (``IntegrityError``), a
JSON file nested too deep or too large, a tokenizer.json
beyond its bounds or a dangling link, a config beyond
``MAX_VIRTUAL_LAYERS`` / ``MAX_DEPTH_CANDIDATES``, and a
model or KV cache that cannot fit in the memory available
divergence (``FloatingPointError``: non-finite loss or      1          ``depthattn CMD: error: <message>``
gradients, a NaN evaluation, a validation loss above ln V)
the system refused (``OSError``: disk full, read-only       1          ``depthattn CMD: error: <strerror> [ENAME]:
file system, no permission; also what safetensors,                     <file, else the command's output flag>``;
``torch.save``, DCP and TensorBoard's writer thread                    for ENOSPC / EDQUOT also ``(N free of M on
report as other types: ``checkpoint.save_safetensors``,                the file system of DIR)``
``save_torch``, ``run.dcp.write_failure``,
``quiet_thread_os_errors``)
preempted: SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 while        128 + n:   ``depthattn CMD: preempted at step N
training (``TrainingPreempted``: the checkpoint of that     143, 130,  (SIGTERM); checkpoint PATH; resume with:
step is written; 128 + n is what a shell reports for a      138        ...``
process signal n ended: schedulers see "ended by a
signal", neither success nor the command's own failure)
interrupted (Ctrl-C outside training)                       130        ``depthattn CMD: interrupted``
the reader of stdout went away (``... | head``)             141        none
anything else (a bug)                                       1          the exception and a pointer to ``--debug``
==========================================================  =========  =============================================
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import re
import shutil
import sys
import threading
import traceback

from . import __version__
from .training.preemption import TrainingPreempted

#: (module, attribute) pairs; each module's ``register(subparsers)`` adds its commands.
COMMAND_MODULES = (
    "depthattn.commands.inspect_cmd",
    "depthattn.commands.data_cmd",
    "depthattn.commands.convert_cmd", "depthattn.commands.analyze_cmd",
    "depthattn.commands.train_cmd", "depthattn.commands.eval_cmd", "depthattn.commands.generate_cmd",
    "depthattn.commands.compare_cmd", "depthattn.commands.export_cmd", "depthattn.commands.unlock_cmd",
    "depthattn.commands.study_cmd",
)

#: Flags that name what a command writes, in the order they are tried to name the target of an ``OSError`` that
#: carries no file name (a ``write`` or ``fsync`` on a full disk).
OUTPUT_FLAGS = (("resume", "--resume"), ("out", "--out"))

#: Arguments that name an existing file or folder (attribute, how the message names it): a path that does not
#: exist is refused with "does not exist" before the command runs, whatever the command would make of it.
INPUT_PATHS = (("checkpoint", "CHECKPOINT"), ("resume", "--resume"), ("init_from", "--init-from"),
               ("config", "--config"), ("data", "--data"), ("from_qwen3", "--from-qwen3"),
               ("to_qwen3", "--to-qwen3"), ("upgrade", "--upgrade"), ("tokenizer", "--tokenizer"), ("run", "RUN"))

DEBUG_HELP = "on an error, show the Python traceback as well as the one-line message"


#: A word argparse takes as a value, never as a flag: ``-`` then a digit, or ``-.`` then a digit (``-0.5``,
#: ``-1e3``, ``-0.5,1.5``). Python 3.11's own pattern matches a lone number only, under which a list whose first
#: item is negative (``--mix -0.5,1.5``) reads as a flag and its option as missing its value.
NEGATIVE_NUMBER = re.compile(r"^-\.?\d")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without prefix abbreviations (``--step 10`` is an error, never ``--steps 10``),
    reading a word that starts like a negative number (``NEGATIVE_NUMBER``) as a value. Sub-parsers are made with the
    parent's class (``add_subparsers``' default), so every parser of the CLI is one."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER  # argparse's own hook (no public one); no flag is -N

    def error(self, message: str):
        """Exit 2 with one line on stderr: ``PROG: error: MESSAGE (did you mean X?); see PROG --help`` (no usage
        block: ``--help`` shows it)."""
        self.exit(2, f"{self.prog}: error: {message}{did_you_mean_choice(message)}; see {self.prog} --help\n")


def sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{name: parser}`` of the sub-commands directly under ``parser`` (empty if it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every sub-parser below it (each once)."""
    out, todo = [], [parser]
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(sub_parsers(p).values())
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="depthattn",
        description="Depth-Attention (arXiv 2606.05014) and cross-layer baselines: data, training, evaluation, "
        "generation and comparison.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for p in all_parsers(parser)[1:]:  # `depthattn train --debug` works as well as `depthattn --debug train`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def command_name(args: argparse.Namespace) -> str:
    """The full sub-command, e.g. ``train``, ``data prepare`` or ``study run``, for error messages."""
    nested = (getattr(args, name, None) for name in ("data_command", "study_command"))
    return " ".join(str(n) for n in (args.command, *nested) if n)


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the sub-command ``args`` selected (``parser`` itself if none)."""
    for name in command_name(args).split():
        parser = sub_parsers(parser).get(name, parser)
    return parser


def did_you_mean(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """``" (did you mean --steps?)"`` for the first unrecognised flag in ``extra`` close to one of ``parser``'s
    (``difflib``'s similarity >= 0.6), else ``""``."""
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    for item in extra:
        if item.startswith("--"):
            close = difflib.get_close_matches(item.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


#: argparse's message for a value outside ``choices`` (a sub-command's name among them).
INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean_choice(message: str) -> str:
    """``" (did you mean train?)"`` for argparse's "invalid choice" ``message`` when one choice is close to the
    value given (``difflib``'s similarity >= 0.6), else ``""``."""
    found = INVALID_CHOICE.search(message)
    if not found:
        return ""
    choices = re.findall(r"'([^']*)'", found.group(2))
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_input_paths(args: argparse.Namespace) -> None:
    """``FileNotFoundError`` "<flag> <path> does not exist" for the first ``INPUT_PATHS`` argument given a path
    that does not exist (with ``--resume``, only it: ``train`` refuses the other flags with their own message)."""
    paths = INPUT_PATHS[1:2] if getattr(args, "resume", None) else INPUT_PATHS
    for attr, flag in paths:
        value = getattr(args, attr, None)
        if isinstance(value, str) and value and not os.path.lexists(value):
            raise FileNotFoundError(f"{flag} {value} does not exist")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def free_space(path: str | os.PathLike) -> str:
    """``"N free of M on the file system of DIR"`` for the nearest existing folder at or above ``path``
    (``shutil.disk_usage``; a quota, EDQUOT, is not visible there); empty if it cannot be read."""
    folder = os.path.abspath(os.fspath(path))
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return ""
    return f"{_size(usage.free)} free of {_size(usage.total)} on the file system of {folder}"


def describe_os_error(e: OSError, args: argparse.Namespace) -> str:
    """One line for an ``OSError``: the reason, the errno name, and the file (or, when the error names none, the
    command's output flag and its value); for a full disk or quota (ENOSPC, EDQUOT) also the free space there."""
    reason = e.strerror or str(e)
    name = errno.errorcode.get(e.errno or -1)
    where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f)
    flag = next(((f, getattr(args, a)) for a, f in OUTPUT_FLAGS if getattr(args, a, None)), None)
    if not where:
        where = f"while writing {flag[0]} {flag[1]}" if flag else "(the error names no file)"
    elif flag and os.fspath(flag[1]) not in where:
        where += f" (writing {flag[0]} {flag[1]})"
    hint = {errno.ENOSPC: "; free some space and run the command again (a run continues with --resume)",
            errno.EDQUOT: "; free some space and run the command again (a run continues with --resume)",
            errno.EROFS: "; choose a writable folder", errno.EACCES: "; check the folder's permissions",
            errno.EPERM: "; check the folder's permissions"}.get(e.errno or -1, "")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_space(e.filename or (flag[1] if flag else "."))
        hint = f" ({free}){hint}" if free else hint
    return f"{reason}{f' [{name}]' if name else ''}: {where}{hint}"


def quiet_thread_os_errors(args: argparse.Namespace) -> list[OSError]:
    """Keep an ``OSError`` in a background thread (TensorBoard's event writer on a full disk) from printing its
    own traceback: the writer re-raises it in the command's thread, which reports it in one line. The errors are
    collected in the list returned, which ``main`` reports if the command ends without having met them. Other
    exceptions, and everything under ``--debug``, go to the default hook."""
    errors: list[OSError] = []
    default = threading.excepthook

    def hook(exc: threading.ExceptHookArgs) -> None:
        if isinstance(exc.exc_value, OSError) and not getattr(args, "debug", False):
            errors.append(exc.exc_value)
        else:
            default(exc)

    threading.excepthook = hook
    return errors


def resume_hint(args: argparse.Namespace) -> str | None:
    """How to continue a preempted command, for ``TrainingPreempted.line`` (None: ``depthattn train --resume RUN``)."""
    if getattr(args, "resume_if_exists", False):
        return "the same command (it has --resume-if-exists)"
    if args.command == "compare":
        return "the same depthattn compare command (it resumes interrupted runs)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the sub-command's error line, not the top-level one
        sub = command_parser(parser, args)
        sub.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(sub, extra)}")
    cmd = f"depthattn {command_name(args)}"
    default_hook = threading.excepthook
    caller_group = process_group_live()  # a group the caller made is the caller's to destroy
    thread_errors = quiet_thread_os_errors(args)
    try:
        check_input_paths(args)
        result = args.func(args)
        if thread_errors:  # a writer thread failed and nothing in the command re-raised it
            raise thread_errors[0]
    except TrainingPreempted as e:  # the checkpoint of the step is written; under torchrun rank 0 says so
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{cmd}: {e.line(resume_hint(args))}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        _report(args, f"{cmd}: interrupted")
        return 130
    except FloatingPointError as e:  # divergence: the run stopped; a runtime failure, not a usage error
        return _report(args, f"{cmd}: error: {e}", 1)
    except (ValueError, FileNotFoundError) as e:  # bad input (incl. decoding errors): one clear message
        return _report(args, f"{cmd}: error: {e}", 2)
    except BrokenPipeError:  # `depthattn ... | head`: the reader left; nothing to report
        sys.stdout = open(os.devnull, "w")  # so the interpreter's final flush does not fail again
        return 141
    except OSError as e:  # the system refused: full disk, read-only file system, permissions
        return _report(args, f"{cmd}: error: {describe_os_error(e, args)}", 1)
    except Exception as e:  # a bug: still one line, the traceback with --debug
        return _report(args, f"{cmd}: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
                       1)
    finally:
        threading.excepthook = default_hook
        if not caller_group and process_group_live():
            sys.modules["torch.distributed"].destroy_process_group()
    return int(result or 0)


def process_group_live() -> bool:
    """Whether this process is in a torch.distributed process group (without importing torch).

    ``main`` destroys a group the command joined (torchrun's) on every way out: a rank that exits with it alive can
    abort at interpreter shutdown ("terminate called without an active exception", SIGABRT) instead of returning
    its exit status. Destroying is local (no collective), so a rank leaving alone after an error cannot hang in it."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _report(args: argparse.Namespace, line: str, code: int = 1) -> int:
    if getattr(args, "debug", False):
        traceback.print_exc()
    sys.stderr.write(" ".join(line.split("\n")) + "\n")  # one write: the ranks of a torchrun job do not interleave
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
