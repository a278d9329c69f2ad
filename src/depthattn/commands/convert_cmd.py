"""``depthattn convert``: Hugging Face Qwen3 checkpoints in and out (see ``DESCRIPTION``)."""

from __future__ import annotations

import argparse

from ..cross_layer import names as method_names

#: Plain-text ``--help`` description (argparse prints it verbatim).
DESCRIPTION = """\
Convert Hugging Face Qwen3 checkpoints to depthattn and back.

  depthattn convert --from-qwen3 DIR --out OUT [--cross-layer METHOD]   Qwen3 folder -> depthattn checkpoint
  depthattn convert --to-qwen3 CKPT --out OUT                           cross_layer="none" checkpoint -> Qwen3 folder
  depthattn convert --upgrade CKPT --out OUT                            older depthattn checkpoint -> Hugging Face folder

CKPT may be a checkpoint folder or a run folder (its newest checkpoint is used). Weights are copied 1:1 (the
parameter names are Qwen3's), and so are the tokenizer files (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) when the source has them. Importing into a method with extra parameters keeps their
vanilla-equivalent initialisation; exporting any method other than "none" is refused. OUT is written atomically
and an existing OUT is refused unless --overwrite is given.
"""


def _tokenizer_note(copied: list[str], source: str, out: str) -> str:
    if "tokenizer.json" in copied:
        return f"tokenizer: {', '.join(copied)}"
    return (f"note: {source} has no tokenizer.json, so {out} has no tokenizer; to add one, copy a tokenizer.json "
            f"into {out} (the prepared data folder's, or what transformers' "
            f"AutoTokenizer.from_pretrained(...).save_pretrained({out!r}) writes)")


def run(args: argparse.Namespace) -> int:
    from ..hf.convert import convert_from_qwen3, convert_to_qwen3

    from ..hf.convert import upgrade_checkpoint

    if sum(bool(x) for x in (args.from_qwen3, args.to_qwen3, args.upgrade)) != 1:
        raise ValueError("give exactly one of --from-qwen3 DIR, --to-qwen3 CKPT or --upgrade CKPT")
    if args.upgrade:
        model, folder = upgrade_checkpoint(args.upgrade, args.out, overwrite=args.overwrite)
        print(f"wrote Hugging Face depthattn folder {args.out} from {folder} (cross_layer="
              f"{model.config.cross_layer}); load it with transformers.AutoModelForCausalLM.from_pretrained("
              f"{args.out!r}, trust_remote_code=True)")
        return 0
    if args.from_qwen3:
        if args.cross_layer not in method_names():
            raise ValueError(f"--cross-layer {args.cross_layer!r} is not one of {method_names()}")
        model, copied = convert_from_qwen3(args.from_qwen3, args.out, overwrite=args.overwrite,
                                           cross_layer=args.cross_layer)
        print(f"wrote depthattn checkpoint {args.out} (cross_layer={model.config.cross_layer}, "
              f"{model.num_params():,} parameters)")
        print(_tokenizer_note(copied, args.from_qwen3, args.out))
    else:
        if args.cross_layer != "none":
            raise ValueError("--cross-layer applies to --from-qwen3 only")
        model, folder, written = convert_to_qwen3(args.to_qwen3, args.out, overwrite=args.overwrite)
        print(f"wrote Hugging Face Qwen3 folder {args.out} from {folder} ({model.num_params():,} parameters); load "
              f"it with transformers.Qwen3ForCausalLM.from_pretrained({args.out!r})")
        print(_tokenizer_note(written, str(folder), args.out))
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert Hugging Face Qwen3 checkpoints to depthattn and back",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-qwen3", metavar="DIR", help="Hugging Face Qwen3 folder (config.json + safetensors)")
    p.add_argument("--to-qwen3", metavar="CKPT",
                   help="depthattn checkpoint with cross_layer='none', or a run folder (its newest checkpoint)")
    p.add_argument("--upgrade", metavar="CKPT",
                   help="re-write a depthattn checkpoint of an older format as a Hugging Face model folder")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it already exists")
    p.add_argument("--cross-layer", default="none", help=f"method for --from-qwen3, one of {method_names()}")
    p.set_defaults(func=run)
