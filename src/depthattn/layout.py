"""Every file and folder name depthattn writes, in one place (a leaf: it imports nothing).

A **run folder** (``depthattn train --out RUN``; ``depthattn.run.RunFolder`` owns its life)::

    run.json            the run record: resolved model and train config, data folder and fingerprint, precision,
                        package versions, git revision
    param_groups.json   which parameters get weight decay
    metrics.jsonl       one JSON object per logged step
    summary.json        written when the run reaches its last step
    diverged.json       written when the divergence guard or a non-finite value stopped the run
    wandb.json          the Weights & Biases run id, so a resumed run logs into the same W&B run
    depthattn.lock      the trainer's lock record: host, pid, start time, command, heartbeat (1,024 bytes)
    tensorboard/        TensorBoard event files
    checkpoints/step_XXXXXXXX/   one checkpoint folder per saved step

A **checkpoint folder** is a Hugging Face model folder (``config.json``, ``generation_config.json``, the weights,
``tokenizer.json``, ``tokenizer_config.json``, ``configuration.py``, ``modeling.py``, ``checksums.json``); a
training checkpoint adds ``train_config.json``, ``trainer_state.pt`` and ``val_loss.json``, and an FSDP run's holds
``dcp/`` shards instead of the weights and optimizer.

A **compare folder** (``depthattn compare --out OUT``) holds ``results.json``, ``report.md``, ``loss_curves.png``
and ``runs/<method>[-loopsN]-seed<S>/`` (each a run folder, plus the evaluation cache ``eval.json`` and
``zero_shot/``), and ``data/`` when it prepared the embedded corpus itself.

Leftovers of interrupted writes and prunes start with one of ``DEBRIS_PREFIXES``.
"""

from __future__ import annotations

import re

# ------------------------------------------------------------------------------------------------------ run folder
RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
DIVERGED_FILE = "diverged.json"
PARAM_GROUPS_FILE = "param_groups.json"
LOCK_FILE = "depthattn.lock"
WANDB_FILE = "wandb.json"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
#: ``compare``'s evaluation cache of a run and the folder of its zero-shot predictions.
EVAL_CACHE_FILE = "eval.json"
ZERO_SHOT_DIR = "zero_shot"
#: The files of a run folder that its writers replace atomically (``fileio.atomic_write_text``).
RUN_FILES = (RUN_FILE, PARAM_GROUPS_FILE, METRICS_FILE, SUMMARY_FILE, DIVERGED_FILE, WANDB_FILE, EVAL_CACHE_FILE)
#: Every name the project's writers create in a run folder.
RUN_FOLDER_NAMES = RUN_FILES + (LOCK_FILE, CHECKPOINT_DIR, TENSORBOARD_DIR, ZERO_SHOT_DIR)
#: Name prefixes of leftovers of interrupted writes and prunes (fileio temporaries, replaced and trashed folders).
DEBRIS_PREFIXES = (".tmp-", ".old-", ".trash-")
#: A checkpoint folder's name: ``step_`` and the global step in eight digits.
STEP_DIR = re.compile(r"^step_(\d{8})$")
#: ``.trash-step_XXXXXXXX``: a pruned checkpoint folder renamed before it is deleted.
TRASHED_STEP_DIR = re.compile(r"^\.trash-step_\d{8}$")

# ----------------------------------------------------------------------------------------------- checkpoint folder
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: ``depthattn/hf`` modules copied into each folder for ``trust_remote_code``.
REMOTE_CODE_FILES = ("configuration.py", "modeling.py")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
MANIFEST_FILE = "checksums.json"
TRAIN_CONFIG_FILE = "train_config.json"
TRAINER_STATE_FILE = "trainer_state.pt"
VAL_LOSS_FILE = "val_loss.json"
#: The folder of an FSDP run's sharded (DCP) model and optimizer inside a checkpoint folder.
SHARDED_DIR = "dcp"

# -------------------------------------------------------------------------------------- what eval and analyze write
#: ``eval --tasks`` (and ``compare``'s zero-shot evaluation, in a run's ``zero_shot/``): results and a table.
ZERO_SHOT_FILES = ("zero_shot.json", "zero_shot.md")
#: ``analyze --out OUT``: the depth weights and their heat map.
DEPTH_WEIGHTS_FILES = ("depth_weights.json", "depth_weights.png")

# --------------------------------------------------------------------------------------------- prepared data folder
#: A prepared data folder (``depthattn data prepare``) holds ``meta.json``, the tokenizer's two files and the shards.
PREPARED_META_FILE = "meta.json"

# -------------------------------------------------------------------------------------------------- compare folder
RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "loss_curves.png"
COMPARE_RUNS_DIR = "runs"
#: Where ``compare`` prepares the embedded corpus when no ``--data`` is given (``.data.partial`` while it does).
COMPARE_DATA_DIR = "data"
#: The files of a compare folder that ``compare`` replaces atomically (the report and plot only beside its results).
COMPARE_FILES = (RESULTS_FILE, REPORT_FILE, PLOT_FILE)
#: Every name ``compare`` creates in its folder, and the two logs an earlier study runner kept beside each compare
#: (``study.log``, ``study_invocations.jsonl``; ``depthattn study`` keeps its logs in ``OUT/logs``), so such folders
#: stay reusable.
COMPARE_FOLDER_NAMES = COMPARE_FILES + (COMPARE_RUNS_DIR, COMPARE_DATA_DIR, ".data.partial", LOCK_FILE, "study.log",
                                        "study_invocations.jsonl")


def step_dir_name(step: int) -> str:
    """``step_XXXXXXXX``: the name of the checkpoint folder of a global step."""
    return f"step_{step:08d}"
