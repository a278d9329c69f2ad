"""``depthattn convert``: Hugging Face Qwen3 checkpoints in and out.

  depthattn convert --from-qwen3 DIR --out OUT [--cross-layer METHOD]   Qwen3 folder → depthattn checkpoint
  depthattn convert --to-qwen3 CKPT --out OUT                           cross_layer="none" checkpoint → Qwen3 folder

Weights are copied 1:1 (the parameter names are Qwen3's). Importing into a method with extra parameters keeps their
vanilla-equivalent initialisation; exporting any method other than "none" is refused.
"""

from __future__ import annotations

import argparse

from ..config import CROSS_LAYER_METHODS


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import load_model
    from ..hf.convert import convert_from_qwen3, save_qwen3

    if bool(args.from_qwen3) == bool(args.to_qwen3):
        raise ValueError("give exactly one of --from-qwen3 DIR or --to-qwen3 CKPT")
    if args.from_qwen3:
        if args.cross_layer not in CROSS_LAYER_METHODS:
            raise ValueError(f"--cross-layer {args.cross_layer!r} is not one of {CROSS_LAYER_METHODS}")
        model = convert_from_qwen3(args.from_qwen3, args.out, cross_layer=args.cross_layer)
        print(f"wrote depthattn checkpoint {args.out} (cross_layer={model.config.cross_layer}, "
              f"{model.num_params():,} parameters)")
    else:
        if args.cross_layer != "none":
            raise ValueError("--cross-layer applies to --from-qwen3 only")
        model = load_model(args.to_qwen3)
        save_qwen3(model, args.out)
        print(f"wrote Hugging Face Qwen3 folder {args.out} ({model.num_params():,} parameters); load it with "
              f"transformers.Qwen3ForCausalLM.from_pretrained({args.out!r})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert Hugging Face Qwen3 checkpoints to depthattn and back",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from-qwen3", metavar="DIR", help="Hugging Face Qwen3 folder (config.json + safetensors)")
    p.add_argument("--to-qwen3", metavar="CKPT", help="depthattn checkpoint with cross_layer='none'")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--cross-layer", default="none", help=f"method for --from-qwen3, one of {CROSS_LAYER_METHODS}")
    p.set_defaults(func=run)
