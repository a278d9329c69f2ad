"""Benchmark cross-layer methods against vanilla, measured interleaved in one run.

For each method: training step (forward + backward) tokens/s, decode tokens/s at batch 1 and 8 with a fixed
context, activation bytes saved for backward (exact, via saved-tensor hooks; plus CUDA peak memory on GPU) and
KV-cache bytes per token. Rounds alternate methods (A B A B …, reversed every other round) so machine noise hits all
of them alike; throughput cells are medians over rounds, and each time ratio is the median over rounds of the
per-round ratio against ``none`` measured back to back (robust to slow drifts of a shared machine).

    python scripts/bench.py --preset small --methods none,depth_attention
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

CLOCK = time.perf_counter  # --clock cpu switches to process CPU time (all threads)

from depthattn import DecoderLM, ModelConfig
from depthattn.generate import decode_one_token, prefill
from depthattn.training.parallelize import apply_compile


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def saved_activation_bytes(model: DecoderLM, ids: torch.Tensor) -> int:
    """Bytes of distinct tensors autograd saves for backward during one training forward."""
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids).loss
    return sum(seen.values())


def time_train_step(model, opt, ids, device, autocast_dtype) -> float:
    _sync(device)
    t0 = CLOCK()
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    return CLOCK() - t0


@torch.inference_mode()
def prefilled(model, batch: int, context: int, steps: int, device):
    """A cache holding a ``context``-token random prompt (room for ``steps`` more) and the next token."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(device)
    cache = model.new_cache(batch, context + steps)
    token = prefill(model, ids, None, cache).argmax(-1)
    decode_one_token(model, token, cache)  # warm-up step
    return cache, token


@torch.inference_mode()
def time_decode(model, cache, token, context: int, steps: int, device) -> float:
    """Seconds per decode step after the ``context`` prefilled tokens (the cache is cropped back first)."""
    cache.crop(context)
    _sync(device)
    t0 = CLOCK()
    for _ in range(steps):
        token = decode_one_token(model, token, cache).argmax(-1)
    _sync(device)
    return (CLOCK() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--methods", default="none,depth_attention")
    p.add_argument("--batch-size", type=int, default=4, help="training micro-batch")
    p.add_argument("--seq-len", type=int, default=256, help="training sequence length")
    p.add_argument("--context", type=int, default=512, help="decode context length")
    p.add_argument("--decode-steps", type=int, default=16, help="timed decode steps per round")
    p.add_argument("--decode-batches", default="1,8")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="parameter dtype for decode; bfloat16 also turns on autocast for training")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = leave)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (training.parallelize.apply_compile); use with --decode-batches ''")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed time; cpu: process CPU time of all threads (less sensitive to other load)")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    methods = args.methods.split(",")
    if methods[0] != "none":
        raise SystemExit("--methods must start with none (the baseline of the ratios)")
    autocast = torch.bfloat16 if args.dtype == "bfloat16" else None
    models, opts = {}, {}
    for m in methods:
        torch.manual_seed(0)
        cfg = ModelConfig.from_preset(args.preset, cross_layer=m)
        models[m] = DecoderLM(cfg, device=device)
        if args.compile:
            apply_compile(models[m])
        opts[m] = torch.optim.AdamW(models[m].parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, models["none"].config.vocab_size, (args.batch_size, args.seq_len), generator=g).to(device)
    decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    train_s = {m: [] for m in methods}
    decode_s = {(m, b): [] for m in methods for b in decode_batches}
    for m in methods:  # warm-up (allocator, kernels)
        time_train_step(models[m].train(), opts[m], ids, device, autocast)
    decoders = {m: (copy.deepcopy(models[m]).to(torch.bfloat16) if args.dtype == "bfloat16" else models[m]).eval()
                for m in methods}
    prompts = {(m, b): prefilled(decoders[m], b, args.context, args.decode_steps, device)
               for m in methods for b in decode_batches}
    for r in range(args.rounds):
        order = methods if r % 2 == 0 else methods[::-1]
        for m in order:
            train_s[m].append(time_train_step(models[m].train(), opts[m], ids, device, autocast))
        for b in decode_batches:
            for m in order:
                decode_s[(m, b)].append(time_decode(decoders[m], *prompts[(m, b)], args.context, args.decode_steps,
                                                    device))
    mem = {m: saved_activation_bytes(models[m].train(), ids) for m in methods}
    peak = {}
    if device.type == "cuda":
        for m in methods:
            torch.cuda.reset_peak_memory_stats()
            time_train_step(models[m], opts[m], ids, device, autocast)
            peak[m] = torch.cuda.max_memory_allocated()
    ntok = args.batch_size * args.seq_len
    print(f"preset={args.preset} device={device} ({torch.get_num_threads()} threads) dtype={args.dtype} "
          f"train batch={args.batch_size}x{args.seq_len} decode context={args.context} rounds={args.rounds} "
          f"torch={torch.__version__} compile={args.compile} clock={args.clock}")
    head = "| method | train tok/s | train time ratio | " + " | ".join(
        f"decode tok/s (B={b}) | decode time ratio (B={b})" for b in decode_batches) + \
        " | saved activations MiB | activation ratio |" + (" CUDA peak MiB |" if peak else "") + \
        " KV bytes/token | KV ratio |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    def paired(xs, base):
        return statistics.median(x / b for x, b in zip(xs, base))

    for m in methods:
        cells = [m, f"{ntok / statistics.median(train_s[m]):,.0f}", f"{paired(train_s[m], train_s['none']):.3f}"]
        for b in decode_batches:
            d = statistics.median(decode_s[(m, b)])
            cells += [f"{b / d:,.1f}", f"{paired(decode_s[(m, b)], decode_s[('none', b)]):.3f}"]
        cells += [f"{mem[m] / 2**20:,.1f}", f"{mem[m] / mem['none']:.3f}"]
        if peak:
            cells.append(f"{peak[m] / 2**20:,.0f}")
        kv = models[m].new_cache(1, 1).bytes_per_token()
        cells += [f"{kv:,}", f"{kv / models['none'].new_cache(1, 1).bytes_per_token():.3f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
