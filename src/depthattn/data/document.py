"""The unit of data: one :class:`Document`, what every reader returns and every writer takes."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Document:
    """One unit of held-out splitting: a novel, a play, an address, a bible book, a documentation page."""

    id: str
    text: str
    source: str = ""
    title: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "source": self.source, "title": self.title, "text": self.text}
