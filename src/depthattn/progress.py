"""The one place progress bars are made: every bar of the package comes from ``progress_bar``.

A bar redraws itself with ``\\r``; in a file (a job's log, ``2> log``) each redraw is kept, so a bar is shown only
when its stream (stderr) is a terminal. Lines a command prints stay: they are the record a log keeps, and
``write_line`` prints one on a line of its own while a bar is drawn (never glued to the bar's line).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

from tqdm.auto import tqdm


def stream_is_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default: ``sys.stderr`` now) is an interactive terminal (``isatty``); False for a file,
    a pipe, or a stream without ``isatty``."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


def progress_bar(iterable: Iterable | None = None, *, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A ``tqdm`` bar on stderr (``kwargs``: tqdm's, e.g. ``total``, ``desc``, ``unit``), shown only when
    ``enabled`` and stderr is a terminal (``stream_is_terminal``); otherwise a disabled bar that accepts the same
    calls (``update``, ``set_postfix``, ``write``) and draws nothing."""
    shown = enabled and stream_is_terminal(kwargs.get("file"))
    return tqdm(iterable, disable=not shown, **kwargs)


def write_line(line: str, file: Any = None) -> None:
    """Print ``line`` (to ``file``, default stdout) on a line of its own: a bar being drawn is cleared first and
    redrawn after (``tqdm.write``), so the line is never glued to the bar's. The training loop's and ``compare``'s
    default ``log``."""
    tqdm.write(line, file=file)
