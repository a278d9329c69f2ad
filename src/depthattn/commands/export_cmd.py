"""``depthattn export``: gather a (sharded) training checkpoint into an ordinary checkpoint folder."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Gather the full weights of a checkpoint (an FSDP run's DCP shards, or a full checkpoint) into OUT:
    model.safetensors, config.json and tokenizer.json, which eval, generate, convert and from_pretrained read.
    RUN_OR_CKPT is a checkpoint folder or a run folder (its newest checkpoint). One process, no torchrun. OUT may not
    be, contain or lie inside RUN_OR_CKPT; an existing OUT is replaced only with --overwrite and only when it is a
    model folder depthattn wrote (checksums.json listing every file)."""
    from ..run.dcp import export_checkpoint

    source = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"exported {source} to {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="gather a training checkpoint (FSDP shards included) into an ordinary "
                                             "checkpoint folder", description=run.__doc__)
    p.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="checkpoint folder, or run folder (its newest checkpoint)")
    p.add_argument("--out", required=True, help="the checkpoint folder to write (atomically)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out (only a model folder depthattn wrote)")
    p.set_defaults(func=run)
