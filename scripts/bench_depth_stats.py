"""Measure the overhead of the depth statistics (``TrainConfig.log_depth_every``) on training step time.

One process, one model: optimizer steps as the trainer takes them (``next_token_loss`` forward and backward over
``grad_accum`` micro-batches, ``clip_grad_norm_``, AdamW, ``zero_grad``) alternate, side by side, between a plain
step and a step on which the statistics are due (``depth_stats.layer_grad_norms`` before clipping, then the probe
forward ``DepthProbe.statistics`` after the update), in ``depthattn.bench.interleaved`` rounds (plain due | due
plain | …), so the machine's changing load hits both alike. With the medians t_plain and t_due over ``--pairs``
pairs (after ``--warmup`` pairs), the overhead at an interval of N steps is (t_due − t_plain) / (N · t_plain): one
due step per N.

    python scripts/bench_depth_stats.py --preset small --method depth_attention --pairs 10

Prints one JSON line: the step times, the extra seconds of a due step, the paired due / plain time ratio (median
over pairs, geometric mean and its 95 % interval: ``depthattn.bench.paired_ratios``) and the overhead at
``--interval`` (default: ``TrainConfig``'s ``log_depth_every``); ``--record PATH`` also writes the per-pair times
(``depthattn.bench.write_record``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from depthattn import DecoderLM, ModelConfig
from depthattn.bench import interleaved, paired_ratios, write_record
from depthattn.data import TokenBatches
from depthattn.eval.perplexity import next_token_loss, validation_windows
from depthattn.training import TrainConfig
from depthattn.training.depth_stats import DepthProbe
from depthattn.training.optim import build_optimizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--method", default="depth_attention")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--interval", type=int, default=TrainConfig().log_depth_every)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--record", type=Path, help="also write the per-pair times here (JSON)")
    args = ap.parse_args()
    if args.pairs < 1 or args.warmup < 0:
        ap.error(f"--pairs must be at least 1 and --warmup at least 0, got {args.pairs} and {args.warmup}")

    device = torch.device(args.device)
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(args.preset, cross_layer=args.method)
    model = DecoderLM(cfg).to(device).train()
    optimizer, _ = build_optimizer(model, 1e-4, 0.1, (0.9, 0.95), 1e-8)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, 200_000, dtype=np.int64)
    batches = TokenBatches(tokens, args.batch_size, args.seq_len, seed=0)
    probe = DepthProbe(args.interval, validation_windows(tokens[:50_000], args.seq_len, 16)[:4, :-1], device)
    amp = torch.bfloat16 if device.type == "cuda" else None

    steps = itertools.count()  # each optimizer step takes the next batch

    def step(due: bool) -> float:
        i = next(steps)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for micro in range(args.grad_accum):
            loss = next_token_loss(model, batches.batch(i, micro).to(device), device, amp)
            (loss / args.grad_accum).backward()
        if due:
            probe.grad_norms(model)
        float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if due:
            probe.statistics(model)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    record = interleaved({"plain": lambda: step(False), "due": lambda: step(True)}, args.pairs, order="abba",
                         warmup=args.warmup)
    t_plain, t_due = statistics.median(record["times"]["plain"]), statistics.median(record["times"]["due"])
    extra = t_due - t_plain
    ratio = paired_ratios(record, "due", "plain")
    result = {"preset": args.preset, "method": args.method, "device": str(device),
              "tokens_per_step": args.batch_size * args.grad_accum * args.seq_len, "pairs": args.pairs,
              "t_plain_s": round(t_plain, 5), "t_due_s": round(t_due, 5), "extra_s": round(extra, 5),
              "due_over_plain": {k: ratio[k] for k in ("median", "geomean", "ci95")},
              "interval": args.interval,
              "overhead_at_interval": extra / (args.interval * t_plain) if args.interval else 0.0}
    print(json.dumps(result))
    if args.record:
        try:
            write_record(args.record, {**record, "result": result}, device=str(device))
        except OSError as e:
            raise SystemExit(f"bench_depth_stats.py: --record {str(args.record)!r}: {e.strerror or e}")


if __name__ == "__main__":
    main()
