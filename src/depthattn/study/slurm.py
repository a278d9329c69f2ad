"""The parts of a study as one SLURM job array, through submitit (the optional ``cluster`` extra:
``pip install depthattn[cluster]``).

Every array task records its start on its node (``invocations``: commit, machine) and runs one part's ``depthattn
compare`` (``runner.command``) in a child process of its own session (``PartJob``); when the study names
``publish``, a task whose part finishes publishes it (``study.publish``). Requeue-safe: SLURM warns a task before
its time limit (submitit's ``--signal=USR2@90``) or on preemption; submitit then calls ``PartJob.checkpoint``, which sends the child SIGUSR1 (the trainer writes the
checkpoint of its current step and exits, ``training.preemption``) and returns the same call, which submitit
requeues; the requeued task runs the same compare, which reuses finished runs and resumes the interrupted one from
that checkpoint. A part is never lost, at most the step in flight.

The job's resources come from the study file's ``[slurm]`` table, overridden by flags (``SLURM_KEYS``).
"""

from __future__ import annotations

import functools
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from .invocations import Invocation, invocation
from .publish import publish_part
from .runner import command
from .spec import Part, Study

#: Keys of ``[slurm]`` (and their flags): ours → submitit's ``AutoExecutor`` parameters.
SLURM_KEYS = {"partition": "slurm_partition", "gpus_per_node": "gpus_per_node", "timeout_min": "timeout_min",
              "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb", "array_parallelism": "slurm_array_parallelism",
              "account": "slurm_account", "qos": "slurm_qos", "constraint": "slurm_constraint",
              "max_num_timeout": "slurm_max_num_timeout"}
#: Seconds ``PartJob.checkpoint`` waits for the trainer to write its checkpoint (within submitit's 90 s warning).
CHECKPOINT_WAIT_S = 75.0
SUBMITIT_DIR = "slurm"


class PartJob(Checkpointable):
    """A part's compare as a submitit job: ``job(cmd, start, publish)`` records ``start`` (an ``Invocation``, if
    given), runs ``cmd`` (``runner.command``), raises ``RuntimeError`` naming its exit status if it fails, and
    then calls ``publish()`` (if given); ``checkpoint(...)`` stops it with a checkpoint and returns the same call
    (for submitit to requeue)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the child process stays behind; a requeued task starts its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.proc = None

    def __call__(self, cmd: list[str], start: Invocation | None = None,
                 publish: Callable[[], Path] | None = None) -> int:
        if start is not None:
            start.record()
        self.proc = subprocess.Popen(cmd, start_new_session=True)  # signals reach it only through checkpoint()
        rc = self.proc.wait()
        if rc != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {rc}); submit the study again to resume it")
        if publish is not None:
            publish()
        return rc

    def checkpoint(self, cmd: list[str], start: Invocation | None = None,
                   publish: Callable[[], Path] | None = None) -> DelayedSubmission:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)  # the trainer finishes its step, writes its checkpoint, exits
            try:
                proc.wait(timeout=CHECKPOINT_WAIT_S)
            except subprocess.TimeoutExpired:
                pass  # requeued anyway: compare resumes from the newest checkpoint on disk
        return DelayedSubmission(PartJob(), cmd, start, publish)


def slurm_parameters(study: Study, flags: dict[str, Any]) -> dict[str, Any]:
    """The ``AutoExecutor.update_parameters`` keywords of the study's array: the file's ``[slurm]`` table, then
    ``flags`` (None values ignored), translated by ``SLURM_KEYS``; the job's name is the study's. Raises
    ``ValueError`` naming the file and an unknown key."""
    given = {**study.slurm, **{k: v for k, v in flags.items() if v is not None}}
    unknown = sorted(set(given) - set(SLURM_KEYS))
    if unknown:
        raise ValueError(f"{study.path}: unknown [slurm] key(s) {unknown}; known: {sorted(SLURM_KEYS)}")
    return {"name": study.name, **{SLURM_KEYS[k]: v for k, v in given.items()}}


def executor(study: Study, flags: dict[str, Any], cluster: str | None = "slurm") -> submitit.AutoExecutor:
    """A submitit ``AutoExecutor`` for the study (logs and pickles in ``OUT/slurm``); ``cluster="debug"`` runs the
    jobs in this process (tests)."""
    folder = study.out / SUBMITIT_DIR
    ex = submitit.AutoExecutor(folder=str(folder / "%j"), cluster=cluster)
    params = slurm_parameters(study, flags)
    if cluster == "debug":
        params = {k: v for k, v in params.items() if not k.startswith("slurm_")}
    ex.update_parameters(**params)
    return ex


def submit(study: Study, parts: list[Part], flags: dict[str, Any], cluster: str | None = "slurm",
           commit: str | None = None) -> list:
    """Submit ``parts`` as one job array (one task per part, each recording its start with ``jobs`` 1 and
    ``commit``, and publishing its part when the study names ``publish``); returns submitit's jobs."""
    ex = executor(study, flags, cluster)
    publish = [None if study.publish is None else functools.partial(publish_part, study, p, study.publish)
               for p in parts]
    return ex.map_array(PartJob(), [command(study, p) for p in parts], [invocation(study, p, 1, commit) for p in parts],
                        publish)  # Checkpointable: requeued, not lost


def sbatch_files(study: Study) -> list[Path]:
    """The sbatch scripts submitit wrote for the study (``OUT/slurm/JOB/JOB_submission.sh``, one per array)."""
    return sorted(Path(study.out / SUBMITIT_DIR).glob("*/*_submission.sh"))
