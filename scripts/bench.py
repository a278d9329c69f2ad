"""Benchmark cross-layer methods against vanilla, measured interleaved in one run.

For each method: training step (forward + backward) tokens/s, decode tokens/s at batch 1 and 8 with a fixed
context, activation bytes saved for backward (exact, via saved-tensor hooks; plus CUDA peak memory on GPU) and
KV-cache bytes per token. Each round times every row's train step, then every row's decode step per batch size, in
one order reversed every other round (``depthattn.bench.interleaved``: A B … | … B A), so machine noise hits all of
them alike; throughput cells are medians over rounds, and each time ratio is the median over rounds of the per-round
ratio against ``none`` measured back to back (``depthattn.bench.paired_ratios``; robust to slow drifts of a shared
machine).

``--compile`` adds a compiled variant of every method (train step: ``torch.compile`` of the whole model; decode:
``generate.CompiledDecoder``, one graph per batch size reused for every token), measured in the same rounds; its
ratios are against compiled ``none``. The peer row ``hf_qwen3`` is ``transformers.Qwen3ForCausalLM`` (sdpa) with
the weights of our ``none`` model: train step, and decode with its own ``DynamicCache`` (cropped back each round).

``--processes N`` repeats the whole measurement in N fresh processes, one after the other, and pools them: the
table's medians and ratios then run over all rounds of all processes, and a last section gives each ratio per
process with the median, the geometric mean and its 95 % t-interval across processes. Rounds within one process
are not independent samples of the machine (single runs of this script have disagreed by up to 18 % on a compiled
decode ratio, docs/benchmarks.md), so a claim of a few per cent needs several processes and their interval.

    python scripts/bench.py --preset small --methods none,depth_attention --compile
    python scripts/bench.py --preset small --methods none,depth_attention --compile --processes 6 --rounds 10
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CLOCK = time.perf_counter  # --clock cpu switches to process CPU time (all threads)

from depthattn import DecoderLM, ModelConfig
from depthattn.bench import across_records, interleaved, paired_ratios, pool, write_record
from depthattn.config import PRESETS
from depthattn.cross_layer.registry import names as method_names
from depthattn.generate import CompiledDecoder, decode_one_token, prefill

PEER = "hf_qwen3"
SPEEDUP = "HF Qwen3 eager decode / our compiled vanilla decode (target >= 2 at B=1)"


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

    def __init__(self, model, kind: str, batch: int, context: int, steps: int, device, cpp_wrapper: bool = True):
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
                self.cache = model.new_cache(batch, context + max(steps, 2))  # the warm-up decodes 2 tokens
                self.token = prefill(model, ids, None, self.cache).argmax(-1)
                self.steps = CompiledDecoder(cpp_wrapper=cpp_wrapper) if kind == "compiled" else None
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


def paired(raw: dict, a: str, b: str) -> float:
    """Median over rounds of the per-round time ratio of ``a`` to ``b`` (``depthattn.bench.paired_ratios``)."""
    return paired_ratios(raw, a, b)["median"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)  # the parent strips --processes by name before a child sees it
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--methods", default="none,depth_attention")
    p.add_argument("--batch-size", type=int, default=4, help="training micro-batch")
    p.add_argument("--seq-len", type=int, default=256, help="training sequence length")
    p.add_argument("--context", type=int, default=512, help="decode context length")
    p.add_argument("--decode-steps", type=int, default=16, help="timed decode steps per round")
    p.add_argument("--decode-batches", default="1,8")
    p.add_argument("--rounds", type=int, default=40, help="interleaved rounds (per process)")
    p.add_argument("--processes", type=int, default=1,
                   help="run the whole measurement in this many fresh processes, one after the other, and pool "
                        "them, with each ratio's 95 %% interval across processes (rounds within one process are "
                        "not independent samples of the machine)")
    p.add_argument("--raw-out", type=Path,
                   help="also write the per-round times here (depthattn.bench.write_record JSON: the command, "
                        "commit, versions, device and CPU, and under \"processes\" one measurement per process)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="parameter dtype for decode; bfloat16 also turns on autocast for training")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = leave)")
    p.add_argument("--compile", action="store_true",
                   help="add a compiled variant of every method (whole-model torch.compile for the train step, "
                        "generate.CompiledDecoder for decode)")
    p.add_argument("--decode-wrapper", choices=["cpp", "python"], default="cpp",
                   help="inductor's wrapper for the compiled CPU decode step (generate.CompiledDecoder's "
                        "cpp_wrapper; default cpp, as generate uses; python: the older, slower wrapper)")
    p.add_argument("--peer", choices=["on", "off"], default="on",
                   help="add transformers.Qwen3ForCausalLM with the weights of none (default on)")
    p.add_argument("--train", choices=["on", "off"], default="on",
                   help="off: skip the train step (decode columns only; quicker, e.g. to profile decode)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed time; cpu: process CPU time of all threads (less sensitive to other load)")
    args = p.parse_args(argv)
    methods = args.methods = args.methods.split(",")  # parsed once: measure reads the lists
    if methods[0] != "none":
        p.error("--methods must start with none (the baseline of the ratios)")
    unknown = [m for m in methods if m not in method_names()]
    if unknown:
        p.error(f"--methods: unknown method {unknown[0]!r}; choose from {', '.join(method_names())}")
    for name in ("rounds", "processes", "decode_steps", "batch_size", "seq_len", "context"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        batches = [int(b) for b in args.decode_batches.split(",") if b]
    except ValueError:
        p.error(f"--decode-batches must be comma-separated integers, got {args.decode_batches!r}")
    if any(b < 1 for b in batches):
        p.error(f"--decode-batches must be at least 1 each, got {args.decode_batches!r}")
    args.decode_batches = batches
    if not batches and args.train == "off":
        p.error("--train off with an empty --decode-batches leaves nothing to time")
    if args.raw_out is not None and (args.raw_out.is_dir() or not args.raw_out.parent.is_dir()):
        p.error(f"--raw-out {str(args.raw_out)!r}: must name a file in an existing folder")
    return args


def rkey(r: tuple[str, str], b: int | None = None) -> str:
    """JSON key of a row (method, variant), or of its decode at batch ``b``."""
    return "/".join(r) if b is None else f"{r[0]}/{r[1]}/{b}"


def measure(args: argparse.Namespace) -> dict:
    """One process's interleaved measurement: a ``depthattn.bench`` record whose ``times`` are the per-round
    seconds of a train step (``rkey(row)``, when ``train``) and of a decode step (``rkey(row, batch)``), plus
    ``{"meta", "rows", "decode_batches", "train", "tokens_per_step", "mem", "kv"}`` (exact memory numbers)."""
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    methods, decode_batches = args.methods, args.decode_batches
    if args.compile:
        from depthattn.generate import CompileUnavailable, check_compile_works
        try:
            check_compile_works(device)
        except CompileUnavailable as e:
            raise SystemExit(f"bench.py: --compile: {e}")
        # one decode graph per (method, batch size) of the same step function: more than dynamo's default of 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                   4 * len(methods) * (len(decode_batches) + 1))
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
    train = args.train == "on"
    t_setup = time.perf_counter()
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
            decoders[(r, b)] = Decoder(dec_model, kind, b, args.context, args.decode_steps, device,
                                        args.decode_wrapper == "cpp")
    setup_s = time.perf_counter() - t_setup
    print(f"warm-up and compilation took {setup_s:.0f} s; timing {args.rounds} rounds", file=sys.stderr, flush=True)

    def train_case(r):
        def case() -> float:
            models[r].train()
            return time_train_step(train_fn[r], opts[r], ids, device, autocast)
        return case

    cases = {rkey(r): train_case(r) for r in rows} if train else {}  # the train steps, then decode per batch size
    for b in decode_batches:
        cases.update({rkey(r, b): functools.partial(time_decode, decoders[(r, b)], args.decode_steps, device)
                      for r in rows})
    record = interleaved(cases, args.rounds, order="abba", warmup=0,
                         log=lambda line: print(line, file=sys.stderr, flush=True))
    load_start, load_end = record["load"]
    meta = (f"preset={args.preset} device={device} ({torch.get_num_threads()} threads) dtype={args.dtype} "
            f"train batch={args.batch_size}x{args.seq_len} decode context={args.context} rounds={args.rounds} "
            f"torch={torch.__version__} compile={args.compile} decode wrapper={args.decode_wrapper} "
            f"peer={args.peer} clock={args.clock} "
            f"warm-up+compile {setup_s:.0f} s train={args.train} "
            f"load average (1 min) {load_start:.2f} at start, {load_end:.2f} at end")
    return {**record, "meta": meta, "rows": [list(r) for r in rows], "decode_batches": decode_batches,
            "train": train, "tokens_per_step": args.batch_size * args.seq_len,
            "mem": {m: saved_activation_bytes(models[(m, "eager")].train(), ids) for m in methods},  # exact, not timed
            "kv": {m: models[(m, "eager")].new_cache(1, 1).bytes_per_token() for m in methods}}


def pooled(raws: list[dict]) -> dict:
    """``depthattn.bench.pool`` of several processes' ``measure`` results, with every process's meta line."""
    meta = "\n".join(f"process {i + 1}: {raw['meta']}" for i, raw in enumerate(raws))
    return dict(pool(raws), meta=f"{meta}\npooled over {len(raws)} processes ({len(raws)} × the rounds above)")


def comparisons(raw: dict) -> list[tuple[str, str, str]]:
    """The paired ratios the report states: (label, numerator key, denominator key) for the train step and every
    decode batch (decode only for the HF-vs-compiled speed-up)."""
    rows = [tuple(r) for r in raw["rows"]]
    compiled = [m for m, v in rows if v == "compiled" and m != "none"]
    van, hf, cv = ("none", "eager"), (PEER, "peer"), ("none", "compiled")
    pairs = []  # (label, a, b, decode only)
    if hf in rows:
        pairs.append(("our eager vanilla / HF Qwen3 eager (target <= 1)", van, hf, False))
    if cv in rows:
        if hf in rows:
            pairs.append((SPEEDUP, hf, cv, True))
        pairs += [(f"compiled {m} / compiled vanilla (target <= 1.02 for depth_attention)", (m, "compiled"), cv,
                   False) for m in compiled]
        pairs.append(("compiled vanilla / eager vanilla", cv, van, False))
    out = []
    for label, a, b, decode_only in pairs:
        if raw["train"] and not decode_only:
            out.append((label, rkey(a), rkey(b)))
        out += [(label, rkey(a, d), rkey(b, d)) for d in raw["decode_batches"]]
    return out


def ratio_name(key: str, label: str = "") -> str:
    """"train" or "decode B=8" for a ``rkey`` ("B=8" on the decode-only speed-up line)."""
    parts = key.split("/")
    if len(parts) == 2:
        return "train"
    return f"B={parts[2]}" if label == SPEEDUP else f"decode B={parts[2]}"


def fmt_ratio(value: float, label: str) -> str:
    return f"{value:.2f}x" if label == SPEEDUP else f"{value:.3f}"


def print_report(raw: dict) -> None:
    """The markdown table and the paired median ratios of one measurement (one process's, or ``pool``'s)."""
    print(raw["meta"])
    rows = [tuple(r) for r in raw["rows"]]
    times, batches = raw["times"], raw["decode_batches"]
    columns = ["method", "variant", "train tok/s", "train time ratio"]
    for b in batches:
        columns += [f"decode tok/s (B={b})", f"decode time ratio (B={b})"]
    columns += ["saved activations MiB", "activation ratio", "KV bytes/token", "KV ratio"]
    head = "| " + " | ".join(columns) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    mem, kv = raw["mem"], raw["kv"]
    for r in rows:
        m, variant = r
        base = ("none", "eager") if variant == "peer" else ("none", variant)
        cells = [m, variant] + ([f"{raw['tokens_per_step'] / statistics.median(times[rkey(r)]):,.0f}",
                                 f"{paired(raw, rkey(r), rkey(base)):.3f}"] if raw["train"] else ["", ""])
        for b in batches:
            d = statistics.median(times[rkey(r, b)])
            cells += [f"{b / d:,.1f}", f"{paired(raw, rkey(r, b), rkey(base, b)):.3f}"]
        if variant == "peer":
            cells += ["", "", "", ""]
        else:
            cells += [f"{mem[m] / 2**20:,.1f}", f"{mem[m] / mem['none']:.3f}",
                      f"{kv[m]:,}", f"{kv[m] / kv['none']:.3f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    print("Paired median time ratios (per round, then the median over rounds):")
    lines: dict[str, list[str]] = {}
    for label, a, b in comparisons(raw):
        lines.setdefault(label, []).append(f"{ratio_name(a, label)} {fmt_ratio(paired(raw, a, b), label)}")
    for label, parts in lines.items():
        print(f"- {label}: " + ", ".join(parts))


def across_processes(raws: list[dict]) -> list[dict]:
    """Every ``comparisons`` ratio per process (its paired median over rounds) and across processes: the median and
    a 95 % t-interval of the geometric mean (t-interval of the mean log ratio, exponentiated; None for one process).
    Returns ``[{"label", "name", "per_process", "median", "geomean", "ci95"}]``."""
    return [{"label": label, "name": ratio_name(a, label), **across_records(raws, a, b)}
            for label, a, b in comparisons(raws[0])]


def print_across_processes(raws: list[dict]) -> None:
    print()
    print(f"Across the {len(raws)} processes (each process's paired median; then their median, geometric mean and "
          "its 95 % t-interval):")
    for c in across_processes(raws):
        f = lambda x: fmt_ratio(x, c["label"])  # noqa: E731
        per = ", ".join(f(x) for x in c["per_process"])
        ci = "n/a" if c["ci95"] is None else f"{f(c['ci95'][0])}–{f(c['ci95'][1])}"
        print(f"- {c['label']}, {c['name']}: per process {per}; median {f(c['median'])}, "
              f"geometric mean {f(c['geomean'])} (95 % interval {ci})")


def child_argv(argv: list[str], raw_out: Path) -> list[str]:
    """``argv`` for one child process: ``--processes`` and ``--raw-out`` (either form) replaced by ``--processes 1``
    and the child's own ``--raw-out`` (given last, so they win even over a form this missed)."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--processes", "--raw-out"):
            skip = True
        elif not a.startswith(("--processes=", "--raw-out=")):
            keep.append(a)
    return keep + ["--processes", "1", "--raw-out", str(raw_out)]


def run_processes(argv: list[str], n: int) -> list[dict]:
    """Run this script ``n`` times in fresh processes with ``child_argv`` and return their ``measure`` results."""
    raws = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            path = Path(tmp) / f"raw{i}.json"
            print(f"== process {i + 1}/{n}", file=sys.stderr, flush=True)
            done = subprocess.run([sys.executable, __file__, *child_argv(argv, path)], stdout=subprocess.DEVNULL)
            if done.returncode:
                raise SystemExit(f"bench.py: process {i + 1}/{n} failed with exit status {done.returncode}")
            raws += json.loads(path.read_text())["processes"]
    return raws


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.processes > 1:
        raws = run_processes(argv, args.processes)
        raw = pooled(raws)
    else:
        raws, raw = None, measure(args)
    print_report(raw)
    if raws:
        print_across_processes(raws)
    if args.raw_out:  # one measurement per process; written after the report, which is never lost
        try:
            write_record(args.raw_out, {"processes": raws or [raw]}, device=args.device)
        except OSError as e:
            raise SystemExit(f"bench.py: --raw-out {str(args.raw_out)!r}: {e.strerror or e}")


if __name__ == "__main__":
    main()
