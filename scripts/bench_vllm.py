"""vLLM serving throughput, vanilla vs Depth-Attention, at several model widths: same engine, batches alternated.

Depth-Attention adds no parameters, and the plugin's forward depends on ``cross_layer`` only through its depth plan
(``served_plan``: all-empty for ``none``), so one engine serves both: each worker process loads a random
Depth-Attention checkpoint of one width and times batches alternately with its own plan and with the empty plan
(vanilla; set through ``LLM.apply_model``), A B B A ... (``depthattn.bench.interleaved``; odd-numbered workers
start with Depth-Attention), each pair on the same prompts. Both methods so share the
process, its weights, its memory placement and its engine config (float32, ``enforce_eager``, prefix caching off so
every batch recomputes; the same engine arguments at every width). The width-``C`` model is the ``small`` preset
(8 layers, vocab 8,192, head_dim 64, Depth-Attention's default stride 4, so the same depth plan at every width: 7 of
the 8 layers mix 2 or 3 candidates) with ``hidden_size = C``, ``intermediate_size = 3C`` (``small``'s ratio),
``C / 64`` query heads and ``max(2, C / 256)`` KV heads: width 256 is ``small`` itself, 1024 and 2048 have the head
layout of the ``360m`` and ``3b`` presets (16 / 4 and 32 / 8 heads, GQA 4x).

Each round runs one worker per width; a worker warms up on one batch per method, checks that the mix changes the
greedy tokens, then times ``--repeats`` pairs of batches of ``--batch`` random prompts of ``--prompt-len`` tokens
with ``--new-tokens`` greedy tokens each (``ignore_eos``). Throughput = (prompt + generated tokens) / time, by wall
clock and by the worker's CPU time (``--threads 1`` torch thread by default, so CPU time holds no OpenMP
spin-waiting: the number to quote on a shared machine). The ratio at a width is the median over all its pairs of
Depth-Attention's time over vanilla's (``depthattn.bench.paired_ratios`` of the workers' pooled records); the
report also gives each process's median, the min-max over pairs and, under the table, the 95 % intervals of the
geometric mean over pairs and across processes. ``--record PATH`` writes every worker's per-pair times as JSON
(``depthattn.bench.write_record``). Run in the vLLM environment (``bash scripts/ci_vllm.sh`` builds it):

    .venv-vllm/bin/python scripts/bench_vllm.py --widths 256,1024,2048 --rounds 2 --repeats 4 --batch 8 \
        --prompt-len 64 --new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from depthattn.bench import across_records, interleaved, paired_ratios, pool, write_record

METHODS = ("none", "depth_attention")


def width_config(width: int):
    """The ``small`` preset at ``hidden_size=width`` (heads of 64, ``max(2, heads // 4)`` KV heads, MLP 3x)."""
    from depthattn import ModelConfig

    if width < 128 or width % 64:
        raise ValueError(f"--widths: each width must be a multiple of 64 and at least 128, got {width}")
    heads = width // 64
    return ModelConfig.from_preset("small", hidden_size=width, intermediate_size=3 * width,
                                   num_attention_heads=heads, num_key_value_heads=max(2, heads // 4))


def make_checkpoint(folder: str, width: int, tok: str) -> str:
    """A ``depth_attention`` checkpoint of a random width-``width`` model (the worker also runs it as vanilla)."""
    import torch

    from depthattn import DecoderLM
    from depthattn.checkpoint import save_model

    torch.manual_seed(0)
    path = os.path.join(folder, f"w{width}")
    save_model(DecoderLM(width_config(width).replace(cross_layer="depth_attention")).eval(), path, tokenizer_file=tok)
    return path


def _set_plan(model, plan):
    """Give the served model (``DepthAttnForCausalLM``) another depth plan: all-empty is exactly the ``none``
    checkpoint's (``served_plan``), the only thing in the plugin's forward that depends on ``cross_layer``."""
    model.model.plan = plan
    model.model.kept = frozenset(j for cands in plan for j in cands)
    return plan


def make_tokenizer(folder: str, vocab_size: int) -> str:
    from depthattn.data import embedded_corpus_documents
    from depthattn.data.tokenizer import train_bpe

    tok = os.path.join(folder, "tokenizer.json")
    train_bpe([t[:50000] for _, t in embedded_corpus_documents()[:3]], vocab_size=vocab_size).save(tok)
    return tok


def worker(args) -> None:
    """One engine on the Depth-Attention checkpoint; batches alternate between its own plan and the empty plan
    (vanilla), A B B A ..., so both methods share the process, its memory placement and its weights."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: apply_model is direct
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.worker, dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=args.prompt_len + args.new_tokens, max_num_seqs=args.batch, seed=0)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    da_plan = llm.apply_model(lambda m: m.model.plan)[0]
    plans = {"none": tuple(() for _ in da_plan), "depth_attention": da_plan}
    g = torch.Generator().manual_seed(args.seed)

    def batch():
        return [TokensPrompt(prompt_token_ids=torch.randint(1, 8000, (args.prompt_len,), generator=g).tolist())
                for _ in range(args.batch)]

    prompts, wall = [], {m: [] for m in METHODS}

    def run(method, prompts):
        llm.apply_model(lambda m: _set_plan(m, plans[method]))
        t0, c0 = time.perf_counter(), time.process_time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0, time.process_time() - c0
        assert all(len(o.outputs[0].token_ids) == args.new_tokens for o in outs)
        return seconds, [o.outputs[0].token_ids for o in outs]

    def case(method):
        def timed() -> float:  # CPU seconds; the wall clock goes beside them
            (w, cpu), _ = run(method, prompts[0])
            wall[method].append(w)
            return cpu
        return timed

    def new_prompts(index: int) -> None:
        prompts[:] = [batch()]  # the same prompts for both methods of a pair

    warm = batch()
    differ = run("none", warm)[1] != run("depth_attention", warm)[1]  # warm-up; the mix must change the tokens
    order = METHODS if args.seed % 2 == 0 else METHODS[::-1]
    cpu = interleaved({m: case(m) for m in order}, args.repeats, order="abba", warmup=0, before_round=new_prompts)
    print("RESULT " + json.dumps({"cpu": cpu, "wall": dict(cpu, times=wall), "threads": torch.get_num_threads(),
                                  "tokens_differ": differ}), flush=True)


def run_worker(path: str, seed: int, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", path, "--repeats", str(args.repeats), "--batch", str(args.batch),
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens), "--seed", str(seed)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))  # vLLM's CPU worker keeps an OMP_NUM_THREADS it finds
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [s for s in res.stdout.splitlines() if s.startswith("RESULT ")]
    if res.returncode != 0 or not line:
        sys.exit(f"worker for {path} failed:\n{res.stderr[-3000:]}")
    return json.loads(line[0][7:])


def parse_widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise SystemExit(f"--widths: expected comma-separated integers such as 256,1024,2048, got {text!r}")
    for w in widths:
        try:
            width_config(w)
        except ValueError as e:
            raise SystemExit(str(e))
    return widths


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}"


def report(widths, results, args) -> None:
    """``results[w][r]``: round ``r``'s worker result at width ``w`` (``{"cpu" | "wall": a depthattn.bench record
    of seconds per batch keyed by method, …}``)."""
    tokens = args.batch * (args.prompt_len + args.new_tokens)
    print(f"\nbatch {args.batch} x ({args.prompt_len} prompt + {args.new_tokens} generated) tokens, float32, "
          f"enforce_eager, prefix caching off, {args.threads} torch thread(s); {args.rounds} worker processes per "
          f"width x {args.repeats} batch pairs each; ratio = median over all pairs of DA time / vanilla time "
          f"(same prompts, back to back); per-process ratio = that process's median")
    print("| width | heads / KV heads | vanilla tok/s wall | DA tok/s wall | vanilla tok per CPU-s | DA tok per CPU-s "
          "| DA/vanilla CPU time | per-process CPU ratios | all pairs min-max | DA/vanilla wall time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    intervals = []
    for w in widths:
        cfg = width_config(w)
        pooled = {c: pool([res[c] for res in results[w]]) for c in ("cpu", "wall")}
        ratio = {c: paired_ratios(pooled[c], "depth_attention", "none") for c in ("cpu", "wall")}
        across = across_records([res["cpu"] for res in results[w]], "depth_attention", "none")
        rate = {(m, c): tokens / statistics.median(pooled[c]["times"][m]) for m in METHODS for c in ("cpu", "wall")}
        print(f"| {w} | {cfg.num_attention_heads} / {cfg.num_key_value_heads} | {rate['none', 'wall']:.0f} | "
              f"{rate['depth_attention', 'wall']:.0f} | {rate['none', 'cpu']:.0f} | "
              f"{rate['depth_attention', 'cpu']:.0f} | {ratio['cpu']['median']:.3f} | "
              f"{', '.join(f'{x:.3f}' for x in across['per_process'])} | "
              f"{spread(ratio['cpu']['ratios'])} | {ratio['wall']['median']:.3f} |")
        intervals.append(f"- width {w}: over the {ratio['cpu']['n']} pairs {interval(ratio['cpu'])}; across the "
                         f"{across['n']} processes {interval(across)}")
    print("\nDA/vanilla CPU time, geometric mean (95 % t-interval of the mean log ratio):")
    print("\n".join(intervals))


def interval(summary: dict) -> str:
    """``"1.012 (0.995-1.030)"``: a ``depthattn.bench`` ratio summary's geometric mean and 95 % interval."""
    ci = "no interval" if summary["ci95"] is None else f"{summary['ci95'][0]:.3f}-{summary['ci95'][1]:.3f}"
    return f"{summary['geomean']:.3f} ({ci})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="256", help="comma-separated hidden sizes (default 256: the small preset)")
    p.add_argument("--rounds", type=int, default=2, help="worker processes per width")
    p.add_argument("--repeats", type=int, default=4, help="timed batch pairs (vanilla, DA) per worker")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker (default 1: CPU time then counts no OpenMP spin-waiting, so it "
                        "stays a fair measure on a loaded machine)")
    p.add_argument("--record", help="also write every worker's per-pair times here (JSON)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    widths = parse_widths(args.widths)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` or kill: still remove the checkpoints
    tokens = args.batch * (args.prompt_len + args.new_tokens)
    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="depthattn-bench-vllm-") as folder:
        tok = make_tokenizer(folder, width_config(widths[0]).vocab_size)
        ckpts = {w: make_checkpoint(folder, w, tok) for w in widths}
        results: dict[int, list[dict]] = {w: [] for w in widths}
        for r in range(args.rounds):
            for w in widths:
                res = run_worker(ckpts[w], r, args)
                results[w].append(res)
                cpu = res["cpu"]["times"]
                print(f"round {r} width {w} ({res['threads']} torch threads, greedy tokens differ: "
                      f"{res['tokens_differ']}, load average {os.getloadavg()[0]:.2f}): CPU s per batch, vanilla "
                      f"{', '.join(f'{x:.3f}' for x in cpu['none'])}; DA "
                      f"{', '.join(f'{x:.3f}' for x in cpu['depth_attention'])}; "
                      f"{tokens / statistics.median(cpu['none']):.0f} vs "
                      f"{tokens / statistics.median(cpu['depth_attention']):.0f} tok per CPU-second",
                      flush=True)
    report(widths, results, args)
    print(f"end {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()[0]:.2f}")
    if args.record:
        try:
            write_record(args.record, {"widths": {str(w): results[w] for w in widths}}, device="cpu")
        except OSError as e:
            sys.exit(f"bench_vllm.py: --record {args.record!r}: {e.strerror or e}")


if __name__ == "__main__":
    main()
