"""``depthattn convert``: Hugging Face Qwen3 and hyq718/Depth-Attention checkpoints in, Qwen3 out (see
``DESCRIPTION``)."""

from __future__ import annotations

import argparse

from ..config import QK_NORM_POSITIONS
from ..cross_layer import names as method_names
from ..layout import TOKENIZER_FILE

#: Plain-text ``--help`` description (argparse prints it verbatim).
DESCRIPTION = """\
Convert Hugging Face Qwen3 checkpoints and the Depth-Attention authors' checkpoints to depthattn, and back to Qwen3.

  depthattn convert --from-qwen3 DIR --out OUT [--cross-layer METHOD] [--set KEY=VALUE ...]
                                                          Qwen3 folder -> depthattn checkpoint
  depthattn convert --from-authors DIR --out OUT [--tokenizer PATH] [--dtype float32|bfloat16]
                    [--qk-norm-position before_rope|k_after_rope] [--allow-vanilla]
                                                          hyq718/Depth-Attention folder -> depthattn checkpoint
  depthattn convert --to-qwen3 CKPT --out OUT             cross_layer="none" checkpoint -> Qwen3 folder
  depthattn convert --upgrade CKPT --out OUT              older depthattn checkpoint -> Hugging Face folder

CKPT may be a checkpoint folder or a run folder (its newest checkpoint is used). Qwen3 weights are copied 1:1 (the
parameter names are Qwen3's), and so are the tokenizer files (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) when the source has them; --set gives the method's knobs (e.g.
depth_attention_stride=2). Importing into a method with extra parameters keeps their vanilla-equivalent
initialisation; exporting any method other than "none" is refused. --from-authors resolves the authors' config
switches as their modelling code does, renames and packs their tensors into ours, says which q/k-norm order it
chose and why, and streams the weights one tensor at a time into sharded safetensors (docs/authors-checkpoints.md).
OUT is written atomically and an existing OUT is refused unless --overwrite is given.
"""


def _tokenizer_note(copied: list[str], source: str, out: str) -> str:
    if TOKENIZER_FILE in copied:
        return f"tokenizer: {', '.join(copied)}"
    return (f"note: {source} has no tokenizer.json, so {out} has no tokenizer; to add one, copy a tokenizer.json "
            f"into {out} (the prepared data folder's, or what transformers' "
            f"AutoTokenizer.from_pretrained(...).save_pretrained({out!r}) writes)")


def _from_authors(args: argparse.Namespace) -> int:
    import torch

    from ..hf.convert import convert_from_authors

    dtype = {None: None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    folder, written = convert_from_authors(args.from_authors, args.out, tokenizer=args.tokenizer, dtype=dtype,
                                           qk_norm_position=args.qk_norm_position,
                                           allow_vanilla=args.allow_vanilla, overwrite=args.overwrite)
    for note in folder.notes:
        print(note)
    cfg = folder.config
    print(f"wrote depthattn checkpoint {args.out} (cross_layer={cfg.cross_layer}, {cfg.num_hidden_layers} layers, "
          f"{str(dtype or folder.dtype).removeprefix('torch.')}); load it with depthattn.checkpoint.load_model or "
          f"transformers.AutoModelForCausalLM.from_pretrained({args.out!r}, trust_remote_code=True)")
    print(_tokenizer_note(written, args.tokenizer or args.from_authors, args.out))
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    if sum(bool(x) for x in (args.from_qwen3, args.from_authors, args.to_qwen3, args.upgrade)) != 1:
        raise ValueError("give exactly one of --from-qwen3 DIR, --from-authors DIR, --to-qwen3 CKPT or --upgrade CKPT")
    authors_only = [flag for flag, given in (("--tokenizer", args.tokenizer), ("--dtype", args.dtype),
                                             ("--qk-norm-position", args.qk_norm_position),
                                             ("--allow-vanilla", args.allow_vanilla)) if given]
    if authors_only and not args.from_authors:
        raise ValueError(f"{authors_only[0]} applies to --from-authors only")
    if (args.cross_layer != "none" or args.set) and not args.from_qwen3:
        raise ValueError(f"{'--cross-layer' if args.cross_layer != 'none' else '--set'} applies to --from-qwen3 only")


def run(args: argparse.Namespace) -> int:
    from ..hf.convert import convert_from_qwen3, convert_to_qwen3, upgrade_checkpoint
    from .inspect_cmd import parse_overrides

    _check_flags(args)
    if args.from_authors:
        return _from_authors(args)
    if args.upgrade:
        model, folder = upgrade_checkpoint(args.upgrade, args.out, overwrite=args.overwrite)
        print(f"wrote Hugging Face depthattn folder {args.out} from {folder} (cross_layer="
              f"{model.config.cross_layer}); load it with transformers.AutoModelForCausalLM.from_pretrained("
              f"{args.out!r}, trust_remote_code=True)")
        return 0
    if args.from_qwen3:
        if args.cross_layer not in method_names():
            raise ValueError(f"--cross-layer {args.cross_layer!r} is not one of {method_names()}")
        overrides = {"cross_layer": args.cross_layer, **parse_overrides(args.set or [])}
        model, copied = convert_from_qwen3(args.from_qwen3, args.out, overwrite=args.overwrite, **overrides)
        cfg = model.config
        knobs = f", depth_attention_stride={cfg.depth_attention_stride}" if cfg.cross_layer.startswith("depth") else ""
        print(f"wrote depthattn checkpoint {args.out} (cross_layer={cfg.cross_layer}{knobs}, "
              f"{model.num_params():,} parameters)")
        print(_tokenizer_note(copied, args.from_qwen3, args.out))
    else:
        model, folder, written = convert_to_qwen3(args.to_qwen3, args.out, overwrite=args.overwrite)
        print(f"wrote Hugging Face Qwen3 folder {args.out} from {folder} ({model.num_params():,} parameters); load "
              f"it with transformers.Qwen3ForCausalLM.from_pretrained({args.out!r})")
        print(_tokenizer_note(written, str(folder), args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert Hugging Face Qwen3 and the authors' checkpoints to depthattn and back",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-qwen3", metavar="DIR", help="Hugging Face Qwen3 folder (config.json + safetensors)")
    p.add_argument("--from-authors", metavar="DIR",
                   help="hyq718/Depth-Attention folder (config.json + model.safetensors, or sharded with an index)")
    p.add_argument("--to-qwen3", metavar="CKPT",
                   help="depthattn checkpoint with cross_layer='none', or a run folder (its newest checkpoint)")
    p.add_argument("--upgrade", metavar="CKPT",
                   help="re-write a depthattn checkpoint of an older format as a Hugging Face model folder")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it already exists")
    p.add_argument("--cross-layer", default="none", help=f"method for --from-qwen3, one of {method_names()}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="ModelConfig field for --from-qwen3, e.g. depth_attention_stride=2 (repeatable)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="--from-authors: a tokenizer.json (or a folder with one) to ship in OUT")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="--from-authors: dtype of the weights written (default: the source's torch_dtype)")
    p.add_argument("--qk-norm-position", choices=QK_NORM_POSITIONS,
                   help="--from-authors: override the q/k-norm order chosen per checkpoint")
    p.add_argument("--allow-vanilla", action="store_true",
                   help="--from-authors: import a folder whose switches resolve to no method as cross_layer='none'")
    p.set_defaults(func=run)
