"""Zero-shot tasks during training (``TrainConfig.eval_tasks``, ``eval_tasks_every``, ``eval_tasks_limit``).

At every ``eval_tasks_every``-th step and at the last step (only the last when it is 0) the project's scorer
(``eval.zero_shot.score_requests``, the definitions of ``depthattn eval --tasks``) scores the first
``eval_tasks_limit`` documents of each task with the run's tokenizer, eagerly (compiled blocks are bypassed:
``torch.compiler.set_stance("force_eager")``), in eval mode, without autocast — the precision the native scorer uses
on the checkpoint. The documents are loaded once, when the run is set up (a task whose data is not installed stops
the run there, before any step).

Distributed (DDP or FSDP): rank r scores documents r, r + W, r + 2W, … (W ranks) in batches of ``eval_batch_size``
requests; every rank runs the same number of forwards (the most any rank needs; the others pad with one-token
forwards, since under FSDP each forward all-gathers shards and a rank that stopped early would leave the others at
the collective until its timeout), and the counts [documents, correct, correct by acc_norm, Σ log-likelihood] are
summed over the ranks with one all-reduce per task. One rank gives exactly ``zero_shot.evaluate_task``'s numbers.

Keys of the step's metrics row: ``task/<name>/acc``, ``task/<name>/acc_norm`` (where defined),
``task/lambada/perplexity``, and ``task/average/acc`` (the mean accuracy over the tasks, as ``run_zero_shot``'s
``average_acc``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import torch

from ..eval.tasks import TASKS, Item, load_task
from ..eval.zero_shot import check_vocab, lambada_metrics, mc_metrics, score_requests


def _batches(items: list[Item], batch_size: int) -> int:
    return -(-sum(len(it.requests) for it in items) // batch_size)


def load_tasks(names: list[str], limit: int | None) -> dict[str, list[Item]]:
    """The documents of each task; ``ValueError`` naming ``TrainConfig.eval_tasks`` and the command that installs
    missing benchmark data (``depthattn data fetch-eval``)."""
    try:
        return {name: load_task(name, limit) for name in names}
    except ValueError as e:
        raise ValueError(f"TrainConfig.eval_tasks={names}: {e}") from None


class TaskSuite:
    """The in-loop tasks of a run: this rank's share of each task's documents and the number of forwards every rank
    runs for it. A periodic job of the trainer (``training.periodic.Periodic``): due every ``every`` steps and at
    ``last_step``; its abandon check passes the fault-injection point ``tasks``."""

    phase = "tasks"

    def __init__(self, tasks: dict[str, list[Item]], tokenizer, batch_size: int, every: int, last_step: int,
                 rank: int = 0, world: int = 1):
        self.tokenizer, self.batch_size, self.every, self.last_step = tokenizer, batch_size, every, last_step
        self.world = world
        self.shards = {name: items[rank::world] for name, items in tasks.items()}
        self.forwards = {name: max(_batches(items[r::world], batch_size) for r in range(world))
                         for name, items in tasks.items()}

    @classmethod
    def for_run(cls, cfg, tokenizer_file: str | os.PathLike, vocab_size: int, rank: int,
                world: int) -> "TaskSuite | None":
        """The suite of ``cfg`` (a ``TrainConfig``) with the data's tokenizer; None without ``eval_tasks``.
        Raises ``ValueError`` for missing benchmark data (``load_tasks``)."""
        if not cfg.eval_tasks:
            return None
        from ..data.tokenizer import load_tokenizer

        tasks = load_tasks(cfg.eval_tasks, cfg.eval_tasks_limit)
        return cls(tasks, load_tokenizer(tokenizer_file, vocab_size), cfg.eval_batch_size, cfg.eval_tasks_every,
                   cfg.total_steps(), rank, world)

    def due(self, step: int) -> bool:
        return step == self.last_step or bool(self.every and step % self.every == 0)

    def run(self, step: int, model, abandon: Callable[[], bool] | None = None) -> dict[str, float] | None:
        """The row keys (module docstring) for ``model`` after ``step``; None when ``abandon()`` (asked before each
        task, a collective under torchrun) says the run is stopping."""
        check_vocab(model, self.tokenizer)
        out: dict[str, float] = {}
        accs = []
        with torch.compiler.set_stance("force_eager"):
            for name, items in self.shards.items():
                if abandon is not None and abandon():
                    return None
                metrics = self._score(model, name, items)
                out.update({f"task/{name}/{k}": v for k, v in metrics.items()})
                accs.append(metrics["acc"])
        out["task/average/acc"] = sum(accs) / len(accs)
        return out

    def _score(self, model, name: str, items: list[Item]) -> dict[str, float]:
        pairs = [p for it in items for p in it.requests]
        scored = score_requests(model, self.tokenizer, pairs, self.batch_size, desc=name, progress=False,
                                min_batches=self.forwards[name])
        spec = TASKS[name]
        if spec.kind == "lambada":
            rows = lambada_metrics(items, scored)["items"] if items else []
            counts = [len(rows), sum(r["is_greedy"] for r in rows), 0, sum(r["loglikelihood"] for r in rows)]
        else:
            lls, k = [], 0
            for it in items:
                lls.append([s.loglikelihood for s in scored[k:k + len(it.requests)]])
                k += len(it.requests)
            rows = mc_metrics(items, lls, norm=spec.norm)["items"] if items else []
            counts = [len(rows), sum(r["pred"] == r["gold"] for r in rows),
                      sum(r.get("pred_norm") == r["gold"] for r in rows), 0.0]
        n, correct, correct_norm, ll_sum = self._summed(counts, model)
        if spec.kind == "lambada":
            return {"acc": correct / n, "perplexity": math.exp(-ll_sum / n)}
        return {"acc": correct / n, **({"acc_norm": correct_norm / n} if spec.norm else {})}

    def _summed(self, counts: list[float], model) -> list[float]:
        """``counts`` summed over the ranks (one float64 all-reduce; as they are in one process)."""
        if self.world == 1:
            return counts
        x = torch.tensor(counts, dtype=torch.float64, device=model.lm_head.weight.device)
        torch.distributed.all_reduce(x)
        return x.tolist()


def summary_line(row: dict[str, Any]) -> str | None:
    """The console line of a metrics ``row`` that holds in-loop task results (None if it holds none):
    ``"step 200 zero-shot acc: arc_easy 0.412, winogrande 0.505, average 0.459"`` (each task's ``acc``, then the
    average over the tasks; the full keys are in ``metrics.jsonl``)."""
    accs = [(k.split("/")[1], v) for k, v in row.items() if k.startswith("task/") and k.endswith("/acc")]
    if not accs:
        return None
    return f"step {row['step']} zero-shot acc: " + ", ".join(f"{name} {v:.3f}" for name, v in accs)
