"""``depthattn inspect``: parameters, FLOPs per token and KV-cache bytes of a config, per method."""

from __future__ import annotations

import argparse

import torch

from ..accounting import kv_cache_bytes_per_token, num_flops, num_params
from ..config import CROSS_LAYER_METHODS, PRESETS, ModelConfig


def inspect_rows(preset: str, methods: list[str], loops: int, seq_len: int) -> list[dict]:
    """One row of costs per method for ``preset`` (analytical; nothing is allocated)."""
    base = ModelConfig.from_preset(preset, num_loops=loops)
    vanilla_params = num_params(base)
    rows = []
    for method in methods:
        cfg = ModelConfig.from_preset(preset, cross_layer=method, num_loops=loops)
        fl = num_flops(cfg, seq_len)
        rows.append(dict(
            method=method, params=num_params(cfg), params_added=num_params(cfg) - vanilla_params,
            flops_per_token=fl.vanilla + fl.extra, extra_flops=fl.extra, extra_pct=100 * fl.ratio,
            extra_pct_with_attention=100 * fl.ratio_with_attention,
            kv_bytes_per_token_bf16=kv_cache_bytes_per_token(cfg, torch.bfloat16),
        ))
    return rows


def format_table(rows: list[dict]) -> str:
    head = ("| method | params | added | fwd FLOPs/token | extra FLOPs | extra % | extra % incl. attn | "
            "KV bytes/token (bf16) |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['method']} | {r['params']:,} | {r['params_added']:,} | {r['flops_per_token']:.4g} | "
                     f"{r['extra_flops']:,.0f} | {r['extra_pct']:.4f} | {r['extra_pct_with_attention']:.4f} | "
                     f"{r['kv_bytes_per_token_bf16']:,} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    methods = args.cross_layer.split(",") if args.cross_layer else ["none", "depth_attention"]
    for m in methods:
        if m not in CROSS_LAYER_METHODS:
            raise ValueError(f"--cross-layer {m!r} is not one of {CROSS_LAYER_METHODS}")
    print(f"preset {args.preset}, loops {args.loops}, attention at seq_len {args.seq_len}")
    print(format_table(inspect_rows(args.preset, methods, args.loops, args.seq_len)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("inspect", help="parameters, FLOPs per token and KV-cache bytes of a preset, per method",
                       description=__doc__)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--cross-layer", default=None, help="comma-separated methods (default: none,depth_attention)")
    p.add_argument("--loops", type=int, default=1, help="num_loops (looped Transformer)")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length for the attention FLOPs term")
    p.set_defaults(func=run)
