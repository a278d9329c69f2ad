"""``depthattn analyze``: Depth-Attention weights per layer on held-out text (see ``DESCRIPTION``)."""

from __future__ import annotations

import argparse
import json
import os

import torch

from ..layout import DEPTH_WEIGHTS_FILES
from ..outputs import check_result_folder, is_written_by, written_by

#: Plain-text ``--help`` description (argparse prints it verbatim).
DESCRIPTION = """\
Mean Depth-Attention weight of every layer over its candidates (self and each source) on held-out text, written
as OUT/depth_weights.json and a heat map OUT/depth_weights.png.

  depthattn analyze CHECKPOINT (--prompt TEXT | --data DIR) --out OUT

CHECKPOINT is a checkpoint folder or a run folder (its newest checkpoint is used). --prompt is tokenised with
the checkpoint's tokenizer.json (or --tokenizer PATH); --data reads the validation tokens of a
"depthattn data prepare" folder (--windows windows of --seq-len tokens from its start).
"""


#: What ``analyze`` writes into ``--out``: the JSON first, the heat map beside it.
OUTPUT_FILES = DEPTH_WEIGHTS_FILES


def _is_result(doc: object) -> bool:
    """Whether parsed JSON is analyze's ``depth_weights.json``: an object with ``"written_by": "depthattn analyze"``
    (``outputs.written_by``), or, written before that mark, exactly the keys ``layers`` (a list) and
    ``num_tokens``, all that every earlier ``analyze`` wrote."""
    return is_written_by(doc, "analyze") or (isinstance(doc, dict) and set(doc) == {"layers", "num_tokens"}
                                             and isinstance(doc["layers"], list))


def run(args: argparse.Namespace) -> int:
    from ..analyze import depth_weight_means, heatmap
    from ..checkpoint import open_checkpoint
    from ..fileio import atomic_write_text
    from ..hf.convert import load_any_model  # a depthattn checkpoint or a Hugging Face Qwen3 folder
    from ..layout import TOKENIZER_FILE

    if bool(args.prompt) == bool(args.data):
        raise ValueError("give exactly one of --prompt TEXT or --data DIR")
    check_result_folder(args.out, OUTPUT_FILES, _is_result, "analyze's depth weights (a JSON object with "
                        "\"written_by\": \"depthattn analyze\")")  # before anything is loaded
    if args.prompt:
        from ..checks import check_text

        check_text(args.prompt, "--prompt")
    with open_checkpoint(args.checkpoint) as folder:  # a run folder: its newest checkpoint, under a shared lock
        model = load_any_model(folder)
        tok_path = args.tokenizer or os.path.join(folder, TOKENIZER_FILE)
        if args.prompt:
            from ..data.tokenizer import read_tokenizer

            if not os.path.lexists(tok_path):
                raise ValueError(f"--prompt needs a tokenizer: {tok_path} not found (pass --tokenizer PATH)")
            tokenizer = read_tokenizer(tok_path, model.config.vocab_size)  # bounded before it is parsed
    if args.prompt:
        ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        if not ids:
            raise ValueError("--prompt is empty after tokenisation")
        ids_BT = torch.tensor([ids[: model.config.max_position_embeddings]])
    else:
        from ..data import load_prepared

        val = load_prepared(args.data).val
        T = min(args.seq_len, model.config.max_position_embeddings)
        n = min(args.windows, len(val) // T)
        if n < 1:
            raise ValueError(f"{args.data}: validation split has {len(val)} tokens, fewer than --seq-len {T}")
        ids_BT = torch.from_numpy(val[: n * T].astype("int64")).view(n, T)
    result = depth_weight_means(model, ids_BT)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, OUTPUT_FILES[0]),
                      json.dumps({**written_by("analyze"), **result}, indent=1) + "\n")
    heatmap(result, os.path.join(args.out, OUTPUT_FILES[1]))
    for row in result["layers"]:
        pairs = ", ".join(f"{'self' if j == row['layer'] else j}:{w:.3f}" for j, w in zip(row["candidates"],
                                                                                         row["weights"]))
        print(f"layer {row['layer']:3d}  {pairs}")
    print(f"wrote {args.out}/depth_weights.json and depth_weights.png ({result['num_tokens']} tokens of {folder})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("analyze", help="Depth-Attention weights per layer on held-out text (JSON + heat map)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="depthattn checkpoint folder (cross_layer='depth_attention'), or a run folder "
                                      "(its newest checkpoint)")
    p.add_argument("--prompt", help="text to analyse")
    p.add_argument("--data", help="prepared data folder (its val split is used)")
    p.add_argument("--tokenizer", help="tokenizer.json for --prompt (default: CHECKPOINT/tokenizer.json)")
    p.add_argument("--seq-len", type=int, default=256, help="window length for --data (default 256)")
    p.add_argument("--windows", type=int, default=8, help="number of windows for --data (default 8)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=run)
