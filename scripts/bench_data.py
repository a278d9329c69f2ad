"""Benchmark `depthattn data prepare`: MB/s and tokens/s at several worker counts, and peak RSS, side by side.

The input is real text: a corpus folder (``depthattn data fetch public-domain-mix --out DIR``, or the embedded
corpus) repeated into ``.jsonl`` files of about ``--mb`` MB (each repeat gets new document ids). Every run is a
fresh subprocess (``python -c`` calling ``prepare_corpus``) so its peak RSS -- the largest of the main process and
its encoding workers, ``resource.getrusage(RUSAGE_CHILDREN)`` of the child and its own ``RUSAGE_SELF`` -- is its
own; the CPU seconds of the main process and of the workers show how much of the machine a run got (CPU / wall
near the worker count: the cores were free; near 1 with 2 workers: the machine was busy). By default the runs
encode with a given tokenizer (an 8192-token BPE trained once on the first 20 MB, outside the timing), so the table
measures the part that scales with workers; ``--train`` times tokenizer training too.

    python scripts/bench_data.py --corpus mix/ --mb 1000 --workers 1 2 --double
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, resource, sys, time
from depthattn.data import prepare_corpus
out, src, tok, workers = sys.argv[1:5]
t = time.perf_counter()
meta = prepare_corpus(out, [src], tokenizer=None if tok == "-" else tok, vocab_size=8192, progress=False, log=None,
                      workers=int(workers))
wall = time.perf_counter() - t
tokens = sum(meta["splits"][s]["tokens"] for s in ("train", "val"))
nbytes = sum(meta["splits"][s]["bytes"] for s in ("train", "val"))
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "tokens": tokens, "bytes": nbytes, "peak_rss_kib": max(me.ru_maxrss, kids.ru_maxrss),
                  "main_cpu_s": me.ru_utime + me.ru_stime, "workers_cpu_s": kids.ru_utime + kids.ru_stime,
                  "train_sha256": meta["splits"]["train"]["sha256"]}))
"""


def repeats_for(corpus: str, mb: float) -> int:
    """How many copies of the corpus make about ``mb`` MB of UTF-8 text (at least 1)."""
    from depthattn.data.inputs import resolve_inputs

    size = sum(len(d.text.encode("utf-8")) for d in resolve_inputs([corpus])[0].documents())
    return max(1, round(mb * 1e6 / size))


def build_input(corpus: str, repeats: int, out: Path) -> Path:
    """``out`` (.jsonl) holding the corpus's documents ``repeats`` times (each copy with its own ids)."""
    from depthattn.data.inputs import resolve_inputs

    docs = list(resolve_inputs([corpus])[0].documents())
    with open(out, "w", encoding="utf-8") as f:
        for r in range(repeats):
            for d in docs:
                f.write(json.dumps({"id": f"{r}/{d.id}", "text": d.text}, ensure_ascii=False) + "\n")
    return out


def run(src: Path, tok: str, workers: int, tmp: Path) -> dict:
    out = tmp / f"out-{workers}-{src.stem}"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), str(src), tok, str(workers)], capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"prepare failed with {workers} workers:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["workers"] = workers
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="embedded", help="a corpus folder (data fetch output) or `embedded`")
    p.add_argument("--mb", type=float, default=1000, help="input size in MB of UTF-8 text (default 1000)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--double", action="store_true", help="also run the largest worker count on 2x the input")
    p.add_argument("--train", action="store_true", help="train the tokenizer inside each timed run")
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-data-", dir=args.workdir) as tmp_s:
        tmp = Path(tmp_s)
        repeats = repeats_for(args.corpus, args.mb)
        src = build_input(args.corpus, repeats, tmp / "input.jsonl")
        tok = "-"
        if not args.train:  # one tokenizer for every run, trained once outside the timing
            from depthattn.data.inputs import resolve_inputs
            from depthattn.data.tokenizer import train_bpe

            t = time.perf_counter()
            docs = resolve_inputs([args.corpus])[0].documents()
            sample = itertools.islice(itertools.accumulate(docs, lambda acc, d: (acc[0] + len(d.text), d.text),
                                                           initial=(0, "")), 1, None)
            texts = (text for n, text in itertools.takewhile(lambda x: x[0] <= 20_000_000, sample))
            train_bpe(texts, vocab_size=8192).save(str(tmp / "tokenizer.json"))
            print(f"tokenizer: 8192-token BPE trained on <= 20 MB of {args.corpus} in "
                  f"{time.perf_counter() - t:.1f} s (not timed below)")
            tok = str(tmp / "tokenizer.json")
        rows = [run(src, tok, w, tmp) for w in args.workers]
        if args.double:
            rows.append(run(build_input(args.corpus, 2 * repeats, tmp / "input2.jsonl"), tok, max(args.workers), tmp))
        base = rows[0]
        print(f"\ninput {args.corpus} repeated to {base['bytes'] / 1e6:,.0f} MB; tokenizer "
              f"{'trained in each run' if args.train else 'given'}")
        print("| workers | input MB | wall s | MB/s | tokens/s | speed-up vs 1st row | peak RSS MB | CPU s main + "
              "workers | CPU / wall |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            mbps = r["bytes"] / 1e6 / r["wall_s"]
            print(f"| {r['workers']} | {r['bytes'] / 1e6:,.0f} | {r['wall_s']:.1f} | {mbps:.2f} | "
                  f"{r['tokens'] / r['wall_s']:,.0f} | {base['wall_s'] / r['wall_s'] * r['bytes'] / base['bytes']:.2f}x"
                  f" | {r['peak_rss_kib'] / 1024:,.0f} | {r['main_cpu_s']:.0f} + {r['workers_cpu_s']:.0f} | "
                  f"{(r['main_cpu_s'] + r['workers_cpu_s']) / r['wall_s']:.2f} |")
        same = {r["train_sha256"] for r in rows[:len(args.workers)]}
        print(f"\ntrain token stream identical across worker counts: {len(same) == 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
