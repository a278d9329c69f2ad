"""Data: real public-domain text from package registries, tokenisation, memory-mapped shards, batch sampling.

- :func:`embedded_corpus_documents` -- the corpus shipped in the package, as ``(doc_id, text)`` pairs.
- :func:`prepare_corpus` -- stream documents (txt, jsonl[.gz|.zst], parquet, datasets folders), split them, train a
  byte-level BPE on a sample, encode in parallel into token shards + ``meta.json``.
- :func:`load_prepared` -- read a prepared folder back (validated, shard sha256 verified) as :class:`PreparedData`.
- :class:`EpochBatches` -- training windows in seeded epochs (each window once per epoch; :class:`KeyedPermutation`).
- :class:`TokenBatches` -- training windows as a pure function of ``(seed, step)``; :func:`sequential_batches` for eval.
- :class:`ShardedTokens` -- several shards as one 1-D token array.

See docs/data.md.
"""

from depthattn.data.corpus import embedded_corpus_documents, embedded_manifest, read_corpus_dir, verify_corpus
from depthattn.data.document import Document
from depthattn.data.epochs import EpochBatches, KeyedPermutation
from depthattn.data.prepare import prepare_corpus, split_documents
from depthattn.data.shards import PreparedData, TokenBatches, load_prepared, sequential_batches
from depthattn.data.tokenstream import ShardedTokens
from depthattn.data.tokenizer import EOS_TOKEN, load_tokenizer, train_bpe

__all__ = [
    "EOS_TOKEN",
    "Document",
    "EpochBatches",
    "KeyedPermutation",
    "PreparedData",
    "ShardedTokens",
    "TokenBatches",
    "embedded_corpus_documents",
    "embedded_manifest",
    "load_prepared",
    "load_tokenizer",
    "prepare_corpus",
    "read_corpus_dir",
    "sequential_batches",
    "split_documents",
    "train_bpe",
    "verify_corpus",
]
