"""What a comparison trains: the methods (``parse_methods``), the settings every (method, seed) run shares
(``CompareSettings``, the default and ``--quick`` budgets), each method's model config (``method_configs``), the run
folders' names (``run_name``) and the default data (the embedded corpus, ``prepare_default_data``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..cross_layer import names as method_names
from ..layout import COMPARE_DATA_DIR, PREPARED_META_FILE, TOKENIZER_FILE
from ..training import TrainConfig, resolve_model_config


#: The default budget: ``small`` preset at seq_len 128, batch 8 → 1,024 tokens per step, 400 steps (410k tokens) per
#: method. Measured on an idle 2-core CPU at ~0.6 s per step with validation: both methods, the final evaluation over
#: the whole held-out split and the samples take about 9 minutes (README), within the 15-minute budget.
DEFAULT_TRAIN = dict(steps=400, batch_size=8, seq_len=128, lr=2e-3, warmup=0.05, eval_every=25, eval_windows=64,
                     eval_batch_size=16, save_every=100, keep_last=1, log_every=1)
DEFAULT_EVAL_TOKENS = 0  # the whole validation split
DEFAULT_OUT = os.path.join("runs", "compare")

#: ``--quick``: the whole job (prepare the corpus, train both methods, evaluate, sample, report, plot) on the ``tiny``
#: preset in about a minute on an idle 2-core CPU; a smoke test of the setup, not a result. Flags given beside it win.
QUICK = dict(preset="tiny", out=os.path.join("runs", "compare-quick"), eval_tokens=16384,
             train=dict(steps=60, batch_size=4, seq_len=64, lr=3e-3, warmup=0.05, eval_every=10, eval_windows=16,
                        eval_batch_size=16, save_every=30, keep_last=1, log_every=1))


def prepare_default_data(out: Path, progress: bool) -> Path:
    """``OUT/data``: the embedded corpus, prepared (default settings) if it has no meta.json yet (``compare``
    without --data; every part of a study without ``data``)."""
    from ..data import load_prepared, prepare_corpus

    folder = out / COMPARE_DATA_DIR
    if not (folder / PREPARED_META_FILE).is_file():
        print(f"preparing the embedded corpus into {folder}")
        prepare_corpus(folder, None, progress=progress, overwrite=True, if_missing=True)
    load_prepared(folder)
    return folder


def parse_methods(text: str) -> list[str]:
    """Comma-separated ``cross_layer`` values; ValueError naming an unknown one."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in method_names()]
    if bad or not methods:
        raise ValueError(f"--methods: unknown method(s) {bad}; choose from {list(method_names())}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods lists a method twice: {methods}")
    return methods


def run_name(method: str, loops: int, seed: int) -> str:
    """The folder name of a (method, seed) run under ``OUT/runs``: ``none-seed0``, ``depth_attention-loops2-seed1``."""
    return f"{method}{f'-loops{loops}' if loops > 1 else ''}-seed{seed}"


@dataclass
class CompareSettings:
    """Everything a comparison trains and evaluates: the methods, the seeds (one run per method and seed, each with
    ``train``'s settings and its own seed), loops (``num_loops``, 1 = no looping), the model preset with its overrides,
    and the final evaluation (validation tokens, None = the whole split; zero-shot tasks, items per task, scorer)."""
    methods: list[str]
    seeds: list[int]
    loops: int
    preset: str
    model_overrides: dict[str, Any]
    train: TrainConfig
    eval_tokens: int | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    harness: str = "native"


def method_configs(settings: CompareSettings, data_dir: str | os.PathLike) -> dict[str, ModelConfig]:
    """The model config each of ``settings.methods`` trains with on the prepared folder ``data_dir`` (its vocabulary
    and tokenizer); ``ValueError`` naming the field for a setting the preset refuses."""
    from ..data import load_prepared

    data_dir = Path(data_dir)
    vocab_size = load_prepared(data_dir).vocab_size
    cfgs = {}
    for m in settings.methods:
        overrides = {**settings.model_overrides, "cross_layer": m}
        if settings.loops != 1:
            overrides["num_loops"] = settings.loops
        cfgs[m] = resolve_model_config(settings.preset, overrides, vocab_size, str(data_dir / TOKENIZER_FILE))
    return cfgs
