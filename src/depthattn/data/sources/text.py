"""Plain-text clean-up shared by the readers: newline and blank-line normalisation, Project Gutenberg headers and
licence text removed."""

from __future__ import annotations

import re

_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(
    r"^(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*|End of (the )?Project Gutenberg.*|"
    r"End of this Project Gutenberg.*)$", re.MULTILINE | re.IGNORECASE)


def strip_gutenberg(text: str) -> str:
    """Remove a Project Gutenberg header (up to the ``*** START OF ...`` line) and footer (from ``End of ...``)."""
    m = _GUTENBERG_START.search(text)
    if m:
        text = text[m.end():]
    m = _GUTENBERG_END.search(text)
    if m:
        text = text[:m.start()]
    return normalize_text(text)


def normalize_text(text: str) -> str:
    """Unix newlines, no trailing spaces, at most one blank line in a row, no leading/trailing whitespace, one
    final newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n" if text.strip() else ""
