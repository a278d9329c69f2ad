"""``depthattn compare``: train several cross-layer methods on the same data, seed and budget; evaluate; report.

Every (method, seed) pair trains in its own run folder ``OUT/runs/<method>[-loopsN]-seed<S>/`` with identical
``TrainConfig`` (same seed, so same data order and, for methods without extra parameters, the same initial
weights). Finished runs are reused and interrupted ones resumed, so re-running a comparison only does missing work.
Outputs: ``OUT/report.md``, ``OUT/results.json``, ``OUT/loss_curves.png``.

A run the divergence guard (or a non-finite loss) stopped is reported as *diverged* with its step (``results.json``:
``methods[m]["diverged"]``; the report's conclusion and table, the terminal table) and left out of the means and
the paired statistics; the other runs go on. A re-run reuses that verdict from the run's ``diverged.json`` instead
of training the run again; ``--set on_divergence=warn`` (``on_nonfinite=skip`` for a non-finite stop) continues it
past the divergence, deleting its folder trains it afresh.

The report opens with its conclusion: for every method, the paired difference from ``none`` over seeds (mean,
standard deviation, 95 % t-interval, seeds favouring; ``depthattn.stats``), what the run cannot show (scale, tokens),
tokens-to-target, zero-shot accuracies with binomial standard errors, and the history of the invocations that built
it (per-run training time from the runs' own logs, so re-running on finished runs does not rewrite it).

The modules, in the order a comparison uses them: ``settings`` (methods, shared settings, budgets, run names, the
default data), ``runner`` (``run_compare``), ``reuse`` (train, resume or reuse a run folder), ``estimate`` (the
duration estimate), ``evaluate`` (a run record from a run folder, with its evaluation cache), ``paired`` (mean ± std
over seeds, paired differences from ``none``, the pairing rule), ``conclusions`` (the report's opening sentences),
``report`` (report.md) and ``plot`` (loss_curves.png), both leaves that render ``results.json`` and import only
``records`` (the records' shared vocabulary) and ``conclusions``. The public names below are re-exported here.
"""

from __future__ import annotations

from .conclusions import conclusions
from .estimate import DurationEstimate
from .evaluate import diverged_run, evaluate_run, task_curve
from .paired import aggregate, pairable_train_differences, paired_stats, run_differences
from .plot import method_colours, plot_curves
from .records import BASELINE, COLUMNS, SAMPLE_PROMPT, SAMPLE_TOKENS, val_curve
from .report import (UNRELIABLE_SPREAD, periodic_note, render_history, render_paired, render_report, render_table,
                     render_task_curves, render_throughput, render_zero_shot, shown_path)
from .runner import run_compare
from .settings import (DEFAULT_EVAL_TOKENS, DEFAULT_OUT, DEFAULT_TRAIN, QUICK, CompareSettings, method_configs,
                       parse_methods, prepare_default_data, run_name)

__all__ = ["BASELINE", "COLUMNS", "DEFAULT_EVAL_TOKENS", "DEFAULT_OUT", "DEFAULT_TRAIN", "QUICK", "SAMPLE_PROMPT",
           "SAMPLE_TOKENS", "UNRELIABLE_SPREAD", "CompareSettings", "DurationEstimate", "aggregate", "conclusions",
           "diverged_run", "evaluate_run", "method_colours", "method_configs", "pairable_train_differences",
           "paired_stats", "parse_methods", "periodic_note", "plot_curves", "prepare_default_data", "render_history",
           "render_paired", "render_report", "render_table", "render_task_curves", "render_throughput",
           "render_zero_shot", "run_compare", "run_differences", "run_name", "shown_path", "task_curve", "val_curve"]
