"""The unit of data: one :class:`Document`, what every reader returns and every writer takes."""

from __future__ import annotations

import dataclasses
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (a JSON ``"\\ud800"`` escape decodes to one; it is not a
    Unicode character, so it cannot be encoded as UTF-8 or tokenised), or None if ``text`` is valid Unicode."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


@dataclasses.dataclass(frozen=True)
class Document:
    """One unit of held-out splitting: a novel, a play, an address, a bible book, a documentation page."""

    id: str
    text: str
    source: str = ""
    title: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "source": self.source, "title": self.title, "text": self.text}
