"""Benchmark cross-layer methods against vanilla, measured interleaved in one run.

For each method: training step (forward + backward) tokens/s, decode tokens/s at batch 1 and 8 with a fixed
context, activation bytes saved for backward (exact, via saved-tensor hooks; plus CUDA peak memory on GPU) and
KV-cache bytes per token. Rounds alternate methods (A B A B …, reversed every other round) so machine noise hits all
of them alike; throughput cells are medians over rounds, and each time ratio is the median over rounds of the
per-round ratio against ``none`` measured back to back (robust to slow drifts of a shared machine).

``--compile`` adds a compiled variant of every method (train step: ``torch.compile`` of the whole model; decode:
``generate.CompiledDecoder``, one graph per batch size reused for every token), measured in the same rounds; its
ratios are against compiled ``none``. The peer row ``hf_qwen3`` is ``transformers.Qwen3ForCausalLM`` (sdpa) with
the weights of our ``none`` model: train step, and decode with its own ``DynamicCache`` (cropped back each round).

    python scripts/bench.py --preset small --methods none,depth_attention --compile
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

CLOCK = time.perf_counter  # --clock cpu switches to process CPU time (all threads)

from depthattn import DecoderLM, ModelConfig
from depthattn.generate import CompiledDecoder, decode_one_token, prefill

PEER = "hf_qwen3"


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


def to_peer(model: DecoderLM, device):
    """``transformers.Qwen3ForCausalLM`` (sdpa attention) with ``model``'s config and weights (same keys)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = model.config
    hf_cfg = Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, attention_bias=False,
        attn_implementation="sdpa")
    hf = Qwen3ForCausalLM(hf_cfg).to(device)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


class Decoder:
    """One way of decoding (ours eager, ours compiled, or the peer) over a prefilled cache it can crop back."""

    def __init__(self, model, kind: str, batch: int, context: int, steps: int, device):
        self.model, self.kind, self.context = model, kind, context
        g = torch.Generator().manual_seed(0)
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (batch, context), generator=g).to(device)
        with torch.inference_mode():
            if kind == "peer":
                out = model(input_ids=ids, use_cache=True)
                cache = getattr(out, "cache", None)
                self.cache = cache if cache is not None else out.past_key_values
                self.token = out.logits[:, -1].argmax(-1)
            else:
                self.cache = model.new_cache(batch, context + steps)
                self.token = prefill(model, ids, None, self.cache).argmax(-1)
                self.steps = CompiledDecoder() if kind == "compiled" else None
            self.step(self.token)  # warm-up (and compilation)
            self.step(self.token)

    def step(self, token):
        if self.kind == "peer":
            return self.model(input_ids=token[:, None], cache=self.cache, use_cache=True).logits[:, -1]
        if self.steps is not None:
            return self.steps.decode_one_token(self.model, token, self.cache)
        return decode_one_token(self.model, token, self.cache)

    def crop(self):
        if self.kind != "peer":
            self.cache.crop(self.context)
        elif self.cache.get_seq_length() > self.context:
            self.cache.crop(self.context - self.cache.get_seq_length())  # transformers: negative = drop this many


@torch.inference_mode()
def time_decode(dec: Decoder, steps: int, device) -> float:
    """Seconds per decode step after the ``context`` prefilled tokens (the cache is cropped back first)."""
    dec.crop()
    token = dec.token
    _sync(device)
    t0 = CLOCK()
    for _ in range(steps):
        token = dec.step(token).argmax(-1)
    _sync(device)
    return (CLOCK() - t0) / steps


def paired(xs, base) -> float:
    """Median over rounds of the per-round time ratio ``x / base``."""
    return statistics.median(x / b for x, b in zip(xs, base))


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
                   help="add a compiled variant of every method (whole-model torch.compile for the train step, "
                        "generate.CompiledDecoder for decode)")
    p.add_argument("--peer", choices=["on", "off"], default="on",
                   help="add transformers.Qwen3ForCausalLM with the weights of none (default on)")
    p.add_argument("--train", choices=["on", "off"], default="on",
                   help="off: skip the train step (decode columns only; quicker, e.g. to profile decode)")
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
    if args.compile:
        from depthattn.generate import CompileUnavailable, check_compile_works
        try:
            check_compile_works(device)
        except CompileUnavailable as e:
            raise SystemExit(f"bench.py: --compile: {e}")
        # one decode graph per (method, batch size) of the same step function: more than dynamo's default of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                   4 * len(methods) * (len(args.decode_batches.split(",")) + 1))
    autocast = torch.bfloat16 if args.dtype == "bfloat16" else None
    # rows: (name, variant); variant "eager" / "compiled" for our methods, "peer" for transformers
    rows = [(m, "eager") for m in methods] + ([(m, "compiled") for m in methods] if args.compile else [])
    models, opts = {}, {}
    for m in methods:
        torch.manual_seed(0)
        models[(m, "eager")] = DecoderLM(ModelConfig.from_preset(args.preset, cross_layer=m), device=device)
    if args.peer == "on":
        rows.append((PEER, "peer"))
        models[(PEER, "peer")] = to_peer(models[("none", "eager")], device)
    for m in methods if args.compile else ():
        models[(m, "compiled")] = copy.deepcopy(models[(m, "eager")])
    train_fn = {r: (torch.compile(models[r]) if r[1] == "compiled" else models[r]) for r in rows}
    for r in rows:
        opts[r] = torch.optim.AdamW(models[r].parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    vocab = models[("none", "eager")].config.vocab_size
    ids = torch.randint(0, vocab, (args.batch_size, args.seq_len), generator=g).to(device)
    decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    train_s = {r: [] for r in rows}
    decode_s = {(r, b): [] for r in rows for b in decode_batches}
    load_start = os.getloadavg()[0]
    t_setup = time.perf_counter()
    train = args.train == "on"
    for r in rows if train else ():  # warm-up (allocator, kernels, compilation)
        for _ in range(2):
            models[r].train()
            time_train_step(train_fn[r], opts[r], ids, device, autocast)
    decoders = {}
    for r in rows:
        m = models[r]
        dec_model = (copy.deepcopy(m).to(torch.bfloat16) if args.dtype == "bfloat16" else m).eval()
        for b in decode_batches:
            kind = "peer" if r[1] == "peer" else r[1]
            decoders[(r, b)] = Decoder(dec_model, kind, b, args.context, args.decode_steps, device)
    setup_s = time.perf_counter() - t_setup
    print(f"warm-up and compilation took {setup_s:.0f} s; timing {args.rounds} rounds", file=sys.stderr, flush=True)
    for k in range(args.rounds):
        order = rows if k % 2 == 0 else rows[::-1]
        for r in order if train else ():
            models[r].train()
            train_s[r].append(time_train_step(train_fn[r], opts[r], ids, device, autocast))
        for b in decode_batches:
            for r in order:
                decode_s[(r, b)].append(time_decode(decoders[(r, b)], args.decode_steps, device))
        print(f"round {k + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    mem = {m: saved_activation_bytes(models[(m, "eager")].train(), ids) for m in methods}  # exact, not timed
    ntok = args.batch_size * args.seq_len
    print(f"preset={args.preset} device={device} ({torch.get_num_threads()} threads) dtype={args.dtype} "
          f"train batch={args.batch_size}x{args.seq_len} decode context={args.context} rounds={args.rounds} "
          f"torch={torch.__version__} compile={args.compile} peer={args.peer} clock={args.clock} "
          f"warm-up+compile {setup_s:.0f} s train={args.train} "
          f"load average (1 min) {load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    columns = ["method", "variant", "train tok/s", "train time ratio"]
    for b in decode_batches:
        columns += [f"decode tok/s (B={b})", f"decode time ratio (B={b})"]
    columns += ["saved activations MiB", "activation ratio", "KV bytes/token", "KV ratio"]
    head = "| " + " | ".join(columns) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        m, variant = r
        base = ("none", "eager") if variant == "peer" else ("none", variant)
        cells = [m, variant] + ([f"{ntok / statistics.median(train_s[r]):,.0f}", f"{paired(train_s[r], train_s[base]):.3f}"]
                                if train else ["", ""])
        for b in decode_batches:
            d = statistics.median(decode_s[(r, b)])
            cells += [f"{b / d:,.1f}", f"{paired(decode_s[(r, b)], decode_s[(base, b)]):.3f}"]
        if variant == "peer":
            cells += ["", "", "", ""]
        else:
            kv, kv0 = (models[(x, "eager")].new_cache(1, 1).bytes_per_token() for x in (m, "none"))
            cells += [f"{mem[m] / 2**20:,.1f}", f"{mem[m] / mem['none']:.3f}", f"{kv:,}", f"{kv / kv0:.3f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    print("Paired median time ratios (per round, then the median over rounds):")
    van = ("none", "eager")
    if args.peer == "on":
        hf = (PEER, "peer")
        parts = ([f"train {paired(train_s[van], train_s[hf]):.3f}"] if train else []) + [
            f"decode B={b} {paired(decode_s[(van, b)], decode_s[(hf, b)]):.3f}" for b in decode_batches]
        print("- our eager vanilla / HF Qwen3 eager (target <= 1): " + ", ".join(parts))
    if args.compile:
        cv = ("none", "compiled")
        if args.peer == "on":
            parts = [f"B={b} {paired(decode_s[(hf, b)], decode_s[(cv, b)]):.2f}x" for b in decode_batches]
            print("- HF Qwen3 eager decode / our compiled vanilla decode (target >= 2 at B=1): " + ", ".join(parts))
        for m in methods[1:]:
            cm = (m, "compiled")
            parts = ([f"train {paired(train_s[cm], train_s[cv]):.3f}"] if train else []) + [
                f"decode B={b} {paired(decode_s[(cm, b)], decode_s[(cv, b)]):.3f}" for b in decode_batches]
            print(f"- compiled {m} / compiled vanilla (target <= 1.02 for depth_attention): " + ", ".join(parts))
        parts = ([f"train {paired(train_s[cv], train_s[van]):.3f}"] if train else []) + [
            f"decode B={b} {paired(decode_s[(cv, b)], decode_s[(van, b)]):.3f}" for b in decode_batches]
        print("- compiled vanilla / eager vanilla: " + ", ".join(parts))


if __name__ == "__main__":
    main()
