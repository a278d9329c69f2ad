"""``depthattn eval``, and the ``--tasks`` / ``--limit`` check shared with ``compare``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ..compat import Side, check_pairing
from ..eval.inference import load_for_inference
from ..fileio import atomic_write_text, read_json
from ..outputs import WRITTEN_BY, check_result_file, is_written_by, written_by
from ..layout import TOKENIZER_FILE, TRAIN_CONFIG_FILE
from ..run.record import run_of_checkpoint
from ..devices import autocast_dtype


def eval_data_dir(folder: Path, data: str | None) -> Path:
    """``--data`` if given (its tokenizer must be the checkpoint's), else the data the run was trained on."""
    if data is None:
        run = run_of_checkpoint(folder)
        if run is None:
            raise ValueError(f"{folder} is not inside a run folder, so its training data is unknown; pass --data DIR")
        data = run["data"]
    data = Path(data)
    tok = data / TOKENIZER_FILE
    if not tok.is_file():
        raise FileNotFoundError(f"{tok} not found: {data} is not a prepared data folder")
    check_pairing("tokenizer mismatch", Side.of_folder(f"the checkpoint {folder}", folder),
                  Side.of_folder(str(data), data),
                  "evaluate on data prepared with the checkpoint's tokenizer (data prepare --tokenizer)",
                  check_data=False)
    return data


#: ``eval``'s window length when the checkpoint records no training ``seq_len`` (capped by the model's positions).
FALLBACK_SEQ_LEN = 1024


def default_seq_len(folder: Path, model) -> tuple[int, str | None]:
    """(window length, note): the training ``seq_len`` from ``folder/train_config.json``, else (no such file, e.g. a
    converted Hugging Face folder) ``min(FALLBACK_SEQ_LEN, max_position_embeddings)`` with a note saying so (None
    when the length came from the file). ``ValueError`` naming the file if it is not JSON or its ``seq_len`` is
    not an integer >= 1."""
    file = folder / TRAIN_CONFIG_FILE
    if not file.is_file():
        n = min(FALLBACK_SEQ_LEN, model.config.max_position_embeddings)
        return n, (f"{file} does not exist, so the training seq_len is unknown; evaluating at seq_len {n} "
                   f"(min({FALLBACK_SEQ_LEN}, max_position_embeddings={model.config.max_position_embeddings})); "
                   f"pass --seq-len to choose")
    try:
        values = read_json(file, "training config")
    except ValueError as e:
        raise ValueError(f"{file}: not a valid JSON file ({e}); pass --seq-len to evaluate without it") from None
    n = values.get("seq_len") if isinstance(values, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{file}: `seq_len` is {n!r}, not an integer >= 1; pass --seq-len to evaluate without it")
    return n, None


def check_task_options(tasks: str | None, limit: int | None, shorten: str = "--max-tokens") -> list[str]:
    """The ``--tasks`` names (empty without ``--tasks``), checked with ``--limit`` before any training or evaluation:
    unknown task names, ``--limit`` < 1 or without ``--tasks``, or missing benchmark data raise ``ValueError`` naming
    the flag (``shorten``: the flag that shortens the perplexity evaluation instead)."""
    from ..eval.tasks import parse_tasks, task_file

    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit} must be >= 1 (examples per zero-shot task)")
    if not tasks:
        if limit is not None:
            raise ValueError(f"--limit counts examples per zero-shot task and needs --tasks (to shorten the "
                             f"perplexity evaluation use {shorten})")
        return []
    try:
        names = parse_tasks(tasks)
    except ValueError as e:
        raise ValueError(f"--tasks: {e}") from None
    for name in names:
        task_file(name)  # the benchmark data is installed
    return names


def _is_result(doc: object) -> bool:
    """Whether parsed JSON is what ``eval --out`` writes: an object with ``"written_by": "depthattn eval"``
    (``outputs.written_by``), or, written before that mark, one without a ``written_by`` that names its
    ``checkpoint`` beside a ``loss`` or ``zero_shot`` (what every earlier ``eval --out`` wrote; a run's
    ``summary.json`` has neither)."""
    if is_written_by(doc, "eval"):
        return True
    return (isinstance(doc, dict) and WRITTEN_BY not in doc and isinstance(doc.get("checkpoint"), str)
            and ("loss" in doc or "zero_shot" in doc))


def run_eval(args: argparse.Namespace) -> int:
    """Validation loss, perplexity (= exp(loss)) and bits per byte of a checkpoint on held-out text; optionally
    zero-shot tasks (--tasks). CHECKPOINT is a checkpoint folder or a run folder (its newest checkpoint)."""
    from ..data import load_prepared
    from ..eval.perplexity import evaluate_perplexity
    from ..eval.zero_shot import run_zero_shot

    tasks = check_task_options(args.tasks, args.limit)  # before loading or evaluating anything
    if args.out:  # an earlier result file is replaced; a file of the checkpoint or data, or the user's, is not
        check_result_file(args.out, [p for p in (args.checkpoint, args.data) if p], _is_result, "an eval result file "
                          "(a JSON object with \"written_by\": \"depthattn eval\")")
    if args.skip_perplexity and not tasks:
        raise ValueError("--skip-perplexity leaves nothing to do without --tasks")
    model, tokenizer, folder, dev = load_for_inference(args.checkpoint, args.device)
    results: dict = {**written_by("eval"), "checkpoint": str(folder)}
    if not args.skip_perplexity:
        data_dir = eval_data_dir(folder, args.data)
        data = load_prepared(data_dir, verify=not args.no_verify)
        if args.seq_len is not None and args.seq_len < 1:
            raise ValueError(f"--seq-len {args.seq_len} must be >= 1")
        seq_len, note = (args.seq_len, None) if args.seq_len else default_seq_len(folder, model)
        if note:
            print(f"note: {note}", file=sys.stderr)
        res = evaluate_perplexity(model, data.split(args.split), tokenizer, seq_len=seq_len,
                                  batch_size=args.batch_size, max_tokens=args.max_tokens, device=dev,
                                  amp_dtype=autocast_dtype("auto", dev), progress=not args.no_progress,
                                  expected_bytes=data.num_bytes(args.split))
        if not math.isfinite(res.loss):  # non-finite weights, or an overflow in the forward: not a measurement
            raise FloatingPointError(f"the {args.split} loss of {folder} is {res.loss} (not finite): its weights are "
                                     f"probably not finite (a diverged run); nothing was written")
        results.update(data=str(data_dir), split=args.split, **res.to_dict())
        print(f"{args.split} loss {res.loss:.6f}  perplexity {res.perplexity:.4f}  bits/byte {res.bits_per_byte:.6f}  "
              f"({res.tokens:,d} tokens, {res.bytes:,d} bytes, seq_len {seq_len})")
    if tasks:
        out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else None
        zs = run_zero_shot(model, tokenizer, tasks=tasks, limit=args.limit, batch_size=args.batch_size,
                           harness=args.harness, out_dir=out_dir, progress=not args.no_progress)
        results["zero_shot"] = zs
        print(zs.get("markdown", ""))
    if args.out:
        atomic_write_text(args.out, json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="perplexity / bits per byte (and zero-shot tasks) of a checkpoint",
                              description=run_eval.__doc__)
    p.add_argument("checkpoint", help="checkpoint folder, or run folder (its newest checkpoint)")
    p.add_argument("--data", default=None, help="prepared data folder (default: the run's training data)")
    p.add_argument("--split", default="val", choices=("val", "train"), help="which split (default val)")
    p.add_argument("--max-tokens", type=int, default=None, help="evaluate only the first N predicted tokens")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: the training seq_len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows (or task requests) per batch (default 8)")
    p.add_argument("--tasks", default=None,
                   help="comma-separated zero-shot tasks, or 'all' (piqa, hellaswag, arc_easy, ...; data from "
                        "`depthattn data fetch-eval`)")
    p.add_argument("--limit", type=int, default=None, help="examples per zero-shot task (needs --tasks)")
    p.add_argument("--harness", choices=("native", "lm-eval"), default="native", help="zero-shot scorer")
    p.add_argument("--skip-perplexity", action="store_true", help="only run --tasks")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--out", default=None,
                   help="write the results as JSON here (replaces only an earlier result file of eval)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the data shards")
    p.set_defaults(func=run_eval)
