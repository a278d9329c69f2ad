"""``depthattn compare``: the main job. Train ``none`` and ``depth_attention`` (or any --methods) with the same seed,
data order and token budget; evaluate; write report.md, results.json and loss_curves.png."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..compare.report import render_table
from ..compare.runner import run_compare
from ..compare.settings import (DEFAULT_EVAL_TOKENS, DEFAULT_OUT, DEFAULT_TRAIN, QUICK, CompareSettings,
                                parse_methods, prepare_default_data)
from ..layout import LOCK_FILE
from ..outputs import COMPARE_FOLDER, check_new_output
from ..training import TrainConfig
from ..training.resume import keep_recorded_behaviour
from .eval_cmd import check_task_options
from .train_cmd import add_model_options, check_model_settings, gather_settings

def parse_seeds(text: str) -> list[int]:
    """``--seeds`` as a list of integers; ``ValueError`` naming the flag and the bad item."""
    seeds = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            seeds.append(int(item))
        except ValueError:
            raise ValueError(f"--seeds {text!r}: {item!r} is not an integer; give comma-separated integers, "
                             f"e.g. --seeds 0,1,2") from None
    if not seeds:
        raise ValueError(f"--seeds {text!r} lists no seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r} lists a seed twice")
    return seeds


def apply_quick(args: argparse.Namespace) -> None:
    """``--quick``: the ``QUICK`` preset, output folder and evaluation budget where the command gave none (its
    train settings are the base that --steps / --set override)."""
    if args.preset is None and args.config is None:
        args.preset = QUICK["preset"]
    if args.out is None:
        args.out = QUICK["out"]
    if args.eval_tokens == DEFAULT_EVAL_TOKENS:
        args.eval_tokens = QUICK["eval_tokens"]


def compare_settings(args: argparse.Namespace) -> tuple[Path, CompareSettings, Path]:
    """(output folder, settings, prepared data folder) of a parsed ``compare`` command line: every flag checked before
    any training (``ValueError`` naming the flag), the embedded corpus prepared into OUT/data when no --data is given.
    The one place that turns the flags into the run ``run_compare`` trains (``scripts/readme_headline.py`` and the
    golden-loss test train the default run's first steps from it)."""
    methods = parse_methods(args.methods)
    seeds = parse_seeds(args.seeds)
    tasks = check_task_options(args.tasks, args.limit, "--eval-tokens")  # before any training
    if args.eval_tokens < 0:
        raise ValueError(f"--eval-tokens {args.eval_tokens} must be >= 0 (0 = the whole validation split)")
    if args.loops is not None and args.loops < 1:
        raise ValueError(f"--loops={args.loops} must be >= 1")
    if args.quick:
        apply_quick(args)
    preset, model_kw, train_kw, data = gather_settings(args)
    model_kw.pop("num_loops", None)
    if "cross_layer" in model_kw:
        raise ValueError("--set cross_layer=... conflicts with --methods; list the methods with --methods")
    base = dict(QUICK["train"] if args.quick else DEFAULT_TRAIN)
    if "tokens" in train_kw and "steps" not in train_kw:
        base.pop("steps")
    base.update({k: v for k, v in train_kw.items() if k != "seed"})
    train_cfg = TrainConfig.from_dict(base)
    train_cfg.total_steps()  # a budget shorter than one step fails here, before any work
    for m in methods:
        check_model_settings(preset, {**model_kw, "cross_layer": m, "num_loops": args.loops or 1})
    out = Path(args.out or DEFAULT_OUT)
    if not (out / LOCK_FILE).exists():  # else run_compare names a live holder, or checks under the lock
        check_new_output(out, COMPARE_FOLDER)  # a new or empty folder, or a compare's own (its runs are reused)
    train_cfg = keep_recorded_behaviour(out, train_cfg, set(train_kw))  # an older release's folder: its behaviour
    data_dir = Path(data) if data else prepare_default_data(out, not args.no_progress)
    settings = CompareSettings(
        methods=methods, seeds=seeds, loops=args.loops or 1, preset=preset, model_overrides=model_kw,
        train=train_cfg, eval_tokens=None if args.eval_tokens == 0 else args.eval_tokens,
        tasks=tasks or None, limit=args.limit,
        harness=args.harness)
    return out, settings, data_dir


def run_compare_cmd(args: argparse.Namespace) -> int:
    """Train every --methods model on the same data, seed and budget, evaluate them, and write OUT/report.md,
    OUT/results.json and OUT/loss_curves.png (per-run folders under OUT/runs/). Finished runs are reused."""
    out, settings, data_dir = compare_settings(args)
    results = run_compare(out, settings, data_dir, progress=not args.no_progress)
    print()
    print("\n".join(results["conclusion"]))
    print()
    print(render_table(results))
    print(f"wrote {out / 'report.md'}, {out / 'results.json'}, {out / 'loss_curves.png'} "
          f"({results['wall_seconds']:.0f} s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="train and compare cross-layer methods (the main job)",
                              description=run_compare_cmd.__doc__)
    add_model_options(p, data_help="prepared data folder (`depthattn data prepare --input TEXT --out DIR`); default: "
                                   "the embedded corpus, prepared once into OUT/data")
    p.add_argument("--methods", default="none,depth_attention",
                   help="comma-separated cross_layer values (default none,depth_attention)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; several give mean ± std and paired 95 %% "
                                                "intervals vs none (default 0)")
    p.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT}; with --quick {QUICK['out']})")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of the whole job in about a minute on 2 CPU cores: the tiny preset, 60 steps of "
                        "4 x 64 tokens, 16,384 evaluation tokens, into runs/compare-quick (flags given beside it win); "
                        "checks the setup, decides nothing")
    p.add_argument("--eval-tokens", type=int, default=DEFAULT_EVAL_TOKENS,
                   help="validation tokens for the final evaluation (default 0 = the whole split)")
    p.add_argument("--tasks", default=None,
                   help="comma-separated zero-shot tasks, or 'all' (piqa, hellaswag, arc_easy, ...; data from "
                        "`depthattn data fetch-eval`)")
    p.add_argument("--limit", type=int, default=None, help="examples per zero-shot task (needs --tasks)")
    p.add_argument("--harness", choices=("native", "lm-eval"), default="native", help="zero-shot scorer")
    p.set_defaults(func=run_compare_cmd)
