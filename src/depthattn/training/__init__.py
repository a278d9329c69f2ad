"""Training: ``train()`` (``loop``) with its settings (``config``), the one plan for starting or continuing a run
(``resume``), AdamW and the schedules (``optim``), the parallelisation wrappers (``parallelize``) and the periodic
jobs (``periodic``). The run on disk (folder, lock, checkpoints, trainer state) is ``depthattn.run``'s, re-exported
here where it is public. See docs/training.md."""

from .config import TrainConfig, load_toml, resolve_model_config
from .guard import DivergenceError
from .loop import NonFiniteError, TrainResult, train
from ..run.folder import RunFolder
from ..run.lock import RunFolderLocked, RunLock
from ..checkpoint import init_from_checkpoint
from ..run.record import read_metrics, read_run, read_summary

__all__ = ["DivergenceError", "NonFiniteError", "RunFolder", "RunFolderLocked", "RunLock", "TrainConfig",
           "TrainResult", "init_from_checkpoint", "load_toml", "read_metrics", "read_run", "read_summary",
           "resolve_model_config", "train"]
