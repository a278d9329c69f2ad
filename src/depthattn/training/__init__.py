"""Training: ``train()`` (``loop``) with its settings (``config``), runtime helpers (``runtime``: device, precision,
seeding), the run folder's files and lock (``run_folder``), checkpoints and the resume policy (``runs``), AdamW and the schedule (``optim``) and the parallelisation
wrappers (``parallelize``). See docs/training.md."""

from .config import TrainConfig, load_toml, resolve_model_config
from .guard import DivergenceError
from .loop import NonFiniteError, TrainResult, train
from ..run.folder import RunFolder
from ..run.lock import RunFolderLocked, RunLock
from .runs import init_from_checkpoint, read_metrics, read_run, read_summary

__all__ = ["DivergenceError", "NonFiniteError", "RunFolder", "RunFolderLocked", "RunLock", "TrainConfig",
           "TrainResult", "init_from_checkpoint", "load_toml", "read_metrics", "read_run", "read_summary",
           "resolve_model_config", "train"]
