"""Where one decode step's time goes: torch.profiler over a few decode steps, eager or compiled.

Prefills ``--context`` random tokens, warms up, times ``--steps`` decode steps (wall clock, one line) and prints the
profiler's table of operators by self CPU time. With ``TORCH_LOGS=output_code`` the compiled variant also prints
inductor's generated code (count kernels with ``grep -c cpp_fused``). Used for docs/benchmarks.md (issue #11);
``scripts/bench.py`` is the benchmark (interleaved ratios), this is the microscope.

    python scripts/profile_decode.py --method none --batch 8 --variant compiled
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from depthattn import DecoderLM, ModelConfig
from depthattn.generate import CompiledDecoder, decode_one_token, prefill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--method", default="none")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--variant", choices=["eager", "compiled"], default="eager")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    args = p.parse_args()
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig.from_preset(args.preset, cross_layer=args.method)).eval()
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.context))
    cache = model.new_cache(args.batch, args.context + args.steps)
    decoder = CompiledDecoder() if args.variant == "compiled" else None
    step = decoder.decode_one_token if decoder else decode_one_token
    with torch.inference_mode():
        token = prefill(model, ids, None, cache).argmax(-1)
        for _ in range(3):  # warm-up (and compilation)
            step(model, token, cache)
        cache.crop(args.context)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(model, token, cache)
        print(f"{args.method} {args.variant} B={args.batch}: {(time.perf_counter() - t0) / args.steps * 1e3:.2f} ms "
              f"per decode step")
        cache.crop(args.context)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(4):
                step(model, token, cache)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
