"""``depthattn generate``: stream text from a checkpoint with the KV cache."""

from __future__ import annotations

import argparse
import sys

from ..checks import check_text
from ..eval.inference import load_for_inference
from ..generate import CompileUnavailable, check_compile_works, check_sampling, stream_text


#: How long ``--compile`` takes before the first token (inductor, a 2-core CPU; a GPU is quicker).
COMPILE_TIME = "a few minutes on CPU the first time"


def check_prompt(model, tokenizer, prompt: str, max_new_tokens: int) -> None:
    """Refuse an empty prompt, or prompt tokens + ``max_new_tokens`` beyond ``max_position_embeddings``, before
    anything is printed (``ValueError`` naming the flags)."""
    check_text(prompt, "--prompt")
    n = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    if n == 0:
        raise ValueError("--prompt must not be empty")
    limit = model.config.max_position_embeddings
    if n >= limit and n + max_new_tokens > limit:
        raise ValueError(f"--prompt has {n} tokens, and the model's max_position_embeddings={limit} leaves no room "
                         f"for new tokens; shorten the prompt")
    if n + max_new_tokens > limit:
        raise ValueError(f"--prompt ({n} tokens) + --max-new-tokens {max_new_tokens} = {n + max_new_tokens} exceeds "
                         f"the model's max_position_embeddings={limit}; use --max-new-tokens {max(limit - n, 0)} or "
                         f"less")


def run_generate(args: argparse.Namespace) -> int:
    """Continue --prompt with a checkpoint (checkpoint folder or run folder), streaming to stdout; stops at EOS."""
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens={args.max_new_tokens} must be >= 0")
    check_sampling(args.temperature, args.top_k, args.top_p)  # fail before loading or echoing the prompt
    check_text(args.prompt, "--prompt")  # bytes that are not UTF-8 arrive as lone surrogates (surrogateescape)
    model, tokenizer, _, dev = load_for_inference(args.checkpoint, args.device)
    check_prompt(model, tokenizer, args.prompt, args.max_new_tokens)
    if args.compile:
        try:
            check_compile_works(dev)  # before anything is printed
        except CompileUnavailable as e:
            print(f"depthattn generate: error: --compile: {e}", file=sys.stderr)
            return 2
        print(f"compiling the prefill and the decode step ({COMPILE_TIME}; the first token waits for it)...",
              file=sys.stderr, flush=True)
    sys.stdout.write(args.prompt)
    for piece in stream_text(model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                             device=dev, compile=args.compile):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text from a checkpoint (KV cache)",
                              description=run_generate.__doc__)
    p.add_argument("checkpoint", help="checkpoint folder, or run folder (its newest checkpoint)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100, help="at most this many new tokens (default 100)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=50, help="keep the k most likely tokens (default 50)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda")
    p.add_argument("--compile", action="store_true",
                   help=f"torch.compile the prefill and the decode step (compiled once, reused for every token; "
                        f"compiling takes {COMPILE_TIME}, so it pays for long generations only; a line on stderr "
                        f"says when it starts)")
    p.set_defaults(func=run_generate)
