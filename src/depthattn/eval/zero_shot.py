"""Zero-shot evaluation by log-likelihood scoring (the definitions of lm-evaluation-harness 0.4).

For each document with choices c_i of a multiple-choice task, the model scores every (context, continuation) pair:

    ll_i = Σ_t log p(cont_t | context, cont_<t)        (natural log, summed over the continuation's tokens)
    acc       = 1[argmax_i ll_i = gold]
    acc_norm  = 1[argmax_i ll_i / len(c_i) = gold]     (len = characters of the choice text without the
                                                         leading one-space delimiter, lm-eval's ``completion_len``)

LAMBADA (one continuation, the last word): ``acc`` = the fraction of documents whose every continuation token is the
model's greedy argmax, ``perplexity`` = exp(−mean_doc ll) (lm-eval ``lambada_openai``).

Tokenisation follows lm-eval's ``HFLM``: trailing spaces of the context move to the continuation, the pair is
encoded whole and the continuation tokens are those after the context's own encoding; an empty context is replaced
by the EOS token; inputs longer than ``max_position_embeddings`` keep their last tokens. Requests are scored in
batches, longest first, right-padded (causal attention never reads the padding).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

from ..checks import check_token_array
from ..data.tokenizer import EOS_TOKEN
from ..fileio import atomic_write_text
from ..layout import ZERO_SHOT_FILES
from ..progress import progress_bar
from ..stats import binomial_se
from .tasks import TASKS, Item, load_task, parse_tasks


@dataclass(frozen=True)
class Scored:
    """Log-likelihood (nats, summed) of one continuation and whether greedy decoding reproduces it."""

    loglikelihood: float
    is_greedy: bool


def check_vocab(model, tokenizer) -> None:
    """``ValueError`` when the tokenizer can emit ids the model's embedding does not have."""
    n_tok = tokenizer.get_vocab_size(with_added_tokens=True)
    if n_tok > model.config.vocab_size:
        raise ValueError(f"tokenizer/model vocabulary mismatch: the tokenizer has {n_tok} tokens but the model's "
                         f"vocab_size is {model.config.vocab_size}; evaluate with the tokenizer.json the model was "
                         f"trained with")


def encode_pairs(tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) per pair, as lm-eval ``HFLM._encode_pair`` splits them."""
    moved = []
    for ctx, cont in pairs:
        n = len(ctx) - len(ctx.rstrip())
        moved.append((ctx[:-n], ctx[-n:] + cont) if n else (ctx, cont))
    eos = tokenizer.token_to_id(EOS_TOKEN)
    whole = tokenizer.encode_batch([c + t for c, t in moved], add_special_tokens=False)
    ctxs = tokenizer.encode_batch([c for c, _ in moved], add_special_tokens=False)
    out = []
    for (ctx, cont), w, c in zip(moved, whole, ctxs):
        if ctx == "":
            if eos is None:
                raise ValueError(f"an empty context needs the {EOS_TOKEN} token, which the tokenizer lacks")
            out.append(([eos], tokenizer.encode(cont, add_special_tokens=False).ids))
        else:
            out.append((c.ids, w.ids[len(c.ids):]))
    return out


@torch.inference_mode()
def score_requests(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int = 16,
                   desc: str = "scoring", progress: bool = True, min_batches: int = 0) -> list[Scored]:
    """Score (context, continuation) pairs with ``model`` (a ``DecoderLM``); one ``Scored`` per pair, in order.

    ``min_batches``: run at least this many forwards, the ones beyond ``ceil(len(pairs) / batch_size)`` on a
    one-token input whose output is dropped (FSDP: every rank must run the same number of forwards, since each
    forward all-gathers the shards; ``training.in_loop_tasks``).

    Raises ``ValueError`` for ``batch_size < 1``, a tokenizer/model vocabulary mismatch, an empty continuation, or a
    continuation longer than ``max_position_embeddings`` (its tokens cannot all be scored).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    check_vocab(model, tokenizer)
    max_len = model.config.max_position_embeddings
    device = model.lm_head.weight.device
    encoded = encode_pairs(tokenizer, pairs)
    inputs = []
    for i, (ctx, cont) in enumerate(encoded):
        if not cont:
            raise ValueError(f"request {i} has an empty continuation after tokenisation: {pairs[i]!r}")
        if len(cont) > max_len:
            raise ValueError(f"request {i} has a continuation of {len(cont)} tokens, more than the model's "
                             f"max_position_embeddings={max_len} can score (continuation {pairs[i][1][:60]!r}...)")
        inputs.append(((ctx + cont)[-(max_len + 1):][:-1], cont))
    order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i][0]))
    results: list[Scored | None] = [None] * len(inputs)
    was_training = model.training
    model.eval()
    try:
        for start in progress_bar(range(0, len(order), batch_size), desc=desc, enabled=progress, unit="batch"):
            idx = order[start:start + batch_size]
            T = len(inputs[idx[0]][0])
            ids = torch.zeros(len(idx), T, dtype=torch.long)
            for r, i in enumerate(idx):
                seq = inputs[i][0]
                ids[r, :len(seq)] = torch.tensor(seq)
            check_token_array(ids.flatten(), model.config.vocab_size, "the tokenised requests")  # the boundary
            logits_BTV = model(ids.to(device)).logits
            for r, i in enumerate(idx):
                seq, cont = inputs[i]
                n = len(cont)
                lp_NV = torch.log_softmax(logits_BTV[r, len(seq) - n:len(seq)].float(), dim=-1)
                target = torch.tensor(cont, device=device)
                ll = float(lp_NV.gather(-1, target[:, None]).sum())
                greedy = bool((lp_NV.argmax(-1) == target).all())
                results[i] = Scored(ll, greedy)
        for _ in range(min_batches - -(-len(order) // batch_size)):  # padding forwards (collectives under FSDP)
            model(torch.zeros(1, 1, dtype=torch.long, device=device))
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


def _argmax(values: list[float]) -> int:
    """Index of the first maximum (numpy.argmax's tie rule)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def mc_metrics(items: list[Item], lls: list[list[float]], norm: bool = True) -> dict:
    """acc (and acc_norm) over documents from per-choice log-likelihoods; also the per-item predictions."""
    per_item, acc, acc_norm = [], 0, 0
    for item, ll in zip(items, lls):
        pred = _argmax(ll)
        row = dict(doc_id=item.doc_id, gold=item.gold, loglikelihoods=ll, pred=pred)
        acc += pred == item.gold
        if norm:
            row["pred_norm"] = _argmax([v / len(c) for v, c in zip(ll, item.choice_texts)])
            acc_norm += row["pred_norm"] == item.gold
        per_item.append(row)
    n = len(items)
    out = dict(n=n, acc=acc / n)
    if norm:
        out["acc_norm"] = acc_norm / n
    return dict(metrics=out, items=per_item)


def lambada_metrics(items: list[Item], scored: list[Scored]) -> dict:
    """Last-word accuracy (greedy match of every continuation token) and perplexity exp(−mean ll)."""
    n = len(items)
    per_item = [dict(doc_id=it.doc_id, loglikelihood=s.loglikelihood, is_greedy=s.is_greedy)
                for it, s in zip(items, scored)]
    mean_ll = sum(s.loglikelihood for s in scored) / n
    return dict(metrics=dict(n=n, acc=sum(s.is_greedy for s in scored) / n, perplexity=math.exp(-mean_ll)),
                items=per_item)


def evaluate_task(model, tokenizer, name: str, limit: int | None = None, batch_size: int = 16,
                  progress: bool = True) -> dict:
    """Load and score one task natively; returns ``{"metrics": {...}, "items": [...]}``."""
    items = load_task(name, limit)
    pairs = [p for it in items for p in it.requests]
    scored = score_requests(model, tokenizer, pairs, batch_size, desc=name, progress=progress)
    if TASKS[name].kind == "lambada":
        return lambada_metrics(items, scored)
    lls, k = [], 0
    for it in items:
        lls.append([s.loglikelihood for s in scored[k:k + len(it.requests)]])
        k += len(it.requests)
    return mc_metrics(items, lls, norm=TASKS[name].norm)


def chance_accuracy(rows: list[dict]) -> float:
    """The accuracy of a uniform guess on a task, from its per-item rows (``mc_metrics``' or lm-eval's ``items``):
    the mean over items of 1 / (number of choices); 0.0 for a task scored by exact match (LAMBADA: no choices)."""
    counts = [len(r["loglikelihoods"]) for r in rows if r.get("loglikelihoods")]
    return sum(1.0 / c for c in counts) / len(counts) if counts else 0.0


def with_uncertainty(metrics: dict[str, dict], items: dict[str, list[dict]]) -> dict:
    """Each task's ``acc_se`` (binomial standard error sqrt(acc (1 − acc) / n), ``stats.binomial_se``) and
    ``chance`` (``chance_accuracy``) added into ``metrics``; returns the average over the tasks:
    ``{"acc", "acc_se", "chance"}`` (the standard error of a mean of independent estimates, sqrt(Σ se²) / k), or
    ``{}`` when no task has an accuracy."""
    for name, m in metrics.items():
        if m.get("acc") is not None:
            m["acc_se"] = binomial_se(m["acc"], m["n"])
            m["chance"] = chance_accuracy(items.get(name, []))
    scored = [m for m in metrics.values() if m.get("acc") is not None]
    if not scored:
        return {}
    k = len(scored)
    return dict(acc=sum(m["acc"] for m in scored) / k, acc_se=math.sqrt(sum(m["acc_se"] ** 2 for m in scored)) / k,
                chance=sum(m["chance"] for m in scored) / k)


def markdown_table(metrics: dict[str, dict], average: dict | None) -> str:
    """Markdown table: one row per task (n, acc ± its binomial standard error, the chance level, acc_norm,
    perplexity) and the average over the tasks (``with_uncertainty``' average: acc, acc_se, chance)."""
    lines = ["| task | n | acc | ± s.e. | chance | acc_norm | perplexity |", "|---|---:|---:|---:|---:|---:|---:|"]
    fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    for name, m in metrics.items():
        lines.append(f"| {name} | {m['n']} | {fmt(m.get('acc'), '.4f')} | {fmt(m.get('acc_se'), '.4f')} | "
                     f"{fmt(m.get('chance'), '.3f')} | {fmt(m.get('acc_norm'), '.4f')} | "
                     f"{fmt(m.get('perplexity'), '.2f')} |")
    if average:
        lines.append(f"| **average acc** | | **{average['acc']:.4f}** | {average['acc_se']:.4f} | "
                     f"{average['chance']:.3f} | | |")
    lines.append("")
    lines.append("s.e.: binomial standard error sqrt(acc (1 − acc) / n) (the average's: sqrt(Σ s.e.²) / tasks); "
                 "chance: the mean of 1 / (number of choices), 0 for LAMBADA (exact match).")
    return "\n".join(lines)


def run_zero_shot(model, tokenizer, tasks, limit: int | None = None, batch_size: int = 16,
                  harness: str = "native", out_dir: str | None = None, progress: bool = True) -> dict:
    """Evaluate ``model`` (a ``depthattn.DecoderLM``) zero-shot on ``tasks`` with ``tokenizer``
    (a ``tokenizers.Tokenizer``).

    Args:
        tasks: names (list or comma-separated; "all") from ``depthattn.eval.tasks.TASKS``.
        limit: score only the first ``limit`` documents of each task.
        harness: "native" (this module) or "lm-eval" (lm-evaluation-harness on the same files, needs
            ``lm-eval==0.4.13``).
        out_dir: when given, writes ``zero_shot.json`` (metrics and per-item predictions) and ``zero_shot.md``.
    Returns:
        ``{"harness", "limit", "tasks": {name: metrics}, "average_acc", "average_acc_se", "average_chance",
        "markdown", "items": {name: [...]}}``; each task's metrics hold ``n``, ``acc``, ``acc_se`` (binomial standard
        error) and ``chance`` (``with_uncertainty``), and ``acc_norm`` / ``perplexity`` where defined.
    Raises:
        ValueError: unknown task or harness, missing benchmark data, tokenizer/model vocabulary mismatch,
            bad ``limit``/``batch_size``.
    """
    names = parse_tasks(tasks)
    if harness not in ("native", "lm-eval"):
        raise ValueError(f"harness={harness!r} must be 'native' or 'lm-eval'")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit={limit!r} must be a positive integer or None")
    check_vocab(model, tokenizer)
    if harness == "lm-eval":
        from .lm_eval_adapter import run_lm_eval

        per_task = run_lm_eval(model, tokenizer, names, limit=limit, batch_size=batch_size)
    else:
        per_task = {n: evaluate_task(model, tokenizer, n, limit, batch_size, progress) for n in names}
    metrics = {n: r["metrics"] for n, r in per_task.items()}
    items = {n: r["items"] for n, r in per_task.items()}
    average = with_uncertainty(metrics, items)
    result = dict(harness=harness, limit=limit, tasks=metrics, average_acc=average.get("acc"),
                  average_acc_se=average.get("acc_se"), average_chance=average.get("chance"),
                  markdown=markdown_table(metrics, average), items=items)
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        atomic_write_text(os.path.join(out_dir, ZERO_SHOT_FILES[0]), json.dumps(result, indent=1) + "\n")
        atomic_write_text(os.path.join(out_dir, ZERO_SHOT_FILES[1]), result["markdown"] + "\n")
    return result
