"""Document boundaries of a prepared folder's token stream, for document masking (``TrainConfig.doc_mask``).

Legend: B rows, T positions of a window's inputs.

``depthattn data prepare`` appends the end-of-document token (``meta.json``'s ``eos_token_id``) after every
document and encodes a literal ``<|endoftext|>`` inside a text as ordinary text, so in its splits EOS occurs exactly
at the end of each document: a window's documents follow from its EOS tokens alone, and no table of boundaries is
stored. A folder *has document boundaries* when its ``meta.json`` records an integer ``eos_token_id`` and its
train split ends with that token (the last document, like every one, is EOS-terminated); token files from
elsewhere (a nanoGPT ``train.bin`` under a hand-written ``meta.json``) fail that.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import Tensor


def window_document_ids(inputs_BT: Tensor, eos_id: int) -> Tensor:
    """Document ids int64 ``[B, T]`` of training inputs: 0 at each row's first token, +1 after every EOS token (the
    EOS belongs to the document it ends; the token after it starts the next). A window that starts inside a document
    counts that document's remainder as its first document (its positions restart at 0 there too)."""
    ends = (inputs_BT == eos_id).long()
    return ends.cumsum(1) - ends


def document_boundary_token(meta: dict, train: np.ndarray, folder: str | Path) -> int:
    """The token that ends every document of the prepared ``folder`` (``meta.json``'s ``eos_token_id``), checked
    against the train split; ``ValueError`` in one line naming the folder when it has no document boundaries."""
    eos = meta.get("eos_token_id")
    if not isinstance(eos, int) or isinstance(eos, bool) or not 0 <= eos < int(meta.get("vocab_size", 0)):
        raise ValueError(f"TrainConfig.doc_mask=true needs document boundaries, but {Path(folder) / 'meta.json'} "
                         f"records no end-of-document token (eos_token_id={eos!r}); prepare the data with "
                         f"`depthattn data prepare` or set doc_mask=false")
    last = int(train[len(train) - 1]) if len(train) else None
    if last != eos:
        raise ValueError(f"TrainConfig.doc_mask=true needs document boundaries, but the train split of {folder} "
                         f"does not end with the end-of-document token {eos} (it ends with {last}): its documents "
                         f"are not EOS-terminated; prepare the data with `depthattn data prepare` or set "
                         f"doc_mask=false")
    return eos

