"""``report.md``: a comparison's ``results.json`` dict rendered as markdown, conclusion first (``render_report``),
and its tables, which the terminal shows too (``render_table``). A leaf: it renders the results and imports nothing
of the comparison's training or evaluation."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from ..stats import binomial_se, difference_text, interval_text
from .conclusions import conclusions
from .records import COLUMNS, SAMPLE_TOKENS


def _throughput_spread(m: dict) -> float | None:
    """(p90 − p10) / median of the per-step throughputs over all seeds of a method (None without steps)."""
    rates = sorted(x for r in m["runs"] for x in r.get("step_tokens_per_s", []))
    if len(rates) < 2:
        return None
    q = statistics.quantiles(rates, n=10)
    return (q[-1] - q[0]) / statistics.median(rates)


#: Relative p10–p90 spread of the per-step throughput above which the tok/s column is flagged unreliable.
UNRELIABLE_SPREAD = 0.2


def _cell(mean: float, std: float, fmt: str, n: int) -> str:
    """``mean ± std`` over seeds; the mean alone for one seed or a constant (std 0)."""
    if n > 1 and std > 0:
        return f"{fmt.format(mean)} ± {fmt.format(std)}"
    return fmt.format(mean)


def render_table(results: dict) -> str:
    """The markdown table of the report (one row per method; mean ± std over seeds when there are several)."""
    methods = results["methods"]
    tasks = sorted({k for m in methods.values() for k in m["mean"] if k.startswith("acc:")},
                   key=lambda k: (k == "acc:average", k))
    seq_len = results.get("settings", {}).get("train", {}).get("seq_len", "?")
    head = ["method"] + [title.format(seq_len=seq_len) for _, title, _ in COLUMNS] + [k[4:] for k in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in methods.items():
        n = len(m["runs"])
        gone = m.get("diverged", [])
        if not n:  # every seed diverged
            stops = ", ".join(f"seed {d['seed']} at step {d['step']}" for d in gone)
            lines.append("| " + " | ".join([name, f"diverged ({stops})"] + [""] * (len(head) - 2)) + " |")
            continue
        label = f"{name} ({len(gone)} of {n + len(gone)} seeds diverged)" if gone else name
        cells = [label] + [_cell(m["mean"][k], m["std"][k], fmt, n) for k, _, fmt in COLUMNS]
        cells += [_cell(m["mean"][k], m["std"][k], "{:.4f}", n) if k in m["mean"] else "" for k in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_throughput(results: dict) -> str:
    """The secondary table of the report: each method's training tokens/s, timed one run after another (so under
    the machine's changing load), with its p10–p90 spread; † marks a spread above ``UNRELIABLE_SPREAD``."""
    lines = ["| method | train tok/s (sequential) | p10–p90 spread |", "|---|---:|---:|"]
    for name, m in results["methods"].items():
        if not m["runs"]:
            continue
        spread = _throughput_spread(m)
        flag = " †" if spread is not None and spread > UNRELIABLE_SPREAD else ""
        tps = _cell(m["mean"]["train_tokens_per_s"], m["std"]["train_tokens_per_s"], "{:.0f}", len(m["runs"]))
        lines.append(f"| {name} | {tps}{flag} | {'n/a' if spread is None else f'{spread:.0%}'} |")
    return "\n".join(lines) + "\n"


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a report shows it, without the machine's absolute layout: relative to the working folder when
    inside it, ``~/...`` when under the home folder, else its last component."""
    p = Path(path).expanduser().absolute()
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return prefix + rel.as_posix() if rel.parts or prefix else "."
    return p.name


def render_paired(results: dict) -> str:
    """The paired table: each method minus ``none``, per seed pair."""
    paired = results.get("paired") or {}
    if not paired:
        return ""
    lines = ["| method | Δ val loss (nats) | 95 % interval | seeds lower | Δ bits/byte | 95 % interval | "
             "tokens to none's final val loss | train time ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, p in paired.items():
        v, b = p["val_loss"], p["bits_per_byte"]
        reached = [t for t in p["tokens_to_target"] if t is not None]
        if len(reached) == len(p["tokens_to_target"]):
            ttt = f"{statistics.fmean(reached):,.0f} of {statistics.fmean(p['base_tokens']):,.0f}"
        elif reached:
            ttt = (f"{statistics.fmean(reached):,.0f} ({len(reached)} of {len(p['tokens_to_target'])} seeds; "
                   "else not reached)")
        else:
            ttt = "not reached"
        ratio = "n/a" if p["train_time_ratio"] is None else f"{p['train_time_ratio']:.2f}"
        lines.append(f"| {name} | {difference_text(v)} | {interval_text(v)} | {v['favouring']} of {v['n']} | "
                     f"{difference_text(b)} | {interval_text(b)} | {ttt} | {ratio} |")
    return "\n".join(lines) + "\n"


def render_zero_shot(results: dict) -> str:
    """Zero-shot accuracies: mean over seeds with the binomial standard error of one run, n and chance level."""
    rows = []
    for name, m in results["methods"].items():
        if not m["runs"]:
            continue
        run0 = m["runs"][0]
        for task, n in run0.get("task_n", {}).items():
            accs = [r["task_accuracy"][task] for r in m["runs"] if task in r.get("task_accuracy", {})]
            acc = statistics.fmean(accs)
            se = binomial_se(acc, n * len(accs))
            rows.append(f"| {name} | {task} | {acc:.4f} | {se:.4f} | {n} × {len(accs)} | "
                        f"{run0['task_chance'][task]:.3f} |")
    if not rows:
        return ""
    return "\n".join(["| method | task | accuracy | binomial s.e. | n (items × seeds) | chance |",
                      "|---|---|---:|---:|---:|---:|"] + rows) + "\n"


def render_task_curves(results: dict) -> str:
    """The in-loop zero-shot accuracies (``TrainConfig.eval_tasks``): per method and task, the accuracy at the
    first and the last step both logged by every seed, mean over seeds ("" when no run logged any)."""
    rows = []
    for name, m in results["methods"].items():
        curves = [r["task_curve"] for r in m["runs"] if r.get("task_curve")]
        if not curves:
            continue
        steps = sorted(set.intersection(*({c["step"] for c in curve} for curve in curves)))
        if not steps:
            continue
        at = {s: [next(c for c in curve if c["step"] == s) for curve in curves] for s in (steps[0], steps[-1])}
        for key in sorted(k for k in at[steps[-1]][0] if k.startswith("task/") and k.endswith("/acc")):
            first, last = (statistics.fmean(c[key] for c in at[s]) for s in (steps[0], steps[-1]))
            rows.append(f"| {name} | {key.split('/')[1]} | {first:.4f} (step {steps[0]}) | "
                        f"{last:.4f} (step {steps[-1]}) | {len(curves)} |")
    if not rows:
        return ""
    return "\n".join(["| method | task | first in-loop acc | last in-loop acc | seeds |", "|---|---|---:|---:|---:|"]
                     + rows) + "\n"


def render_history(results: dict) -> list[str]:
    lines = ["## Wall time", "", "Training time per run (optimizer steps over every session, from the run's "
             "metrics.jsonl):", "", "| run | train s |", "|---|---:|"]
    total = 0.0
    for m in results["methods"].values():
        for r in m["runs"] + m.get("diverged", []):
            total += float(r.get("train_seconds", 0.0))
            lines.append(f"| {Path(r['run_dir']).name}{' (diverged)' if 'reason' in r else ''} | "
                         f"{float(r.get('train_seconds', 0.0)):.0f} |")
    lines += ["", f"Total training time of the runs: {total:.0f} s.", "",
              "Invocations of `compare` that built this folder (each trains what is missing, evaluates everything):",
              ""]
    for i, h in enumerate(results.get("history", []), 1):
        actions: dict[str, int] = {}
        for r in h.get("runs", {}).values():
            key = r["action"].split(" at step")[0]
            actions[key] = actions.get(key, 0) + 1
        what = ", ".join(f"{v} {k}" for k, v in actions.items()) or "details not recorded"
        lines.append(f"{i}. {h.get('started_utc') or 'earlier'}: {h['wall_seconds']:.0f} s ({what})")
    lines += ["", f"Sum over invocations: {sum(h['wall_seconds'] for h in results.get('history', [])):.0f} s.", ""]
    return lines


def periodic_note(t: dict) -> str:
    """What the curves measure, beside the table's final evaluation: the periodic validation of training, on at
    most ``eval_windows`` windows spread evenly over the split (``eval.perplexity.validation_windows``) — another
    set of windows, so the numbers differ."""
    windows = t.get("eval_windows")
    subset = (f"at most {windows} windows ({windows * t['seq_len']:,d} tokens) spread evenly over the validation "
              f"split" if windows else "windows spread evenly over the validation split")
    return (f"The loss curves and the plot show the periodic validation during training, on {subset}; the table's "
            f"val loss is the final evaluation above, over another set of windows, so the two need not agree (nor "
            f"does the curve's last point equal the table).")


def render_report(results: dict) -> str:
    s = results["settings"]
    t = s["train"]
    spreads = {name: _throughput_spread(m) for name, m in results["methods"].items()}
    flagged = [n for n, v in spreads.items() if v is not None and v > UNRELIABLE_SPREAD]
    spread_text = ", ".join(f"{n} {v:.0%}" for n, v in spreads.items() if v is not None)
    lines = ["# depthattn compare", ""] + results.get("conclusion", conclusions(results)) + ["",
        f"Methods {', '.join(s['methods'])}; preset `{s['preset']}` with overrides `{s['model_overrides']}`; "
        f"loops {s['loops']}; seeds {s['seeds']}; {t['steps']} steps × {t['batch_size'] * t['grad_accum']} × "
        f"{t['seq_len']} tokens; peak lr {t['lr']}, warm-up {t['warmup']:.0%}, cosine to {t['min_lr_ratio']} × peak; "
        f"data `{shown_path(s['data'])}`.", "",
        "**a ± b** is the mean ± the sample standard deviation over seeds (omitted for one seed and for numbers that "
        "are the same for every seed). Validation loss, perplexity (= exp(loss)) and bits per byte are measured over "
        "the validation split in non-overlapping windows of the training length"
        + (f" (first {s['eval_tokens']:,d} tokens)" if s["eval_tokens"] else "") + ". "
        + periodic_note(t) + " Forward FLOPs/token is the analytical count (depthattn.accounting.num_flops(...)"
        f".total): matmuls, the method's extra FLOPs and sequence attention at the training length T = "
        f"{t['seq_len']}.", "",
        render_table(results),
        "## Training throughput (indicative only)", "",
        "Train tok/s is the median of the per-step training throughput on this machine over the steps after the "
        "first (the first step's warm-up excluded; from metrics.jsonl). **The runs were timed one after another "
        "(sequentially, not interleaved)**, so throughput differences include the machine's changing load: p10–p90 "
        f"spread of the per-step throughput {spread_text or 'n/a'}; † marks a spread above "
        f"{UNRELIABLE_SPREAD:.0%} (unreliable" + (f": {', '.join(flagged)}" if flagged else "") + "). Speed "
        "comparisons come from `scripts/bench.py`, which interleaves the methods' steps on one machine.", "",
        render_throughput(results)]
    paired = render_paired(results)
    if paired:
        lines += ["## Paired differences from `none`", "",
                  "Per seed, the method's number minus `none`'s with the same seed (same data order); negative "
                  "= better. Δ is the mean ± sample standard deviation of the per-seed differences; the 95 % interval "
                  "is mean ± t(0.975, n − 1) · std / √n (not available with one seed). Tokens to none's final val "
                  "loss: the tokens at which the method's periodic validation curve first reaches `none`'s last "
                  "periodic validation loss (same seed), linearly interpolated, mean over seeds, of the run's "
                  "tokens. Train time ratio: Σ optimizer-step seconds over seeds, method / `none` (sequential "
                  "timing, see above).", "", paired]
    zs = render_zero_shot(results)
    if zs:
        lines += ["## Zero-shot", "", "Accuracy is the mean over seeds; the binomial standard error is "
                  "√(acc (1 − acc) / N) with N = items × seeds; chance is the mean of 1 / (number of choices).",
                  "", zs]
    in_loop = render_task_curves(results)
    if in_loop:
        limit = t.get("eval_tasks_limit")
        lines += ["## Zero-shot during training", "",
                  f"Scored by the trainer (`eval_tasks`) on the first {limit or 'all'} documents of each task every "
                  f"{t.get('eval_tasks_every') or t['steps']} steps and at the last step (the native scorer's "
                  "definitions, mean over seeds); the plot's fourth panel shows the average accuracy over the tasks.",
                  "", in_loop]
    lines += ["![validation loss](loss_curves.png)", "",
              f"## Samples (seed 0, temperature 0.8, top-k 50, {SAMPLE_TOKENS} tokens)", "",
              f"Prompt: `{s['sample_prompt']}`", ""]
    for name, m in results["methods"].items():
        if not m["runs"]:
            lines += [f"- **{name}**: no sample (every seed diverged)"]
            continue
        sample = m["runs"][0]["sample"].replace("\n", " ")
        lines += [f"- **{name}**: {s['sample_prompt']}{sample}"]
    lines += [""] + render_history(results)
    return "\n".join(lines)
