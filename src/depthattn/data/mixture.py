"""Source mixtures at prepare time: ``depthattn data prepare --input A --input B --mix 0.7,0.3``.

The training split of a mixture holds ``M = sum_k t_k`` tokens (``t_k``: the tokens of source ``k``'s training
documents, EOS included; the sources' natural total), of which source ``k`` contributes ``T_k = round(w_k * M)``:

* ``r_k = T_k // t_k`` full copies of its training documents (upsampling by repetition; 0 when ``w_k`` is below its
  natural share), then
* the remainder ``T_k - r_k * t_k`` from its documents in a seeded order (``numpy.random.default_rng([seed, k,
  tag])``, the prepare ``--seed``): whole documents while they fit, then a prefix of the next one closed by EOS
  (downsampling), so the realised token shares equal the weights to within one token per source.

Documents are written source by source in input order (the copies, then the remainder's documents in their input
order); the training order comes from ``TrainConfig.data_order`` anyway. The validation split keeps every source's
held-out documents as they are (natural shares, no repetition: a held-out document is never seen twice). The
tokenizer is trained on the unmixed training documents. ``meta.json`` records ``mixture``: the weights, the seed and
per source the natural and mixed tokens, the repetition factor and the realised share.

Source ``k``'s training tokens are staged in ``.mix-k-00000.bin`` inside the folder being written (removed before
it is installed): a mixture needs its sources' training tokens on disk twice until the copy is done.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from depthattn.data.encode import ShardWriter
from depthattn.data.tokenizer import token_byte_lengths

#: ``--mix`` weights must add up to 1 within this (absolute): ``0.333,0.333,0.334`` and thirds to 4 digits pass.
SUM_TOLERANCE = 1e-3
_TAG = 0x4D4958  # "MIX"
_CHUNK = 1 << 22


def parse_mix(text: str) -> list[float]:
    """``"0.7,0.3"`` -> ``[0.7, 0.3]``; ValueError naming ``--mix`` and the bad item."""
    items = [s.strip() for s in str(text).split(",")]
    out = []
    for s in items:
        try:
            out.append(float(s))
        except ValueError:
            raise ValueError(f"--mix {text}: {s!r} is not a number (give one weight per --input, e.g. "
                             f"--mix 0.7,0.3)") from None
    return out


def check_mix(weights: list[float], inputs: list[str]) -> list[float]:
    """The weights as floats, or ValueError (one line): a count other than the ``--input`` count, a negative or
    non-finite weight, or a sum (possibly infinite) more than :data:`SUM_TOLERANCE` away from 1."""
    shown = ",".join(f"{w:g}" for w in weights)
    if len(weights) != len(inputs):
        raise ValueError(f"--mix {shown}: {len(weights)} weight{'s' if len(weights) != 1 else ''} for "
                         f"{len(inputs)} --input{'s' if len(inputs) != 1 else ''} ({', '.join(inputs)}); give one "
                         f"weight per --input, in order")
    bad = [w for w in weights if not math.isfinite(w) or w < 0]
    if bad:
        raise ValueError(f"--mix {shown}: weight {bad[0]:g} is {'negative' if bad[0] < 0 else 'not finite'}; "
                         f"weights are token shares >= 0")
    try:
        total = math.fsum(weights)
    except OverflowError:  # finite weights whose sum is not: 1e308,1e308
        total = math.inf
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"--mix {shown}: the weights add up to {total:g}, not 1 (tolerance {SUM_TOLERANCE:g}); "
                         f"they are the sources' token shares of the training split")
    return [float(w) for w in weights]


def mixture_targets(natural: list[int], weights: list[float]) -> list[int]:
    """``T_k = round(w_k * sum(natural))``: each source's training tokens in the mixture."""
    total = sum(natural)
    return [int(round(w * total)) for w in weights]


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What one source contributes: ``repeats`` full copies, then ``docs`` (indices into its training documents,
    ascending) whole, then the first ``cut_tokens - 1`` tokens of document ``cut`` and EOS (``cut`` None: none)."""

    repeats: int
    docs: np.ndarray
    cut: int | None
    cut_tokens: int

    def tokens(self, counts: np.ndarray) -> int:
        return self.repeats * int(counts.sum()) + int(counts[self.docs].sum()) + self.cut_tokens


def plan_source(counts: np.ndarray, target: int, seed: int, index: int) -> SourcePlan:
    """The plan giving ``target`` tokens (within one) from documents of ``counts`` tokens each (EOS included).

    Raises:
        ValueError: ``target > 0`` but the source has no training tokens.
    """
    total = int(counts.sum())
    if target <= 0:
        return SourcePlan(0, np.zeros(0, dtype=np.int64), None, 0)
    if total == 0:
        raise ValueError("the source has no training tokens")
    repeats, rem = divmod(target, total)
    order = np.random.default_rng([seed, index, _TAG]).permutation(len(counts))
    cum = np.cumsum(counts[order])
    whole = int(np.searchsorted(cum, rem, side="right"))  # documents that fit entirely
    left = rem - (int(cum[whole - 1]) if whole else 0)
    cut, cut_tokens = (int(order[whole]), left) if left > 1 else (None, 0)  # 1 token left: an EOS alone is dropped
    return SourcePlan(repeats, np.sort(order[:whole]), cut, cut_tokens)


class MixStaging:
    """Training tokens of each source staged in ``folder/.mix-k-00000.bin`` during the encode pass, then copied
    into the training split by the sources' plans (:meth:`compose`)."""

    def __init__(self, folder: Path, dtype: str, docs_per_source: list[int]):
        self.folder, self.dtype = folder, dtype
        self.source_of = np.repeat(np.arange(len(docs_per_source)), docs_per_source)
        self.counts = np.zeros(len(self.source_of), dtype=np.int64)
        self.writers = [ShardWriter(folder, f".mix-{k}", dtype, 1 << 62) for k in range(len(docs_per_source))]

    def write(self, doc: int, ids: np.ndarray) -> None:
        """Append tokens of training document ``doc`` (global input index) to its source's staging file."""
        self.writers[int(self.source_of[doc])].write(ids)
        self.counts[doc] += len(ids)

    def compose(self, out: ShardWriter, weights: list[float], seed: int, tok: Tokenizer, is_train: np.ndarray,
                chars: np.ndarray, names: list[str], eos_id: int) -> tuple[dict, dict]:
        """Write the mixture into ``out``; returns (the train split's ``documents``/``bytes``/``characters``, the
        ``mixture`` record of meta.json). ValueError naming a source with weight > 0 and no training tokens."""
        byte_len = token_byte_lengths(tok)
        K = len(self.writers)
        docs_k = [np.flatnonzero((self.source_of == k) & is_train) for k in range(K)]
        natural = [int(self.counts[d].sum()) for d in docs_k]
        stats = {"documents": 0, "bytes": 0, "characters": 0}
        sources = []
        for k, (docs, target) in enumerate(zip(docs_k, mixture_targets(natural, weights))):
            counts = self.counts[docs]
            try:
                plan = plan_source(counts, target, seed, k)
            except ValueError:
                raise ValueError(f"--input {names[k]}: --mix gives it weight {weights[k]:g}, but none of its "
                                 f"documents is in the training split (all were held out for validation); give it "
                                 f"more documents, or weight 0") from None
            self.writers[k].close()
            path = self.folder / self.writers[k].shards[0]["file"]
            tokens = np.memmap(path, dtype=self.dtype, mode="r") if natural[k] else np.zeros(0, self.dtype)
            start = np.concatenate([[0], np.cumsum(counts)])
            emitted = self._emit_source(out, tokens, start, plan, byte_len, eos_id, stats, chars[docs], tok)
            del tokens
            path.unlink()
            sources.append({"input": names[k], "weight": weights[k], "natural_tokens": natural[k],
                            "tokens": emitted, "repeats": emitted / natural[k] if natural[k] else 0.0})
        total = sum(s["tokens"] for s in sources)
        for s in sources:
            s["share"] = s["tokens"] / total if total else 0.0
        return stats, {"weights": weights, "seed": seed, "sum_tolerance": SUM_TOLERANCE, "sources": sources}

    @staticmethod
    def _emit_source(out: ShardWriter, tokens: np.ndarray, start: np.ndarray, plan: SourcePlan, byte_len,
                     eos_id: int, stats: dict, chars: np.ndarray, tok: Tokenizer) -> int:
        n = 0

        def emit(ids: np.ndarray) -> None:
            nonlocal n
            for i in range(0, len(ids), _CHUNK):
                part = np.asarray(ids[i:i + _CHUNK])
                out.write(part)
                stats["bytes"] += int(byte_len[part.astype(np.int64)].sum())
                n += len(part)

        for _ in range(plan.repeats):
            emit(tokens)
        stats["documents"] += plan.repeats * (len(start) - 1) + len(plan.docs) + (plan.cut is not None)
        stats["characters"] += plan.repeats * int(chars.sum()) + int(chars[plan.docs].sum())
        for d in plan.docs:
            emit(tokens[start[d]:start[d + 1]])
        if plan.cut is not None:
            prefix = np.asarray(tokens[start[plan.cut]:start[plan.cut] + plan.cut_tokens - 1])
            emit(np.append(prefix, np.array([eos_id], dtype=prefix.dtype)))
            stats["characters"] += len(tok.decode(prefix.astype(np.int64).tolist(), skip_special_tokens=False))
        return n

    def abort(self) -> None:
        """Close and remove the staging files (after an error; :meth:`compose` removes them when done)."""
        for w in self.writers:
            w.abort()
            for shard in w.shards:
                (self.folder / shard["file"]).unlink(missing_ok=True)
