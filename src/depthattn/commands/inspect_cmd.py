"""depthattn inspect: analytical costs of a preset per cross-layer method (nothing is allocated).

Per method: parameters and those added over vanilla; forward FLOPs per token without sequence attention (matmuls:
the vanilla forward 2·(non-embedding params + V·D), blocks once per loop, plus the method's extra FLOPs) and with
sequence attention at --seq-len (causal mean of (T+1)/2 keys; what `depthattn compare` reports at its training
length); the method's extra FLOPs and their % of the vanilla forward (docs/specs/spec-baselines.md §1 denominator),
also with attention added to the denominator; KV-cache bytes per token; in-flight bytes per token (the residual
state a token carries through depth, docs/specs/spec-baselines.md §7); and the prefill working set, in-flight bytes
× prompt length T. Bytes are for bfloat16 activations. The vocabulary is the preset's (or --set vocab_size=N);
`train` takes it from the data's tokenizer instead.
"""

from __future__ import annotations

import argparse
import json

import torch

from ..accounting import inflight_bytes_per_token, kv_cache_bytes_per_token, num_flops, num_params
from ..config import PRESETS, ModelConfig, check_keys
from ..cross_layer import loopable as loopable_methods, names as method_names
from ..fileio import loads_json


def inspect_rows(preset: str, methods: list[str], loops: int, seq_len: int, prompt_len: int = 2048,
                 overrides: dict | None = None) -> list[dict]:
    """One row of costs per method for ``preset`` (analytical; nothing is allocated).

    Raises ``ValueError`` for an unknown preset, method, override key or an invalid combination (e.g. loops > 1
    with a method that does not support looping).
    """
    overrides = dict(overrides or {})
    base = ModelConfig.from_preset(preset, num_loops=loops, **overrides)
    vanilla_params = num_params(base)
    rows = []
    for method in methods:
        cfg = base.replace(cross_layer=method)
        fl = num_flops(cfg, seq_len)
        inflight = inflight_bytes_per_token(cfg, torch.bfloat16)
        rows.append(dict(
            method=method, params=num_params(cfg), params_added=num_params(cfg) - vanilla_params,
            vocab_size=cfg.vocab_size, seq_len=seq_len,
            flops_per_token=fl.vanilla + fl.extra, flops_per_token_with_attention=fl.total,
            extra_flops=fl.extra, extra_pct=100 * fl.ratio,
            extra_pct_with_attention=100 * fl.ratio_with_attention,
            kv_bytes_per_token_bf16=kv_cache_bytes_per_token(cfg, torch.bfloat16),
            inflight_bytes_per_token_bf16=inflight, prompt_len=prompt_len,
            prefill_working_set_bytes_bf16=inflight * prompt_len,
        ))
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table of ``inspect_rows`` output."""
    T = rows[0]["prompt_len"] if rows else 0
    S = rows[0]["seq_len"] if rows else 0
    head = ("| method | params | added | fwd FLOPs/token (matmul, excl. attention) | "
            f"fwd FLOPs/token incl. attention (seq_len={S}) | extra FLOPs/token | extra % | extra % incl. attn | "
            f"KV bytes/token | in-flight bytes/token | prefill working set (T={T}) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['method']} | {r['params']:,} | {r['params_added']:,} | {r['flops_per_token']:.4g} | "
                     f"{r['flops_per_token_with_attention']:.4g} | "
                     f"{r['extra_flops']:,.0f} | {r['extra_pct']:.3f} | {r['extra_pct_with_attention']:.3f} | "
                     f"{r['kv_bytes_per_token_bf16']:,} | {r['inflight_bytes_per_token_bf16']:,} | "
                     f"{r['prefill_working_set_bytes_bf16'] / 2**20:,.1f} MiB |")
    return "\n".join(lines)


def parse_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` strings (VALUE as JSON, else a string) → dict; raises ``ValueError`` naming a bad item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} must look like KEY=VALUE")
        try:
            out[key] = loads_json(value, f"--set {key}")
        except json.JSONDecodeError:  # a plain string (a JSON value nested too deep is a ValueError)
            out[key] = value
    check_keys(out, "--set")
    return out


def run(args: argparse.Namespace) -> int:
    """Print the cost table of ``--preset`` for the ``--cross-layer`` methods."""
    if args.cross_layer in (None, "all"):  # with loops > 1: only the methods for which looping is defined
        methods = list(method_names() if args.loops == 1 else loopable_methods())
    else:
        methods = [m.strip() for m in args.cross_layer.split(",") if m.strip()]
    for m in methods:
        if m not in method_names():
            raise ValueError(f"--cross-layer {m!r} is not one of {method_names()} (or 'all')")
    if args.prompt_len < 1:
        raise ValueError(f"--prompt-len {args.prompt_len} must be >= 1")
    if args.seq_len < 1:
        raise ValueError(f"--seq-len {args.seq_len} must be >= 1")
    overrides = parse_overrides(args.set or [])
    rows = inspect_rows(args.preset, methods, args.loops, args.seq_len, args.prompt_len, overrides)
    vocab = rows[0]["vocab_size"]
    source = "--set vocab_size" if "vocab_size" in overrides else "the preset's; train uses the data tokenizer's"
    print(f"preset {args.preset}, vocab {vocab} ({source}), loops {args.loops}, attention at seq_len {args.seq_len}, "
          f"prompt length {args.prompt_len}, bfloat16 bytes" + (f", overrides {overrides}" if overrides else ""))
    print(format_table(rows))
    return 0


def register(sub) -> None:
    p = sub.add_parser("inspect", help="parameters, FLOPs, KV-cache and in-flight bytes of a preset, per method",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--cross-layer", default="all", help="comma-separated methods, or 'all' (default)")
    p.add_argument("--loops", type=int, default=1, help="num_loops (looped Transformer)")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length for the attention FLOPs term (default 2048)")
    p.add_argument("--prompt-len", type=int, default=2048, help="prompt length T for the prefill working set (default 2048)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="ModelConfig override, e.g. attnres_recency_bias=3.0 (repeatable)")
    p.set_defaults(func=run)
