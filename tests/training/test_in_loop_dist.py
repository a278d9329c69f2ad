"""In-loop zero-shot tasks and depth statistics under torchrun (two gloo processes, one launch): DDP and FSDP2.

Each rank scores a shard of the documents (5 per task: 3 and 2, so rank 1 pads with forwards to rank 0's count
— without the padding FSDP would hang at the collective); the reduced counts equal the native scorer's on the
checkpoint in one process. Under FSDP the probe's depth weights equal ``analyze``'s on the gathered weights and the
per-layer gradient norms (sharded squares all-reduced) add up to the global norm.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from depthattn import DecoderLM
from depthattn import checkpoint as ckpt
from depthattn.analyze import depth_weight_means
from depthattn.data import load_prepared, load_tokenizer
from depthattn.eval import zero_shot as zs
from depthattn.eval.perplexity import validation_windows
from depthattn.training import read_metrics
from depthattn.run.dcp import load_sharded
from depthattn.training.depth_stats import probe_batch

from helpers import torchrun
from test_in_loop import needs_data

pytestmark = [pytest.mark.dist, needs_data]

TASKS, LIMIT = ["arc_easy", "lambada"], 5
BASE = dict(steps=4, batch_size=2, seq_len=32, eval_every=2, eval_windows=8, eval_batch_size=2, save_every=2,
            keep_last=3, device="cpu", tensorboard=False, eval_tasks=TASKS, eval_tasks_every=2,
            eval_tasks_limit=LIMIT, log_depth_every=2)

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from depthattn.training import TrainConfig, resolve_model_config, train

    data, out, base = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    cfg = resolve_model_config("tiny", {"cross_layer": "depth_attention"}, 512, "tokenizer.json")
    for dp in ("ddp", "fsdp"):
        train(out / dp, cfg, TrainConfig(**base, data_parallel=dp), data, progress=False)
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir) -> Path:
    root = tmp_path_factory.mktemp("in_loop_dist")
    data = data_dir
    (root / "runs.py").write_text(SCRIPT, encoding="utf-8")
    torchrun([str(root / "runs.py"), str(data), str(root), json.dumps(BASE)], root, timeout_s=600)
    return root


def _model(run: Path, step: int) -> DecoderLM:
    folder = run / "checkpoints" / f"step_{step:08d}"
    model = DecoderLM(ckpt.load_config(folder))
    if run.name == "fsdp":
        load_sharded(folder, model, None)
    else:
        model.load_state_dict(ckpt.load_state(folder))
    return model.eval()


@pytest.mark.parametrize("dp", ["ddp", "fsdp"])
def test_two_ranks_give_the_counts_of_one(runs, data_dir, dp):
    rows = read_metrics(runs / dp)
    assert [r["step"] for r in rows if "task/arc_easy/acc" in r] == [2, 4]
    tok = load_tokenizer(data_dir / "tokenizer.json")
    for step in (2, 4):
        row = next(r for r in rows if r["step"] == step)
        model = _model(runs / dp, step)
        for name in TASKS:
            native = zs.evaluate_task(model, tok, name, LIMIT, batch_size=2, progress=False)["metrics"]
            assert round(row[f"task/{name}/acc"] * LIMIT) == round(native["acc"] * LIMIT), (step, name)
            if "acc_norm" in native:
                assert round(row[f"task/{name}/acc_norm"] * LIMIT) == round(native["acc_norm"] * LIMIT)
            if "perplexity" in native:  # Σ ll over another batching: float32 rounding only
                assert math.log(row[f"task/{name}/perplexity"]) == pytest.approx(math.log(native["perplexity"]),
                                                                                 rel=1e-5)


def test_fsdp_depth_statistics_and_grad_norms(runs, data_dir):
    rows = read_metrics(runs / "fsdp")
    probe = probe_batch(validation_windows(load_prepared(data_dir).val, 32, BASE["eval_windows"]))
    for step in (2, 4):
        row = next(r for r in rows if r["step"] == step)
        res = depth_weight_means(_model(runs / "fsdp", step), probe)
        for layer in res["layers"][1:]:
            u = layer["layer"]
            assert row[f"depth/L{u}/self"] == pytest.approx(layer["weights"][-1], abs=1e-5)
            for j, w in zip(layer["candidates"][:-1], layer["weights"]):
                assert row[f"depth/L{u}/from{j}"] == pytest.approx(w, abs=1e-5)
        parts = [v for k, v in row.items() if k.startswith("grad_norm/")]
        assert len(parts) == 6
        assert math.sqrt(sum(v * v for v in parts)) == pytest.approx(row["grad_norm"], rel=1e-5)
    ddp = {r["step"]: r for r in read_metrics(runs / "ddp")}
    for row in rows:  # FSDP equals DDP on the same global batch: so do its per-layer norms
        for k, v in row.items():
            if k.startswith("grad_norm/"):
                assert v == pytest.approx(ddp[row["step"]][k], rel=1e-4), k
