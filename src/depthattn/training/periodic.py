"""The trainer's periodic jobs: work after an optimizer step that adds keys to the step's metrics row.

Each job says when it is due (``due(step)``) and what it adds (``run(step, model, abandon)``: the keys, or None
when ``abandon()`` said the run is stopping; ``phase``: the fault-injection point its abandon check passes, None for
a job that is never abandoned). The loop runs the due ones in a fixed order, on every rank (their forwards are
collectives under FSDP), and merges their keys into the row:

* ``Validation`` (here): ``val_loss`` every ``eval_every`` steps and at the last step;
* ``in_loop_tasks.TaskSuite``: ``task/...`` every ``eval_tasks_every`` steps and at the last step;
* ``depth_stats.DepthProbe``: ``depth/...`` every ``log_depth_every`` steps.

The divergence guard (``guard.Guard``) is not one: it adds no key, and reads the row after it is logged.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

#: ``measure(model, abandon)``: the mean validation loss (nats), or None when ``abandon()`` stopped it.
Measure = Callable[[Any, Callable[[], bool] | None], float | None]


class Periodic(Protocol):
    phase: str | None

    def due(self, step: int) -> bool:
        """Whether the job runs after optimizer step ``step``."""

    def run(self, step: int, model: Any, abandon: Callable[[], bool] | None = None) -> dict[str, float] | None:
        """The metrics-row keys for ``model`` after ``step``; None when ``abandon()`` says the run is stopping."""


class Validation:
    """The periodic validation loss: due every ``every`` steps (0: only the last) and at ``last_step``; ``run``
    measures it (``measure``: ``eval.perplexity.mean_loss`` on the run's validation windows; ``abandon`` is asked
    between batches) into ``{"val_loss": nats}`` and keeps the newest (``loss``, ``step``). ``measure(model)`` alone
    is the loss now, kept nowhere (a checkpoint's, the final one of a resumed run)."""

    phase = "eval"

    def __init__(self, measure: Measure, every: int, last_step: int):
        self.measure, self.every, self.last_step = measure, every, last_step
        self.loss: float | None = None  # the newest periodic validation loss (None: none yet this session)
        self.step = -1  # the step it was measured after

    def due(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0) or step == self.last_step

    def run(self, step: int, model: Any, abandon: Callable[[], bool] | None = None) -> dict[str, float] | None:
        loss = self.measure(model, abandon)
        if loss is None:
            return None
        self.loss, self.step = loss, step
        return {"val_loss": loss}

    def loss_at(self, step: int) -> float | None:
        """The periodic validation loss measured after ``step``, if any."""
        return self.loss if self.step == step else None
